"""Admission trusts no starter (issue 22: 3): hardware ids come from the node's own agent, a re-start
of an admitted node does nothing, and replacing a node with denylisted hardware takes the approval
and the disruption lease that any replace takes."""

from __future__ import annotations

import asyncio

from temporalio.common import WorkflowIDReusePolicy
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from api.admission import AdmissionInput
from api.names import admission_workflow_id
from tests.workflows.fake_node import FakeNode
from tests.workflows.fakes import xid
from tests.workflows.test_node_remediation import make_fleet, wait_for
from tests.workflows.test_trust_boundaries import controller_policy
from workers.reporting import start_admission
from workflows.node_admission import NodeAdmission


async def test_a_restart_of_an_admitted_node_with_claimed_denylisted_ids_does_nothing(ts_env, uniq):
    fleet = make_fleet(ts_env, uniq, controller_policy())
    n = fleet.add(FakeNode(f"adm-{uniq}", [], faulty=False))
    fleet.denylist["GPU-someone-elses"] = "replaced: Xid 79"
    async with fleet.workers():
        first = await ts_env.client.execute_workflow(
            NodeAdmission.run, AdmissionInput(node=n.name, hardware_ids=[g.uuid for g in n.ids()]),
            id=admission_workflow_id(n.name, fleet.cluster), task_queue=fleet.task_queue)
        assert first.outcome == "healthy"
        calls_before = list(n.calls)
        again = await ts_env.client.execute_workflow(
            NodeAdmission.run, AdmissionInput(node=n.name, hardware_ids=["GPU-someone-elses"]),
            id=admission_workflow_id(n.name, fleet.cluster), task_queue=fleet.task_queue,
            id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE)
    new_calls = n.calls[len(calls_before):]
    assert "cloud.replace" not in new_calls, "no replace on a claim"
    assert "kube.quarantine" not in new_calls, "an admitted node is not tainted again"
    assert "node.validate" not in new_calls, "nor validated under its jobs"
    assert again.outcome == "healthy" and "admitted before" in again.reason, again.reason


async def test_a_node_with_denylisted_hardware_is_replaced_only_with_approval_and_a_lease(ts_env, uniq):
    policy = controller_policy()
    policy.ladder.replace.requires_approval = True
    fleet = make_fleet(ts_env, uniq, policy)
    n = fleet.add(FakeNode(f"den-{uniq}", [], faulty=False))
    fleet.denylist[n.ids()[3].uuid] = "replaced: Xid 79"
    async with fleet.workers():
        await start_admission(ts_env.client, node=n.name, cluster=fleet.cluster, hardware_ids=[], task_queue=fleet.task_queue)
        handle = ts_env.client.get_workflow_handle_for(NodeAdmission.run, admission_workflow_id(n.name, fleet.cluster))

        async def awaiting() -> bool:
            acts = await handle.query(NodeAdmission.actions_so_far)
            return any(a.step == "approval" for a in acts) or "cloud.replace" in n.calls

        await wait_for(awaiting, timeout=20)
        await asyncio.sleep(0.5)
        assert "cloud.replace" not in n.calls, "no replace before an operator approves"
        await handle.execute_update(NodeAdmission.approve, args=["bob"])
        result = await handle.result()
        history = await handle.fetch_history()
    await Replayer(workflows=[NodeAdmission], data_converter=pydantic_data_converter).replay_workflow(history)
    assert result.outcome == "denied_admission" and n.ids()[3].uuid in result.reason
    assert "cloud.replace" in n.calls
    steps = [a.step for a in result.actions]
    assert steps.index("lease") < steps.index("cloud.replace"), steps
    assert any(a.summary == "approve by bob" for a in result.actions)


