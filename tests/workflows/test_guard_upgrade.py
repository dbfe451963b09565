"""A controller's start continues the fleet guard as new (the `upgrade` update, issue 22: 11), so a
long-lived guard runs the code deployed since: its books and policy go with it, and cordons are
answered as before. On the dev server, in real time."""

from __future__ import annotations

from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from api.names import guard_workflow_id
from tests.workflows.fake_node import FakeNode
from tests.workflows.fakes import xid
from tests.workflows.test_guard_never_wedged import fleet_of, guard_status, quick_policy
from tests.workflows.test_node_remediation import wait_for
from workers.controller import tell_guard_the_policy
from workflows.fleet_guard import FleetGuard
from workflows.node_remediation import NodeRemediation


async def test_a_controllers_start_continues_the_guard_as_new_with_its_books(dev_env, uniq):
    policy = quick_policy()
    policy.guard.max_unhealthy = 5
    fleet = fleet_of(dev_env, uniq, policy)
    stuck = fleet.add(FakeNode(f"stuck-{uniq}", [xid(48)], cured_by="reset", fail={"kube.return_to_service"}))
    n = fleet.add(FakeNode(f"up-{uniq}", [xid(48)], cured_by="reset"))
    guard = dev_env.client.get_workflow_handle(guard_workflow_id(fleet.cluster))
    async with fleet.workers():
        assert (await (await fleet.report(stuck.name)).result()).outcome == "quarantined"
        old_run = (await guard.describe()).run_id
        assert await tell_guard_the_policy(dev_env.client, fleet.cluster, policy.guard)  # the controller's start

        async def continued() -> bool:
            return (await guard.describe()).run_id != old_run

        await wait_for(continued, timeout=15)
        st = await guard_status(fleet)
        assert stuck.name in st.unhealthy, "the books went with it"
        handle = await fleet.report(n.name)
        result = await handle.result()
        actions = (await handle.query(NodeRemediation.status)).actions
    assert result.outcome == "returned"
    assert not any("no answer from the fleet guard" in a.summary for a in actions), "admitted, not timed out"
    # The old run's whole history (the update and its continue-as-new included) replays on this code.
    old_history = await dev_env.client.get_workflow_handle(guard_workflow_id(fleet.cluster), run_id=old_run).fetch_history()
    await Replayer(workflows=[FleetGuard], data_converter=pydantic_data_converter).replay_workflow(old_history)
