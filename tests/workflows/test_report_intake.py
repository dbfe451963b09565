"""Report intake without a server: what each report does to an episode's state."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from api.episode import RemediationState, Stage
from api.reports import MAX_REPORT_FINDINGS
from policies.loader import default_policy
from policies.terms import Generation, Rung
from workflows.report_intake import record_rejection, take_report

NOW = datetime(2026, 12, 3, tzinfo=UTC)


def report(seq: int, *, boot: str = "b1", node: str = "n1", source: str = "agent", xids=(), event=None) -> dict:
    findings = [{"kind": "xid", "xid": x, "gpu_index": 0, "message": f"Xid {x}", "event_id": event} for x in xids]
    return {"node": node, "boot_id": boot, "seq": seq, "source": source, "findings": findings}


def take(s: RemediationState, raw) -> str | None:
    return take_report(s, raw, node="n1", generation=Generation.HOPPER, policy=default_policy(),
                       now_us=int(NOW.timestamp() * 10**6))


def test_an_accepted_report_is_the_latest_and_the_first():
    s = RemediationState()
    assert take(s, report(1, xids=[79])) is None
    assert s.latest.seq == 1 and s.first_report.seq == 1 and s.boot_id == "b1"
    assert take(s, report(2)) is None
    assert s.latest.seq == 2 and s.first_report.seq == 1


@pytest.mark.parametrize("raw, why", [
    ({"node": "n1"}, "malformed report: boot_id"),
    ("not a report", "malformed report"),
    (report(1, node="n2"), "report for node 'n2' sent to 'n1'"),
    ({**report(1), "findings": [{"kind": "xid", "xid": 79}] * (MAX_REPORT_FINDINGS + 1)}, "findings (at most"),
])
def test_bad_reports_are_rejected_with_the_reason(raw, why):
    s = RemediationState()
    got = take(s, raw)
    assert got is not None and why in got
    assert s.latest is None, "a rejected report changes nothing"


def test_sequences_count_per_sender_and_boot():
    s = RemediationState()
    assert take(s, report(5, xids=[79])) is None
    assert take(s, report(5, xids=[79])) is None and s.duplicates == 1, "the same report again is a duplicate"
    assert "stale sequence 4" in take(s, report(4))
    assert take(s, report(1, source="watcher")) is None, "another sender counts its own"
    assert take(s, report(1, boot="b2")) is None, "a new boot starts again"
    assert take(s, report(9, boot="b1")) is None, "only the episode's own reboot retires a boot"
    s.rungs_tried = [Rung.REBOOT]
    assert take(s, report(2, boot="b3")) is None
    assert "stale report from earlier boot b1" in take(s, report(10, boot="b1"))


def test_a_sequence_far_ahead_of_the_clock_is_rejected():
    s = RemediationState()
    assert "more than a day ahead" in take(s, report(int(NOW.timestamp() * 10**6) + 2 * 86400 * 10**6))


def test_a_resent_event_after_the_fix_is_no_recurrence_but_a_new_one_is():
    s = RemediationState()
    assert take(s, report(1, xids=[79], event="kmsg:1")) is None
    s.stage = Stage.PROBATION
    assert take(s, report(2, xids=[79], event="kmsg:1")) is None
    assert s.recurrence is None, "the agent still holding the event it sent is no recurrence"
    assert take(s, report(3, xids=[79], event="kmsg:2")) is None
    assert s.recurrence is not None and [f.event_id for f in s.recurrence.findings] == ["kmsg:2"]


def test_rejections_are_kept_bounded_and_counted():
    s = RemediationState()
    for i in range(100):
        record_rejection(s, f"bad {i}", {"x": "y" * 500}, NOW)
    assert s.rejected_total == 100 and len(s.rejected) < 100 and s.rejected[-1].reason == "bad 99"
    assert len(s.rejected[-1].excerpt) == 200
