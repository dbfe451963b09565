"""Report intake, with no server: what a report does to an episode's state (accepted, a
duplicate, or rejected with the reason), and which of its findings are news."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import ValidationError

from api.episode import RejectedReport, RemediationState, Stage
from api.reports import report_bounds_problem
from policies.classify import classify
from policies.findings import Finding, HealthReport
from policies.model import Policy
from policies.terms import Generation, Rung
from workflows.episode_constants import MAX_BOOTS_KEPT, MAX_REJECTED_KEPT, MAX_SEQ_SENDERS_KEPT

MAX_EVENTS_KEPT = 256  # event ids an episode remembers (bounded: continue-as-new carries them)
# A sequence is a detector's wall clock in microseconds (or a small counter): one more than a day
# ahead of the workflow's clock is no sequence, and none counts as later than the clock itself, so a
# spoofed huge one cannot make the genuine sender's reports stale for longer than its clock skew.
MAX_SEQ_AHEAD_US = 24 * 3600 * 10**6


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
    # A suspicion is no probed condition either: only the load test answers it.
    return all(f.event_id is None and f.kind not in ("xid", "suspect") for f in acted)


def take_report(s: RemediationState, raw: Any, *, node: str, generation: Generation, policy: Policy,
                now_us: int = 0) -> str | None:
    """Applies one report, as received, to the episode's state: the reason it was rejected, or
    None (accepted, or a duplicate counted). Anything wrong with it is a rejection, never an
    exception. `now_us` is the workflow's clock."""
    if (problem := report_bounds_problem(raw)) is not None:
        return problem
    try:
        r = HealthReport.model_validate(raw)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(report)"
        return f"malformed report: {where}: {first['msg']}"
    except Exception as err:  # noqa: BLE001 - any bad input is a rejection, not a task failure
        return f"malformed report: {type(err).__name__}"
    if r.node != node:
        return f"report for node {r.node!r} sent to {node!r}"
    if r.boot_id in s.retired_boots:
        return f"stale report from earlier boot {r.boot_id}"
    if r.seq > now_us + MAX_SEQ_AHEAD_US:
        return f"sequence {r.seq} is more than a day ahead of the clock ({now_us} us): not a sequence"
    # Sequences are per sender and boot: the agent, a condition watcher and an operator each count their own.
    last = s.seq_by_boot.get(_seq_key(r))
    if last is not None and r.seq <= last:
        if s.latest and r.fingerprint() == s.latest.fingerprint():
            s.duplicates += 1
            return None
        return f"stale sequence {r.seq} (already have {last} from {r.source} for boot {r.boot_id})"
    if _heard_before(r, s.seen_events):
        # Two condition watchers (or a re-send) with the same events: counted once, whoever sent it.
        s.duplicates += 1
        s.seq_by_boot[_seq_key(r)] = min(r.seq, now_us)
        return None
    _accept(s, r, generation, policy, now_us)
    return None


def _heard_before(r: HealthReport, seen: list[str]) -> bool:
    """Every finding is an event the episode has already heard of."""
    known = set(seen)
    return bool(r.findings) and all(f.event_id is not None and f.event_id in known for f in r.findings)


def _accept(s: RemediationState, r: HealthReport, generation: Generation, policy: Policy, now_us: int) -> None:
    # Only the reboot the episode asked for retires a boot: a report naming another boot at any
    # other time (a spoof, a watcher) cannot make the agent's reports stale.
    retire = bool(s.rungs_tried) and s.rungs_tried[-1] is Rung.REBOOT
    if s.boot_id is not None and r.boot_id != s.boot_id and retire:
        s.retired_boots = [*s.retired_boots, s.boot_id][-MAX_BOOTS_KEPT:]
        s.seq_by_boot = {k: v for k, v in s.seq_by_boot.items() if not k.endswith(f":{s.boot_id}")}
    s.boot_id = r.boot_id
    s.seq_by_boot[_seq_key(r)] = min(r.seq, now_us)
    if len(s.seq_by_boot) > MAX_SEQ_SENDERS_KEPT:
        # Dicts keep insertion order: the senders heard from longest ago go first.
        s.seq_by_boot = dict(list(s.seq_by_boot.items())[-MAX_SEQ_SENDERS_KEPT:])
    s.latest = r
    if s.first_report is None:
        s.first_report = r
    seen = s.seen_events
    s.seen_events = remember_events(seen, new_event_ids(r, seen))
    if s.stage in (Stage.RETURN, Stage.PROBATION) and not r.healthy and s.recurrence is None:
        # Re-sent events are no recurrence: only findings the episode has not heard of.
        news = recurrence_findings(r, seen)
        if news and classify(news, generation, policy).actionable:
            s.recurrence = r.model_copy(update={"findings": news})


def describe(raw: Any) -> str:
    """A report, as received, in a few words for a person: sender, sequence and findings."""
    if not isinstance(raw, dict):
        return repr(raw)[:200]
    found = [f"{f.get('kind')}{' ' + str(f['xid']) if f.get('xid') is not None else ''}"
             for f in raw.get("findings") or [] if isinstance(f, dict)]
    return (f"seq {raw.get('seq')} from {str(raw.get('source', 'agent'))[:64]}, boot {str(raw.get('boot_id'))[:64]}: "
            + (", ".join(found[:8]) or "healthy"))


def record_rejection(s: RemediationState, reason: str, raw: Any, now: datetime) -> None:
    """Kept in `status` (the newest few, with an excerpt) and counted: a rejected report is never lost silently."""
    s.rejected_total += 1
    s.rejected = [*s.rejected, RejectedReport(at=now, reason=reason, excerpt=repr(raw)[:200])][-MAX_REJECTED_KEPT:]


def _seq_key(r: HealthReport) -> str:
    return f"{r.source}:{r.boot_id}"
