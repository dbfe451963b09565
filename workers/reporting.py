"""Sending a health report: signal-with-start of `remediate/<cluster>/<node>`, one path for every
detector; and which id a node's episode runs under (the upgrade path from ids without the cluster)."""

from __future__ import annotations

import logging

from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle
from temporalio.common import (
    SearchAttributePair,
    TypedSearchAttributes,
    WorkflowIDConflictPolicy,
    WorkflowIDReusePolicy,
)
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

import api as c
from api.admission import AdmissionInput, AdmissionResult
from api.episode import SA_NODE, SA_STAGE, RemediationInput, RemediationResult, Stage
from api.names import (
    admission_workflow_id,
    legacy_admission_workflow_id,
    legacy_remediation_workflow_id,
    remediation_workflow_id,
)
from api.reports import MAX_REPORT_FINDINGS, report_bounds_problem
from policies.findings import Finding, HealthReport
from policies.terms import Generation

log = logging.getLogger(__name__)


def fit_to_bounds(report: HealthReport) -> HealthReport:
    """A detector's report cut to the bounds every receiver enforces: messages shortened first,
    then the findings beyond what fits left out, with one finding saying how many (fail closed:
    the node is still reported unhealthy)."""
    if report_bounds_problem(report.model_dump(mode="json")) is None:
        return report
    findings = [f.model_copy(update={"message": f.message[:200]}) for f in report.findings]
    keep = min(len(findings), MAX_REPORT_FINDINGS - 1)
    while keep > 0:
        extra = [Finding(kind="probe_broken", message=f"{len(findings) - keep} more findings left out: report bounds")] \
            if keep < len(findings) else []
        fitted = report.model_copy(update={"findings": [*findings[:keep], *extra]})
        if report_bounds_problem(fitted.model_dump(mode="json")) is None:
            return fitted
        keep = keep * 3 // 4
    return report.model_copy(update={"findings": [Finding(kind="probe_broken", message="findings left out: report bounds")],
                                     "gpus": report.gpus[:64]})


class ReportTooLarge(ValueError):
    """A report over its bounds is refused before it is sent (the workflow would reject it too)."""


async def _run_status(client: Client, workflow_id: str) -> WorkflowExecutionStatus | None:
    """The status of the newest run under an id; None when there is none or the server cannot say
    (a describe refused or failed must not stop a report: the new id is the fallback)."""
    try:
        return (await client.get_workflow_handle(workflow_id).describe()).status
    except RPCError as err:
        if err.status != RPCStatusCode.NOT_FOUND:
            log.warning("describe %s failed (%s): taken as not running", workflow_id, err)
        return None


async def episode_id(client: Client, node: str, cluster: str) -> str:
    """The id a node's episode runs under: `remediate/<cluster>/<node>`, except where an episode
    started before ids carried the cluster still runs under `remediate/<node>` and none runs under
    the new id. Reports and operator commands go to it until it ends (a second episode beside it
    would act on the node twice); the node's next spell starts under the new id. A running new-id
    episode always wins: a legacy-id run started beside it cannot draw its reports away."""
    current = remediation_workflow_id(node, cluster)
    if await _run_status(client, current) == WorkflowExecutionStatus.RUNNING:
        return current
    legacy = legacy_remediation_workflow_id(node)
    if await _run_status(client, legacy) == WorkflowExecutionStatus.RUNNING:
        return legacy
    return current


async def send_report(
    client: Client,
    report: HealthReport | dict,
    *,
    node: str,
    generation: Generation = Generation.HOPPER,
    cluster: str = "default",
    task_queue: str = c.DEFAULT_TASK_QUEUE,
    history_limit: int | None = None,
) -> WorkflowHandle:
    """Deliver a report to the node's running episode, or start one with it.

    The episode's policy is the controller's: a sender names only the node, cluster and generation.

    A healthy report to a node with no running episode still starts one that ends `healthy` at
    once; callers that only send on transitions (the agent) rarely do that.
    """
    payload = report.model_dump(mode="json") if isinstance(report, HealthReport) else report
    if (problem := report_bounds_problem(payload)) is not None:
        raise ReportTooLarge(f"{node}: {problem}")
    return await client.start_workflow(
        c.EPISODE_WORKFLOW,
        RemediationInput(node=node, cluster=cluster, generation=generation, guard_task_queue=task_queue,
                         history_limit=history_limit),
        id=await episode_id(client, node, cluster),
        task_queue=task_queue,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        result_type=RemediationResult,
        start_signal=c.EPISODE_SIGNAL_REPORT,
        start_signal_args=[payload],
        static_summary=f"Remediation of GPU node {node}",
        search_attributes=TypedSearchAttributes([SearchAttributePair(SA_NODE, node),
                                                SearchAttributePair(SA_STAGE, Stage.TRIAGE.value)]),
    )


async def start_admission(client: Client, *, node: str, hardware_ids: list[str], cluster: str,
                          task_queue: str = c.DEFAULT_TASK_QUEUE) -> bool:
    """Start `admit/<cluster>/<node>` once per node; False when it already ran (or runs) for this
    node, under that id or under `admit/<node>` from before ids carried the cluster."""
    if await _run_status(client, legacy_admission_workflow_id(node)) is not None:
        return False  # admitted (or being admitted) before the upgrade: once is enough
    try:
        await client.start_workflow(
            c.ADMISSION_WORKFLOW,
            AdmissionInput(node=node, hardware_ids=hardware_ids),
            result_type=AdmissionResult,
            id=admission_workflow_id(node, cluster), task_queue=task_queue,
            # A node is admitted once: an agent restart must not put a serving node back behind the taint.
            id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
            static_summary=f"Admission of new GPU node {node}",
        )
    except WorkflowAlreadyStartedError:
        return False
    return True
