"""Fleet what-if: the real workflows on the time-skipping server against modelled faults."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sim.whatif.engine import run_whatif, simulate_policy
from sim.whatif.faultmodel import FaultModel, FaultModelError, draw_faults, load_fault_model

ROOT = Path(__file__).resolve().parents[2]


def model(text: str) -> FaultModel:
    import yaml

    return FaultModel.model_validate(yaml.safe_load(text))


BUSY = """
name: busy
classes:
  memory: {rate: 40, finding: {kind: ecc_dbe}, cured_by: {reset: 0.5, reboot: 0.3, replace: 0.2},
           recurrence: {probability: 0.3, window: 2d}}
  lost: {rate: 20, finding: {kind: xid, xid: 79}, cured_by: {reboot: 0.7, replace: 0.3}}
  app: {rate: 10, finding: {kind: xid, xid: 13}, cured_by: {kill: 1.0}}
"""


def test_a_bad_fault_model_is_refused_with_the_key_named(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nclasses:\n  a: {rate: 1, finding: {kind: xid}, cured_by: {reset: 0.5}, colour: red}\n")
    with pytest.raises(FaultModelError) as err:
        load_fault_model(bad)
    text = "; ".join(err.value.problems)
    assert "classes.a.colour: unknown key" in text
    assert "classes.a.finding: an xid is given exactly when kind is xid" in text
    run = subprocess.run([sys.executable, "-m", "workers.cli", "whatif", str(bad), "--nodes", "5", "--days", "1"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "classes.a.colour: unknown key" in run.stderr, run.stderr
    bad.write_text("name: x\nclasses:\n  a: {rate: 1, finding: {kind: ecc_dbe}, cured_by: {reset: 0.5, reboot: 0.2}}\n")
    with pytest.raises(FaultModelError, match="classes.a: cured_by: probabilities must be at least 0 and sum to 1"):
        load_fault_model(bad)


def test_the_shipped_model_loads_and_its_rates_are_in_the_published_range():
    m = load_fault_model("large-cluster")
    total = sum(c.rate for c in m.classes.values())
    assert 2.0 <= total <= 7.0, f"{total} per 1,000 node-days: outside Meta's 2-7"


def test_the_faults_drawn_depend_on_the_seed_only():
    m = model(BUSY)
    a, b = draw_faults(m, 100, 10, seed=7), draw_faults(m, 100, 10, seed=7)
    assert a == b and len(a) > 30
    assert draw_faults(m, 100, 10, seed=8) != a
    assert all(x.at_s <= y.at_s for x, y in zip(a, a[1:], strict=False))


@pytest.mark.timeout(300)
async def test_a_fault_cured_by_reset_is_reset_by_default_and_replaced_by_replace_only():
    """The stand-in fleet obeys the model: what the ladder does shows in the counts."""
    m = model("name: resets\nclasses:\n  mem: {rate: 60, finding: {kind: ecc_dbe}, cured_by: {reset: 1.0}}\n")
    faults = len(draw_faults(m, 30, 5, seed=3))
    default = await simulate_policy(m, "default", 30, 5, 3)
    assert faults >= 4 and default.faults == faults
    assert default.resets == faults and default.replacements == 0 and default.reboots == 0
    assert default.episodes == {"returned": faults}
    assert default.jobs_interrupted <= faults and default.node_hours_lost > 0
    replace = await simulate_policy(m, "replace-only", 30, 5, 3)
    # A fault drawn for a machine already out being replaced strikes nothing: it is dropped.
    struck = faults - replace.faults_dropped
    assert replace.faults == faults and struck >= faults - 2
    assert replace.replacements == struck and replace.resets == 0 and replace.denylisted_nodes == struck
    assert replace.node_hours_lost > default.node_hours_lost


@pytest.mark.timeout(300)
async def test_a_run_whose_server_clock_stops_starts_again_with_the_same_figures(monkeypatch):
    """The time-skipping server can stop moving (sim/whatif/clock.off_grid). The first attempt here
    is made to look stuck at once (no wall time allowed for a day): it is torn down, run again on a
    fresh server, and gives what an undisturbed run gives, saying it took one restart."""
    from sim.whatif import engine

    m = model("name: resets\nclasses:\n  mem: {rate: 60, finding: {kind: ecc_dbe}, cured_by: {reset: 1.0}}\n")
    plain = await simulate_policy(m, "default", 10, 2, 5)
    once = engine._simulate_once
    stall_s = engine.STALL_S

    async def first_attempt_stuck(*args):
        engine.STALL_S = 0.0 if args[-1] == 0 else stall_s
        return await once(*args)

    monkeypatch.setattr(engine, "STALL_PER_FAULT_S", 0.0)

    monkeypatch.setattr(engine, "_simulate_once", first_attempt_stuck)
    restarted = await simulate_policy(m, "default", 10, 2, 5)
    assert (plain.clock_restarts, restarted.clock_restarts) == (0, 1)
    assert restarted.model_dump(exclude={"wall_s", "clock_restarts"}) == plain.model_dump(
        exclude={"wall_s", "clock_restarts"})
    monkeypatch.setattr(engine, "STALL_S", 0.0)
    monkeypatch.setattr(engine, "_simulate_once", once)
    with pytest.raises(engine.WhatIfError, match="started again 2 times"):
        await simulate_policy(m, "default", 10, 2, 5)


@pytest.mark.timeout(600)
def test_one_seed_gives_the_same_numbers_twice():
    """50 nodes for 10 days, twice (two processes, two servers, one after the other: two at once can
    stall under load, see run_whatif): every figure equal."""
    m = model(BUSY)
    a, b = run_whatif(m, ["default", "default"], 50, 10, seed=11, jobs=1)
    assert a.faults >= 20, a.faults
    assert a.model_dump(exclude={"wall_s", "clock_restarts"}) == b.model_dump(exclude={"wall_s", "clock_restarts"})


@pytest.mark.timeout(600)
def test_the_default_policy_loses_fewer_node_hours_than_replace_only_on_the_shipped_model():
    """120 nodes for 20 days draws 10 faults at seed 1 (bench/whatif.py runs the full 300 x 30)."""
    run = subprocess.run([sys.executable, "-m", "workers.cli", "whatif", "large-cluster", "--nodes", "120",
                          "--days", "20", "--policy", "default", "--policy", "replace-only", "--json"],
                         cwd=ROOT, capture_output=True, text=True, timeout=580)
    assert run.returncode == 0, run.stderr[-2000:]
    doc = json.loads(run.stdout)
    default, replace = doc["policies"]
    assert default["faults"] == replace["faults"] >= 8
    assert default["node_hours_lost"] < replace["node_hours_lost"]
    assert default["availability"] > replace["availability"]
    assert default["replacements"] < replace["replacements"]


def _test_servers_under(pid: int) -> set[int]:
    """temporal-test-server processes whose parent is a child of `pid` (a policy's process)."""
    def parent(p: str) -> int:
        return int(Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[1])
    found = set()
    for p in (p for p in Path("/proc").iterdir() if p.name.isdigit()):
        try:
            if b"temporal-test-server" in (p / "cmdline").read_bytes() and parent(str(parent(p.name))) == pid:
                found.add(int(p.name))
        except (OSError, ValueError, IndexError):
            continue
    return found


@pytest.mark.timeout(120)
def test_an_interrupted_run_leaves_no_process_behind():
    """Ctrl-C on a long run: the policies' processes and their test servers are gone with it."""
    import os
    import signal
    import time

    cli = subprocess.Popen([sys.executable, "-m", "workers.cli", "whatif", "large-cluster", "--nodes", "1000",
                            "--days", "300", "--jobs", "2"], cwd=ROOT, stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while len(servers := _test_servers_under(cli.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert len(servers) == 2, "both policies' test servers should be running"
        os.kill(cli.pid, signal.SIGINT)
        cli.wait(timeout=30)
        time.sleep(1)
        left = {p for p in servers if Path(f"/proc/{p}").exists()
                and Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"}
        assert not left, f"test servers left running: {left}"
    finally:
        if cli.poll() is None:
            os.killpg(cli.pid, signal.SIGKILL)


async def test_a_mass_failure_stays_under_max_unhealthy_trickles_canaries_and_every_node_comes_back(tmp_path):
    """Issue 25: many nodes of a fleet fail at once. The guard quarantines at most max_unhealthy,
    the storm breaker opens, leases trickle as canaries that step up as they come back, and in the
    end every node is back in service."""
    from sim.whatif.faultmodel import mass_failure

    m = model("name: push\nclasses:\n  gsp: {rate: 0.01, finding: {kind: xid, xid: 119}, cured_by: {reset: 0.6, reboot: 0.4}}\n")
    policy = tmp_path / "storm.yaml"
    policy.write_text("guard: {max_unhealthy: 5, max_disruptive: 4}\n")
    faults = mass_failure(m, 40, 16, "gsp", seed=2)
    assert len({f.slot for f in faults}) == 16 and {f.at_s for f in faults} == {600.0}
    out = await simulate_policy(m, str(policy), 40, 3, 2, faults=faults)
    assert out.max_unhealthy == 5 and 0 < out.peak_quarantined <= 5, out
    assert out.guard_trips >= 1, "16 new faults within the storm window open the breaker"
    assert any(c.startswith("proven") for c in out.canaries), out.canaries
    assert out.episodes == {"returned": 16} and out.down_at_end == 0, out
    assert out.resets == 16 and 0 < out.reboots < 16 and out.replacements == 0  # reset first, then reboot


def test_a_mass_failure_names_what_is_wrong():
    from sim.whatif.faultmodel import mass_failure

    m = model(BUSY)
    with pytest.raises(FaultModelError, match="classes.cosmic: no such class"):
        mass_failure(m, 10, 5, "cosmic")
    with pytest.raises(ValueError, match="between 1 and the fleet's 10 nodes, not 11"):
        mass_failure(m, 10, 11, "memory")


@pytest.mark.parametrize("arg,said", [
    ("70:gsp", "N from 1 to --nodes (60)"),
    ("gsp", "--mass-failure takes N:CLASS"),
    ("7:cosmic", "classes.cosmic: no such class (one of faulty_gpu,"),
])
def test_the_cli_refuses_a_bad_mass_failure_naming_what_is_wrong(arg, said):
    run = subprocess.run([sys.executable, "-m", "workers.cli", "whatif", "large-cluster", "--nodes", "60",
                          "--mass-failure", arg], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert run.returncode == 2 and said in run.stderr, run.stderr
