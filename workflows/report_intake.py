"""Report intake rules that need no server: which findings of a report are news to an episode."""

from __future__ import annotations

import json

from policies.findings import Finding, HealthReport

MAX_EVENTS_KEPT = 256  # event ids an episode remembers (bounded: continue-as-new carries them)
# A report's bounds, checked by the sender and again by the workflow: the episode keeps up to three
# reports (first, latest, recurrence), and continue-as-new must carry its state far below
# Temporal's 2 MB payload limit whatever a sender does.
MAX_REPORT_BYTES = 64 * 1024
MAX_REPORT_FINDINGS = 256


def report_bounds_problem(raw) -> str | None:
    """Why a report (as received) is over its bounds, or None."""
    size = len(json.dumps(raw, default=str, separators=(",", ":")))
    if size > MAX_REPORT_BYTES:
        return f"report too large: {size} bytes (at most {MAX_REPORT_BYTES})"
    findings = raw.get("findings") if isinstance(raw, dict) else None
    if isinstance(findings, list) and len(findings) > MAX_REPORT_FINDINGS:
        return f"report has {len(findings)} findings (at most {MAX_REPORT_FINDINGS})"
    return None


def new_event_ids(report: HealthReport, seen: list[str]) -> list[str]:
    """Ids of the report's one-shot events that the episode has not heard of."""
    known = set(seen)
    return sorted({f.event_id for f in report.findings if f.event_id and f.event_id not in known})


def remember_events(seen: list[str], new: list[str]) -> list[str]:
    return [*seen, *new][-MAX_EVENTS_KEPT:]


def recurrence_findings(report: HealthReport, seen: list[str]) -> list[Finding]:
    """What in a report after the fix counts as the fault coming back: a new event (a new
    kernel-log record or NVML event), or a condition the probes still find. A re-send of an event
    the episode already acted on is neither: the agent holds one-shot events for a while."""
    known = set(seen)
    return [f for f in report.findings if f.event_id is None or f.event_id not in known]


def fault_cleared(acted: list[Finding], latest: HealthReport | None) -> bool:
    """Whether a healthy report means the fault is gone: only for conditions the probes measure
    (a GPU counted, a port up). A one-shot event (an Xid, a kernel-log record) is not undone when
    the agent stops holding it; the fault it showed stays."""
    if latest is None or not latest.healthy or not acted:
        return False
    return all(f.event_id is None and f.kind != "xid" for f in acted)
