"""An operator steering an episode on the time-skipping server: approval, pause and resume, skip,
cancel."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from temporalio.client import WorkflowUpdateFailedError
from temporalio.service import RPCError

from policies.loader import default_policy
from tests.workflows.fake_node import FakeNode
from tests.workflows.fakes import xid
from tests.workflows.test_node_remediation import held_after_drain, make_fleet, run_node, wait_for
from workflows.node_remediation import NodeRemediation


async def test_approval_gate_times_out_to_awaiting_approval(ts_env, uniq):
    policy = default_policy()
    policy.ladder.reboot.requires_approval = True
    policy.ladder.reboot.approval_timeout = timedelta(hours=2)
    fleet = make_fleet(ts_env, uniq, policy)
    n = fleet.add(FakeNode(f"appr-{uniq}", [xid(79)], cured_by="reboot"))
    async with fleet.workers():
        result = await run_node(fleet, n)
    assert result.outcome == "awaiting_approval"
    assert result.rungs == []
    assert n.cordoned, "a node awaiting approval stays quarantined"


async def test_approval_granted_proceeds(ts_env, uniq):
    policy = default_policy()
    policy.ladder.reboot.requires_approval = True
    fleet = make_fleet(ts_env, uniq, policy)
    n = fleet.add(FakeNode(f"apok-{uniq}", [xid(79)], cured_by="reboot"))
    async with fleet.workers():
        handle = await fleet.report(n.name)
        with pytest.raises(WorkflowUpdateFailedError):
            await handle.execute_update(NodeRemediation.resume)

        async def awaiting():
            return (await handle.query(NodeRemediation.status)).awaiting_approval == "reboot"

        await wait_for(awaiting)
        await handle.execute_update(NodeRemediation.approve, "reboot")
        result = await handle.result()
    assert (result.outcome, result.rungs) == ("returned", ["reboot"])


async def test_pause_holds_actions_until_resume(ts_env, uniq):
    fleet = make_fleet(ts_env, uniq)
    async with held_after_drain(fleet, FakeNode(f"pause-{uniq}", [xid(48)], cured_by="reset",
                                                hold=asyncio.Event())) as (handle, n):
        status = await handle.execute_update(NodeRemediation.pause, "maintenance window")
        assert status.paused
        n.hold.set()
        await asyncio.sleep(1.0)
        assert "node.reset_gpu" not in n.calls, "no action while paused"
        with pytest.raises(WorkflowUpdateFailedError):
            await handle.execute_update(NodeRemediation.approve)
        await handle.execute_update(NodeRemediation.resume)
        result = await handle.result()
    assert (result.outcome, result.rungs) == ("returned", ["reset"])


async def test_skip_to_replace(ts_env, uniq):
    fleet = make_fleet(ts_env, uniq)
    async with held_after_drain(fleet, FakeNode(f"skip-{uniq}", [xid(79)], cured_by="reboot",
                                                hold=asyncio.Event())) as (handle, n):
        with pytest.raises(WorkflowUpdateFailedError) as rejected:
            await handle.execute_update(NodeRemediation.skip_to, "explode")
        assert "unknown rung 'explode'" in str(rejected.value.cause)
        await handle.execute_update(NodeRemediation.skip_to, "replace")
        n.hold.set()
        result = await handle.result()
    assert (result.outcome, result.rungs) == ("replaced", ["replace"])
    assert "cloud.reboot" not in n.calls


async def test_cancel_leaves_node_quarantined(ts_env, uniq):
    fleet = make_fleet(ts_env, uniq)
    async with held_after_drain(fleet, FakeNode(f"cancel-{uniq}", [xid(79)], cured_by="reboot",
                                                hold=asyncio.Event())) as (handle, n):
        await handle.execute_update(NodeRemediation.cancel, "hands-on repair")
        n.hold.set()
        result = await handle.result()
        with pytest.raises((WorkflowUpdateFailedError, RPCError)):
            await handle.execute_update(NodeRemediation.cancel, "again")
    assert result.outcome == "quarantined" and "hands-on repair" in result.reason
    assert n.cordoned and "cloud.reboot" not in n.calls
