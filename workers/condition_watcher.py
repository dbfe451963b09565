"""Node conditions from other detectors (node-problem-detector, DCGM exporters, a cloud's monitoring
agent) turned into the same health reports the agent sends: one format, one validation path."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime

from kubernetes import client, watch
from kubernetes.client.rest import ApiException
from temporalio.client import Client

import api as c
from policies.findings import Finding, FindingKind, HealthReport, condition_event_id
from policies.terms import Generation
from workers.reporting import send_report

log = logging.getLogger("gpuheal.watcher")


@dataclass(frozen=True)
class ConditionRule:
    """A node condition that means a GPU fault once it has held for `for_s` seconds."""

    type: str  # e.g. "XidCriticalError" (NPD), "AcceleratedHardwareReady" (EKS node monitoring agent)
    status: str = "True"
    for_s: float = 0.0
    kind: FindingKind = FindingKind.NODE_CONDITION


@dataclass
class WatcherConfig:
    rules: list[ConditionRule]
    cluster: str = "default"
    task_queue: str = c.DEFAULT_TASK_QUEUE
    generation: Generation = Generation.HOPPER
    label_selector: str | None = None


@dataclass
class _NodeState:
    since: dict[str, float] = field(default_factory=dict)  # rule type -> when it started matching
    sent: tuple = ()


class ConditionWatcher:
    def __init__(self, temporal: Client, core: client.CoreV1Api, config: WatcherConfig, clock=time.monotonic):
        self.temporal, self.core, self.config, self.clock = temporal, core, config, clock
        self.nodes: dict[str, _NodeState] = {}
        self.sent = 0

    def findings_for(self, node: client.V1Node) -> list[Finding]:
        st = self.nodes.setdefault(node.metadata.name, _NodeState())
        conds = {c.type: c for c in node.status.conditions or []}
        now, out = self.clock(), []
        for rule in self.config.rules:
            cond = conds.get(rule.type)
            if cond is None or cond.status != rule.status:
                st.since.pop(rule.type, None)
                continue
            start = st.since.setdefault(rule.type, now)
            if now - start >= rule.for_s:
                out.append(Finding(kind=rule.kind, message=f"node condition {rule.type}={rule.status}: "
                                                           f"{cond.reason or ''} {cond.message or ''}".strip()[:2000],
                                   event_id=condition_event_id(rule.type, cond.last_transition_time)))
        return out

    async def observe(self, node: client.V1Node) -> HealthReport | None:
        """Report a change of what the configured conditions say; nothing otherwise."""
        findings = self.findings_for(node)
        st = self.nodes[node.metadata.name]
        fingerprint = tuple(sorted(f.message for f in findings))
        if fingerprint == st.sent:
            return None
        boot = (node.status.node_info.boot_id if node.status and node.status.node_info else None) or "unknown-boot"
        report = HealthReport(node=node.metadata.name, boot_id=boot, seq=time.time_ns() // 1000, source="watcher",
                              agent_version="gpuheal-condition-watcher", detected_at=datetime.now(UTC),
                              findings=findings)
        await send_report(self.temporal, report, node=node.metadata.name, generation=self.config.generation, cluster=self.config.cluster,
                          task_queue=self.config.task_queue)
        st.sent = fingerprint
        self.sent += 1
        return report

    async def run(self, stop: asyncio.Event, timeout_s: int = 30) -> None:
        """List, then watch from the list's resourceVersion, each event handled as it arrives; when
        a watch times out, resume from the last resourceVersion seen; on 410 Gone, list again."""
        while not stop.is_set():
            nodes = await asyncio.to_thread(self.core.list_node, label_selector=self.config.label_selector)
            for n in nodes.items:
                await self.observe(n)
            rv = nodes.metadata.resource_version
            while not stop.is_set() and rv is not None:
                rv = await self._watch_from(rv, stop, timeout_s)

    async def _watch_from(self, rv: str, stop: asyncio.Event, timeout_s: int) -> str | None:
        """One watch call, streamed: returns the resourceVersion to resume from, None to re-list."""
        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()
        w = watch.Watch()

        def pump() -> None:  # a daemon thread: a stopping controller does not wait for the call's timeout
            try:
                for ev in w.stream(self.core.list_node, resource_version=rv, timeout_seconds=timeout_s,
                                   label_selector=self.config.label_selector):
                    loop.call_soon_threadsafe(events.put_nowait, ev)
                loop.call_soon_threadsafe(events.put_nowait, {"type": "END"})
            except Exception as err:  # noqa: BLE001 - handed to the loop, which decides
                loop.call_soon_threadsafe(events.put_nowait, {"type": "FAILED", "error": err})

        threading.Thread(target=pump, name="node-watch", daemon=True).start()
        stopping = asyncio.ensure_future(stop.wait())
        try:
            while True:
                got = asyncio.ensure_future(events.get())
                await asyncio.wait({got, stopping}, return_when=asyncio.FIRST_COMPLETED)
                if not got.done():
                    got.cancel()
                    w.stop()
                    return None
                ev = got.result()
                if ev["type"] == "END":
                    return rv
                if ev["type"] == "FAILED":
                    err = ev["error"]
                    if not (isinstance(err, ApiException) and err.status == 410):
                        log.warning("node watch failed (%s): listing again", err)
                        await asyncio.sleep(1)
                    return None  # 410 Gone: the resourceVersion is compacted away
                if ev["type"] == "ERROR":
                    return None
                obj = ev["object"]
                rv = obj.metadata.resource_version or rv
                if ev["type"] in ("ADDED", "MODIFIED"):
                    await self.observe(obj)
        finally:
            stopping.cancel()
