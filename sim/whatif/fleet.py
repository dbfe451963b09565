"""The what-if fleet: stand-in activities, with the real names, that act on modelled nodes, and the
bookkeeping of each node slot's time out of service. The cluster and cloud stand-ins are here; the
node-local ones in node_standin.py, the ledger's in ledger_standin.py; nodes and slots in slots.py.

A slot is one place in the fleet; it holds one node at a time (a replacement brings a new node,
with a new name and new hardware). A slot is out of service while its node is faulty, cordoned,
rebooting, gone or not yet admitted.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from temporalio import activity
from temporalio.client import Client
from temporalio.worker import Worker

import api as c
from activities.guard import GuardActivities
from activities.policy import PolicyActivities
from policies.findings import Finding, HealthReport
from policies.model import Policy
from policies.terms import Generation, Rung
from sim.whatif.clock import DELIVER_ACTIVITY, ClockEvent, clock_workflow_id
from sim.whatif.faultmodel import GRID_S, NODE_WIDE, FaultDraw, FaultModel
from sim.whatif.ledger_standin import LedgerStandIns
from sim.whatif.node_standin import NodeStandIns
from sim.whatif.slots import Node, Slot
from workers.reporting import send_report, start_admission

WHATIF_CLUSTER = "whatif"  # the stand-in fleet's cluster: its guard and its episodes' ids


@dataclass
class WhatIfFleet(NodeStandIns, LedgerStandIns):
    client: Client
    task_queue: str
    policy: Policy
    model: FaultModel
    faults: list[FaultDraw]
    nodes_count: int
    t0: datetime
    clock: Callable[[], Awaitable[datetime]]
    seed: int = 0
    slots: list[Slot] = field(default_factory=list)
    by_name: dict[str, Node] = field(default_factory=dict)
    records: list[c.RemediationRecord] = field(default_factory=list)
    denylist: dict[str, str] = field(default_factory=dict)
    denylisted_nodes: set[str] = field(default_factory=set)
    admitted_hw: dict[str, set[str]] = field(default_factory=dict)  # node -> hardware it was admitted with
    calls: Counter = field(default_factory=Counter)
    jobs_interrupted: int = 0
    dropped: int = 0  # faults that arrived while their slot's node was being replaced
    open_episodes: set[str] = field(default_factory=set)
    episode_names: set[str] = field(default_factory=set)
    quarantined: set[str] = field(default_factory=set)  # nodes under gpuheal's quarantine taint now
    peak_quarantined: int = 0  # the most at once: what the guard's max_unhealthy bounds
    _workers: dict[str, tuple[Worker, asyncio.Task]] = field(default_factory=dict)
    _retiring: list[asyncio.Task] = field(default_factory=list)

    def __post_init__(self) -> None:
        rng = random.Random(f"{self.seed}/jobs")
        for i in range(self.nodes_count):
            node = Node(name=f"n{i:04d}", slot=i)
            self.slots.append(Slot(index=i, node=node, has_job=rng.random() < self.model.utilization))
            self.by_name[node.name] = node

    # --- virtual time ---------------------------------------------------------------------------
    async def now(self) -> float:
        """Seconds since the start, on the test server's clock, floored to the GRID_S grid.

        The server's clock runs with the wall clock while work is in flight, so each step lands
        some milliseconds after its modelled time. Every modelled time is on the grid (the clock
        fires each event 1-4 s past it: clock.off_grid), so flooring gives every run of one seed
        the same figures. (A local activity's schedule time is the worker's wall clock, so it
        cannot say.)"""
        return math.floor((await self.clock() - self.t0).total_seconds() / GRID_S) * GRID_S

    def at(self, now: float) -> datetime:
        return self.t0 + timedelta(seconds=now)

    def _slot(self, node: Node) -> Slot:
        return self.slots[node.slot]

    async def _changed(self, node: Node, since: float | None = None) -> None:
        self._slot(node).update(await self.now(), since)

    async def _schedule(self, ev: ClockEvent) -> None:
        await self.client.get_workflow_handle(clock_workflow_id(self.task_queue)).signal("schedule", ev)

    def _node(self, req) -> Node:
        self.calls[activity.info().activity_type] += 1
        return self.by_name[req.node]

    def _cure(self, node: Node, rung: Rung) -> list[FaultDraw]:
        cured = [f for f in node.active.values() if Rung.cures(rung.value, f.cured_by.value)]
        for f in cured:
            del node.active[f.id]
        return cured

    async def _recur_later(self, node: Node, cured: list[FaultDraw], now: float) -> None:
        for f in cured:
            if f.recurs_after_s is not None:
                await self._schedule(ClockEvent(at_s=now + f.recurs_after_s, kind="recur", slot=node.slot, fault=f.id,
                                                node=node.name))

    def _debt(self, node: Node, seconds: float) -> None:
        self._slot(node).debt += seconds

    # --- the clock's events ---------------------------------------------------------------------
    @activity.defn(name=DELIVER_ACTIVITY)
    async def deliver(self, events: list[ClockEvent]) -> None:
        now = await self.now()
        for ev in events:
            slot = self.slots[ev.slot]
            node = slot.node
            if ev.kind in ("fault", "recur"):
                f = self.faults[ev.fault]
                if not node.exists or not node.admitted or (ev.kind == "recur" and ev.node and ev.node != node.name):
                    self.dropped += 1
                    continue
                node.active[f.id] = f
                await self._changed(node, since=max(now - self.model.durations.detect.total_seconds(), 0)
                              if ev.kind == "fault" else None)
                await self._report(node)
            elif ev.kind == "boot" and ev.node == node.name:
                node.rebooting = False
                await self._changed(node)
                await self._report(node)
            elif ev.kind == "ready":
                await self._join(slot, ev.node)

    async def _report(self, node: Node) -> None:
        await self._ensure_worker(node.name)
        node.seq += 1
        findings = [Finding(kind=f.finding.kind, xid=f.finding.xid,
                            gpu_index=None if f.finding.kind in NODE_WIDE else d.gpu,
                            uuid=None if f.finding.kind in NODE_WIDE else f"GPU-{node.name}-{d.gpu}",
                            serial=None if f.finding.kind in NODE_WIDE else f"SN-{node.name}-{d.gpu}",
                            message=d.fault_class)
                    for d in sorted(node.active.values(), key=lambda d: d.id)
                    for f in [self.model.classes[d.fault_class]]]
        report = HealthReport(node=node.name, boot_id=f"boot-{node.name}-{node.boot}", seq=node.seq,
                              gpus=node.ids(), findings=findings, detected_at=self.at(await self.now()),
                              instance_host_id=f"h-{node.name}")
        if findings:
            self.open_episodes.add(node.name)
            self.episode_names.add(node.name)
        await send_report(self.client, report, node=node.name, generation=Generation.HOPPER,
                          cluster=WHATIF_CLUSTER, task_queue=self.task_queue)

    async def _join(self, slot: Slot, name: str) -> None:
        """A new node is Ready in the slot: tainted until NodeAdmission validates it twice."""
        node = Node(name=name, slot=slot.index, admitted=False)
        slot.node = node
        self.by_name[name] = node
        slot.update(await self.now())
        await self._ensure_worker(name)
        await start_admission(self.client, node=name, hardware_ids=HealthReport(
            node=name, boot_id="b", seq=0, gpus=node.ids(), instance_host_id=f"h-{name}").hardware_ids(),
            cluster=WHATIF_CLUSTER, task_queue=self.task_queue)

    # --- kube -----------------------------------------------------------------------------------
    @activity.defn(name=c.KUBE_QUARANTINE)
    async def quarantine(self, req: c.QuarantineRequest) -> c.QuarantineResult:
        n = self._node(req)
        changed, n.cordoned = not n.cordoned, True
        if req.taint_key == c.QUARANTINE_TAINT:
            self.quarantined.add(n.name)
            self.peak_quarantined = max(self.peak_quarantined, len(self.quarantined))
        await self._changed(n)
        return c.QuarantineResult(node=n.name, changed=changed, cordoned_at=self.at(await self.now()))

    @activity.defn(name=c.KUBE_RETURN_TO_SERVICE)
    async def return_to_service(self, req: c.ReturnToServiceRequest) -> c.ReturnToServiceResult:
        n = self._node(req)
        n.cordoned = n.drained = False
        if c.QUARANTINE_TAINT in req.taint_keys:
            self.quarantined.discard(n.name)
        if c.UNVALIDATED_TAINT in (req.taint_keys or []):
            n.admitted = True
        await self._changed(n)
        return c.ReturnToServiceResult(node=n.name, changed=True)

    @activity.defn(name=c.KUBE_ATTRIBUTE_PODS)
    async def attribute_pods(self, req: c.AttributePodsRequest) -> c.AttributePodsResult:
        n = self._node(req)
        return c.AttributePodsResult(pods=[f"train/job-{n.slot}"] if self._slot(n).has_job else [])

    @activity.defn(name=c.KUBE_DRAIN)
    async def drain(self, req: c.DrainRequest) -> c.DrainResult:
        n = self._node(req)
        evicted = [f"train/job-{n.slot}"] if self._slot(n).has_job and not n.drained else []
        self.jobs_interrupted += len(evicted)
        n.drained = True
        return c.DrainResult(evicted=evicted)

    @activity.defn(name=c.KUBE_EVENT)
    async def event(self, req: c.EventRequest) -> None:
        self.calls[c.KUBE_EVENT] += 1

    @activity.defn(name=c.KUBE_CHECK_NODE)
    async def check_node(self, req: c.NodeCheckRequest) -> c.NodeCheckResult:
        n = self.by_name.get(req.node)
        if n is None or not n.exists:
            return c.NodeCheckResult(exists=False, ours=False, reason=f"node {req.node} does not exist")
        return c.NodeCheckResult(exists=True, ours=True)

    @activity.defn(name=c.KUBE_FLEET_SIZE)
    async def count_fleet(self) -> int:
        return self.nodes_count

    @activity.defn(name=c.KUBE_QUARANTINED_NODES)
    async def quarantined_nodes(self) -> list[str]:
        return sorted(s.node.name for s in self.slots if s.node.exists and s.node.cordoned and s.node.admitted)

    # --- cloud ----------------------------------------------------------------------------------
    @activity.defn(name=c.CLOUD_REBOOT)
    async def reboot(self, req: c.RebootRequest) -> c.RebootResult:
        n, now = self._node(req), await self.now()
        cured = self._cure(n, Rung.REBOOT)
        from_boot = f"kubelet-{n.boot}"
        n.boot, n.seq, n.rebooting = n.boot + 1, 0, True
        await self._changed(n)
        await self._recur_later(n, cured, now)
        await self._schedule(ClockEvent(at_s=now + self.model.durations.reboot.total_seconds(), kind="boot",
                                        slot=n.slot, node=n.name))
        return c.RebootResult(instance_id=f"i-{n.name}", rebooted=True, from_boot=from_boot)

    @activity.defn(name=c.CLOUD_BOOT_ID)
    async def kubelet_boot_id(self, req: c.BootIdRequest) -> str | None:
        return f"kubelet-{self._node(req).boot}"

    @activity.defn(name=c.CLOUD_REPLACE)
    async def replace(self, req: c.ReplaceRequest) -> c.ReplaceResult:
        n, now = self._node(req), await self.now()
        if n.exists:  # idempotent under retry: one replacement per node
            n.exists, n.active = False, {}
            self.quarantined.discard(n.name)  # the Node is gone with its taint
            slot = self._slot(n)
            slot.replacements += 1
            await self._changed(n)
            self.open_episodes.discard(n.name)
            await self._schedule(ClockEvent(at_s=now + self.model.durations.replacement.total_seconds(), kind="ready",
                                            slot=n.slot, node=f"n{n.slot:04d}-r{slot.replacements}"))
        return c.ReplaceResult(instance_id=f"i-{n.name}", action="ec2")

    # --- workers ----------------------------------------------------------------------------------
    def controller_activities(self) -> list:
        guard = GuardActivities(self.client)
        return [self.deliver, self.quarantine, self.return_to_service, self.attribute_pods, self.drain, self.event,
                self.check_node, self.count_fleet, self.quarantined_nodes, self.reboot, self.kubelet_boot_id,
                self.replace, *self.ledger_activities(), guard.running_holders,
                PolicyActivities(self.policy, "whatif", WHATIF_CLUSTER).current, guard.signal_guard, guard.liveness,
                guard.running_episodes, guard.take_room]

    def node_activities(self) -> list:
        """What each node's agent serves on node/<cluster>/<node>."""
        return [self.kill, self.reset, self.gpu_pods, self.validate, self.inventory, self.hardware_ids]

    async def _ensure_worker(self, node: str) -> None:
        """What the node's agent serves, started when the node first needs it."""
        if node in self._workers:
            return
        w = Worker(self.client, task_queue=c.node_task_queue(node, WHATIF_CLUSTER), max_concurrent_activity_task_polls=1,
                   activities=self.node_activities())
        self._workers[node] = (w, asyncio.create_task(w.run()))

    def _retire_worker(self, node: str) -> None:
        """Forgotten at once (a report meanwhile starts a fresh one), shut down beside the run."""
        entry = self._workers.pop(node, None)
        if entry is not None:
            self._retiring.append(asyncio.create_task(self._stop(*entry)))

    @staticmethod
    async def _stop(w: Worker, task: asyncio.Task) -> None:
        with contextlib.suppress(Exception):
            await w.shutdown()
        with contextlib.suppress(BaseException):
            await task

    async def stop_workers(self) -> None:
        for w, task in self._workers.values():
            await self._stop(w, task)
        self._workers.clear()
        await asyncio.gather(*self._retiring, return_exceptions=True)
        self._retiring.clear()
