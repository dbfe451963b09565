"""NodeRemediation on the time-skipping server: each ladder path, bad input, the budget, continue-as-new
(the operator's updates: test_operator_steering.py)."""

from __future__ import annotations

import asyncio
import contextlib

from temporalio.api.enums.v1 import EventType

from api.episode import RemediationResult
from api.names import guard_workflow_id
from policies.findings import Finding
from policies.loader import default_policy
from tests.workflows.fake_node import FakeNode
from tests.workflows.fakes import FakeFleet, xid
from workflows.fleet_guard import FleetGuard
from workflows.node_remediation import NodeRemediation


def make_fleet(ts_env, uniq, policy=None) -> FakeFleet:
    return FakeFleet(client=ts_env.client, task_queue=f"tq-{uniq}", policy=policy or default_policy(),
                     cluster=f"c-{uniq}")


async def run_node(fleet: FakeFleet, node: FakeNode) -> RemediationResult:
    handle = await fleet.report(node.name)
    return await handle.result()


@contextlib.asynccontextmanager
async def held_after_drain(fleet: FakeFleet, node: FakeNode):
    """Workers up and one report: the episode's handle once it drained, its rung held on `node.hold`."""
    n = fleet.add(node)
    async with fleet.workers():
        handle = await fleet.report(n.name)
        await wait_for(lambda: _async(lambda: "kube.drain" in n.calls))
        yield handle, n


async def run_with_status(fleet: FakeFleet, node: FakeNode):
    """Workers up, one report: the episode's result and its final status."""
    async with fleet.workers():
        handle = await fleet.report(node.name)
        return await handle.result(), await handle.query(NodeRemediation.status)


async def no_task_failures(handle) -> None:
    events = [e async for e in handle.fetch_history_events()]
    failed = [e for e in events if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED]
    assert not failed, failed


async def wait_for(predicate, timeout: float = 10.0) -> None:
    """Polls until `predicate()` holds. The floor of 60 s is for a loaded CI machine, where a dev
    server's task can take seconds: a condition that holds returns at once, only a failure waits."""
    loop = asyncio.get_running_loop()
    end = loop.time() + max(timeout, 60.0)
    while loop.time() < end:
        if await predicate():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"condition not reached in {max(timeout, 60.0):.0f} s: {getattr(predicate, '__name__', predicate)}")


async def test_application_fault_kills_only(ts_env, uniq):
    fleet = make_fleet(ts_env, uniq)
    n = fleet.add(FakeNode(f"app-{uniq}", [xid(13)], cured_by="kill"))
    async with fleet.workers():
        result = await run_node(fleet, n)
    assert result.outcome == "returned"
    assert result.attribution == "application"
    assert result.rungs == ["kill"]
    assert "kube.quarantine" not in n.calls and "kube.drain" not in n.calls
    assert result.validations == 1


async def test_cured_by_reset(ts_env, uniq):
    fleet = make_fleet(ts_env, uniq)
    n = fleet.add(FakeNode(f"reset-{uniq}", [xid(48)], cured_by="reset"))
    async with fleet.workers():
        result = await run_node(fleet, n)
    assert (result.outcome, result.rungs, result.fault_class) == ("returned", ["reset"], "memory")
    assert result.validations == 2
    assert n.calls.index("kube.quarantine") < n.calls.index("kube.drain") < n.calls.index("node.reset_gpu")
    assert n.calls.index("node.reset_gpu") < n.calls.index("kube.return_to_service")
    assert not n.cordoned
    assert result.detect_to_cordon_ms is not None and result.detect_to_cordon_ms >= 0


async def test_cured_by_reboot(ts_env, uniq):
    fleet = make_fleet(ts_env, uniq)
    n = fleet.add(FakeNode(f"reboot-{uniq}", [xid(79)], cured_by="reboot"))
    result, status = await run_with_status(fleet, n)
    assert (result.outcome, result.rungs, result.fault_class) == ("returned", ["reboot"], "gpu_lost")
    assert status.boot_id == f"boot-{n.name}-1"
    assert [r.outcome for r in fleet.records] == ["returned"]


