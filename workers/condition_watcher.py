"""Node conditions from other detectors (node-problem-detector, DCGM exporters, a cloud's monitoring
agent) turned into the same health reports the agent sends: one format, one validation path."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime

from kubernetes import client, watch
from temporalio.client import Client

from activities import contracts as c
from policies.findings import Finding, FindingKind, HealthReport
from policies.model import Generation, Policy
from workers.reporting import send_report


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
    policy: Policy
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
                                                           f"{cond.reason or ''} {cond.message or ''}".strip()[:2000]))
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
        await send_report(self.temporal, report, node=node.metadata.name, policy=self.config.policy,
                          generation=self.config.generation, cluster=self.config.cluster,
                          task_queue=self.config.task_queue)
        st.sent = fingerprint
        self.sent += 1
        return report

    async def run(self, stop: asyncio.Event, timeout_s: int = 30) -> None:
        """List, then watch from the list's resourceVersion; re-list on expiry (410)."""
        while not stop.is_set():
            nodes = await asyncio.to_thread(self.core.list_node, label_selector=self.config.label_selector)
            for n in nodes.items:
                await self.observe(n)
            rv = nodes.metadata.resource_version
            events = await asyncio.to_thread(lambda rv=rv: list(watch.Watch().stream(
                self.core.list_node, resource_version=rv, timeout_seconds=timeout_s,
                label_selector=self.config.label_selector)))
            for ev in events:
                if ev["type"] in ("ADDED", "MODIFIED"):
                    await self.observe(ev["object"])