async def test_an_admission_waits_for_a_running_episode_to_end(ts_env, uniq):
    """A node under remediation gets an admission (its first report raced the agent's admission, or it
    served before gpuheal came and a start of `admit/<cluster>/<node>` arrives): its unvalidated taint
    and validation would take the node out of service past the guard's count (safety simulation, seed
    24). Nothing is done until the episode ends; then the node is checked again: this episode was
    terminated with the node quarantined, so it is held for a person and the admission does nothing
    (safety soak, seed 669: an admission tainted and validated a node its episode had replaced)."""
    from tests.workflows.test_sender_cannot_steer import _awaiting_reboot

    fleet = make_fleet(ts_env, uniq, controller_policy())  # reboot waits a day for approval
    n = fleet.add(FakeNode(f"beside-{uniq}", [xid(79)], cured_by="reboot"))
    async with fleet.workers():
        episode = await _awaiting_reboot(fleet, n)
        calls_before = len(n.calls)
        handle = await ts_env.client.start_workflow(
            NodeAdmission.run, AdmissionInput(node=n.name, hardware_ids=["GPU-claimed"]),
            id=admission_workflow_id(n.name, fleet.cluster), task_queue=fleet.task_queue)

        async def waiting() -> bool:
            return any(a.step == "remediation" for a in await handle.query(NodeAdmission.actions_so_far))

        await wait_for(waiting, timeout=20)
        await asyncio.sleep(0.5)
        during = [x for x in n.calls[calls_before:] if x.startswith(("kube.quarantine", "node.", "cloud."))]
        await episode.terminate("test over")
        n.faulty = False
        result = await handle.result()
    assert during == [], f"the admission acted beside the episode: {during}"
    after = [x for x in n.calls[calls_before:] if x.startswith(("kube.quarantine", "kube.return", "node.", "cloud."))]
    assert after == [] and result.outcome == "quarantined", (after, result)
    assert "left" in result.reason and "for a person" in result.reason, result.reason


async def test_an_admission_after_an_episode_that_returned_the_node_goes_on(ts_env, uniq):
    fleet = make_fleet(ts_env, uniq, controller_policy())
    hold = asyncio.Event()
    n = fleet.add(FakeNode(f"after-{uniq}", [xid(48)], cured_by="reset", hold=hold))
    async with fleet.workers():
        episode = await fleet.report(n.name)
        await wait_for(lambda: _true("kube.drain" in n.calls), timeout=20)
        handle = await ts_env.client.start_workflow(
            NodeAdmission.run, AdmissionInput(node=n.name, hardware_ids=[]),
            id=admission_workflow_id(n.name, fleet.cluster), task_queue=fleet.task_queue)

        async def waiting() -> bool:
            return any(a.step == "remediation" for a in await handle.query(NodeAdmission.actions_so_far))

        await wait_for(waiting, timeout=20)
        hold.set()
        assert (await episode.result()).outcome in ("validated", "returned")
        result = await handle.result()
    assert result.outcome == "healthy", result
    checks = [a for a in result.actions if a.step == "kube.check_node"]
    assert len(checks) == 2 and "again after its remediation" in checks[1].summary, checks


async def test_an_admission_of_a_node_left_quarantined_does_nothing(ts_env, uniq):
    """A node an earlier episode left quarantined for a person (it carries gpuheal's taint) is not
    tainted, validated, checked against the denylist or recorded as admitted: the hold is a person's
    to lift (red-team review of admission-recheck-after-episode)."""
    fleet = make_fleet(ts_env, uniq, controller_policy())
    n = fleet.add(FakeNode(f"held-adm-{uniq}", [], faulty=False))
    n.cordoned = True  # gpuheal's quarantine taint from an episode that ended `quarantined`
    fleet.denylist[f"GPU-{n.name}-0"] = "replaced: Xid 79"
    async with fleet.workers():
        result = await ts_env.client.execute_workflow(
            NodeAdmission.run, AdmissionInput(node=n.name, hardware_ids=[]),
            id=admission_workflow_id(n.name, fleet.cluster), task_queue=fleet.task_queue)
    assert result.outcome == "quarantined" and "held for a person" in result.reason, result
    assert not any(x.startswith(("kube.quarantine", "kube.return", "node.", "cloud.", "ledger.admit")) for x in n.calls), n.calls
    assert n.cordoned


async def _true(value):
    return value
