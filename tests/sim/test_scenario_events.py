"""Scenario `events:` (agent stop/start, another sender's report, operator commands, conditions,
a controller restart) and the side effects `simulate --json` reports per node."""

import json
import subprocess
import sys

import pytest

from sim.scenario import ScenarioError, load_scenario

EVENTS = """
name: events
time_scale: 0.002
budget: 1
fleet: {nodes: 3, jobs: [{name: j, nodes: [gpu-node-0, gpu-node-1], min_available: 1}]}
faults:
  - {node: gpu-node-1, at: 0s, kind: xid, xid: 79, gpu: 2, cured_by: reboot}
events:
  - {at: 1s, kind: agent_stop, node: gpu-node-2}
  - {at: 30m, kind: controller_restart}
  - {at: 40m, kind: agent_start, node: gpu-node-2}
  - {at: 50m, kind: operator, node: gpu-node-0, command: approve}
"""


@pytest.mark.parametrize("bad,problem", [
    ("events: [{kind: operator, node: gpu-node-0}]", "operator needs a command"),
    ("events: [{kind: agent_stop}]", "agent_stop needs a node"),
    ("events: [{kind: report, node: gpu-node-7}]", "events.0.node: unknown node 'gpu-node-7'"),
    ("events: [{kind: operator, node: gpu-node-0, command: skip}]", "skip needs a rung"),
    ("events: [{kind: reboot_everything, node: gpu-node-0}]", "events.0.kind"),
])
def test_bad_events_name_the_key(bad, problem):
    with pytest.raises(ScenarioError) as err:
        load_scenario(text=f"name: t\nfleet: {{nodes: 2}}\n{bad}\n")
    assert any(problem in p for p in err.value.problems), err.value.problems


@pytest.mark.timeout(300)
def test_simulate_json_reports_each_nodes_side_effects_through_events(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text(EVENTS)
    run = subprocess.run([sys.executable, "-m", "workers.cli", "simulate", str(f), "--json"], capture_output=True,
                         text=True, timeout=280)
    assert run.returncode == 0, run.stderr[-3000:]
    rows = {r["node"]: r for r in json.loads(run.stdout)["nodes"]}
    one = rows["gpu-node-1"]
    assert (one["outcome"], one["rungs"]) == ("returned", ["reboot"]), one
    fx = one["side_effects"]
    assert fx["reboots"] == 1 and not fx["terminated"] and fx["denylisted"] == [] and fx["resets"] == []
    assert fx["drained"] == ["default/j-1"], fx
    quiet = rows["gpu-node-0"]["side_effects"]
    assert quiet == {"drained": [], "killed": [], "resets": [], "reboots": 0, "terminated": False, "denylisted": []}
    assert rows["gpu-node-0"]["outcome"] == "healthy", "an approve with nothing to approve changes nothing"
