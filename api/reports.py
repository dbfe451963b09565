"""A health report's bounds, which the sender and the episode both enforce."""

from __future__ import annotations

import json

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
