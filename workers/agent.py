"""The node agent: probe loop with hysteresis, reports on transitions, and the node-local worker."""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pynvml
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode
from temporalio.worker import Worker

import api as c
from activities.node import NodeActivities
from health.kmsg import KmsgFollower
from health.runner import ProbeConfig, kmsg_findings, run_cycle
from health.xid_watch import XidWatcher
from policies.baseline import NodeExpectations
from policies.classify import judge
from policies.findings import Finding, FindingKind, HealthReport
from policies.model import Policy
from policies.terms import Generation
from workers import telemetry
from workers.reporting import episode_id, fit_to_bounds, send_report, start_admission

AGENT_VERSION = "gpuheal-agent/0.1"
log = logging.getLogger("gpuheal.agent")


@dataclass
class AgentConfig:
    node: str
    policy: Policy
    cluster: str = "default"
    task_queue: str = c.DEFAULT_TASK_QUEUE
    generation: Generation = Generation.HOPPER
    probe: ProbeConfig = field(default_factory=ProbeConfig)
    poll_interval_s: float = 10.0
    persist_polls: int = 3  # a non-fatal finding must be seen this many polls in a row
    resend_interval_s: float = 300.0  # while unhealthy, re-send so a lost signal heals
    event_hold_s: float = 600.0  # how long a one-shot Xid event counts as a current finding
    kmsg: Path | None = Path("/dev/kmsg")  # the fallback when NVML events are missing; None: off
    kmsg_state: Path | None = None  # where the kernel-log position is kept (on the host: survives restarts)
    admit_on_start: bool = True  # a node's first agent report starts its admission (admit/<cluster>/<node>)
    # Ask the controller for the node's profile and baseline (`gpuheal agent` in a cluster); off when a
    # profile was given by name or file (--profile), and in tests that drive the agent alone.
    lookup_expectations: bool = False
    expectations_refresh_s: float = 600.0


# Slow signals: a degraded link or throttling must persist `persist_polls` polls before it is
# reported, however the catalogue rates it: one sample of a link retraining is not a fault.
SLOW_SIGNALS = {FindingKind.PCIE_DEGRADED, FindingKind.NVLINK_DOWN, FindingKind.THERMAL}


def _key(f: Finding) -> tuple:
    return f.kind.value, f.xid, f.gpu_index, f.recovery_action


