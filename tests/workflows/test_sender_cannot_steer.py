"""A sender cannot choose parts of an episode, nor make later genuine reports count for nothing
(issue 22: 9, 15d): the node is the workflow id's, the cluster and history limit the controller's,
a spoofed sequence or boot id does not poison ordering, an undecodable report is recorded."""

from __future__ import annotations

import asyncio

from temporalio.api.common.v1 import Payload
from temporalio.common import RawValue

from api.episode import RemediationInput
from api.names import guard_workflow_id, remediation_workflow_id
from policies.loader import default_policy
from tests.workflows.fake_node import FakeNode
from tests.workflows.fakes import xid
from tests.workflows.test_node_remediation import make_fleet, wait_for
from tests.workflows.test_trust_boundaries import controller_policy
from workers.reporting import send_report
from workflows.node_remediation import NodeRemediation


async def _status(handle):
    return await handle.query(NodeRemediation.status)


async def _awaiting_reboot(fleet, n):
    """An episode for `n` that waits (a day) for approval to reboot: reports can be sent to it."""
    handle = await fleet.report(n.name)

    async def awaiting() -> bool:
        return (await _status(handle)).awaiting_approval == "reboot"

    await wait_for(awaiting, timeout=30)
    return handle


async def test_an_undecodable_report_is_recorded_as_rejected(ts_env, uniq):
    fleet = make_fleet(ts_env, uniq, controller_policy())
    n = fleet.add(FakeNode(f"undec-{uniq}", [xid(48)], cured_by="reboot"))
    async with fleet.workers():
        handle = await _awaiting_reboot(fleet, n)
        bad = RawValue(Payload(metadata={"encoding": b"json/plain"}, data=b"{not json at all"))
        await handle.signal("report", bad)

        async def recorded() -> bool:
            return (await _status(handle)).rejected_total >= 1

        await wait_for(recorded, timeout=10)
        st = await _status(handle)
        await handle.execute_update(NodeRemediation.cancel, args=["test over", "test"])
    assert "undecodable report" in st.rejected[-1].reason, st.rejected
    assert "not json" in st.rejected[-1].excerpt


async def test_a_start_naming_another_node_and_cluster_acts_on_its_own_id(ts_env, uniq):
    fleet = make_fleet(ts_env, uniq, controller_policy())
    b = fleet.add(FakeNode(f"b-{uniq}", [xid(48)], cured_by="reboot"))
    other = f"other-{uniq}"
    async with fleet.workers():
        handle = await ts_env.client.start_workflow(
            NodeRemediation.run, RemediationInput(node=b.name, cluster=other),
            id=remediation_workflow_id(f"not-{b.name}", fleet.cluster), task_queue=fleet.task_queue,
            start_signal="report", start_signal_args=[b.report().model_dump(mode="json")])

        async def rejected() -> bool:
            return (await _status(handle)).rejected_total >= 1

        await wait_for(rejected, timeout=10)
        st = await _status(handle)
        await handle.terminate("test over")
    assert st.node == f"not-{b.name}", "the node is the one the workflow id names"
    assert st.cluster == fleet.cluster, "the cluster is the controller's"
    assert f"report for node {b.name!r}" in st.rejected[-1].reason
    assert not b.calls, f"nothing done to {b.name} from another node's episode: {b.calls}"
    try:
        await ts_env.client.get_workflow_handle(guard_workflow_id(other)).describe()
        started_other_guard = True
    except Exception:  # noqa: BLE001 - not found: never started
        started_other_guard = False
    assert not started_other_guard, "no guard of another cluster was started"


async def test_a_spoofed_sequence_or_boot_does_not_make_genuine_reports_stale(ts_env, uniq):
    fleet = make_fleet(ts_env, uniq, controller_policy())
    n = fleet.add(FakeNode(f"seq-{uniq}", [xid(48)], cured_by="reboot"))
    async with fleet.workers():
        handle = await _awaiting_reboot(fleet, n)
        genuine = n.report()
        huge = genuine.model_copy(update={"seq": 10**30})
        await fleet.send_raw(n.name, huge.model_dump(mode="json"))
        other_boot = genuine.model_copy(update={"seq": 1, "boot_id": "spoofed-boot"})
        await fleet.send_raw(n.name, other_boot.model_dump(mode="json"))
        later = [n.report(healthy=False) for _ in range(2)]
        for r in later:
            await fleet.send_raw(n.name, r.model_dump(mode="json"))

        async def heard() -> bool:
            st = await _status(handle)
            return st.rejected_total >= 2 or (st.rejected_total >= 1 and st.boot_id == genuine.boot_id)

        await wait_for(heard, timeout=10)
        st = await _status(handle)
        await handle.execute_update(NodeRemediation.cancel, args=["test over", "test"])
    reasons = [r.reason for r in st.rejected]
    assert any("ahead of the clock" in r for r in reasons), reasons
    assert not any("stale" in r for r in reasons), f"genuine reports were rejected as stale: {reasons}"
    assert st.boot_id == genuine.boot_id, "the agent's boot is still the episode's"