async def test_nothing_cures_replaces_and_denylists(ts_env, uniq):
    fleet = make_fleet(ts_env, uniq)
    n = fleet.add(FakeNode(f"dead-{uniq}", [xid(48)], cured_by="none"))
    async with fleet.workers():
        result = await run_node(fleet, n)
    assert result.outcome == "replaced"
    assert result.rungs == ["reset", "reboot", "replace"]
    assert {f"GPU-{n.name}-2", f"SN-{n.name}-1"} <= set(fleet.denylist)


async def test_node_never_returns_after_reboot_climbs(ts_env, uniq):
    fleet = make_fleet(ts_env, uniq)
    n = fleet.add(FakeNode(f"gone-{uniq}", [xid(79)], cured_by="reboot", reboot_returns=False))
    result, status = await run_with_status(fleet, n)
    assert result.rungs == ["reboot", "replace"]
    assert result.outcome == "replaced"
    assert any("no report from a new boot" in a.detail for a in status.actions)


async def test_recurrence_in_probation_escalates(ts_env, uniq):
    fleet = make_fleet(ts_env, uniq)
    n = fleet.add(FakeNode(f"recur-{uniq}", [xid(48)], cured_by="reset", recurs=1))
    async with fleet.workers():
        result = await run_node(fleet, n)
    # Fixed by reset, came back in probation: the next try starts one rung above reset.
    assert result.rungs == ["reset", "reboot"]
    assert result.outcome == "returned"
    assert result.validations == 4


async def test_bad_foreign_stale_and_duplicate_reports_are_rejected(ts_env, uniq):
    policy = default_policy()
    policy.ladder.reboot.requires_approval = True  # park the episode so reports arrive mid-flight
    fleet = make_fleet(ts_env, uniq, policy)
    n = fleet.add(FakeNode(f"bad-{uniq}", [xid(79)], cured_by="reboot"))
    async with fleet.workers():
        handle = await fleet.report(n.name)
        first = n.report()
        good = first.model_dump(mode="json")
        await fleet.send_raw(n.name, good)  # duplicate of a new seq: accepted once
        await fleet.send_raw(n.name, good)  # exact duplicate: deduplicated, not an error
        await fleet.send_raw(n.name, "not a report")
        await fleet.send_raw(n.name, {"node": n.name})
        await fleet.send_raw(n.name, {**good, "seq": "many"})
        await fleet.send_raw(n.name, {**good, "findings": [{"kind": "cosmic_ray"}]})
        await fleet.send_raw(n.name, {**good, "findings": [{"kind": "xid", "xid": 79}] * 600})
        await fleet.send_raw(n.name, {**good, "node": "someone-else"})
        await fleet.send_raw(n.name, {**good, "seq": 0, "findings": []})
        await fleet.send_raw(n.name, None)

        async def all_in():
            return (await handle.query(NodeRemediation.status)).rejected_total >= 8

        async def parked():
            return (await handle.query(NodeRemediation.status)).awaiting_approval == "reboot"

        await wait_for(all_in)
        await wait_for(parked)
        status = await handle.query(NodeRemediation.status)
        await handle.execute_update(NodeRemediation.approve, "reboot")
        await handle.result()
        await no_task_failures(handle)
    reasons = [r.reason for r in status.rejected]
    assert status.duplicates == 1
    assert any("malformed report: (report)" in r for r in reasons)
    assert any("findings.0.kind" in r for r in reasons)
    assert any("findings" in r and "600" in r or "at most 512" in r for r in reasons)
    assert any("someone-else" in r for r in reasons)
    assert any("stale sequence 0" in r for r in reasons)
    assert any(r.startswith("malformed report: seq:") for r in reasons), "the non-integer seq"


