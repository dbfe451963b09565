"""The load-faults scenario end to end: real controller, agents, fake API server, moto and the
battery on simulated GPUs. Each GPU passes every NVML check and fails only under load."""

from datetime import timedelta

import pytest

from sim.runner import run_scenario
from sim.scenario import BUILTIN_SCENARIOS, load_scenario
from workers import operator as op
from workers.operator import OperatorError

pytestmark = pytest.mark.timeout(300)


async def test_load_faults_are_found_under_load_and_climb_the_ladder_only_when_the_test_fails():
    scenario, policy = load_scenario(BUILTIN_SCENARIOS / "load-faults.yaml")
    seen = {}

    async def after(doc, fleet):
        for node in ("gpu-node-0", "gpu-node-1", "gpu-node-5"):
            seen[node] = await op.history(fleet.temporal, node, fleet.cluster)
        seen["denied"] = fleet.ledger.denied([g.uuid for g in fleet.hosts["gpu-node-0"].nv.gpus])
        seen["figures"] = fleet.ledger.db.execute(
            "SELECT node, serial, tier, figures FROM load_figures WHERE node = 'gpu-node-5'").fetchall()
        with pytest.raises(OperatorError, match="suspect reports are limited to one per 1:00:00 per node"):
            await op.suspect_report(fleet.temporal, "gpu-node-5", "again", timedelta(hours=1), fleet.cluster,
                                    fleet.task_queue)

    doc = await run_scenario(scenario, policy, after=after)
    rows = {r["node"]: r for r in doc["nodes"]}
    got = {n: (r["outcome"], r["fault_class"], r["rungs"]) for n, r in rows.items() if n in
           ("gpu-node-0", "gpu-node-1", "gpu-node-2", "gpu-node-3", "gpu-node-4", "gpu-node-5")}
    assert got == {
        # corrupts a product under load, nothing cures it: off the fleet per the ladder
        "gpu-node-0": ("replaced", "silent_data_corruption", ["reset", "reboot", "replace"]),
        # 70% of its kind's throughput: degraded; a reboot (in this scenario) cures it
        "gpu-node-1": ("returned", "degraded", ["reset", "reboot"]),
        "gpu-node-2": ("returned", "memory_pattern", ["reset"]),
        "gpu-node-3": ("returned", "clock_slowdown", ["reset", "reboot"]),
        "gpu-node-4": ("returned", "xid", ["reset"]),
        # suspected but healthy: drained, load-tested, returned with no rung
        "gpu-node-5": ("healthy", "suspect", []),
    }, [(e["outcome"], e["reason"]) for e in seen["gpu-node-0"]]
    # The finding names the GPU and the test; only that GPU's ids are denylisted.
    steps = [s for e in seen["gpu-node-0"] for s in e["steps"]]
    first = next(s for s in steps if s["step"] == "node.validate")
    assert "suspect" in first["summary"] and "repair load test" in first["summary"]
    assert "compute under load (repair tier) on GPU 3 (GPU-gpu-node-0-03, serial SN-gpu-node-0-1)" in first["detail"]
    assert set(seen["denied"]) == {"GPU-gpu-node-0-03"}
    # A degraded GPU names its figure against its kind.
    steps = [s for e in seen["gpu-node-1"] for s in e["steps"]]
    assert any("tflops_sustained" in s["detail"] and "GPU 5" in s["detail"] for s in steps if s["step"] == "node.validate")
    # The healthy suspect's figures are in its history and in the ledger, per GPU serial.
    steps = [s for e in seen["gpu-node-5"] for s in e["steps"]]
    (v,) = [s for s in steps if s["step"] == "node.validate"]
    assert v["detail"].startswith("passed") and "load repair passed" in v["detail"] and "SN-gpu-node-5-0" in v["detail"]
    assert {(r[0], r[2]) for r in seen["figures"]} == {("gpu-node-5", "repair")} and len(seen["figures"]) == 8
    assert any(s["step"] == "kube.return_to_service" and s["ok"] for s in steps)