async def test_a_senders_history_limit_is_ignored(ts_env, uniq):
    fleet = make_fleet(ts_env, uniq, controller_policy())
    n = fleet.add(FakeNode(f"hist-{uniq}", [xid(48)], cured_by="reset"))
    async with fleet.workers():
        handle = await send_report(ts_env.client, n.report(), node=n.name, cluster=fleet.cluster,
                                   task_queue=fleet.task_queue, history_limit=1)
        result = await handle.result()
        st = await _status(handle)
    assert result.outcome == "returned"
    assert len(st.run_ids) == 1, "no continue-as-new on a sender's say"
    assert "history_limit" in st.actions[0].detail, "the history says what the start input set and was ignored"


async def test_a_report_arriving_while_the_episode_closes_is_recorded(ts_env, uniq):
    fleet = make_fleet(ts_env, uniq, default_policy().scaled(0.001))  # waited on in real time
    n = fleet.add(FakeNode(f"late-{uniq}", [xid(48)], cured_by="reset"))
    fleet.record_hold = asyncio.Event()
    async with fleet.workers():
        handle = await fleet.report(n.name)
        await asyncio.wait_for(fleet.record_started.wait(), 30)  # ledger.record: the episode is closing
        n.faulty = True
        await fleet.send_raw(n.name, n.report().model_dump(mode="json"))  # the fault back, just then

        async def heard() -> bool:
            return any(a.step == "report" for a in (await _status(handle)).actions)

        try:
            await wait_for(heard, timeout=5)
        except AssertionError:
            pass  # asserted below, once the episode is closed
        finally:
            fleet.record_hold.set()
        result = await handle.result()
        st = await _status(handle)
    late = [a for a in st.actions if a.step == "report"]
    assert late, "the late report is in the actions (status, history)"
    assert result.late_reports == 1
    assert "after the episode ended" in late[0].summary and "xid 48" in late[0].detail


async def test_an_episode_started_by_a_rejected_report_ends_rejected_not_wedged(ts_env, uniq):
    """A start whose only report is malformed waits for a valid one, saying so, then ends `rejected`
    with why (before first-report-deadline it waited at triage, unseen, for ever)."""
    from temporalio.common import WorkflowIDConflictPolicy

    from api.episode import RemediationResult

    fleet = make_fleet(ts_env, uniq, controller_policy())
    n = fleet.add(FakeNode(f"badstart-{uniq}", [xid(48)], cured_by="reboot"))
    nested: dict = {}
    for _ in range(200):
        nested = {"x": nested}
    async with fleet.workers():
        handle = await ts_env.client.start_workflow(
            NodeRemediation.run, RemediationInput(node=n.name, cluster=fleet.cluster),
            id=remediation_workflow_id(n.name, fleet.cluster), task_queue=fleet.task_queue,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING, start_signal="report",
            start_signal_args=[{"node": n.name, "findings": nested}], result_type=RemediationResult)

        async def rejected_once() -> bool:
            return (await _status(handle)).rejected_total >= 1

        await wait_for(rejected_once, timeout=10)
        st = await _status(handle)
        assert st.waiting.startswith(f"a valid report from {n.name}"), st.waiting
        result = await handle.result()
    assert result.outcome == "rejected" and "no valid report" in result.reason, result
    assert n.calls == [], "nothing was done to the node"


async def test_the_ending_task_runs_no_local_activity(ts_env, uniq):
    """The guard's signals and the ledger record are local activities: run in the task that ends the
    run, a guard's answer arriving meanwhile fails that task (UNHANDLED_COMMAND), the retry runs them
    again, they draw another answer, and so on for ever (safety simulation, seed 35: 1,200 failed
    tasks). Since commit-before-close their markers are recorded in a task of their own."""
    from temporalio.api.enums.v1 import EventType

    fleet = make_fleet(ts_env, uniq, default_policy())
    n = fleet.add(FakeNode(f"close-{uniq}", [xid(48)], cured_by="reset"))
    async with fleet.workers():
        handle = await fleet.report(n.name)
        await handle.result()
        events = [e.event_type async for e in handle.fetch_history_events()]
    last_task = max(i for i, t in enumerate(events) if t == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED)
    assert events[-1] == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED
    assert EventType.EVENT_TYPE_MARKER_RECORDED not in events[last_task:], \
        [EventType.Name(t) for t in events[last_task:]]
