"""The ladder takes no destructive step the facts do not justify, second pass (issue 22: 1, 2,
4, 5, 6, 12, 13, 14, 15a, 15b). Each test failed on the workflow before its fix."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from temporalio.client import WorkflowUpdateFailedError

from api.guard import LeaseGrant
from api.names import guard_workflow_id
from policies.findings import Finding
from policies.loader import default_policy
from tests.workflows.fake_node import FakeNode
from tests.workflows.fakes import DESTRUCTIVE, xid
from tests.workflows.test_do_no_harm import event, stage_is
from tests.workflows.test_node_remediation import make_fleet, run_with_status, wait_for
from workflows.fleet_guard import FleetGuard
from workflows.node_remediation import NodeRemediation


async def test_dry_run_writes_nothing_destructive(ts_env, uniq):
    """Xid 54 starts at replace: a dry run says so, and changes nothing (issue 22, defect 1)."""
    policy = default_policy()
    policy.dry_run = True
    fleet = make_fleet(ts_env, uniq, policy)
    n = fleet.add(FakeNode(f"dry-{uniq}", [xid(54)], cured_by="none"))
    result, status = await run_with_status(fleet, n)
    assert (result.outcome, result.rungs) == ("dry_run", ["replace"])
    assert fleet.denylist == {}, "a dry run writes no denylist entry"
    assert any(a.step == "denylist" and "would" in a.summary for a in status.actions)
    for kind, reqs in n.requests.items():
        if kind in DESTRUCTIVE:
            assert all(r.dry_run for r in reqs), f"{kind} sent without dry_run"


def approval_policy(*rungs: str):
    policy = default_policy()
    policy.ladder.reset.return_timeout = timedelta(seconds=1)  # polled in real time: the settle is not skipped
    for rung in rungs:
        policy.ladder.for_rung(rung).requires_approval = True
    return policy


async def awaiting(handle, rung: str) -> bool:
    return (await handle.query(NodeRemediation.status)).awaiting_approval == rung


async def test_approve_names_the_rung(ts_env, uniq):
    """An operator approves the rung they saw: another rung, or none named, approves nothing (15a)."""
    fleet = make_fleet(ts_env, uniq, approval_policy("reboot"))
    n = fleet.add(FakeNode(f"aprung-{uniq}", [xid(79)], cured_by="reboot"))
    async with fleet.workers():
        handle = await fleet.report(n.name)
        await wait_for(lambda: awaiting(handle, "reboot"))
        for wrong in ("replace", ""):
            with pytest.raises(WorkflowUpdateFailedError) as err:
                await handle.execute_update(NodeRemediation.approve, wrong)
            assert "awaits approval to reboot: nothing approved" in str(err.value.cause)
        assert await awaiting(handle, "reboot"), "still waiting for the person"
        await handle.execute_update(NodeRemediation.approve, "reboot")
        result = await handle.result()
    assert (result.outcome, result.rungs) == ("returned", ["reboot"])


async def test_no_lease_held_while_a_person_decides(ts_env, uniq):
    """Reset and reboot failed, replace waits a day for approval: the disruption lease goes back
    to the fleet meanwhile, and is taken again once approved (issue 22, defect 6)."""
    fleet = make_fleet(ts_env, uniq, approval_policy("replace"))
    n = fleet.add(FakeNode(f"aplease-{uniq}", [xid(48)], cured_by="none"))
    async with fleet.workers():
        handle = await fleet.report(n.name)
        await wait_for(lambda: awaiting(handle, "replace"))
        guard = fleet.client.get_workflow_handle(guard_workflow_id(fleet.cluster))
        assert (await guard.query(FleetGuard.status)).holders == [], "no lease held through the approval wait"
        status = await handle.query(NodeRemediation.status)
        assert not status.lease_held and not status.lease_requested
        await handle.execute_update(NodeRemediation.approve, "replace")
        result = await handle.result()
        status = await handle.query(NodeRemediation.status)
    assert (result.outcome, result.rungs) == ("replaced", ["reset", "reboot", "replace"])
    leases = [a.summary.split()[0] for a in status.actions if a.step == "lease"]
    assert leases == ["disruption", "gave", "disruption"], "given back for the wait, taken again to replace"


async def test_application_fault_without_agent_is_not_rebooted(ts_env, uniq):
    """Xid 13 (a user's bug) and no agent to kill the job: nothing on the node says the machine is
    bad, so no drain and no reboot; it is cordoned and left for a person, with why (defect 5)."""
    policy = default_policy()
    policy.validation.agent_timeout = timedelta(seconds=1)  # the test server waits for it in real time
    fleet = make_fleet(ts_env, uniq, policy)
    n = fleet.add(FakeNode(f"appgone-{uniq}", [xid(13)], cured_by="kill", agent=False))
    result, status = await run_with_status(fleet, n)
    assert (result.outcome, result.rungs) == ("quarantined", ["kill"])
    assert result.reason.startswith("agent_missing") and "application fault" in result.reason
    assert not {"kube.drain", "cloud.reboot", "node.reset_gpu", "cloud.replace"} & set(n.calls)
    assert n.cordoned, "cordoned for the person, no new work lands on it meanwhile"


def agent_policy():
    policy = default_policy()
    policy.validation.agent_timeout = timedelta(seconds=1)  # the test server waits for it in real time
    return policy


async def test_agent_silent_after_reboot_is_never_replaced(ts_env, uniq):
    """The agent sends one report from the new boot and dies: validation finds nobody. That says
    nothing about the hardware: quarantined for a person, not replaced or denylisted (defect 2)."""
    fleet = make_fleet(ts_env, uniq, agent_policy())
    n = fleet.add(FakeNode(f"once-{uniq}", [xid(79)], cured_by="reboot", after_reboot="once"))
    result, status = await run_with_status(fleet, n)
    assert (result.outcome, result.rungs) == ("quarantined", ["reboot"])
    assert result.reason.startswith("agent_missing") and "nothing is replaced" in result.reason
    assert "cloud.replace" not in n.calls and fleet.denylist == {}
    assert status.agent_missing


async def test_watcher_boot_id_does_not_end_the_reboot_wait(ts_env, uniq):
    """A condition watcher reports the kubelet's new boot id; the agent never comes up. The reboot
    wait goes on for the agent (no validation against nobody), then says what it saw (defect 2)."""
    fleet = make_fleet(ts_env, uniq, agent_policy())
    n = fleet.add(FakeNode(f"watch-{uniq}", [xid(79)], cured_by="reboot", after_reboot="watcher"))
    result, status = await run_with_status(fleet, n)
    assert (result.outcome, result.rungs) == ("quarantined", ["reboot"])
    assert result.reason.startswith("agent_missing") and "kubelet boot id kubelet-0 -> kubelet-1" in result.reason
    assert not [a for a in status.actions if a.step == "validate"], "no validation while no agent is up"
    assert "cloud.replace" not in n.calls and fleet.denylist == {}


async def test_kill_with_no_gpu_located_kills_nobody(ts_env, uniq):
    """A kernel-log Xid 13 whose bus id maps to no GPU: no kill on every GPU (other tenants' jobs),
    the node is cordoned and left for a person with the reason (defect 4)."""
    fleet = make_fleet(ts_env, uniq)
    lost = Finding(kind="xid", xid=13, pci="0000:99:00", message="Xid 13 at an unknown bus id")
    n = fleet.add(FakeNode(f"nogpu-{uniq}", [lost], cured_by="kill"))
    result, _ = await run_with_status(fleet, n)
    kills = n.requests.get("node.kill_gpu_processes", [])
    assert all(r.gpus or not r.all_gpus for r in kills) and not [r for r in kills if not r.gpus], \
        "no kill without an implicated GPU"
    assert result.outcome == "quarantined" and "names no GPU" in result.reason
    assert n.cordoned and "kube.drain" not in n.calls


async def test_kill_names_the_mig_instance(ts_env, uniq):
    """An NVML Xid 13 from MIG instance 2/0 of GPU 1: the kill names that instance (defect 4)."""
    fleet = make_fleet(ts_env, uniq)
    mig = Finding(kind="xid", xid=13, gpu_index=1, gpu_instance_id=2, compute_instance_id=0, message="NVML Xid event 13")
    n = fleet.add(FakeNode(f"mig-{uniq}", [mig], cured_by="kill"))
    result, _ = await run_with_status(fleet, n)
    assert (result.outcome, result.rungs) == ("returned", ["kill"])
    [req] = n.requests["node.kill_gpu_processes"]
    assert req.gpus == [1] and not req.all_gpus
    assert [(t.gpu_index, t.gpu_instance_id, t.compute_instance_id) for t in req.mig] == [(1, 2, 0)]


async def test_late_lease_grant_is_not_taken(ts_env, uniq):
    """A grant that arrives after the lease was given back (a re-grant of a re-sent request) is not
    a lease: a recurrence in probation asks the guard again and drains only as a holder (defect 12)."""
    policy = default_policy()
    policy.ladder.reset.return_timeout = policy.validation.soak = timedelta(seconds=1)  # polled in real time
    fleet = make_fleet(ts_env, uniq, policy)
    fleet.check_drain_lease = True
    n = fleet.add(FakeNode(f"late-{uniq}", [event(48, "boot/1")], cured_by="reset"))
    async with fleet.workers():
        handle = await fleet.report(n.name)
        await wait_for(lambda: stage_is(handle, "probation"), timeout=30)
        first = (await handle.query(NodeRemediation.status)).run_ids[0]
        await handle.signal("lease_granted", LeaseGrant(holder=handle.id, granted_at=datetime.now(UTC),
                                                        request_id=f"{first}/1"))
        assert not (await handle.query(NodeRemediation.status)).lease_held, "no lease without a request"
        n.findings, n.faulty = [event(48, "boot/2")], True  # the fault comes back
        await fleet.report(n.name)
        result = await handle.result()
    assert result.rungs == ["reset", "reboot"]
    assert fleet.drained_without_lease == [], "every drain under a lease the guard knows of"


async def test_a_recurrence_not_from_the_nodes_agent_replaces_nothing(ts_env, uniq):
    """Fixed by reboot, then in probation a report with an Xid from a `watcher` (anyone able to signal
    can claim that): the rung above reboot is replace, which needs the node's own probes. It is
    cordoned for a person instead (safety simulation, seed 117: it replaced and denylisted)."""
    policy = default_policy()
    policy.validation.soak = timedelta(seconds=1)
    fleet = make_fleet(ts_env, uniq, policy)
    n = fleet.add(FakeNode(f"watch-{uniq}", [event(79, "boot/1")], cured_by="reboot"))
    async with fleet.workers():
        handle = await fleet.report(n.name)
        await wait_for(lambda: stage_is(handle, "probation"), timeout=30)
        forged = n.report(healthy=False).model_copy(update={"source": "watcher", "seq": n.seq + 1,
                                                             "findings": [event(79, "boot/2")]})
        await fleet.send_raw(n.name, forged.model_dump(mode="json"))
        result = await handle.result()
    assert result.outcome == "quarantined" and "not its own agent" in result.reason, result
    assert result.rungs == ["reboot"] and "cloud.replace" not in n.calls and fleet.denylist == {}


async def test_an_application_fault_that_climbs_to_replace_denylists_no_board(ts_env, uniq):
    """Xid 13 (an application's fault) on GPU 2, and nothing cures the node: the ladder climbs to
    replace on failed validations, but an application fault names no faulty board, so nothing goes
    on the permanent denylist (safety simulation, seed 120: GPU 2's ids were denylisted)."""
    fleet = make_fleet(ts_env, uniq)
    n = fleet.add(FakeNode(f"appall-{uniq}", [xid(13)], cured_by="none"))
    result, status = await run_with_status(fleet, n)
    assert result.outcome == "replaced" and result.rungs[-1] == "replace", result
    assert fleet.denylist == {}
    assert any(a.step == "denylist" and "nothing denylisted" in a.detail for a in status.actions)


async def test_failed_replacement_denylists_nothing(ts_env, uniq):
    """The terminate did not take: the node stays quarantined for a person, and its hardware is not
    refused anywhere meanwhile (defect 13: the denylist was written first)."""
    fleet = make_fleet(ts_env, uniq)
    n = fleet.add(FakeNode(f"norepl-{uniq}", [xid(54)], cured_by="none", fail={"cloud.replace"}))
    result, _ = await run_with_status(fleet, n)
    assert result.outcome == "quarantined" and "replacement failed" in result.reason
    assert fleet.denylist == {}


async def test_a_reboot_the_cloud_refused_is_no_reason_to_replace(ts_env, uniq):
    """The reboot call failed after its retries (the cloud API, not the node): no rung was tried, so
    nothing is replaced or denylisted; the node stays quarantined for a person, with why (safety
    simulation, seeds 62 and 65: it climbed to replace). A failed reset still climbs to reboot."""
    fleet = make_fleet(ts_env, uniq)
    n = fleet.add(FakeNode(f"norb-{uniq}", [xid(79)], cured_by="reboot", fail={"cloud.reboot"}))
    result, status = await run_with_status(fleet, n)
    assert result.outcome == "quarantined" and "reboot could not be done" in result.reason, result.reason
    assert "cloud.replace" not in n.calls and fleet.denylist == {}
    v = fleet.add(FakeNode(f"noval-{uniq}", [xid(79)], cured_by="none", fail={"node.validate"}))
    result, _ = await run_with_status(fleet, v)  # the reboot went out; its validation could not run
    assert result.outcome == "quarantined" and "validation could not run" in result.reason, result.reason
    assert "cloud.replace" not in v.calls
    m = fleet.add(FakeNode(f"noreset-{uniq}", [xid(48)], cured_by="reboot", fail={"node.reset_gpu"}))
    result, _ = await run_with_status(fleet, m)
    assert result.outcome == "returned" and result.rungs == ["reset", "reboot"], result


async def test_replacement_under_a_lifecycle_hook_is_replaced(ts_env, uniq):
    fleet = make_fleet(ts_env, uniq)
    n = fleet.add(FakeNode(f"hook-{uniq}", [xid(54)], cured_by="none", lifecycle_hook=True))
    result, status = await run_with_status(fleet, n)
    assert result.outcome == "replaced" and set(fleet.denylist) == {f"GPU-{n.name}-2", f"SN-{n.name}-1"}
    assert any("Terminating:Wait" in a.detail for a in status.actions if a.step == "replace")


async def test_replaced_node_is_not_replaced_again(ts_env, uniq):
    """The terminated host's agent reports once more after the episode ended replaced: that report
    starts nothing destructive, and the ledger and denylist hold one replacement (defect 14)."""
    fleet = make_fleet(ts_env, uniq)
    n = fleet.add(FakeNode(f"twice-{uniq}", [xid(54)], cured_by="none"))
    async with fleet.workers():
        first = await (await fleet.report(n.name)).result()
        assert first.outcome == "replaced"
        calls = len(n.calls)
        second = await (await fleet.report(n.name)).result()  # the old host, 0.2 s after the terminate
    assert second.outcome == "rejected" and "was replaced" in second.reason
    assert not {"kube.quarantine", "kube.drain", "cloud.reboot", "cloud.replace", "node.reset_gpu"} & set(n.calls[calls:])
    assert len(fleet.records) == 1 and len(fleet.denylist) == 2


async def test_repeat_offenders_are_counted_per_board(ts_env, uniq):
    """Faults on GPUs 0, 2 and 4 of one node are three boards once each: no straight replace; a
    third fault on board SN-2 (GPUs 4 and 5) is a repeat offender (issue 22, 15b)."""
    fleet = make_fleet(ts_env, uniq)
    n = fleet.add(FakeNode(f"board-{uniq}", [xid(48, gpu=0)], cured_by="reset"))
    rungs = []
    async with fleet.workers():
        for gpu in (0, 2, 4, 4, 5):
            n.findings, n.faulty = [xid(48, gpu=gpu)], True
            rungs.append([r.value for r in (await (await fleet.report(n.name)).result()).rungs])
    assert rungs == [["reset"], ["reset"], ["reset"], ["reset"], ["replace"]]


async def test_a_gpu_named_only_by_a_manual_report_is_never_killed_or_reset(ts_env, uniq):
    """Anyone able to signal can send a report naming GPU 1 (safety soak, seed 1211): kill and reset
    target only GPUs the node's own agent named, so no tenant of GPU 1 is signalled and GPU 1 is
    not reset; the ladder climbs past the reset it could not do."""
    from policies.findings import HealthReport
    from workers.reporting import send_report

    fleet = make_fleet(ts_env, uniq)
    n = fleet.add(FakeNode(f"man-{uniq}", [xid(48, gpu=1)], cured_by="reboot"))
    async with fleet.workers():
        manual = HealthReport(node=n.name, boot_id=f"boot-{n.name}-{n.boot}", seq=1, source="manual",
                              gpus=n.ids(), findings=[xid(48, gpu=1)], detected_at=datetime.now(UTC))
        handle = await send_report(fleet.client, manual, node=n.name, cluster=fleet.cluster,
                                   task_queue=fleet.task_queue)
        result = await handle.result()
        status = await handle.query(NodeRemediation.status)
    kills = n.requests.get("node.kill_gpu_processes", [])
    assert all(not k.all_gpus and 1 not in k.gpus and not k.mig for k in kills), kills
    assert not n.requests.get("node.reset_gpu"), "GPU 1 was reset on a manual report's word"
    reset = [a for a in status.actions if a.step == "reset"]
    assert reset and not reset[0].ok and "not from" in reset[0].detail, status.actions
    assert "reboot" in [r.value for r in result.rungs], result
