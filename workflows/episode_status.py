"""What an episode shows and refuses, as functions of its state: the `status` query (what it
waits on, in words) and whether its id is one this controller serves. No workflow calls here."""

from __future__ import annotations

import api as c
from api.episode import GuardAnswer, RemediationState, RemediationStatus, Stage
from policies.model import Policy


def episode_status(s: RemediationState, *, node: str, cluster: str, policy: Policy | None) -> RemediationStatus:
    return RemediationStatus(
        node=node, stage=s.stage, outcome=s.outcome, outcome_reason=s.outcome_reason, triage=s.triage,
        next_rung=s.next_rung, fixed_by=s.fixed_by, rungs_tried=s.rungs_tried, attempts=s.attempts,
        actions=s.actions, lease_held=s.lease_held, quarantined=s.quarantined, paused=s.paused,
        pause_reason=s.pause_reason, awaiting_approval=s.awaiting_approval, cancel_reason=s.cancel_reason,
        rejected=s.rejected, rejected_total=s.rejected_total, duplicates=s.duplicates,
        validations=s.validations, boot_id=s.boot_id, run_ids=s.run_ids, agent_missing=s.agent_missing,
        implicated=s.implicated, policy_name=s.policy_name, policy_sha256=s.policy_sha256,
        cluster=cluster, lease_requested=s.lease_requested, admission=s.admission,
        waiting=waiting_for(s, node=node, policy=policy), held=s.held,
    )


def waiting_for(s: RemediationState, *, node: str, policy: Policy | None) -> str:
    """What the episode waits on now, in words (`gpuheal status NODE`)."""
    if s.stage is Stage.DONE:
        return ""
    if s.held:
        return f"a person: {s.held}" + ("" if "gpuheal lift" in s.held else f" (gpuheal lift {node})")
    if s.paused:
        return f"resume: paused ({s.pause_reason})"
    if s.admission == GuardAnswer.DEFERRED:
        return f"room to quarantine: {s.admission_reason}"
    if s.awaiting_approval is not None:
        return f"approval to {s.awaiting_approval.value} (gpuheal approve {node} {s.awaiting_approval.value})"
    if s.lease_requested and not s.lease_held:
        return "a disruption lease from the fleet guard"
    if s.latest is None and s.stage is Stage.TRIAGE:
        return f"a valid report from {node} ({s.rejected_total} rejected so far)"
    if s.stage is Stage.PROBATION:
        return f"the end of probation ({policy.probation if policy else ''})"
    return ""


def id_refused(workflow_id: str, cluster: str, node: str) -> str | None:
    """Why the id is no episode of this controller's (None: it is). `remediate/<cluster>/<node>`
    must name the controller's cluster: a sender naming another would start a second episode for
    the node beside its real one. An id from before ids carried the cluster names none, so no
    recorded history reaches the refusal (no patch needed); nor does an id of another shape
    (every recorded id is `remediate/<node>`), which is refused."""
    if c.node_in_workflow_id(workflow_id, "remediate") is None:
        return f"the episode id {workflow_id[:200]!r} is not remediate/<cluster>/<node>"
    named = c.cluster_in_workflow_id(workflow_id, "remediate")
    if named is None or named == cluster:
        return None
    return (f"the episode id names cluster {named}, the controller serves {cluster}: a report "
            f"for {node} goes to remediate/{cluster}/{node}")
