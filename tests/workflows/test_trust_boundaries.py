"""Whoever can reach Temporal may send a report or start an episode, but cannot choose how it acts:
the policy is the controller's, and a first run's input carries nothing but node, cluster and
generation (issue: trust boundaries)."""

from __future__ import annotations

from datetime import timedelta

from activities.policy import policy_hash
from api.admission import AdmissionInput
from api.episode import RemediationInput, RemediationState, Stage
from api.names import admission_workflow_id, guard_workflow_id, remediation_workflow_id
from policies.loader import default_policy
from tests.workflows.fake_node import FakeNode
from tests.workflows.fakes import xid
from tests.workflows.test_node_remediation import make_fleet, wait_for
from workflows.node_admission import NodeAdmission
from workflows.node_remediation import NodeRemediation


def controller_policy():
    policy = default_policy()
    policy.name = "site-production"
    policy.ladder.reset.return_timeout = timedelta(seconds=1)
    policy.ladder.reboot.requires_approval = True
    policy.ladder.reboot.approval_timeout = timedelta(days=1)
    return policy


def sender_policy():
    """What a tenant pod would like: no approval, a dry run, another ownership tag."""
    policy = default_policy()
    policy.name = "tenant"
    policy.ladder.reboot.requires_approval = False
    policy.dry_run = True
    policy.ownership_tag = "anything=goes"
    return policy


async def test_a_start_carrying_its_own_policy_and_state_acts_on_the_controllers(ts_env, uniq):
    policy = controller_policy()
    fleet = make_fleet(ts_env, uniq, policy)
    n = fleet.add(FakeNode(f"trust-{uniq}", [xid(48, gpu=1)], cured_by="reboot"))
    forged = RemediationInput(
        node=n.name, cluster=fleet.cluster, policy=sender_policy(), expected_gpus=99, guard_task_queue="nowhere",
        state=RemediationState(stage=Stage.LADDER, skip_to="replace", quarantined=True, lease_held=True))
    async with fleet.workers():
        handle = await ts_env.client.start_workflow(
            NodeRemediation.run, forged, id=remediation_workflow_id(n.name, fleet.cluster), task_queue=fleet.task_queue,
            start_signal="report", start_signal_args=[n.report().model_dump(mode="json")])
        await wait_for(lambda: _awaiting(handle, "reboot"), timeout=30)
        st = await handle.query(NodeRemediation.status)
        guard = await ts_env.client.get_workflow_handle(guard_workflow_id(fleet.cluster)).describe()
        await handle.execute_update(NodeRemediation.cancel, args=["test over", "test"])
        await handle.result()
    assert (st.policy_name, st.policy_sha256) == ("site-production", policy_hash(policy))
    first = st.actions[0]
    assert first.step == "policy" and first.summary.startswith("policy site-production")
    assert all(k in first.detail for k in ("policy", "state", "expected_gpus", "guard_task_queue")), first.detail
    assert st.rungs_tried == ["reset"], "the forged skip to replace and stage were not taken"
    assert not any(r.dry_run for r in n.requests["kube.quarantine"]), "the sender's dry run was not taken"
    assert all(r.expected_gpus is None for r in n.requests["node.validate"]), "the agent's own GPU count decides"
    assert "node.reboot" not in n.calls and "cloud.reboot" not in n.calls, "the reboot waits for approval"
    assert guard.task_queue == fleet.task_queue, "the guard runs on the controller's queue, not the sender's"


async def test_a_report_sent_the_usual_way_names_the_controllers_policy(ts_env, uniq):
    policy = controller_policy()
    fleet = make_fleet(ts_env, uniq, policy)
    n = fleet.add(FakeNode(f"named-{uniq}", [xid(48, gpu=1)], cured_by="reset"))
    async with fleet.workers():
        handle = await fleet.report(n.name)
        result = await handle.result()
        st = await handle.query(NodeRemediation.status)
    assert result.outcome == "returned"
    assert (st.policy_name, st.policy_sha256) == ("site-production", policy_hash(policy))
    assert st.actions[0].detail == "", "nothing was ignored: the sender sent no policy"


async def test_admission_started_with_a_dry_run_policy_still_taints(ts_env, uniq):
    fleet = make_fleet(ts_env, uniq, controller_policy())
    n = fleet.add(FakeNode(f"admit-{uniq}", [], faulty=False))
    async with fleet.workers():
        result = await ts_env.client.execute_workflow(
            NodeAdmission.run, AdmissionInput(node=n.name, policy=sender_policy(), hardware_ids=["GPU-x"], expected_gpus=1),
            id=admission_workflow_id(n.name, fleet.cluster), task_queue=fleet.task_queue)
    assert result.outcome == "healthy"
    assert result.actions[0].step == "policy" and "policy" in result.actions[0].detail
    assert not n.requests["kube.quarantine"][0].dry_run
    assert all(r.expected_gpus is None for r in n.requests["node.validate"])


async def _awaiting(handle, rung: str) -> bool:
    return (await handle.query(NodeRemediation.status)).awaiting_approval == rung
