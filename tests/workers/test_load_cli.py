"""`gpuheal validate` and `gpuheal baseline` as a person runs them."""

import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta

import api as c
from activities.ledger import SqliteLedger
from activities.load_ledger import SqliteFigures
from policies.load import GpuLoadResult


def gpuheal(*args: str, timeout: int = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "workers.cli", *args], capture_output=True, text=True, timeout=timeout)


def test_validate_without_a_gpu_could_not_run_in_one_line():
    """This machine has no NVIDIA driver: exit 2, one JSON line with the reason, never a pass."""
    run = gpuheal("validate", "--json")
    assert run.returncode == 2, run.stderr
    (line,) = run.stdout.splitlines()
    doc = json.loads(line)
    assert doc["passed"] is False and doc["could_not_run"].startswith("load test (quick) could not run: NVML")
    assert run.stderr.count("\n") == 1 and "could not run" in run.stderr


def test_validate_refuses_bad_gpus():
    run = gpuheal("validate", "--gpus", "0,x")
    assert run.returncode == 2 and "--gpus '0,x': a comma-separated list" in run.stderr


def figures(node: str, i: int, tflops: float) -> GpuLoadResult:
    return GpuLoadResult(index=i, uuid=f"GPU-{node}-{i}", serial=f"SN-{node}-{i}", sku="NVIDIA H200",
                         figures={"tflops_sustained": tflops, "h2d_gbps": 55.0})


def test_baseline_shows_each_sku_and_its_outliers(tmp_path):
    path = tmp_path / "ledger.db"
    store = SqliteFigures(SqliteLedger(path))
    at = datetime(2026, 12, 1, tzinfo=UTC)
    for n in range(6):
        node = f"gpu-node-{n}"
        tflops = 450.0 if n == 4 else 650.0 + n
        store.record(c.LoadFiguresRecord(node=node, episode=f"e{n}", tier="quick", at=at,
                                         gpus=[figures(node, 0, tflops), figures(node, 1, 651.0)]))
    # A newer measurement replaces a GPU's older one in the median.
    store.record(c.LoadFiguresRecord(node="gpu-node-0", episode="e-late", tier="repair", at=at + timedelta(hours=1),
                                     gpus=[figures("gpu-node-0", 0, 652.0)]))
    run = gpuheal("baseline", "--ledger", str(path), "--json")
    assert run.returncode == 0, run.stderr
    doc = json.loads(run.stdout)
    (sku,) = doc["skus"]
    assert (sku["sku"], sku["nodes"], sku["judged_by"]) == ("NVIDIA H200", 6, "fleet median")
    assert sku["medians"] == {"tflops_sustained": 651.0, "h2d_gbps": 55.0} and sku["floors"]["tflops_sustained"] == 530
    assert doc["outliers"] == ["gpu-node-4 GPU-gpu-node-4-0: tflops_sustained 450 = 69% of the NVIDIA H200 median"]
    assert "NVIDIA H200: 6 nodes, judged by fleet median" in gpuheal("baseline", "--ledger", str(path)).stdout


def test_baseline_without_a_ledger_says_so():
    run = gpuheal("baseline", "--ledger", "/nonexistent/ledger.db")
    assert run.returncode == 2 and "no ledger at /nonexistent/ledger.db" in run.stderr


def test_report_takes_an_xid_or_a_suspicion():
    run = gpuheal("report", "n1", "--xid", "79", "--suspect", "slow")
    assert run.returncode == 2 and "not allowed with argument" in run.stderr
    run = gpuheal("report", "n1", "--xid", "79")
    assert run.returncode == 2 and "--xid needs --gpu" in run.stderr
