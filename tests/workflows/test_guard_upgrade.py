"""A guard run started before guard-never-wedged meets the new behaviour when the controller starts
(issue 22: 11): it answered no quarantine requests, so every cordon waited admission_timeout. A worker
with the old guard code starts the guard; the upgraded controller takes over; its start continues the
guard as new, and an episode's cordon is admitted at once. On the dev server, in real time."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer, UnsandboxedWorkflowRunner, Worker

from api.guard import GuardInput, GuardState
from api.names import guard_workflow_id
from tests.workflows.fake_node import FakeNode
from tests.workflows.fakes import xid
from tests.workflows.test_guard_never_wedged import fleet_of, quick_policy
from tests.workflows.test_node_remediation import wait_for
from workers.controller import tell_guard_the_policy
from workflows.fleet_guard import FleetGuard
from workflows.node_remediation import NodeRemediation


@workflow.defn(name="FleetGuard")
class FleetGuardBeforeNeverWedged(FleetGuard):
    """The guard as it ran before the guard-never-wedged patch (and the ones after it)."""

    @workflow.init
    def __init__(self, inp: GuardInput) -> None:
        self.inp, self.policy = inp, inp.policy
        self.s = inp.state or GuardState(fleet_size=inp.fleet_size)
        self._wake, self._regrant, self._answers, self._relearning = True, set(), [], None
        self._never_wedged = self._idle_recheck = self._paged = self._upgrade = False
        self._holder_check = None

    @workflow.run
    async def run(self, inp: GuardInput) -> None:
        await super().run(inp)


async def test_a_guard_from_before_never_wedged_answers_cordons_after_the_controller_starts(dev_env, uniq):
    policy = quick_policy()
    policy.guard.admission_timeout = timedelta(minutes=10)  # what an unanswered cordon would wait
    fleet = fleet_of(dev_env, uniq, policy)
    n = fleet.add(FakeNode(f"up-{uniq}", [xid(48)], cured_by="reset"))
    guard = dev_env.client.get_workflow_handle(guard_workflow_id(fleet.cluster))
    async with Worker(dev_env.client, task_queue=fleet.task_queue, workflows=[FleetGuardBeforeNeverWedged],
                      workflow_runner=UnsandboxedWorkflowRunner()):  # a test module: not re-imported per run
        await dev_env.client.start_workflow(FleetGuardBeforeNeverWedged.run, GuardInput(cluster=fleet.cluster,
                                            policy=policy.guard), id=guard_workflow_id(fleet.cluster),
                                            task_queue=fleet.task_queue)
        old_run = (await guard.describe()).run_id
        await wait_for(lambda: _answered(guard), timeout=10)
    async with fleet.workers():  # the upgraded controller
        before = await guard.query(FleetGuard.status)
        assert await tell_guard_the_policy(dev_env.client, fleet.cluster, policy.guard)
        handle = await fleet.report(n.name)

        async def cordoned() -> bool:
            return n.cordoned

        await wait_for(cordoned, timeout=20)
        st = await handle.query(NodeRemediation.status)
        assert not any("no answer from the fleet guard" in a.summary for a in st.actions), "admitted, not timed out"
        after = await guard.query(FleetGuard.status)
        result = await handle.result()
    # The old run's whole history (the upgrade and its continue-as-new included) replays on this code.
    old_history = await dev_env.client.get_workflow_handle(guard_workflow_id(fleet.cluster), run_id=old_run).fetch_history()
    await Replayer(workflows=[FleetGuard], data_converter=pydantic_data_converter).replay_workflow(old_history)
    assert before.behaviour, "the old run said it keeps the old behaviour"
    assert (await guard.describe()).run_id != old_run, "the guard continued as new"
    assert after.behaviour == ""
    assert result.outcome == "returned"


async def _answered(guard) -> bool:
    try:
        await guard.query(FleetGuard.status)
        return True
    except Exception:  # noqa: BLE001 - not yet
        return False
