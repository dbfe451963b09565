"""A guard slow to answer is waited for; only a stuck one is cordoned past (issue 25: the guard
storm's timed-out cordons took 1,631 nodes past max_unhealthy 1,000). On the dev server in real
time, with a scaled policy; the rule itself apart from the RPCs."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from temporalio import workflow
from temporalio.client import WorkflowExecutionStatus
from temporalio.service import RPCError
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from activities.guard import guard_liveness
from api.names import GUARD_WORKFLOW, guard_workflow_id
from tests.workflows.fake_node import FakeNode
from tests.workflows.fakes import xid
from tests.workflows.test_guard_never_wedged import fleet_of, guard_status, quick_policy
from tests.workflows.test_node_remediation import wait_for
from workflows.node_remediation import NodeRemediation

NOW = datetime(2026, 12, 7, tzinfo=UTC)
MINUTE = timedelta(minutes=1)


def test_a_guard_is_stuck_when_it_does_not_run_its_task_fails_or_no_worker_polls():
    running = WorkflowExecutionStatus.RUNNING
    assert guard_liveness(WorkflowExecutionStatus.TERMINATED, 0, "q", NOW, NOW, MINUTE).stuck
    assert "attempt 2" in guard_liveness(running, 2, "q", NOW, NOW, MINUTE).why
    assert guard_liveness(running, 1, "q", None, NOW, MINUTE).stuck, "no worker ever polled"
    assert guard_liveness(running, 1, "q", NOW - 2 * MINUTE, NOW, MINUTE).stuck, "its worker went away"
    assert not guard_liveness(running, 1, "q", NOW - MINUTE / 2, NOW, MINUTE).stuck
    assert not guard_liveness(running, 0, "q", NOW, NOW, MINUTE).stuck, "waiting on its own activity: slow"
    assert not guard_liveness(running, 1, "q", False, NOW, MINUTE).stuck, "a server that cannot list pollers"


async def test_a_slow_guard_is_waited_for_and_max_unhealthy_holds(dev_env, uniq):
    """Two faults with room for one, and a guard that answers after admission_timeout (it counts the
    fleet first, slowly): it runs and its worker polls, so both wait for its answer, and one is
    deferred. Before, both cordoned past max_unhealthy."""
    policy = quick_policy()
    policy.guard.max_unhealthy, policy.guard.admission_timeout = 1, timedelta(seconds=1)
    policy.guard.holder_check_interval = timedelta(hours=1)  # no reconcile with the taints meanwhile
    fleet = fleet_of(dev_env, uniq, policy)
    fleet.count_delay = 4.0
    hold = asyncio.Event()  # the admitted node's drain waits: it stays quarantined meanwhile
    nodes = [fleet.add(FakeNode(f"n{i}-{uniq}", [xid(48)], cured_by="reset", hold=hold)) for i in range(2)]
    async with fleet.workers():
        try:
            await _one_cordoned_one_deferred(fleet, nodes)
        finally:
            hold.set()  # else the held drain keeps the workers from shutting down


async def _one_cordoned_one_deferred(fleet, nodes):
    handles = [await fleet.report(n.name) for n in nodes]

    async def answered() -> bool:
        try:
            st = await guard_status(fleet)
        except RPCError:
            return False  # not started yet
        return len(st.unhealthy) == 1 and len(st.deferred) == 1

    await wait_for(answered, timeout=20)
    await asyncio.sleep(1.5)  # past another admission_timeout: nothing more is cordoned
    assert sum(n.cordoned for n in nodes) == 1, [n.name for n in nodes if n.cordoned]
    actions = [a for h in handles for a in (await h.query(NodeRemediation.status)).actions]
    assert any("the fleet guard is slow to answer" in a.summary for a in actions), actions
    assert not any("cordoning anyway" in (a.detail or "") for a in actions), actions
    for n in nodes:
        n.hold.set()
    results = await asyncio.wait_for(asyncio.gather(*(h.result() for h in handles)), 60)
    assert [r.outcome for r in results] == ["returned", "returned"], "the deferred one went next"


@workflow.defn(name=GUARD_WORKFLOW)
class DeafGuard:
    """A guard that runs and is polled, and never answers (a bug, a lost notice)."""

    @workflow.run
    async def run(self, _inp: dict) -> None:
        await workflow.wait_condition(lambda: False)


async def test_a_guard_that_runs_but_never_answers_is_taken_as_stuck_in_the_end(dev_env, uniq):
    """Slow is not forever: past SLOW_GUARD_PATIENCE admission_timeouts the cordon goes ahead, with
    the reason, and the guard is told first."""
    policy = quick_policy()
    policy.guard.admission_timeout = timedelta(milliseconds=200)
    fleet = fleet_of(dev_env, uniq, policy)
    node = fleet.add(FakeNode(f"deaf-{uniq}", [xid(48)], cured_by="reset"))
    deaf = f"deaf-guard-{uniq}"
    await dev_env.client.start_workflow(GUARD_WORKFLOW, {}, id=guard_workflow_id(fleet.cluster), task_queue=deaf)
    async with Worker(dev_env.client, task_queue=deaf, workflows=[DeafGuard],
                            workflow_runner=UnsandboxedWorkflowRunner()), fleet.workers():
        handle = await fleet.report(node.name)
        await wait_for(lambda: _async(node.cordoned), timeout=30)
        actions = (await handle.query(NodeRemediation.status)).actions
        await dev_env.client.get_workflow_handle(guard_workflow_id(fleet.cluster)).terminate()
    slow = [a for a in actions if "slow to answer" in a.summary]
    anyway = [a.detail for a in actions if "cordoning anyway" in (a.detail or "")]
    assert slow and anyway and "runs but has not answered in" in anyway[0], actions


async def _async(value: bool) -> bool:
    return value
