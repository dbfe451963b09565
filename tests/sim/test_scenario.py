"""The scenario format, and `gpuheal simulate` end to end on the embedded servers."""

import json
import subprocess
import sys

import pytest

from sim.scenario import ScenarioError, load_scenario

GOOD = """
name: t
time_scale: 0.01
budget: 1
fleet: {nodes: 3, jobs: [{name: j, nodes: [gpu-node-0, gpu-node-1], min_available: 1}]}
faults:
  - {node: gpu-node-1, at: 0s, kind: xid, xid: 79, gpu: 2, cured_by: reboot}
"""


def test_loads_and_scales():
    sc, policy = load_scenario(text=GOOD)
    assert sc.fleet.names() == ["gpu-node-0", "gpu-node-1", "gpu-node-2"]
    assert policy.guard.max_disruptive == 1
    assert policy.validation.soak.total_seconds() == pytest.approx(6.0)


@pytest.mark.parametrize("bad,problem", [
    ("name: t\nfleet: {nodes: 2, gpus: 8}\n", "fleet.gpus: unknown key"),
    ("name: t\nfaults: [{node: gpu-node-9, kind: gpu_lost}]\n", "unknown node 'gpu-node-9'"),
    ("name: t\nfaults: [{node: gpu-node-0, kind: cosmic_ray}]\n", "faults.0.kind"),
    ("name: t\nfaults: [{node: gpu-node-0, kind: xid}]\n", "kind xid needs an xid"),
    ("name: t\nfaults: [{node: gpu-node-0, kind: gpu_lost, at: soon}]\n", "faults.0.at: must be a duration like 10m"),
    ("name: t\npolicy: nope.yaml\n", "policy: (file): cannot read"),
    ("fleet: {}\n", "name: required key is missing"),
])
def test_bad_scenarios_name_the_key(bad, problem):
    with pytest.raises(ScenarioError) as err:
        load_scenario(text=bad)
    assert any(problem in p for p in err.value.problems), err.value.problems


def test_cli_refuses_bad_scenario(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text("name: t\nfleet: {nodez: 2}\n")
    run = subprocess.run([sys.executable, "-m", "workers.cli", "simulate", str(f)], capture_output=True, text=True)
    assert run.returncode == 2 and "fleet.nodez: unknown key" in run.stderr


def test_simulate_json_document(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text(GOOD.replace("time_scale: 0.01", "time_scale: 0.002"))
    run = subprocess.run([sys.executable, "-m", "workers.cli", "simulate", str(f), "--json"], capture_output=True,
                         text=True, timeout=240)
    assert run.returncode == 0, run.stderr[-2000:]
    doc = json.loads(run.stdout)
    rows = {r["node"]: r for r in doc["nodes"]}
    assert set(rows) == {"gpu-node-0", "gpu-node-1", "gpu-node-2"}
    r = rows["gpu-node-1"]
    assert (r["outcome"], r["fault_class"], r["attribution"], r["rungs"], r["validations"]) == \
        ("returned", "gpu_lost", "platform", ["reboot"], 2)
    assert r["workflow_id"].startswith("remediate/sim-") and r["workflow_id"].endswith("/gpu-node-1") and r["run_ids"] and r["history_events"] > 0
    assert rows["gpu-node-0"]["outcome"] == "healthy" and rows["gpu-node-0"]["attribution"] is None
    assert doc["fleet"]["max_disruptive_at_once"] == 1 and doc["fleet"]["evictions_breaking_budget"] == 0


def test_simulate_past_its_deadline_says_what_waits_and_exits_1(tmp_path):
    """A fault that needs a person (replace waits for approval in this policy) cannot settle: at the
    scenario's deadline simulate prints every node's row, the unfinished one `waiting` with why."""
    policy = tmp_path / "p.yaml"
    policy.write_text("ladder: {replace: {requires_approval: true, approval_timeout: 100d}}\n")
    f = tmp_path / "s.yaml"
    f.write_text(f"name: stuck\ntime_scale: 0.002\npolicy: {policy}\ndeadline: 2h\nfleet: {{nodes: 3}}\n"
                 "faults:\n  - {node: gpu-node-1, kind: row_remap_failure, gpu: 2, cured_by: none}\n")
    run = subprocess.run([sys.executable, "-m", "workers.cli", "simulate", str(f), "--json"], capture_output=True,
                         text=True, timeout=240)
    assert run.returncode == 1, run.stderr[-2000:]
    doc = json.loads(run.stdout)
    row = next(r for r in doc["nodes"] if r["node"] == "gpu-node-1")
    assert doc["deadline_passed"] and row["outcome"] == "waiting"
    assert row["waiting"].startswith("approval to replace"), row
