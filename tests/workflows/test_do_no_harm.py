"""The ladder takes no destructive step the facts do not justify (issue: do no harm).

Each test here fails on the workflow as it was before the `do-no-harm` patch."""

from __future__ import annotations

from datetime import timedelta

import pytest

from api.names import guard_workflow_id, remediation_workflow_id
from policies.findings import Finding
from policies.loader import default_policy
from tests.workflows.fake_node import FakeNode
from tests.workflows.fakes import xid
from tests.workflows.test_node_remediation import make_fleet, run_node, run_with_status, wait_for
from workflows.fleet_guard import FleetGuard
from workflows.node_remediation import NodeRemediation


def event(code: int, event_id: str, gpu: int = 2) -> Finding:
    """A one-shot kernel-log event as the agent sends it: with the id it gave the record."""
    return xid(code, gpu).model_copy(update={"event_id": event_id})


async def stage_is(handle, stage: str) -> bool:
    return (await handle.query(NodeRemediation.status)).stage == stage


def quick_kill_policy():
    policy = default_policy()
    policy.ladder.kill.return_timeout = timedelta(seconds=1)
    return policy


async def test_resent_event_in_probation_is_a_duplicate(ts_env, uniq):
    """The agent re-sends a held Xid 13 every few minutes: in probation that is the same event,
    never a recurrence, so a user's bug is not drained and reset."""
    fleet = make_fleet(ts_env, uniq, quick_kill_policy())
    n = fleet.add(FakeNode(f"resend-{uniq}", [event(13, "boot/1")], cured_by="kill"))
    async with fleet.workers():
        handle = await fleet.report(n.name)
        await wait_for(lambda: stage_is(handle, "probation"), timeout=30)
        await fleet.report(n.name, healthy=False)  # the agent's re-send: new seq, same event
        await fleet.report(n.name, healthy=False)
        result = await handle.result()
    assert (result.outcome, result.rungs) == ("returned", ["kill"])
    assert "kube.drain" not in n.calls and "node.reset_gpu" not in n.calls


async def test_new_event_in_probation_is_a_recurrence(ts_env, uniq):
    fleet = make_fleet(ts_env, uniq, quick_kill_policy())
    n = fleet.add(FakeNode(f"again-{uniq}", [event(13, "boot/1")], cured_by="kill"))
    async with fleet.workers():
        handle = await fleet.report(n.name)
        await wait_for(lambda: stage_is(handle, "probation"), timeout=30)
        n.findings = [event(13, "boot/2")]  # a new kernel-log record
        await fleet.report(n.name, healthy=False)
        result = await handle.result()
    assert result.rungs[:2] == ["kill", "reset"]


async def test_failed_cordon_takes_no_disruptive_step(ts_env, uniq):
    fleet = make_fleet(ts_env, uniq)
    n = fleet.add(FakeNode(f"nocordon-{uniq}", [xid(48)], cured_by="reset", fail={"kube.quarantine"}))
    async with fleet.workers():
        result = await run_node(fleet, n)
    assert result.outcome == "failed" and "did not take effect" in result.reason
    assert result.rungs == []
    assert not {"kube.drain", "node.reset_gpu", "cloud.reboot", "cloud.replace"} & set(n.calls)


async def test_failed_uncordon_is_not_returned(ts_env, uniq):
    fleet = make_fleet(ts_env, uniq)
    n = fleet.add(FakeNode(f"nouncordon-{uniq}", [xid(48)], cured_by="reset", fail={"kube.return_to_service"}))
    async with fleet.workers():
        result = await run_node(fleet, n)
        guard = await ts_env.client.get_workflow_handle(guard_workflow_id(fleet.cluster)).query(FleetGuard.status)
    assert result.outcome == "quarantined" and "uncordon failed" in result.reason
    assert guard.holders == [], "the lease is given back all the same"
    assert n.name in guard.unhealthy, "a node that takes no work is not healthy to the guard"


async def test_silent_agent_is_agent_missing_never_replaced(ts_env, uniq):
    """Nobody polls node/<cluster>/<node>: reboot through the cloud, then wait; the agent never returns,
    so the node stays quarantined with that reason: not terminated, nothing denylisted."""
    policy = default_policy()
    policy.validation.agent_timeout = timedelta(seconds=1)  # the test server waits for it in real time
    fleet = make_fleet(ts_env, uniq, policy)
    n = fleet.add(FakeNode(f"silent-{uniq}", [xid(48)], cured_by="none", agent=False))
    async with fleet.workers():
        result = await run_node(fleet, n)
        status = await fleet.client.get_workflow_handle(remediation_workflow_id(n.name, fleet.cluster)).query(NodeRemediation.status)
    assert result.outcome == "quarantined" and result.reason.startswith("agent_missing")
    assert "kubelet boot id kubelet-0 -> kubelet-1" in result.reason
    assert result.rungs == ["reset", "reboot"]
    assert "cloud.replace" not in n.calls and fleet.denylist == {}
    assert status.agent_missing


async def test_denylist_takes_only_implicated_hardware(ts_env, uniq):
    fleet = make_fleet(ts_env, uniq)
    n = fleet.add(FakeNode(f"deny-{uniq}", [xid(48, gpu=2)], cured_by="none"))
    async with fleet.workers():
        result = await run_node(fleet, n)
    assert result.outcome == "replaced"
    assert set(fleet.denylist) == {f"GPU-{n.name}-2", f"SN-{n.name}-1"}, "only the GPU the probe named"