async def test_stale_boot_report_cannot_restart_remediation(ts_env, uniq):
    fleet = make_fleet(ts_env, uniq)
    n = fleet.add(FakeNode(f"stale-{uniq}", [xid(79)], cured_by="reboot", recurs=0))
    async with fleet.workers():
        handle = await fleet.report(n.name)
        old_boot = n.report(healthy=False)  # taken before the reboot
        await fleet.send_raw(n.name, old_boot.model_dump(mode="json"))

        async def rebooted():
            return (await handle.query(NodeRemediation.status)).boot_id == f"boot-{n.name}-1"

        await wait_for(rebooted)
        await fleet.send_raw(n.name, old_boot.model_copy(update={"seq": 99}).model_dump(mode="json"))
        result = await handle.result()
        status = await handle.query(NodeRemediation.status)
    assert (result.outcome, result.rungs) == ("returned", ["reboot"])
    assert any("earlier boot" in r.reason for r in status.rejected)


async def test_budget_of_two_never_exceeded_by_five_nodes(dev_env, uniq):
    # Real time with a scaled policy, on the dev server: the time-skipping server's global clock
    # jumps past concurrent workflows' task timeouts, and its history builder fails under several
    # episodes re-sending lease requests on timers.
    ts_env = dev_env
    policy = default_policy().scaled(0.001)
    policy.guard.max_disruptive = 2
    fleet = make_fleet(ts_env, uniq, policy)
    fleet.act_delay = 0.3
    fleet.fleet_size = 40  # 5 faulty of 40: below max_unhealthy, so only the lease budget holds them
    nodes = [fleet.add(FakeNode(f"b{i}-{uniq}", [xid(48)], cured_by="reset")) for i in range(5)]
    with ts_env.auto_time_skipping_disabled():
        async with fleet.workers():
            handles = [await fleet.report(n.name) for n in nodes]
            results = await asyncio.gather(*(h.result() for h in handles))
            guard = await ts_env.client.get_workflow_handle(guard_workflow_id(fleet.cluster)).query(FleetGuard.status)
    assert all(r.outcome == "returned" for r in results)
    assert fleet.max_disruptive == 2, "leases overlapped up to the budget, never beyond"
    assert guard.max_seen_holders == 2
    assert guard.holders == [] and guard.waiters == []


async def test_continue_as_new_keeps_state(ts_env, uniq):
    fleet = make_fleet(ts_env, uniq)
    fleet.history_limit = 40
    n = fleet.add(FakeNode(f"can-{uniq}", [xid(48)], cured_by="none"))
    async with fleet.workers():
        handle = await fleet.report(n.name)
        await fleet.send_raw(n.name, "garbage before continue-as-new")
        result = await handle.result()
        status = await handle.query(NodeRemediation.status)
    assert len(result.run_ids) >= 2, "the episode continued as new at least once"
    assert result.rungs == ["reset", "reboot", "replace"]
    assert result.outcome == "replaced"
    assert status.rejected_total == 1 and status.rejected[0].reason.startswith("malformed report")


async def test_unknown_xid_fails_closed(ts_env, uniq):
    fleet = make_fleet(ts_env, uniq)
    n = fleet.add(FakeNode(f"unk-{uniq}", [Finding(kind="xid", xid=4242, gpu_index=0)], cured_by="reset"))
    async with fleet.workers():
        result = await run_node(fleet, n)
    assert (result.fault_class, result.rungs, result.outcome) == ("unknown_xid", ["reset"], "returned")


async def test_transient_activity_errors_are_retried(ts_env, uniq):
    fleet = make_fleet(ts_env, uniq)
    fleet.transient_failures = {"kube.quarantine": 2, "node.validate": 1}
    n = fleet.add(FakeNode(f"flaky-{uniq}", [xid(48)], cured_by="reset"))
    async with fleet.workers():
        result = await run_node(fleet, n)
    assert (result.outcome, result.rungs) == ("returned", ["reset"])
    assert n.calls.count("kube.quarantine") == 3


async def _async(fn):
    return fn()
