"""A waiting episode's history stays small: while the fleet is paused, it re-sends its lease
request on a doubling interval (capped at RESEND_BACKOFF_CAP x holder_check_interval), so an hour of
pause adds a bounded number of events, not one re-send per interval."""

import asyncio
from datetime import timedelta

from policies.loader import default_policy
from tests.workflows.fake_node import FakeNode
from tests.workflows.fakes import FakeFleet, xid
from workflows.fleet_guard import FleetGuard
from workflows.lease import RESEND_BACKOFF_CAP
from workflows.node_remediation import NodeRemediation


async def _events(handle) -> int:
    return len((await handle.fetch_history()).events)


async def test_a_paused_fleets_waiter_grows_its_history_by_a_bounded_number_per_hour(ts_env, uniq):
    policy = default_policy()
    policy.validation.soak = timedelta(seconds=30)
    fleet = FakeFleet(client=ts_env.client, task_queue=f"tq-{uniq}", policy=policy, cluster=f"c-{uniq}")
    first = fleet.add(FakeNode(f"first-{uniq}", [xid(48)], cured_by="reset"))
    waiter = fleet.add(FakeNode(f"waiter-{uniq}", [xid(48)], cured_by="reset"))
    async with fleet.workers():
        done = await (await fleet.report(first.name)).result()  # starts the guard
        assert done.outcome == "returned"
        guard = ts_env.client.get_workflow_handle(f"fleet-guard/{fleet.cluster}")
        await guard.execute_update(FleetGuard.pause, "driver rollout")
        handle = await fleet.report(waiter.name)
        for _ in range(100):
            if (await handle.query(NodeRemediation.status)).lease_requested:
                break
            await asyncio.sleep(0.05)
        interval = policy.guard.holder_check_interval
        await ts_env.sleep(interval * RESEND_BACKOFF_CAP)  # past the ramp to the capped interval
        start = await _events(handle)
        await ts_env.sleep(timedelta(hours=6))
        grown = await _events(handle) - start
        status = await handle.query(NodeRemediation.status)
        assert status.lease_requested and not status.lease_held, "still waiting: the fleet is paused"
        # At the cap (40 min) that is 9 re-sends in 6 h, each a timer, a guard signal and a workflow
        # task (about 7 events); one per holder_check_interval would be 72 re-sends (about 500 events).
        assert grown <= 9 * 8, f"{grown} events in 6 h of pause"
        await guard.execute_update(FleetGuard.resume)
        await ts_env.sleep(timedelta(minutes=1))
        status = await handle.query(NodeRemediation.status)
        assert status.lease_held or status.rungs_tried, "resumed: the waiter gets its lease"
        took = [a for a in status.actions if a.step == "lease" and a.ok]
        assert took and took[-1].detail.startswith("after waiting 6h"), "the wait is in the runbook"
