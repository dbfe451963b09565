"""The Grafana dashboard and the Prometheus alert rules under deploy/monitoring/: valid, naming
only metrics gpuheal exports, and the rules unit-tested with promtool (`.ci/run` installs it from
Debian's `prometheus` package; without it the promtool test says so and does not run)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import yaml

from policies.loader import default_policy
from tests.net import free_port
from tests.workflows.fake_node import FakeNode
from tests.workflows.fakes import FakeFleet, xid
from workers import telemetry
from workers.temporal_client import TemporalOptions, connect

ROOT = Path(__file__).resolve().parents[2]
MON = ROOT / "deploy" / "monitoring"
SUFFIXES = {"histogram": ("_bucket", "_sum", "_count")}
# PromQL's own words and functions, and label names, that the metric-name pattern also matches.
NOT_METRICS = {"sum", "by", "rate", "increase", "histogram_quantile", "max", "min", "or", "unless", "offset", "and",
               "le", "label_values", "min_over_time", "count", "on"}


def metric_names(expr: str) -> set[str]:
    """Identifiers in a PromQL expression that are not functions, keywords, label names or strings."""
    text = re.sub(r'"[^"]*"', '""', expr)
    text = re.sub(r"label_values\(([^,()]+),\s*\w+\s*\)", r"\1", text)  # Grafana's variable query
    text = re.sub(r"\{[^}]*\}", "{}", text)  # label matchers
    text = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", "", text)  # grouping labels
    text = re.sub(r"\[[^\]]*\]", "[]", text)
    return {t for t in re.findall(r"\b[a-zA-Z_:][a-zA-Z0-9_:]*\b", text) if t not in NOT_METRICS and not t.startswith("$")}


def exported(name: str) -> bool:
    for metric, kind in telemetry.EXPORTED_METRICS.items():
        if name == metric or name in {metric + s for s in SUFFIXES.get(kind, ())}:
            return True
    return False


def dashboard_exprs() -> list[str]:
    doc = json.loads((MON / "grafana-dashboard.json").read_text())
    out = [t["expr"] for p in doc["panels"] for t in p.get("targets", [])]
    out += [v["query"] for v in doc["templating"]["list"] if v["type"] == "query"]
    return out


def rule_exprs() -> list[str]:
    return [r["expr"] for g in yaml.safe_load((MON / "alert-rules.yaml").read_text())["groups"] for r in g["rules"]]


def test_the_dashboard_is_valid_json_and_every_query_names_exported_metrics():
    doc = json.loads((MON / "grafana-dashboard.json").read_text())
    assert doc["uid"] and doc["schemaVersion"] >= 36
    titles = [p["title"] for p in doc["panels"] if p["type"] != "row"]
    for wanted in ("Availability", "by outcome", "Detect to cordon", "budget", "Waiters", "breaker", "attribution",
                   "Node-hours lost"):
        assert any(wanted.lower() in t.lower() for t in titles), (wanted, titles)
    ids = [p["id"] for p in doc["panels"]]
    assert len(ids) == len(set(ids))
    for expr in dashboard_exprs():
        names = metric_names(expr)
        assert names, expr
        assert all(exported(n) for n in names), (expr, [n for n in names if not exported(n)])
    assert (MON / "grafana-dashboard.json").read_text() == _generated(), "run python deploy/monitoring/dashboard.py"


def _generated() -> str:
    run = subprocess.run([sys.executable, "-c", "import runpy; m = runpy.run_path('deploy/monitoring/dashboard.py');"
                          " print(m['render'](), end='')"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    return run.stdout


def test_every_alert_rule_names_exported_metrics():
    names = [r["alert"] for g in yaml.safe_load((MON / "alert-rules.yaml").read_text())["groups"] for r in g["rules"]]
    assert len(names) == len(set(names)) == 7
    for expr in rule_exprs():
        found = metric_names(expr)
        assert found and all(exported(n) for n in found), (expr, found)


def test_the_metric_checker_catches_a_name_gpuheal_does_not_export():
    assert metric_names('sum by (cluster) (rate(gpuheal_detect_to_cordon_bucket{cluster=~"$c"}[5m]))') == {
        "gpuheal_detect_to_cordon_bucket"}
    assert not exported("gpuheal_detect_to_cordon_total") and not exported("gpuheal_remediations_total")
    assert not exported("gpuheal_guard_budget_bucket") and exported("gpuheal_time_to_repair_count")


def test_exported_metrics_are_the_ones_the_code_creates():
    """The list is what the source creates: every gpuheal_* name in workflows/, activities/ and workers/."""
    found = set()
    for d in ("workflows", "activities", "workers"):
        for f in (ROOT / d).glob("*.py"):
            found |= set(re.findall(r'"(gpuheal_[a-z_]+)"', f.read_text()))
    assert found == set(telemetry.EXPORTED_METRICS), found ^ set(telemetry.EXPORTED_METRICS)


async def test_an_episode_exports_the_guard_and_episode_metrics_by_those_names(dev_env, uniq):
    port = free_port()
    address = dev_env.client.service_client.config.target_host
    client = await connect(opts=TemporalOptions(address=address, metrics=f"prometheus://127.0.0.1:{port}"))
    fleet = FakeFleet(client=client, task_queue=f"mon-{uniq}", policy=default_policy().scaled(0.001),
                      cluster=f"mon-{uniq}")
    node = fleet.add(FakeNode(f"mon-{uniq}", [xid(48)], cured_by="reset"))
    async with fleet.workers():
        handle = await fleet.report(node.name)
        await handle.result()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            text = r.read().decode()
    shown = {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line.startswith("gpuheal_")}
    for name in ("gpuheal_remediations", "gpuheal_detect_to_cordon_bucket", "gpuheal_guard_budget",
                 "gpuheal_guard_waiting", "gpuheal_fleet_nodes", "gpuheal_nodes_unhealthy", "gpuheal_guard_deferred",
                 "gpuheal_guard_oldest_deferred_seconds", "gpuheal_storm_breaker_open"):
        assert name in shown, (name, sorted(shown))
    assert all(exported(n) for n in shown), sorted(n for n in shown if not exported(n))


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is not on the PATH")
def test_the_alert_rules_pass_promtool_check_and_their_unit_tests():
    check = subprocess.run(["promtool", "check", "rules", "alert-rules.yaml"], cwd=MON, capture_output=True, text=True,
                           timeout=60)
    assert check.returncode == 0 and "SUCCESS: 7 rules found" in check.stdout, check.stdout + check.stderr
    test = subprocess.run(["promtool", "test", "rules", "alert-rules.test.yaml"], cwd=MON, capture_output=True,
                          text=True, timeout=120)
    assert test.returncode == 0 and "SUCCESS" in test.stdout, test.stdout + test.stderr
