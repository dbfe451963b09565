"""The outcome ledger's figures: stored whole in both ledgers, summed by `gpuheal outcomes`, and
counted as metrics when the ledger takes a record (the figures a dashboard shows)."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from temporalio.testing import ActivityEnvironment

import api as c
from activities.ledger import LedgerActivities, SqliteLedger
from activities.outcomes import failed_again, figures, outcome_report
from policies.findings import Finding
from tests.net import free_port
from workers import telemetry

ROOT = Path(__file__).resolve().parents[2]
T0 = datetime(2026, 11, 1, tzinfo=UTC)


def rec(episode: str, node: str, day: float, outcome="returned", attribution="platform", out_h=2.0, fault="memory",
        ids=None, sku="hopper") -> c.RemediationRecord:
    start = T0 + timedelta(days=day)
    pods = [c.InterruptedPod(pod=f"ml/{episode}", attribution=attribution)]
    return c.RemediationRecord(
        node=node, episode=episode, hardware_ids=ids or [f"SN-{node}"], fault_class=fault, attribution=attribution,
        rungs=["kill"] if attribution == "application" else ["reset"], outcome=outcome, started_at=start,
        ended_at=start + timedelta(hours=out_h + 1), returned_at=start + timedelta(hours=out_h) if outcome == "returned"
        else None, out_of_service_s=0.0 if attribution == "application" else out_h * 3600,
        phases={"quarantine": 600, "drain": 600, "reset": 1800, "validation": 0.25 * out_h * 3600},
        pods=pods, sku=sku, profile="default", finding=Finding(kind="ecc_dbe", gpu_index=1))


def test_both_ledgers_keep_the_whole_record_and_list_it_since_a_time(ledger):
    old = rec("e-old", "n1", 0)
    new = rec("e-new", "n2", 10)
    assert ledger.record(old) and ledger.record(new) and not ledger.record(new)
    assert ledger.records() == [old, new]
    assert ledger.records(T0 + timedelta(days=5)) == [new]


def test_a_record_from_before_the_outcome_ledger_still_lists(tmp_path):
    """Rows written before the body table existed are rebuilt from their columns."""
    led = SqliteLedger(tmp_path / "l.db")
    r = rec("e1", "n1", 0)
    led.record(r)
    led.db.execute("DELETE FROM remediation_body")
    [back] = led.records()
    assert (back.episode, back.hardware_ids, back.rungs, back.phases) == ("e1", ["SN-n1"], ["reset"], {})


def test_figures_node_hours_by_cause_and_phase_mttr_and_repeats():
    records = [rec("a", "n1", 0), rec("b", "n1", 3), rec("c", "n2", 0), rec("d", "n2", 20, outcome="replaced"),
               rec("e", "n3", 1, attribution="application", fault="app")]
    doc = figures(records)
    assert doc["episodes"] == 5 and doc["by_outcome"] == {"replaced": 1, "returned": 4}
    assert doc["node_hours_lost"] == pytest.approx(8.0)
    assert doc["node_hours_lost_by_cause"] == {"memory": 8.0}
    # 2 h out, by the phases' shares (600 + 600 + 1800 + 1800 s of 4800).
    assert doc["node_hours_lost_by_phase"]["reset"] == pytest.approx(4 * 2 * 1800 / 4800, abs=0.01)
    assert doc["mttr_h"] == pytest.approx(2.0)
    # n1 fails again 3 days after its return; n2's second failure is 20 days on.
    assert (doc["failed_again_7d"], doc["failed_again_30d"]) == (1, 2) and doc["repaired"] == 3
    assert doc["pod_interruptions"] == {"platform": 4, "application": 1}
    assert failed_again([rec("x", "n9", 0, ids=["A"]), rec("y", "n9", 1, ids=["B"])], 7) == 0, "new hardware"
    grouped = outcome_report(records, None, by="fault")
    assert set(grouped["groups"]) == {"memory", "app"} and grouped["groups"]["app"]["node_hours_lost"] == 0
    assert grouped["episodes_list"][0]["finding"] == {"kind": "ecc_dbe", "gpu_index": 1, "message": ""}


async def test_the_ledger_counts_each_record_once_as_metrics(tmp_path):
    port = free_port()
    runtime = telemetry.make_runtime(f"prometheus://127.0.0.1:{port}")
    env = ActivityEnvironment()
    env.metric_meter = runtime.metric_meter
    acts = LedgerActivities(SqliteLedger(tmp_path / "l.db"))
    first = rec("m1", "n1", 0)
    first = first.model_copy(update={"started_at": datetime.now(UTC) - timedelta(hours=4),
                                     "ended_at": datetime.now(UTC) - timedelta(hours=1)})
    again = first.model_copy(update={"episode": "m2", "started_at": datetime.now(UTC)})
    for r in (first, first, again):  # the retried write of m1 counts once
        await env.run(acts.record, r)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    lines = [x for x in text.splitlines() if x.startswith("gpuheal_")]

    def value(prefix: str, *labels: str) -> float:
        found = [x for x in lines if x.startswith(prefix + "{") and all(label in x for label in labels)]
        assert len(found) == 1, (prefix, labels, lines)
        return float(found[0].rsplit(" ", 1)[1])

    assert value("gpuheal_episodes_recorded", 'outcome="returned"', 'fault_class="memory"') == 2
    assert value("gpuheal_node_seconds_lost", 'phase="reset"') == pytest.approx(2 * int(7200 * 1800 / 4800), abs=2)
    assert value("gpuheal_time_to_repair_count", 'fault_class="memory"') == 2
    assert value("gpuheal_pod_interruptions", 'attribution="platform"') == 2
    assert value("gpuheal_repeat_failures", 'window="7d"') == 1 and value("gpuheal_repeat_failures", 'window="30d"') == 1


def test_gpuheal_outcomes_reads_the_ledger(tmp_path):
    led = SqliteLedger(tmp_path / "l.db")
    now = datetime.now(UTC)
    for r in (rec("a", "n1", 0), rec("b", "n2", 0, sku="blackwell")):
        led.record(r.model_copy(update={"started_at": now - timedelta(days=2), "ended_at": now - timedelta(days=2)}))
    led.record(rec("old", "n3", 0))  # 2026-11-01: outside --since 7d
    cli = [sys.executable, "-m", "workers.cli", "outcomes", "--ledger", str(tmp_path / "l.db")]
    run = subprocess.run([*cli, "--since", "7d", "--by", "sku", "--json"], cwd=ROOT, capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 0, run.stderr
    doc = json.loads(run.stdout)
    assert [e["episode"] for e in doc["episodes_list"]] == ["a", "b"] and set(doc["groups"]) == {"hopper", "blackwell"}
    text = subprocess.run([*cli, "--since", "all"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert text.returncode == 0 and "mean time to repair: 2.00 h" in text.stdout, text.stdout + text.stderr
    bad = subprocess.run([*cli, "--since", "lately"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--since 'lately'" in bad.stderr
    none = subprocess.run([*cli[:-2], "--ledger", str(tmp_path / "nope.db")], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert none.returncode == 2 and "no such ledger file" in none.stderr
