"""What each kind of schedule step does to the world: the agent, the controller, operators, and
senders that lie. Each step records itself; a step that cannot be done now (an update the
episode's validator refuses, no episode to steer) is recorded as refused and changes nothing."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from temporalio.common import WorkflowIDReusePolicy

import api as c
from api.admission import AdmissionInput
from api.episode import RemediationInput
from api.guard import GateRelease, LeaseGrant
from api.names import HOLDER_SIGNAL_GRANTED
from policies.findings import Finding, GpuIds, HealthReport
from sim.safety.schedule import Step
from sim.safety.sim_node import SimNode
from sim.safety.world import OLD_DENIED, SafetyWorld
from workers.reporting import send_report
from workflows.node_admission import NodeAdmission
from workflows.node_remediation import NodeRemediation

OPERATOR = "safety-operator"
RPC_S = 5.0  # wall seconds an operator waits for an answer (the controller may be down)


async def do_step(w: SafetyWorld, step: Step) -> None:
    n: SimNode | None = w.nodes.get(step.node)
    action = _ACTIONS[step.kind]
    try:
        await action(w, step, n)
    except Exception as err:  # noqa: BLE001 - refused or unreachable: recorded, the schedule goes on
        w.note("step_failed", step.node, step=step.kind, why=f"{type(err).__name__}: {str(err)[:120]}")


async def _fault(w, step, n) -> None:
    n.faulty, n.event = True, n.event + 1
    n.findings = n.fault_findings()
    if n.agent and not n.replaced:
        await w.agent_report(n)


async def _resend(w, step, n) -> None:
    if n.agent and not n.replaced and (n.faulty or w.episode_seen(n.name)):
        await w.agent_report(n)


async def _resend_replaced(w, step, n) -> None:
    """The agent on a terminated host, still running for a moment, sends what it sees once more."""
    if n.agent:
        await w.agent_report(n)


async def _agent_stop(w, step, n) -> None:
    await w.stop_agent(n.name)
    w.note("agent_stop", n.name)


async def _agent_start(w, step, n) -> None:
    if n.agent:
        return
    w.start_agent(n.name)
    w.note("agent_start", n.name)
    if n.faulty and not n.replaced:
        await w.agent_report(n)


async def _reboot_lost(w, step, n) -> None:
    n.reboot_returns = False
    w.note("reboot_lost", n.name)


async def _kube_fail(w, step, n) -> None:
    n.fail.add(step.arg)  # for good: the call returns but the effect is not there
    w.note("fails", n.name, call=step.arg)


async def _cloud_fail(w, step, n) -> None:
    w.transient_failures[step.arg] = w.transient_failures.get(step.arg, 0) + 4
    w.note("fails", n.name, call=step.arg, times=4)


async def _slow(w, step, n) -> None:
    w.act_delay = 0.05
    w.note("slow", "")


def _episode(w, node: str):
    return w.client.get_workflow_handle(c.remediation_workflow_id(node, w.cluster))


async def _update(w, node: str, name: str, *args) -> None:
    h = _episode(w, node)
    before = await asyncio.wait_for(h.query(NodeRemediation.status), RPC_S)
    e = w.note("operator", node, cmd=name, args=list(args), awaiting=before.awaiting_approval and before.awaiting_approval.value)
    await asyncio.wait_for(h.execute_update(name, args=[*args, OPERATOR]), RPC_S)
    e.detail["done"] = True


async def _pause(w, step, n):
    await _update(w, n.name, "pause", "safety: pause")


async def _resume(w, step, n):
    await _update(w, n.name, "resume")


async def _approve(w, step, n):
    await _update(w, n.name, "approve")


async def _skip(w, step, n):
    await _update(w, n.name, "skip_to", step.arg)


async def _cancel(w, step, n):
    await _update(w, n.name, "cancel", "safety: cancel")


async def _force(w, step, n):
    w.note("force", "", leases=1)
    h = w.client.get_workflow_handle(c.guard_workflow_id(w.cluster))
    await asyncio.wait_for(h.execute_update("release_gate", GateRelease(leases=1, by=OPERATOR)), RPC_S)


def _forged(node: str, boot: str, seq: int, findings: list[Finding], source: str = "agent", gpus=None) -> dict:
    return HealthReport(node=node, boot_id=boot, seq=seq, source=source, gpus=gpus or [],
                        findings=findings, detected_at=datetime.now(UTC)).model_dump(mode="json")


def _lost_gpu(gpu: int = 0, uuid: str | None = None) -> Finding:
    return Finding(kind="xid", xid=79, gpu_index=gpu, uuid=uuid, message="forged")


async def _spoof(w, node: str, payload: dict, **kw) -> None:
    w.note("spoof", node, **{k: v for k, v in kw.items() if k != "cluster"}, cluster=kw.get("cluster", w.cluster))
    await send_report(w.client, payload, node=node, cluster=kw.get("cluster", w.cluster), task_queue=w.task_queue,
                      history_limit=kw.get("history_limit"))


async def _spoof_foreign(w, step, n):
    target = w.sched.ghost if int(step.at_s) % 2 else w.sched.foreign[0]
    await _spoof(w, target, _forged(target, "boot-x", 1, [_lost_gpu()]), what="foreign node")


async def _spoof_cluster(w, step, n):
    await _spoof(w, n.name, _forged(n.name, f"boot-{n.name}-{n.boot}", 10**6, [_lost_gpu()], source="manual"),
                 what="other cluster", cluster=f"other-{w.sched.seed}")


async def _spoof_id(w, step, n):
    wid = c.remediation_workflow_id(f"not-{n.name}", w.cluster)
    w.note("spoof", n.name, what=f"episode id {wid}", cluster=f"other-{w.sched.seed}")
    await w.client.start_workflow(
        NodeRemediation.run, RemediationInput(node=n.name, cluster=f"other-{w.sched.seed}", guard_task_queue=w.task_queue),
        id=wid, task_queue=w.task_queue, start_signal="report",
        start_signal_args=[_forged(n.name, f"boot-{n.name}-{n.boot}", 10**6, [_lost_gpu()], source="manual")])


async def _spoof_seq(w, step, n):
    await _spoof(w, n.name, _forged(n.name, f"boot-{n.name}-{n.boot}", 10**30, []), what="huge seq")


async def _spoof_boot(w, step, n):
    await _spoof(w, n.name, _forged(n.name, f"boot-{n.name}-{n.boot + 7}", 1, []), what="other boot id")


async def _spoof_hw(w, step, n):
    gpus = [GpuIds(index=i, uuid=f"GPU-forged-{i}", serial=f"SN-forged-{i}") for i in range(4)]
    await _spoof(w, n.name, _forged(n.name, f"boot-{n.name}-{n.boot}", 10**6, [_lost_gpu(1, "GPU-forged-1")],
                                    source="watcher", gpus=gpus), what="forged hardware ids")


async def _spoof_nested(w, step, n):
    deep: dict = {"kind": "xid"}
    for _ in range(150):
        deep = {"kind": deep}
    payload = {"node": n.name, "boot_id": f"boot-{n.name}-{n.boot}", "seq": 5, "findings": [deep]}
    await _spoof(w, n.name, payload, what="deep nesting")


async def _spoof_history(w, step, n):
    await _spoof(w, n.name, _forged(n.name, f"boot-{n.name}-{n.boot}", 10**6, [_lost_gpu()], source="manual"),
                 what="history_limit=1", history_limit=1)


async def _spoof_admission(w, step, n):
    w.note("spoof", n.name, what="admission with denylisted ids")
    await w.client.start_workflow(
        NodeAdmission.run, AdmissionInput(node=n.name, hardware_ids=[OLD_DENIED]), id=c.admission_workflow_id(n.name, w.cluster),
        task_queue=w.task_queue, id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE)


async def _watchers(w, n, findings: list[Finding]) -> None:
    """Two condition-watcher replicas see the same condition and each sends it (kubelet's boot id)."""
    w.watcher_seq += 1
    n.watched.extend(findings)
    for replica in (0, 1):
        report = HealthReport(node=n.name, boot_id=f"boot-{n.name}-{n.boot}", seq=10**15 + 2 * w.watcher_seq + replica,
                              source="watcher", findings=findings, detected_at=datetime.now(UTC))
        w.note("report", n.name, source="watcher", findings=[f.label() for f in findings])
        await send_report(w.client, report, node=n.name, cluster=w.cluster, task_queue=w.task_queue)


async def _condition(w, step, n):
    await _watchers(w, n, [Finding(kind="node_condition", message="node condition GpuDriverReady=False")])


async def _condition_clear(w, step, n):
    if w.episode_seen(n.name):
        await _watchers(w, n, [])


async def _late_grant(w, step, n):
    w.note("late_grant", n.name)
    holder = c.remediation_workflow_id(n.name, w.cluster)
    await _episode(w, n.name).signal(HOLDER_SIGNAL_GRANTED, LeaseGrant(holder=holder, granted_at=datetime.now(UTC)))


async def _dup_guard(w, step, n):
    if not w.guard_msgs:
        return
    req = w.guard_msgs[len(w.guard_msgs) // 2]
    w.note("dup_guard", str(req.payload.get("node", "")), signal=req.signal)
    h = w.client.get_workflow_handle(c.guard_workflow_id(req.cluster))
    await h.signal(req.signal, req.payload)


async def _fault_again(w, step, n):
    if n.fault and not n.replaced:
        await _fault(w, step, n)


async def _join(w, step, n):
    new = w.nodes[w.sched.joiner]
    if new.agent:
        return
    w.start_agent(new.name)
    w.note("join", new.name)
    from workers.reporting import start_admission

    await start_admission(w.client, node=new.name, hardware_ids=new.report().hardware_ids(), cluster=w.cluster,
                          task_queue=w.task_queue)


async def _probe(w, step, n):
    await w.observe("probe")


async def _gone(w, step, n):
    n.exists = False  # the node controller removed the terminated instance's Node
    w.note("node_gone", n.name)


_ACTIONS = {
    "fault": _fault, "resend": _resend, "agent_stop": _agent_stop, "agent_start": _agent_start,
    "reboot_lost": _reboot_lost, "kube_fail": _kube_fail, "cloud_fail": _cloud_fail, "slow": _slow,
    "pause": _pause, "resume": _resume, "approve": _approve, "skip": _skip,
    "cancel": _cancel, "force": _force, "spoof_foreign": _spoof_foreign, "spoof_cluster": _spoof_cluster,
    "spoof_id": _spoof_id, "spoof_seq": _spoof_seq, "spoof_boot": _spoof_boot, "spoof_hw": _spoof_hw,
    "spoof_nested": _spoof_nested, "spoof_history": _spoof_history, "spoof_admission": _spoof_admission,
    "condition": _condition, "condition_clear": _condition_clear, "late_grant": _late_grant, "dup_guard": _dup_guard,
    "fault_again": _fault_again, "join": _join, "probe": _probe, "gone": _gone, "resend_replaced": _resend_replaced,
}