class Agent:
    def __init__(self, client: Client, config: AgentConfig, nv=pynvml, boot_id: str | None = None, clock=time.monotonic):
        self.client, self.config, self.nv, self.clock = client, config, nv, clock
        self.boot_id = boot_id or Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        # Never backwards within a boot, across restarts too (an open episode rejects a lower seq).
        self.seq = time.time_ns() // 1000
        self.streak: dict[tuple, int] = {}
        self.events: dict[tuple, tuple[Finding, float]] = {}
        self.sent: tuple = ()  # fingerprint of what the workflow last heard; () = healthy
        self.sent_at: float | None = None
        self.signals = 0
        self.kmsg = (KmsgFollower(config.kmsg, config.kmsg_state, self.boot_id)
                     if config.kmsg is not None else None)
        self.announce = True  # first cycle after (re)start: an open episode must hear of this boot
        # Event ids: seeded from the wall clock so a restarted agent never reuses one.
        self._event_ids = itertools.count(time.time_ns() // 1000)
        self.expectations: NodeExpectations | None = None
        self._lookup: asyncio.Task | None = None
        self._looked_at: float | None = None

    def add_events(self, findings: list[Finding]) -> None:
        """One-shot events (an Xid, a DBE) count as current findings for `event_hold_s`; each gets an
        id, so the workflow tells a re-send of the same event from a new one."""
        now = self.clock()
        for f in findings:
            if f.event_id is None:
                f = f.model_copy(update={"event_id": f"{self.boot_id[:36]}/{next(self._event_ids)}"})
            self.events[_key(f)] = (f, now)

    def confirmed(self, findings: list[Finding]) -> list[Finding]:
        """Hysteresis: fatal findings count at once; the rest must persist `persist_polls` polls."""
        now, cfg = self.clock(), self.config
        self.events = {k: (f, t) for k, (f, t) in self.events.items() if now - t < cfg.event_hold_s}
        current = {_key(f): f for f in findings} | {k: f for k, (f, _) in self.events.items()}
        self.streak = {k: self.streak.get(k, 0) + 1 for k in current}
        out = []
        for k, f in sorted(current.items(), key=lambda kv: str(kv[0])):
            fatal = f.kind not in SLOW_SIGNALS and judge(f, cfg.generation, cfg.policy).severity == "fatal"
            if fatal or self.streak[k] >= cfg.persist_polls:
                out.append(f)
        return out

    async def step(self) -> HealthReport | None:
        """One poll; returns the report it sent, if any."""
        self._look_up_expectations()
        if self.expectations is None and self._lookup is not None:
            # Until the first answer, give the controller a moment: a cycle without its profile checks less.
            await asyncio.wait({self._lookup}, timeout=10)
        snap = await asyncio.to_thread(run_cycle, self.config.probe, self.nv)
        if not snap.findings and snap.inventory is not None:
            self._look_up_expectations(learn=snap.inventory)
        if self.kmsg is not None:
            try:
                self.add_events(kmsg_findings(self.kmsg.poll(), snap.gpus))
            except OSError as err:
                snap.findings.append(Finding(kind="probe_broken", message=f"kernel log {self.kmsg.path}: {err.strerror}"))
        telemetry.count_probe_failures(self.client.service_client.config.runtime, self.config.node, snap.findings)
        if self.announce and self.config.admit_on_start:
            ids = sorted({g.uuid for g in snap.gpus} | {g.serial for g in snap.gpus if g.serial})
            await start_admission(self.client, node=self.config.node, hardware_ids=ids, cluster=self.config.cluster,
                                  task_queue=self.config.task_queue)
        findings = self.confirmed(snap.findings)
        # A new event of the same kind on the same GPU is news: it is sent at once, not at the re-send.
        fingerprint = tuple(sorted(str((*_key(f), f.event_id)) for f in findings))
        now = self.clock()
        due = bool(findings) and self.sent_at is not None and now - self.sent_at >= self.config.resend_interval_s
        if fingerprint == self.sent and not due and not (self.announce and await self._episode_open()):
            self.announce = False
            return None
        self.announce = False
        # On the wall clock (never backwards): past a spoofed sequence, clamped by the workflow to its
        # clock, within the clocks' skew.
        self.seq = max(self.seq + 1, time.time_ns() // 1000)
        report = HealthReport(node=self.config.node, boot_id=self.boot_id, seq=self.seq, source="agent",
                              agent_version=AGENT_VERSION, detected_at=datetime.now(UTC), gpus=snap.gpus,
                              findings=findings)
        report = fit_to_bounds(report)
        await send_report(self.client, report, node=self.config.node, generation=self.config.generation,
                          cluster=self.config.cluster, task_queue=self.config.task_queue)
        self.sent, self.sent_at, self.signals = fingerprint, now, self.signals + 1
        log.info("node %s: sent report seq %d with %d findings", self.config.node, self.seq, len(findings))
        return report

    def _look_up_expectations(self, learn=None) -> None:
        """In the background, ask the controller for this node's profile and baseline (NodeProfile
        workflow): at start, every `expectations_refresh_s`, and with what a healthy cycle saw when
        the node has no baseline yet (it is recorded, learned, not validated)."""
        cfg = self.config
        if not cfg.lookup_expectations or (self._lookup is not None and not self._lookup.done()):
            return
        now = self.clock()
        if learn is not None:
            if self.expectations is None or self.expectations.baseline is not None:
                return
        elif self._looked_at is not None and now - self._looked_at < cfg.expectations_refresh_s:
            return
        self._looked_at = now
        self._lookup = asyncio.create_task(self._expectations_from_controller(learn))

    async def _expectations_from_controller(self, learn) -> None:
        from temporalio.common import WorkflowIDConflictPolicy

        from api.names import profile_workflow_id
        from api.node import ExpectationsRequest

        cfg = self.config
        try:
            exp = await self.client.execute_workflow(
                c.PROFILE_WORKFLOW, ExpectationsRequest(node=cfg.node, observed=learn, boot_id=self.boot_id),
                id=profile_workflow_id(cfg.node, cfg.cluster), task_queue=cfg.task_queue, execution_timeout=timedelta(minutes=2),
                id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING, result_type=NodeExpectations)
        except Exception as err:  # noqa: BLE001 - no answer: probe on with what we have, ask again later
            log.warning("node %s: no expectations from the controller yet: %s", cfg.node, err)
            self._looked_at = self.clock() - cfg.expectations_refresh_s + 30
            return
        self.expectations = exp
        cfg.probe.apply_profile(exp.profile_name, exp.profile, exp.baseline)
        if exp.profile is not None and exp.profile.generation is not None:
            cfg.generation = exp.profile.generation
        log.info("node %s: profile %s (%s); baseline %s%s", cfg.node, exp.profile_name, exp.reason,
                 exp.baseline.summary() if exp.baseline else "none", f"; {exp.recorded}" if exp.recorded else "")

    async def _episode_open(self) -> bool:
        """After a reboot the episode waits for a report from the new boot, healthy or not."""
        try:
            desc = await self.client.get_workflow_handle(
                await episode_id(self.client, self.config.node, self.config.cluster)).describe()
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND:
                return False
            raise
        return desc.status == WorkflowExecutionStatus.RUNNING

    async def run(self, stop: asyncio.Event) -> None:
        """Poll every interval; an NVML event wakes the loop at once."""
        watcher = XidWatcher(self.nv).start()
        try:
            while not stop.is_set():
                if watcher.error:
                    self.add_events([Finding(kind="probe_broken", message=watcher.error)])
                    watcher.stop()
                    watcher = XidWatcher(self.nv).start()  # NVML initialised again (a driver reload)
                self.add_events(watcher.drain())
                try:
                    await self.step()
                except Exception:  # noqa: BLE001 - the loop must outlive a failed send; it retries next poll
                    log.exception("probe cycle failed on %s", self.config.node)
                deadline = self.clock() + self.config.poll_interval_s
                while not stop.is_set() and self.clock() < deadline and watcher.events.empty():
                    await asyncio.sleep(0.1)
        finally:
            watcher.stop()
            if self._lookup is not None:
                self._lookup.cancel()


async def run_agent(client: Client, config: AgentConfig, stop: asyncio.Event, nv=pynvml) -> None:
    """The probe loop and the node-local worker (task queue node/<cluster>/<name>) together. The
    queue without the cluster is served too: episodes started before queues carried it schedule there."""
    activities = NodeActivities(config.probe, nv).activities()
    async with Worker(client, task_queue=c.node_task_queue(config.node, config.cluster), activities=activities), \
            Worker(client, task_queue=c.legacy_node_task_queue(config.node), activities=activities):
        await Agent(client, config, nv).run(stop)
