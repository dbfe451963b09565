"""Stand-in activities with the real names, modelling nodes: what cures them, whether they come back.

The workflow tests check the workflow's decisions; the real activities have their own tests against
the fake API server and moto.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import warnings
from dataclasses import dataclass, field
from datetime import UTC, datetime

from temporalio import activity
from temporalio.client import Client
from temporalio.service import RPCError
from temporalio.worker import Worker

import api as c
from activities.errors import NO_EFFECT, fail
from activities.guard import GuardActivities
from activities.room_pool import RoomPool
from api.names import guard_workflow_id, remediation_workflow_id
from policies.findings import Finding, HealthReport
from policies.model import Policy
from tests.workflows.fake_ledger import FakeLedger
from tests.workflows.fake_node import FakeAgentActivities, FakeNode
from workers.reporting import send_report
from workflows.fleet_guard import FleetGuard
from workflows.node_admission import NodeAdmission
from workflows.node_remediation import NodeRemediation


@dataclass
class FakeFleet(FakeAgentActivities, FakeLedger):
    client: Client
    task_queue: str
    policy: Policy
    cluster: str
    nodes: dict[str, FakeNode] = field(default_factory=dict)
    disruptive_now: set[str] = field(default_factory=set)
    max_disruptive: int = 0
    denylist: dict[str, str] = field(default_factory=dict)
    records: list[c.RemediationRecord] = field(default_factory=list)
    transient_failures: dict[str, int] = field(default_factory=dict)  # activity name -> failures left
    act_delay: float = 0.0
    history_limit: int | None = None
    fleet_size: int | None = None  # what kube.fleet_size answers; None: the nodes added
    events: list[c.EventRequest] = field(default_factory=list)
    holder_check_delay: float = 0.0  # how long guard.running_holders takes (a slow server)
    count_delay: float = 0.0  # how long kube.fleet_size takes (a guard slow to answer its first cordons)
    agents: dict[str, Worker] = field(default_factory=dict)  # node -> the worker serving node/<cluster>/<node>
    check_drain_lease: bool = False  # each drain asks the guard whether the node holds a lease
    drained_without_lease: list[str] = field(default_factory=list)
    episodes_unlisted: bool = False  # guard.running_episodes fails (visibility down)
    record_hold: asyncio.Event | None = None  # ledger.record waits on it (an episode held in its close)
    record_started: asyncio.Event = field(default_factory=asyncio.Event)
    guard_client: Client | None = None  # the guard's activities' client (tests slow its calls down)
    admitted_hw: dict[str, set[str]] = field(default_factory=dict)  # the ledger's admissions: node -> hardware
    room: RoomPool | None = None  # quarantine room reserved ahead for this controller (None: every cordon asks)

    def add(self, node: FakeNode) -> FakeNode:
        self.nodes[node.name] = node
        return node

    async def report(self, name: str, **kw):
        return await send_report(self.client, self.nodes[name].report(**kw), node=name,
                                 cluster=self.cluster, task_queue=self.task_queue,
                                 history_limit=self.history_limit)

    async def send_raw(self, name: str, raw) -> None:
        await self.client.get_workflow_handle(remediation_workflow_id(name, self.cluster)).signal("report", raw)

    def _node(self, req) -> FakeNode:
        n = self.nodes[req.node]
        kind = activity.info().activity_type
        n.calls.append(kind)
        n.requests.setdefault(kind, []).append(req)
        if kind in n.fail:
            raise fail(NO_EFFECT, f"injected: {kind} on {n.name} did not take effect")
        left = self.transient_failures.get(kind, 0)
        if left:
            self.transient_failures[kind] = left - 1
            raise RuntimeError(f"injected transient failure of {kind}")
        return n

    def _leave_disruption(self, name: str) -> None:
        self.disruptive_now.discard(name)

    # --- kube ----------------------------------------------------------------------------------
    @activity.defn(name=c.KUBE_QUARANTINE)
    async def quarantine(self, req: c.QuarantineRequest) -> c.QuarantineResult:
        n = self._node(req)
        if req.dry_run:  # as the real one: a dry run changes nothing
            return c.QuarantineResult(node=n.name, changed=False, cordoned_at=datetime.now(UTC), dry_run=True)
        changed, n.cordoned = not n.cordoned, True
        return c.QuarantineResult(node=n.name, changed=changed, cordoned_at=datetime.now(UTC))

    @activity.defn(name=c.KUBE_RETURN_TO_SERVICE)
    async def return_to_service(self, req: c.ReturnToServiceRequest) -> c.ReturnToServiceResult:
        n = self._node(req)
        n.cordoned = False
        self._leave_disruption(n.name)
        if n.recurs > 0:
            # Sent before the activity completes: on the time-skipping server, probation's timer
            # would otherwise fire before a report sent later arrives.
            n.recurs -= 1
            n.faulty = True
            await self.report(n.name)
        return c.ReturnToServiceResult(node=n.name, changed=True)

    @activity.defn(name=c.KUBE_ATTRIBUTE_PODS)
    async def attribute_pods(self, req: c.AttributePodsRequest) -> c.AttributePodsResult:
        if req.node not in self.nodes:
            return c.AttributePodsResult()  # an unknown node has no pods
        self._node(req)
        return c.AttributePodsResult(pods=[f"default/job-on-{req.node}"])

    @activity.defn(name=c.KUBE_DRAIN)
    async def drain(self, req: c.DrainRequest) -> c.DrainResult:
        n = self._node(req)
        if self.check_drain_lease:
            guard = await self.client.get_workflow_handle(guard_workflow_id(self.cluster)).query(FleetGuard.status)
            if not any(h.node == n.name for h in guard.holders):
                self.drained_without_lease.append(n.name)
        self.disruptive_now.add(n.name)
        self.max_disruptive = max(self.max_disruptive, len(self.disruptive_now))
        if n.hold is not None:
            await n.hold.wait()
        if n.pdb_stuck:
            return c.DrainResult(remaining=[f"default/job-on-{n.name}"], timed_out=True, pdb_blocked=5)
        return c.DrainResult(evicted=[f"default/job-on-{n.name}"])

    @activity.defn(name=c.KUBE_EVENT)
    async def event(self, req: c.EventRequest) -> None:
        self.events.append(req)

    @activity.defn(name=c.KUBE_CHECK_NODE)
    async def check_node(self, req: c.NodeCheckRequest) -> c.NodeCheckResult:
        n = self.nodes.get(req.node)
        if n is not None and n.exists:
            self._node(req)  # recorded, and an injected failure raises, as any call on a node
        return self._checked(req.node, req.boot_id)

    def _checked(self, node: str, boot_id: str | None) -> c.NodeCheckResult:
        """kube.check_node's answer, recording nothing (policy.current gives it too)."""
        n = self.nodes.get(node)
        if n is None or not n.exists:
            return c.NodeCheckResult(exists=False, ours=False, reason=f"node {node} does not exist")
        said = re.search(r"-(\d+)$", boot_id or "")  # boot-<node>-N (agent) or kubelet-N (watcher)
        said = int(said[1]) if said else None
        if n.replaced_boot is not None and said is not None and (said == n.replaced_boot or said != n.boot):
            return c.NodeCheckResult(exists=True, ours=False, reason=f"node {n.name} was replaced: the report's "
                                     f"boot {boot_id} is its old host's")
        if n.replaced_boot == n.boot:  # as kube.check_node reads the replaced annotation
            return c.NodeCheckResult(exists=True, ours=False, reason=f"node {n.name} was replaced: reports from its "
                                     "old host start nothing")
        held = n.cordoned and n.replaced_boot is None  # a replaced host's taint holds nothing for a new one
        return c.NodeCheckResult(exists=True, ours=True, quarantined="fault" if held else None)

    @activity.defn(name=c.KUBE_FLEET_SIZE)
    async def count_fleet(self) -> int:
        await asyncio.sleep(self.count_delay)
        return self.fleet_size if self.fleet_size is not None else len(self.nodes)

    @activity.defn(name=c.KUBE_QUARANTINED_NODES)
    async def quarantined_nodes(self) -> list[str]:
        return sorted(n.name for n in self.nodes.values() if n.cordoned)

    # --- cloud ---------------------------------------------------------------------------------
    @activity.defn(name=c.CLOUD_REBOOT)
    async def reboot(self, req: c.RebootRequest) -> c.RebootResult:
        n = self._node(req)
        await asyncio.sleep(self.act_delay)
        n.apply("reboot")
        from_boot = f"kubelet-{n.boot}"
        if n.reboot_returns:
            n.boot += 1
            n.seq = 0
            if n.after_reboot != "agent":
                await self.stop_agent(n.name)
            if n.after_reboot == "watcher":
                await send_report(self.client, HealthReport(
                    node=n.name, boot_id=f"kubelet-{n.boot}", seq=1, source="watcher", detected_at=datetime.now(UTC)),
                    node=n.name, cluster=self.cluster, task_queue=self.task_queue)
            elif n.agent or n.after_reboot == "once":
                await self.report(n.name)  # the agent's first report from the new boot
        return c.RebootResult(instance_id=f"i-{n.name}", rebooted=True, from_boot=from_boot)

    @activity.defn(name=c.CLOUD_BOOT_ID)
    async def kubelet_boot_id(self, req: c.BootIdRequest) -> str | None:
        return f"kubelet-{self._node(req).boot}"

    @activity.defn(name=c.CLOUD_REPLACE)
    async def replace(self, req: c.ReplaceRequest) -> c.ReplaceResult:
        n = self._node(req)
        self._leave_disruption(n.name)
        n.replaced_boot = n.boot  # as cloud.replace marks the Node
        if n.lifecycle_hook:
            return c.ReplaceResult(instance_id=f"i-{n.name}", action="asg", lifecycle_state="Terminating:Wait")
        return c.ReplaceResult(instance_id=f"i-{n.name}", action="ec2")

    # --- guard: the real activities against the server, slowed or failed on demand -------------
    @activity.defn(name=c.GUARD_RUNNING_HOLDERS)
    async def running_holders(self, req: c.LiveHoldersRequest) -> c.LiveHoldersResult:
        await asyncio.sleep(self.holder_check_delay)
        return await GuardActivities(self.guard_client or self.client).running_holders(req)

    @activity.defn(name=c.GUARD_RUNNING_EPISODES)
    async def running_episodes(self, req: c.RunningEpisodesRequest) -> c.RunningEpisodesResult:
        if self.episodes_unlisted:
            raise RuntimeError("visibility unavailable")
        return await GuardActivities(self.client).running_episodes(req)

    def activities(self) -> list:
        guard = GuardActivities(self.client, self.room)
        return [self.quarantine, self.return_to_service, self.attribute_pods, self.drain, self.reboot,
                self.replace, self.kill, self.reset, self.validate, *self.ledger_activities(), self.event,
                self.count_fleet, guard.signal_guard, guard.take_room, guard.liveness, self.running_episodes, self.quarantined_nodes,
                self.check_node, self.kubelet_boot_id, self.gpu_pods, self.current_policy, self.hardware_ids,
                self.inventory, self.running_holders]

    @contextlib.asynccontextmanager
    async def workers(self):
        """The controller's worker plus one per node queue (what each node's agent would serve)."""
        ws = [Worker(self.client, task_queue=self.task_queue, workflows=[NodeRemediation, FleetGuard, NodeAdmission],
                     activities=self.activities())]
        for n in self.nodes.values():
            if n.agent:
                self.agents[n.name] = Worker(self.client, task_queue=c.node_task_queue(n.name, self.cluster), activities=self.activities())
                ws.append(self.agents[n.name])
        started: list[Worker] = []
        try:
            for w in ws:
                await w.__aenter__()
                started.append(w)
            yield
        finally:
            try:
                if self.room is not None:
                    await self.room.close()  # before the guard stops: its updates would find no worker
                if started:
                    await self.stop_guard()
            finally:
                for w in reversed(started):
                    await bounded_shutdown(w)

    async def stop_agent(self, name: str) -> None:
        """The node's agent dies: nobody polls node/<cluster>/<node> any more (shutting down twice is harmless)."""
        self.nodes[name].agent = False
        if (w := self.agents.pop(name, None)) is not None:
            await w.shutdown()

    async def stop_guard(self) -> None:
        """The guard runs forever; left behind without its worker it would stall the time-skipping
        server (a workflow task nobody polls keeps time from skipping for every later test)."""
        handle = self.client.get_workflow_handle(guard_workflow_id(self.cluster))
        with contextlib.suppress(RPCError):
            # Terminating mid workflow task leaks the test server's time lock: wait for it to idle.
            for _ in range(100):
                if not (await handle.describe()).raw_description.HasField("pending_workflow_task"):
                    break
                await asyncio.sleep(0.05)
            await handle.terminate("test over")


async def bounded_shutdown(worker: Worker, limit_s: float = 60) -> None:
    """Shut a test worker down, at most limit_s: sdk-core can panic while a local activity ends
    ("receive half not dropped", once in CI) and its shutdown then never returns."""
    try:
        await asyncio.wait_for(worker.__aexit__(None, None, None), limit_s)
    except TimeoutError:
        warnings.warn(f"worker on {worker.config()['task_queue']} did not shut down within {limit_s} s", stacklevel=1)


# Activities that change a node: under a dry run each must carry dry_run (the denylist is checked apart).
DESTRUCTIVE = {c.KUBE_DRAIN, c.NODE_KILL, c.NODE_RESET, c.CLOUD_REBOOT, c.CLOUD_REPLACE}


def xid(code: int, gpu: int = 2) -> Finding:
    return Finding(kind="xid", xid=code, gpu_index=gpu, pci="0000:91:00", message=f"Xid {code}")
