""""Quarantined for a person" holds (issue 22: 8): the agent's re-send after a `quarantined` ending
starts no second drain and no second ledger record; only an operator's `lift` (recorded with who)
or the taint's removal ends the hold."""

from __future__ import annotations

from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from tests.workflows.fake_node import FakeNode
from tests.workflows.fakes import xid
from tests.workflows.test_node_remediation import make_fleet, wait_for
from workflows.node_remediation import NodeRemediation


async def wait_until_held(handle) -> None:
    async def held() -> bool:
        return bool((await handle.query(NodeRemediation.status)).held)

    await wait_for(held, timeout=20)


async def test_a_resend_after_a_quarantined_ending_is_held_until_an_operator_lifts_it(ts_env, uniq):
    fleet = make_fleet(ts_env, uniq)
    n = fleet.add(FakeNode(f"held-{uniq}", [xid(48)], cured_by="reset", fail={"kube.drain"}))
    async with fleet.workers():
        first = await (await fleet.report(n.name)).result()
        assert first.outcome == "quarantined", first.reason
        assert n.cordoned and len(fleet.records) == 1
        handle = await fleet.report(n.name)  # the agent re-sends: the fault is still there

        async def held() -> bool:
            st = await handle.query(NodeRemediation.status)
            return bool(getattr(st, "held", "")) or st.stage == "done"

        await wait_for(held, timeout=20)
        st = await handle.query(NodeRemediation.status)
        assert n.calls.count("kube.drain") == 1, f"no second drain ({st.outcome}: {st.outcome_reason})"
        assert len(fleet.records) == 1, "no second ledger record toward repeat-offender replacement"
        assert st.held and "gpuheal lift" in st.waiting, (st.stage, st.outcome_reason)
        await fleet.report(n.name)  # and again
        await handle.execute_update(NodeRemediation.lift, args=["board reseated", "alice"])
        result = await handle.result()
        st = await handle.query(NodeRemediation.status)
        history = await handle.fetch_history()
    # The held episode's history (hold, re-sent reports, lift) replays on this code.
    await Replayer(workflows=[NodeRemediation], data_converter=pydantic_data_converter).replay_workflow(history)
    assert result.outcome == "healthy" and "lifted by alice" in result.reason
    assert any(a.step == "operator" and "lift by alice" in a.summary for a in st.actions)
    assert not n.cordoned, "the lift uncordons"
    assert len(fleet.records) == 1, "no second ledger record toward repeat-offender replacement"
    assert n.calls.count("kube.drain") == 1


async def test_a_node_the_api_cannot_check_is_held_not_drained(ts_env, uniq):
    """Whether an earlier episode left the node quarantined is unknown when kube.check_node cannot
    answer (safety soak, seeds 1460, 1562: a new episode drained and rebooted such a node): it is
    held for a person with the reason, and nothing disruptive runs until a lift."""
    fleet = make_fleet(ts_env, uniq)
    n = fleet.add(FakeNode(f"unchecked-{uniq}", [xid(48)], cured_by="reset", fail={"kube.check_node"}))
    async with fleet.workers():
        handle = await fleet.report(n.name)

        await wait_until_held(handle)
        st = await handle.query(NodeRemediation.status)
        assert "could not ask the API server" in st.held and "gpuheal lift" in st.held, st.held
        assert not any(x in n.calls for x in ("kube.drain", "node.kill_gpu_processes", "node.reset_gpu", "cloud.reboot"))
        await handle.execute_update(NodeRemediation.lift, args=["checked by hand", "alice"])
        await handle.result()


