"""Red team, issue 22 second pass: the lease (defects 6 and 12) and approvals (15a) under the
schedules beside their tests: grants duplicated, late, or without a request id; a skip while the
lease is being waited for; an approval for a rung the episode moved away from."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest
from temporalio.client import WorkflowUpdateFailedError

from api.guard import LeaseGrant
from api.names import guard_workflow_id
from policies.loader import default_policy
from tests.workflows.fake_node import FakeNode
from tests.workflows.fakes import FakeFleet, xid
from tests.workflows.test_node_remediation import wait_for
from workflows.fleet_guard import FleetGuard
from workflows.node_remediation import NodeRemediation


def fleet_of(ts_env, uniq, policy) -> FakeFleet:
    fleet = FakeFleet(client=ts_env.client, task_queue=f"tq-{uniq}", policy=policy, cluster=f"c-{uniq}")
    fleet.check_drain_lease, fleet.fleet_size = True, 100
    return fleet


def one_lease_policy(approve: tuple[str, ...] = ()):
    policy = default_policy()
    policy.guard.max_disruptive, policy.guard.max_unhealthy = 1, 10  # room to cordon both, one lease
    policy.ladder.reset.return_timeout = policy.validation.soak = timedelta(seconds=1)
    for rung in approve:
        policy.ladder.for_rung(rung).requires_approval = True
    return policy


async def status(handle):
    return await handle.query(NodeRemediation.status)


async def waiting_for_lease(handle) -> bool:
    s = await status(handle)
    return s.lease_requested and not s.lease_held


async def test_grant_without_request_id_is_not_a_lease_while_the_guard_says_wait(ts_env, uniq):
    """A grant with an empty request id (a guard worker still on old code in a rolling deploy, or any
    sender able to signal) was taken whenever a request was out: a drain with no holder at the guard.
    Since grant-needs-request-id it is ignored; B drains only once A gives the lease back."""
    fleet = fleet_of(ts_env, uniq, one_lease_policy())
    a = fleet.add(FakeNode(f"holder-{uniq}", [xid(48)], cured_by="reset", hold=asyncio.Event()))
    b = fleet.add(FakeNode(f"waiter-{uniq}", [xid(48)], cured_by="reset"))
    async with fleet.workers():
        ha = await fleet.report(a.name)
        await wait_for(lambda: _true("kube.drain" in a.calls))
        hb = await fleet.report(b.name)
        await wait_for(lambda: waiting_for_lease(hb), timeout=20)
        await hb.signal("lease_granted", LeaseGrant(holder=hb.id, granted_at=datetime.now(UTC)))
        await eventually(lambda: "kube.drain" in b.calls)  # with A still holding the only lease
        a.hold.set()
        await ha.result(), await hb.result()
    assert fleet.drained_without_lease == [], "a drain ran with no holder at the guard"


async def _true(v: bool) -> bool:
    return v


async def eventually(predicate, timeout: float = 10.0) -> bool:
    """Whether `predicate()` holds within `timeout` s (the defect shows within it, a loaded machine or not)."""
    for _ in range(int(timeout / 0.1)):
        if predicate():
            return True
        await asyncio.sleep(0.1)
    return False


async def test_skip_while_waiting_for_a_lease_then_approval_holds_no_lease(ts_env, uniq):
    """B waits for the lease (A holds the only one); an operator skips B to reboot, which needs
    approval: B's outstanding request is given back for the wait, a late grant of it is ignored,
    an approval for the rung the operator saw before the skip is refused, and the reboot drains only
    under a new grant (held)."""
    fleet = fleet_of(ts_env, uniq, one_lease_policy(approve=("reboot",)))
    a = fleet.add(FakeNode(f"holder-{uniq}", [xid(48)], cured_by="reset", hold=asyncio.Event()))
    b = fleet.add(FakeNode(f"skip-{uniq}", [xid(48)], cured_by="reboot"))
    async with fleet.workers():
        ha = await fleet.report(a.name)
        await wait_for(lambda: _true("kube.drain" in a.calls))
        hb = await fleet.report(b.name)
        await wait_for(lambda: waiting_for_lease(hb), timeout=20)
        first = (await status(hb)).run_ids[0]
        await hb.execute_update(NodeRemediation.skip_to, "reboot")
        await wait_for(lambda: _awaiting(hb, "reboot"), timeout=20)
        guard = fleet.client.get_workflow_handle(guard_workflow_id(fleet.cluster))
        g = await guard.query(FleetGuard.status)
        assert all(h.node != b.name for h in g.holders) and hb.id not in g.waiters, g
        s = await status(hb)
        assert not s.lease_held and not s.lease_requested
        # The guard's grant of the request B gave back, late; and a duplicate of it.
        for _ in range(2):
            await hb.signal("lease_granted", LeaseGrant(holder=hb.id, granted_at=datetime.now(UTC),
                                                        request_id=f"{hb.id}/{first}/1"))
        assert not (await status(hb)).lease_held
        with pytest.raises(WorkflowUpdateFailedError):
            await hb.execute_update(NodeRemediation.approve, "reset")  # what the operator saw before the skip
        a.hold.set()
        await ha.result()
        await hb.execute_update(NodeRemediation.approve, "reboot")
        rb = await hb.result()
    assert rb.rungs == ["reboot"] and rb.outcome == "returned", (rb.outcome, rb.rungs)
    assert fleet.drained_without_lease == [], "every drain under a lease the guard knows of"
    assert "node.reset_gpu" not in b.calls


async def _awaiting(handle, rung: str) -> bool:
    return (await status(handle)).awaiting_approval == rung


async def test_pause_during_the_approval_wait_holds_the_drain(ts_env, uniq):
    fleet = fleet_of(ts_env, uniq, one_lease_policy(approve=("reset",)))
    n = fleet.add(FakeNode(f"pauseapp-{uniq}", [xid(48)], cured_by="reset"))
    async with fleet.workers():
        h = await fleet.report(n.name)
        await wait_for(lambda: _awaiting(h, "reset"), timeout=20)
        await h.execute_update(NodeRemediation.pause, "customer job finishing")
        await h.execute_update(NodeRemediation.approve, "reset")
        await eventually(lambda: "kube.drain" in n.calls)
        s = await status(h)
        drained_while_paused = s.paused and "kube.drain" in n.calls
        held_lease_while_paused = s.paused and s.lease_held
        await h.execute_update(NodeRemediation.resume)
        await h.result()
    assert not drained_while_paused and not held_lease_while_paused, \
        f"paused, yet drained={'kube.drain' in n.calls} lease_held={s.lease_held}"


async def test_pause_during_the_lease_wait_holds_the_drain(ts_env, uniq):
    fleet = fleet_of(ts_env, uniq, one_lease_policy())
    a = fleet.add(FakeNode(f"holder-{uniq}", [xid(48)], cured_by="reset", hold=asyncio.Event()))
    b = fleet.add(FakeNode(f"pauselease-{uniq}", [xid(48)], cured_by="reset"))
    async with fleet.workers():
        ha = await fleet.report(a.name)
        await wait_for(lambda: _true("kube.drain" in a.calls))
        hb = await fleet.report(b.name)
        await wait_for(lambda: waiting_for_lease(hb), timeout=20)
        await hb.execute_update(NodeRemediation.pause, "hands off")
        a.hold.set()
        await ha.result()
        await eventually(lambda: "kube.drain" in b.calls)
        s = await status(hb)
        drained_while_paused = s.paused and "kube.drain" in b.calls
        await hb.execute_update(NodeRemediation.resume)
        await hb.result()
    assert not drained_while_paused, "the paused node was drained when its lease came"
