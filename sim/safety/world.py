"""The world one safety schedule runs in: the stand-in activities of tests/workflows/fakes.py,
extended to record every side effect (with who asked and whether it was a dry run), to model
processes per GPU (and per MIG instance), and a second sender's view of the node. Its record is
effects.py, its nodes sim_node.py, its workers (which a schedule stops and starts) workers.py."""

from __future__ import annotations

import asyncio
import random
from datetime import UTC, datetime
from typing import Any

from temporalio import activity
from temporalio.client import Client
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.exceptions import ApplicationError
from temporalio.worker import Worker

import api as c
from activities.guard import GuardActivities
from activities.policy import PolicyActivities
from api.guard import GuardInput
from policies.findings import HealthReport
from sim.safety.effects import SIDE_EFFECTS, Effect
from sim.safety.schedule import GPUS, Schedule, driver_id, jitter
from sim.safety.sim_node import SimNode
from sim.safety.workers import WorkerSwitches
from tests.workflows.fakes import FakeFleet
from workflows.fleet_guard import FleetGuard
from workflows.node_remediation import NodeRemediation

OLD_DENIED = "GPU-denied-long-ago"  # a legitimate denylist entry from before the schedule
LATER_SIGNAL = "later"


class SafetyWorld(WorkerSwitches, FakeFleet):
    """FakeFleet plus the record of every side effect, for one schedule."""

    def __init__(self, client: Client, sched: Schedule):
        super().__init__(client=client, task_queue=sched.task_queue, policy=sched.policy, cluster=sched.cluster,
                         history_limit=sched.history_limit)
        self.sched = sched
        self.log: list[Effect] = []
        self.fleet_size = len(sched.nodes)
        self.controller: tuple[Worker, asyncio.Task] | None = None
        self.agents: dict[str, tuple[Worker, asyncio.Task]] = {}
        self.finished = asyncio.Event()
        self.final: dict[str, Any] = {}
        self.errors: list[str] = []
        self.watcher_seq = 0
        self.policy_asked = 0
        self.guard_msgs: list[c.GuardSignalRequest] = []
        self.room_taken = 0  # cordons in room reserved ahead, over the controller's runs
        self.room_pools = 0  # one per controller start: each its own identity, as a new process
        self.denylist[OLD_DENIED] = "replaced long ago"
        for spec in sched.nodes:
            n = self.add(SimNode(spec.name, [], cured_by=spec.cured_by, reboot_returns=spec.reboot_returns,
                                 gpus=GPUS, faulty=False, mig=spec.mig, fault=spec.fault, gpu=spec.gpu,
                                 cordoned_by_other=spec.cordoned_by_other, cordoned=spec.cordoned_by_other))
            n.findings = n.fault_findings() if n.fault else []
        for name in sched.foreign:
            self.add(SimNode(name, [], gpus=GPUS, faulty=False, ours=False))
        self.add(SimNode(sched.joiner, [], gpus=GPUS, faulty=False, admitted=False, agent=False))

    async def room_before_faults(self, wait_s: float = 5.0) -> None:
        """A controller in service finds its guard running and its room pool filled: the guard is
        started, and the schedule waits (a few wall seconds at most) for the pool's first room."""
        await self.client.start_workflow(c.GUARD_WORKFLOW, GuardInput(cluster=self.cluster, policy=self.policy.guard),
                                         id=c.guard_workflow_id(self.cluster), task_queue=self.task_queue,
                                         id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING)
        self.room.start(self.cluster)
        for _ in range(int(wait_s / 0.05)):
            if self.room is None or self.room.held(self.cluster):
                return
            await asyncio.sleep(0.05)

    # --- the record ------------------------------------------------------------------------------
    def note(self, kind: str, node: str, wf: str = "", dry: bool = False, **detail) -> Effect:
        e = Effect(len(self.log), kind, node, wf, dry, detail)
        self.log.append(e)
        return e

    def _node(self, req) -> SimNode:
        info = activity.info()
        kind, wf = info.activity_type, info.workflow_id or ""
        n = self.nodes.get(req.node)
        if n is None:
            self.note(kind, req.node, wf, getattr(req, "dry_run", False), unknown=True)
            raise ApplicationError(f"no such node {req.node}", type="NodeGone", non_retryable=True)
        super()._node(req)  # injected failures raise here, before any effect
        if kind in SIDE_EFFECTS:
            self.note(kind, n.name, wf, getattr(req, "dry_run", False))
        return n

    def _last(self) -> Effect:
        return self.log[-1]

    # --- kube ------------------------------------------------------------------------------------
    def _checked(self, node: str, boot_id: str | None) -> c.NodeCheckResult:
        n = self.nodes.get(node)
        if n is not None and n.exists and not n.ours:
            return c.NodeCheckResult(exists=True, ours=False, reason=f"{n.name} is not a GPU node of this cluster")
        found = super()._checked(node, boot_id)
        if found.ours and not n.tainted:
            # As the real check: held only by gpuheal's own taint, not by a cordon someone else set.
            found = found.model_copy(update={"quarantined": None})
        return found

    @activity.defn(name=c.KUBE_QUARANTINE)
    async def quarantine(self, req: c.QuarantineRequest) -> c.QuarantineResult:
        n = self._node(req)
        self._last().detail["taint"] = req.taint_key
        changed = not n.cordoned
        if not req.dry_run:
            n.cordoned = True
            n.tainted = n.tainted or req.taint_key == c.QUARANTINE_TAINT
        return c.QuarantineResult(node=n.name, changed=changed, cordoned_at=datetime.now(UTC), dry_run=req.dry_run)

    @activity.defn(name=c.KUBE_RETURN_TO_SERVICE)
    async def return_to_service(self, req: c.ReturnToServiceRequest) -> c.ReturnToServiceResult:
        n = self._node(req)
        if req.dry_run:
            return c.ReturnToServiceResult(node=n.name, changed=False, dry_run=True)
        if c.QUARANTINE_TAINT in req.taint_keys:
            n.tainted = False
        # As the real activity: a cordon someone else set before gpuheal stays, and so does one
        # gpuheal's quarantine taint still holds (an admission's uncordon lifts only its own taint).
        n.cordoned = n.cordoned_by_other or n.tainted
        if c.UNVALIDATED_TAINT in req.taint_keys:
            n.admitted = True
        return c.ReturnToServiceResult(node=n.name, changed=True, left_cordoned=n.cordoned)

    @activity.defn(name=c.KUBE_DRAIN)
    async def drain(self, req: c.DrainRequest) -> c.DrainResult:
        n = self._node(req)
        await asyncio.sleep(self.act_delay)
        return c.DrainResult(evicted=[] if req.dry_run else [f"default/job-on-{n.name}"], dry_run=req.dry_run)

    @activity.defn(name=c.KUBE_QUARANTINED_NODES)
    async def quarantined_nodes(self) -> list[str]:
        return sorted(n.name for n in self.nodes.values() if n.tainted)

    # --- cloud -----------------------------------------------------------------------------------
    @activity.defn(name=c.CLOUD_REBOOT)
    async def reboot(self, req: c.RebootRequest) -> c.RebootResult:
        n = self._node(req)
        from_boot = f"kubelet-{n.boot}"
        if req.dry_run:
            return c.RebootResult(instance_id=f"i-{n.name}", rebooted=False, from_boot=from_boot, dry_run=True)
        prior = [e for e in self.log[:-1] if e.kind == c.CLOUD_REBOOT and e.detail.get("key") == req.idempotency_key]
        self._last().detail.update(key=req.idempotency_key, returns=n.reboot_returns)
        if prior:  # one reboot per key (the real activity's tags)
            return c.RebootResult(instance_id=f"i-{n.name}", rebooted=False, from_boot=from_boot)
        await asyncio.sleep(self.act_delay)
        n.apply("reboot")
        if n.reboot_returns:
            n.boot += 1
            n.seq = 0
            if n.agent:
                await self.agent_report(n)  # the agent's first report from the new boot
        return c.RebootResult(instance_id=f"i-{n.name}", rebooted=True, from_boot=from_boot)

    @activity.defn(name=c.CLOUD_REPLACE)
    async def replace(self, req: c.ReplaceRequest) -> c.ReplaceResult:
        n = self._node(req)
        if req.dry_run:
            return c.ReplaceResult(instance_id=f"i-{n.name}", action="dry_run")
        n.replaced_boot = n.boot  # as cloud.replace marks the Node
        if not n.replaced:
            n.replaced = True  # EC2 runs the instance on a while after terminate: its agent may report once more
            await self.later(0.2, "resend_replaced", n.name)
            await self.later(600.0, "gone", n.name)
        return c.ReplaceResult(instance_id=f"i-{n.name}", action="ec2")

    # --- node-local --------------------------------------------------------------------------------
    @activity.defn(name=c.NODE_KILL)
    async def kill(self, req: c.KillRequest) -> c.KillResult:
        """As the real activity: the named GPUs' processes (every GPU's with all_gpus); on a GPU in
        MIG mode only the named instances' (all of them on older requests, which name none)."""
        n = self._node(req)
        gpus = set(range(n.gpus)) if getattr(req, "all_gpus", False) else set(req.gpus)
        named = {(m.gpu_index, m.gpu_instance_id) for m in getattr(req, "mig", [])}
        hit = [(g, gi) for g, gi in n.processes() if g in gpus and (
            gi is None or not named or (g, gi) in named)]
        self._last().detail["signalled"] = hit
        if req.dry_run:
            return c.KillResult(dry_run=True)
        n.apply("kill")
        return c.KillResult(killed=[c.GpuProcess(pid=1000 + 10 * g + (gi or 0), gpu_index=g) for g, gi in hit])

    @activity.defn(name=c.NODE_RESET)
    async def reset(self, req: c.ResetRequest) -> c.ResetResult:
        n = self._node(req)
        self._last().detail["gpus"] = list(req.gpus)
        if req.dry_run:
            return c.ResetResult(dry_run=True)
        await asyncio.sleep(self.act_delay)
        n.apply("reset")
        return c.ResetResult(reset=req.gpus)

    @activity.defn(name=c.NODE_VALIDATE)
    async def validate(self, req: c.ValidateRequest) -> c.ValidationResult:
        n = self._node(req)
        self.note("validate", n.name, activity.info().workflow_id or "", passed=not n.faulty)
        return c.ValidationResult(passed=not n.faulty, findings=n.findings if n.faulty else [], checks=["safety"])

    @activity.defn(name=c.POLICY_CURRENT)
    async def current_policy(self, req: c.PolicyRequest) -> c.PolicySnapshot:
        """The controller's policy, its durations moved a few odd milliseconds for each asker: two
        workflows whose timers would fire at one instant (a grant and a re-sent request, say) are
        what wedges the time-skipping server (schedule._jitter). Limits and switches are unchanged."""
        self.policy_asked += 1
        policy = self.policy.model_copy(deep=True)
        jitter(policy, random.Random(f"{self.sched.seed}/{req.node}/{self.policy_asked}"))
        return await self._with_node_check(PolicyActivities(policy, "safety", self.cluster).snapshot, req)

    # --- ledger and guard ----------------------------------------------------------------------------
    @activity.defn(name=c.LEDGER_DENYLIST)
    async def denylist_add(self, req: c.DenylistRequest) -> c.DenylistResult:
        n = self._node(req)
        self._last().detail["ids"] = list(req.hardware_ids)
        added = [i for i in req.hardware_ids if i not in self.denylist]
        self.denylist.update({i: req.reason for i in added})
        del n  # the entry stands whatever became of the node
        return c.DenylistResult(added=added)

    def _recorded(self, rec: c.RemediationRecord) -> None:
        self.note("ended", rec.node, activity.info().workflow_id or "", outcome=rec.outcome, rungs=rec.rungs)

    @activity.defn(name=c.GUARD_SIGNAL)
    async def signal_guard(self, req: c.GuardSignalRequest) -> None:
        self.note("guard." + req.signal, str(req.payload.get("node", "")), activity.info().workflow_id or "",
                  cluster=req.cluster, holder=req.payload.get("holder", ""),
                  **{k: req.payload[k] for k in ("outcome", "healthy", "admission") if req.payload.get(k)})
        self.guard_msgs.append(req)
        await GuardActivities(self.client).signal_guard(req)

    def activities(self) -> list:
        acts = [a for a in super().activities() if getattr(a, "__name__", "") != "signal_guard"]
        return [*acts, self.signal_guard]

    # --- the agent -----------------------------------------------------------------------------------
    async def agent_report(self, n: SimNode, healthy: bool | None = None) -> None:
        report = n.report(healthy)
        if report.findings:
            n.genuine.extend(report.findings)
        self.note("report", n.name, source="agent", findings=[f.label() for f in report.findings])
        await self._send(n, report)

    async def _send(self, n: SimNode, report: HealthReport) -> None:
        from workers.reporting import send_report

        await send_report(self.client, report, node=n.name, cluster=self.cluster, task_queue=self.task_queue,
                          history_limit=self.history_limit)

    def episode_seen(self, node: str) -> bool:
        return any(e.kind == "report" and e.node == node for e in self.log)

    async def later(self, delay_s: float, kind: str, node: str) -> None:
        """A step the world itself schedules (virtual seconds from now), through the schedule's driver."""
        await self.client.get_workflow_handle(driver_id(self.sched.seed)).signal(
            LATER_SIGNAL, {"delay_s": delay_s, "kind": kind, "node": node})

    async def observe(self, label: str) -> Effect:
        """What every episode and the guard say now (status queries), recorded for the invariants."""
        seen: dict[str, Any] = {}
        for name in [s.name for s in self.sched.nodes] + [self.sched.joiner]:
            h = self.client.get_workflow_handle(c.remediation_workflow_id(name, self.cluster))
            try:
                desc = await h.describe()
            except Exception:  # noqa: BLE001 - no episode ever ran for this node
                continue
            row: dict[str, Any] = {"status": desc.status.name}
            try:
                st = await asyncio.wait_for(h.query(NodeRemediation.status), 10)
                row.update(stage=st.stage.value, outcome=st.outcome and st.outcome.value, reason=st.outcome_reason,
                           waiting=st.waiting, lease_held=st.lease_held, quarantined=st.quarantined,
                           awaiting=st.awaiting_approval and st.awaiting_approval.value, paused=st.paused)
            except Exception as err:  # noqa: BLE001 - said in the row
                row["query_error"] = f"{type(err).__name__}: {str(err)[:100]}"
            seen[name] = row
        guard: dict[str, Any] = {}
        try:
            g = await asyncio.wait_for(self.client.get_workflow_handle(c.guard_workflow_id(self.cluster)).query(
                FleetGuard.status), 10)
            guard = {"holders": [h.holder for h in g.holders], "unhealthy": list(g.unhealthy)}
        except Exception:  # noqa: BLE001 - no guard started (nothing disruptive asked)
            pass
        return self.note(label, "", episodes=seen, guard=guard)


def _instance_named(instances, gpu: int, gi: int) -> bool:
    """Whether a kill request's MIG instance list names (gpu, gi); the shape is the contract's."""
    for item in instances:
        pair = (item.get("gpu"), item.get("gi")) if isinstance(item, dict) else tuple(item)[:2]
        if tuple(pair) == (gpu, gi):
            return True
    return False
