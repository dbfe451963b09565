"""Reports are bounded (64 KB, 256 findings; the sender and the workflow both check), and the state
continue-as-new carries stays under 256 KB whatever the senders do (Temporal refuses payloads over
2 MB, which would wedge the episode)."""

from __future__ import annotations

import json

import pytest
from temporalio.api.enums.v1 import EventType, WorkflowTaskFailedCause

from api.names import remediation_workflow_id
from api.reports import MAX_REPORT_BYTES, report_bounds_problem
from policies.findings import Finding, GpuIds, HealthReport
from tests.workflows.fake_node import FakeNode
from tests.workflows.fakes import xid
from tests.workflows.test_node_remediation import make_fleet
from workers.reporting import ReportTooLarge, fit_to_bounds, send_report
from workflows.node_remediation import NodeRemediation


def big_finding(i: int) -> dict:
    return Finding(kind="xid", xid=79, gpu_index=i % 8, message="x" * 2000).model_dump(mode="json")


def test_fit_to_bounds_keeps_the_node_unhealthy():
    report = HealthReport(node="n", boot_id="b", seq=1, gpus=[GpuIds(index=i, uuid=f"GPU-{i}") for i in range(8)],
                          findings=[Finding(kind="xid", xid=79, gpu_index=i % 8, message="m" * 2000) for i in range(500)])
    assert report_bounds_problem(report.model_dump(mode="json")) is not None
    fitted = fit_to_bounds(report)
    assert report_bounds_problem(fitted.model_dump(mode="json")) is None
    assert fitted.findings[0].xid == 79 and fitted.findings[-1].kind == "probe_broken"
    assert "left out" in fitted.findings[-1].message


async def test_oversized_reports_are_rejected_and_state_stays_small(ts_env, uniq):
    fleet = make_fleet(ts_env, uniq)
    fleet.history_limit = 40  # continue as new between rungs, carrying whatever the senders left
    n = fleet.add(FakeNode(f"big-{uniq}", [xid(48)], cured_by="none"))
    async with fleet.workers():
        handle = await fleet.report(n.name)
        base = n.report().model_dump(mode="json")
        with pytest.raises(ReportTooLarge):
            await send_report(fleet.client, {**base, "findings": [big_finding(i) for i in range(40)]}, node=n.name,
                              cluster=fleet.cluster, task_queue=fleet.task_queue)
        # The worst a sender can do past the sender's check: reports just under the bounds, many
        # senders, and reports far over them (each about 1.6 MB, under Temporal's own limit).
        near = {**base, "findings": [big_finding(i) for i in range(29)]}
        assert len(json.dumps(near)) < MAX_REPORT_BYTES
        for i in range(40):
            await fleet.send_raw(n.name, {**near, "source": f"sender-{i}", "seq": 10 + i})
        huge = {**base, "seq": 999, "findings": [big_finding(i) for i in range(800)]}
        for _ in range(3):
            await fleet.send_raw(n.name, huge)
        await fleet.send_raw(n.name, {**base, "seq": 1000, "findings": [xid(79).model_dump(mode="json")] * 300})

        result = await handle.result()
        status = await handle.query(NodeRemediation.status)
    assert result.outcome == "replaced" and len(result.run_ids) >= 2
    reasons = [r.reason for r in status.rejected]
    assert sum("report too large" in r for r in reasons) == 3 and any("300 findings" in r for r in reasons)
    # Every continue-as-new input of the episode, measured as it went over the wire.
    sizes = []
    for run_id in status.run_ids:
        run = fleet.client.get_workflow_handle(remediation_workflow_id(n.name, fleet.cluster), run_id=run_id)
        async for e in run.fetch_history_events():
            # A signal landing while a run closes makes the server refuse that completion
            # (UNHANDLED_COMMAND) and hand the new signal to a fresh task: normal. Nothing else may fail.
            if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED:
                assert e.workflow_task_failed_event_attributes.cause == \
                    WorkflowTaskFailedCause.WORKFLOW_TASK_FAILED_CAUSE_UNHANDLED_COMMAND, e
            if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW:
                sizes.append(sum(len(p.data) for p in e.workflow_execution_continued_as_new_event_attributes.input.payloads))
    assert sizes, "the episode continued as new"
    assert max(sizes) < 256 * 1024, sizes