async def test_report_from_a_person_denylists_nothing(ts_env, uniq):
    """An operator's report is no probe on the hardware: the node may be replaced, nothing denied."""
    fleet = make_fleet(ts_env, uniq)
    n = fleet.add(FakeNode(f"manual-{uniq}", [xid(48, gpu=2)], cured_by="none"))
    async with fleet.workers():
        from workers.reporting import send_report
        report = n.report().model_copy(update={"source": "manual"})
        handle = await send_report(fleet.client, report, node=n.name, cluster=fleet.cluster,
                                   task_queue=fleet.task_queue)
        result = await handle.result()
    assert result.outcome == "replaced" and fleet.denylist == {}


async def test_report_for_unknown_node_is_rejected(ts_env, uniq):
    fleet = make_fleet(ts_env, uniq)
    n = fleet.add(FakeNode(f"ghost-{uniq}", [xid(79)], exists=False))
    async with fleet.workers():
        result = await run_node(fleet, n)
    assert result.outcome == "rejected" and "does not exist" in result.reason
    assert n.calls == [], "no cordon, no pod marks, nothing"
    assert fleet.records == [] and fleet.denylist == {}
    guard = fleet.client.get_workflow_handle(guard_workflow_id(fleet.cluster))
    try:
        await guard.describe()
        started = True
    except Exception:  # noqa: BLE001 - RPCError not found: no guard was ever started
        started = False
    assert not started, "no lease was asked for"


async def test_failed_drain_stops_before_the_rung(ts_env, uniq):
    fleet = make_fleet(ts_env, uniq)
    n = fleet.add(FakeNode(f"nodrain-{uniq}", [xid(79)], cured_by="reboot", fail={"kube.drain"}))
    async with fleet.workers():
        result = await run_node(fleet, n)
    assert result.outcome == "quarantined" and result.reason.startswith("drain failed")
    assert "cloud.reboot" not in n.calls and n.cordoned


async def test_escalated_drain_is_said_in_the_history(ts_env, uniq):
    """A drain that timed out under `timeout_action: escalate` is a failed step naming the pods left,
    and the rung that went ahead over them says so."""
    fleet = make_fleet(ts_env, uniq)
    n = fleet.add(FakeNode(f"stuck-{uniq}", [xid(48)], cured_by="reset", pdb_stuck=True))
    result, status = await run_with_status(fleet, n)
    assert (result.outcome, result.rungs) == ("returned", ["reset"])
    drain = next(a for a in status.actions if a.step == "drain")
    assert not drain.ok and f"default/job-on-{n.name}" in drain.detail and "escalate" in drain.detail
    reset = next(a for a in status.actions if a.step == "reset")
    assert "went ahead over 1 pods the drain left" in reset.detail


def approval_policy():
    policy = default_policy()
    policy.ladder.reboot.requires_approval = True
    return policy


async def awaiting_approval(handle) -> bool:
    return (await handle.query(NodeRemediation.status)).awaiting_approval is not None


@pytest.mark.parametrize("steer", ["cancel", "skip_to"])
async def test_operator_steers_while_awaiting_approval(ts_env, uniq, steer):
    """A cancel or a skip ends the wait for approval at once (it used to wait out the 24 h)."""
    fleet = make_fleet(ts_env, uniq, approval_policy())
    n = fleet.add(FakeNode(f"ap{steer[:4]}-{uniq}", [xid(79)], cured_by="reboot"))
    async with fleet.workers():
        handle = await fleet.report(n.name)
        await wait_for(lambda: awaiting_approval(handle))
        if steer == "cancel":
            await handle.execute_update(NodeRemediation.cancel, "hands-on repair")
        else:
            await handle.execute_update(NodeRemediation.skip_to, "replace")
        result = await handle.result()
    if steer == "cancel":
        assert result.outcome == "quarantined" and "hands-on repair" in result.reason
    else:
        assert (result.outcome, result.rungs) == ("replaced", ["replace"])


async def test_long_pause_gives_the_lease_back(dev_env, uniq):
    """On the dev server in real time (the time-skipping server mishandles an update that lands
    while an activity runs and time is skipped: "invalid history builder state")."""
    import asyncio

    policy = default_policy().scaled(0.001)
    policy.pause_releases_lease_after = timedelta(seconds=1)
    fleet = make_fleet(dev_env, uniq, policy)
    n = fleet.add(FakeNode(f"longpause-{uniq}", [xid(48)], cured_by="reset", hold=asyncio.Event()))
    async with fleet.workers():
        handle = await fleet.report(n.name)
        await wait_for(lambda: _has(n, "kube.drain"))
        await handle.execute_update(NodeRemediation.pause, "vendor on site")
        n.hold.set()
        guard = fleet.client.get_workflow_handle(guard_workflow_id(fleet.cluster))

        async def released():
            return (await guard.query(FleetGuard.status)).holders == []

        await wait_for(released)
        assert not (await handle.query(NodeRemediation.status)).lease_held
        assert "node.reset_gpu" not in n.calls
        await handle.execute_update(NodeRemediation.resume)
        result = await handle.result()
        status = await handle.query(NodeRemediation.status)
    assert (result.outcome, result.rungs) == ("returned", ["reset"])
    leases = [a for a in status.actions if a.step == "lease"]
    assert [a.summary.split()[0] for a in leases] == ["disruption", "gave", "disruption"], "taken again on resume"


async def test_pods_are_attributed_by_gpu(ts_env, uniq):
    fleet = make_fleet(ts_env, uniq)
    n = fleet.add(FakeNode(f"podgpu-{uniq}", [xid(48, gpu=2)], cured_by="reset",
                           pod_gpus={"uid:a": [2], "uid:b": [5]}))
    async with fleet.workers():
        await run_node(fleet, n)
    req = n.requests["kube.attribute_pods"][0]
    assert req.gpus == [2] and req.pod_gpus == {"uid:a": [2], "uid:b": [5]}


async def _has(n: FakeNode, call: str) -> bool:
    return call in n.calls