async def test_a_node_held_unchecked_is_asked_again_and_its_old_report_left_for_a_person(ts_env, uniq):
    """A one-shot fault is not re-sent for ever: while the API server cannot answer, the held episode
    asks again on a timer (5 min, doubling, at most 1 h). When it answers and no newer report came,
    the report is old news (the node may have been rebooted or mended meanwhile): the node is
    cordoned for a person, nothing disruptive is done (red-team review of hold-when-unchecked)."""
    fleet = make_fleet(ts_env, uniq)
    n = fleet.add(FakeNode(f"recheck-{uniq}", [xid(48)], cured_by="reset", fail={"kube.check_node"}))
    async with fleet.workers():
        handle = await fleet.report(n.name)

        await wait_until_held(handle)
        assert "asked again in 0:05:00" in (await handle.query(NodeRemediation.status)).held
        checks = n.calls.count("kube.check_node")
        n.fail.discard("kube.check_node")  # the API server is back; nobody re-sends the fault
        result = await handle.result()  # the time-skipping server runs the re-check timer
    assert n.calls.count("kube.check_node") == checks + 1, "asked again once, by the timer"
    assert result.outcome == "quarantined" and "no newer report came" in result.reason, result.reason
    assert n.cordoned, "cordoned for a person"
    assert not any(x in n.calls for x in ("kube.drain", "node.kill_gpu_processes", "node.reset_gpu", "cloud.reboot"))


async def test_a_node_held_unchecked_is_remediated_on_a_new_report_once_the_api_answers(ts_env, uniq):
    fleet = make_fleet(ts_env, uniq)
    n = fleet.add(FakeNode(f"renew-{uniq}", [xid(48)], cured_by="reset", fail={"kube.check_node"}))
    async with fleet.workers():
        handle = await fleet.report(n.name)

        await wait_until_held(handle)
        n.fail.discard("kube.check_node")
        await fleet.report(n.name)  # the agent's re-send: fresh evidence
        result = await handle.result()
    assert result.outcome == "returned", result.reason
    assert [r.value for r in result.rungs] == ["reset"]


def test_the_recheck_doubles_up_to_an_hour():
    from datetime import timedelta

    from api.episode import RemediationState
    from workflows.remediation_steps import RemediationSteps

    steps = RemediationSteps.__new__(RemediationSteps)
    steps.s = RemediationState()
    waits = []
    for unanswered in range(1, 8):
        steps.s.held_unchecked = unanswered
        waits.append(steps._recheck_in())
    assert waits == [timedelta(minutes=m) for m in (5, 10, 20, 40, 60, 60, 60)]


async def test_the_policy_answers_the_node_check_held_and_replaced_alike(ts_env, uniq):
    """The controller's policy.current answers the node check with the policy (as the stand-in
    fleet does now, like the real one): a node an earlier episode left quarantined is held, and a
    late report from a replaced host is refused, with no kube.check_node call, and the triage
    records the check all the same."""
    fleet = make_fleet(ts_env, uniq)
    held = fleet.add(FakeNode(f"was-held-{uniq}", [xid(48)], cured_by="reset", cordoned=True))
    # The report comes from boot 0, the host gpuheal replaced: its Node now runs boot 1.
    old = fleet.add(FakeNode(f"old-host-{uniq}", [xid(48)], cured_by="reset", replaced_boot=0, boot=0))
    async with fleet.workers():
        handle = await fleet.report(held.name)
        await wait_until_held(handle)
        st = await handle.query(NodeRemediation.status)
        assert "from an earlier episode" in st.held, st.held
        await handle.execute_update(NodeRemediation.lift, args=["checked by hand", "alice"])
        await handle.result()
        history = await handle.fetch_history()
        refused = await (await fleet.report(old.name)).result()
    # The check answered with the policy (patch policy-with-node-check) replays on this code.
    await Replayer(workflows=[NodeRemediation], data_converter=pydantic_data_converter).replay_workflow(history)
    assert refused.outcome == "rejected" and "replaced" in refused.reason, refused.reason
    for n in (held, old):
        assert "kube.check_node" not in n.calls, (n.name, n.calls)
    assert any(a.step == "kube.check_node" and a.ok for a in st.actions), st.actions
    assert not any(x in old.calls for x in ("kube.quarantine", "kube.drain", "node.reset_gpu")), old.calls
