"""A closed episode read from its event history: its steps and outcome, with no worker to answer.

A query replays the workflow on a worker polling the run's task queue; a closed run's queue may have
no poller left (an earlier demo, a renamed queue, a retired controller build), so `gpuheal history`
reads closed runs from the server's history instead, as the Temporal UI does.
"""

from __future__ import annotations

from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client, WorkflowHandle

from api.episode import RemediationResult
from api.names import NODE_VALIDATE
from api.node import ValidationResult
from policies.load import describe

_DONE = {
    EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED: ("activity_task_completed_event_attributes", True),
    EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED: ("activity_task_failed_event_attributes", False),
    EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT: ("activity_task_timed_out_event_attributes", False),
    EventType.EVENT_TYPE_ACTIVITY_TASK_CANCELED: ("activity_task_canceled_event_attributes", False),
}
DETAIL_LIMIT = 300  # characters of an activity's result kept per step


def _text(client: Client, payload) -> str:
    try:
        value = client.data_converter.payload_converter.from_payload(payload, None)
    except Exception:  # noqa: BLE001 - an undecodable payload is shown as such, not a failed listing
        return "<undecodable>"
    return value if isinstance(value, str) else str(value)


def _summary(client: Client, event: HistoryEvent) -> str:
    return _text(client, event.user_metadata.summary) if event.user_metadata.HasField("summary") else ""


def _result_text(client: Client, attrs, ok: bool, name: str = "") -> str:
    if not ok:
        failure = getattr(attrs, "failure", None)
        return failure.message if failure is not None and failure.message else "timed out"
    payloads = attrs.result.payloads
    if payloads and name == NODE_VALIDATE:
        return _validation_text(client, payloads[0])
    return _text(client, payloads[0])[:DETAIL_LIMIT] if payloads else ""


def _validation_text(client: Client, payload) -> str:
    """A validation in full: what failed (each finding names its GPU and test) and every figure the
    load test measured, one line per GPU."""
    try:
        r = client.data_converter.payload_converter.from_payload(payload, ValidationResult)
    except Exception:  # noqa: BLE001 - an undecodable payload is shown as such, not a failed listing
        return "<undecodable>"
    lines = ["passed" if r.passed else "failed: " + ", ".join(f.label() for f in r.findings)]
    lines += [f.message for f in r.findings if f.gpu_index is not None or f.kind.value == "probe_broken"][:16]
    if r.load is not None:
        lines.append(describe(r.load))
    return "\n".join(lines) + f" ({', '.join(r.checks)})"


async def closed_episode(client: Client, handle: WorkflowHandle) -> dict:
    """Steps (activities with their summaries and results, timers, local activities) and the outcome
    from the completion event; a run that continued as new says so."""
    steps: list[dict] = []
    scheduled: dict[int, dict] = {}
    timers: dict[str, dict] = {}
    outcome: dict = {"outcome": None, "reason": None, "rungs": []}
    async for event in handle.fetch_history_events():
        at = event.event_time.ToDatetime().isoformat()
        kind = event.event_type
        if kind == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            name = event.activity_task_scheduled_event_attributes.activity_type.name
            scheduled[event.event_id] = {"at": at, "step": name, "summary": _summary(client, event) or name,
                                         "ok": None, "detail": None}
        elif kind in _DONE:
            field, ok = _DONE[kind]
            attrs = getattr(event, field)
            step = scheduled.pop(attrs.scheduled_event_id, None)
            if step is not None:
                steps.append({**step, "ok": ok, "detail": _result_text(client, attrs, ok, step["step"])})
        elif kind == EventType.EVENT_TYPE_TIMER_STARTED:
            timers[event.timer_started_event_attributes.timer_id] = step = {
                "at": at, "step": "timer", "summary": _summary(client, event) or "timer", "ok": True,
                "detail": f"for {event.timer_started_event_attributes.start_to_fire_timeout.ToTimedelta()}"}
            steps.append(step)
        elif kind == EventType.EVENT_TYPE_TIMER_CANCELED:
            # A wait that ended early: what it waited for came (a grant, an answer, an operator).
            if (step := timers.get(event.timer_canceled_event_attributes.timer_id)) is not None:
                step["detail"] = f"{step['detail']}, ended early at {at[11:19]}"
        elif kind == EventType.EVENT_TYPE_MARKER_RECORDED and event.marker_recorded_event_attributes.marker_name == "core_local_activity":
            data = event.marker_recorded_event_attributes.details.get("data")
            meta = client.data_converter.payload_converter.from_payload(data.payloads[0], None) if data else {}
            name = (meta or {}).get("activity_type") or "local activity"
            failed = event.marker_recorded_event_attributes.HasField("failure")
            steps.append({"at": at, "step": name, "summary": _summary(client, event) or name, "ok": not failed,
                          "detail": event.marker_recorded_event_attributes.failure.message if failed else None})
        elif kind == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED:
            request = event.workflow_execution_update_accepted_event_attributes.accepted_request
            # The CLI sends its identity as an argument too; it is in the summary already.
            args = [a for a in (_text(client, p) for p in request.input.args.payloads) if a != request.meta.identity]
            steps.append({"at": at, "step": "operator", "summary": f"{request.input.name} by {request.meta.identity}",
                          "ok": True, "detail": ", ".join(args) or None})
        elif kind == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED:
            payloads = event.workflow_execution_completed_event_attributes.result.payloads
            if payloads:
                result = (await client.data_converter.decode(payloads, [RemediationResult]))[0]
                outcome = {"outcome": result.outcome.value, "reason": result.reason,
                           "rungs": [r.value for r in result.rungs]}
        elif kind == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW:
            outcome["reason"] = "continued as new (the episode goes on in the next run)"
        elif kind == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TERMINATED:
            outcome["reason"] = f"terminated: {event.workflow_execution_terminated_event_attributes.reason}"
    steps.extend(s for s in scheduled.values())  # scheduled and never finished (a terminated run)
    return {**outcome, "steps": steps}
