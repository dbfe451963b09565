"""The battery on simulated GPUs (real arithmetic, modelled time) and the real tools' output formats."""

import json
from pathlib import Path

import pytest

from health.load import tools
from health.load.battery import run_battery
from health.load.device import LoadTestUnavailable
from health.nvml import probe_nvml
from policies.load import GpuLoadResult, LoadTestPolicy, SkuReference, judge_against_kind
from policies.model import Policy
from sim.load_device import sim_opener
from sim.nvml import SimulatedNvml

LOAD = Policy().scaled(0.01).validation.load  # the quick tier's 30 s of GEMM in 0.3 s of device time


def battery(nv, **kw):
    return run_battery(sim_opener(nv), nv, kw.pop("policy", LOAD), kw.pop("tier", "quick"), **kw)


def test_healthy_node_passes_with_every_figure_named_per_gpu():
    nv = SimulatedNvml("n1", gpus=4)
    r = battery(nv)
    assert r.passed and not r.findings, r.findings
    assert r.tests == ["compute", "memory", "bandwidth", "peer", "clocks", "events"]
    assert [(g.index, g.uuid, g.serial) for g in r.gpus] == [(g.index, g.uuid, g.serial) for g in nv.gpus]
    f = r.gpus[0].figures
    assert f["tflops_sustained"] == pytest.approx(734, rel=0.01)  # the modelled burst: 0.3 s < the 5 s of burst
    assert f["hbm_read_tbps"] == pytest.approx(3.6) and f["hbm_mismatches"] == 0
    assert f["h2d_gbps"] == pytest.approx(55.4) and f["peer_gbps_min"] == pytest.approx(350)
    assert f["known_answer_checks"] >= 2 and f["abft_max_error"] < f["abft_tolerance"]
    # The SW power cap under full load is normal (30 of 31 samples on a real H200): seen, not failed.
    assert f["clock_sw_power_cap_samples"] >= 1 and r.gpus[0].failed == []
    assert nv.gpus[0].clock_reasons == 0  # the load's reasons end with the load


@pytest.mark.parametrize("fault,kind,test,words", [
    ("corrupt_under_load", "silent_data_corruption", "compute", "products under load"),
    ("hbm_cells", "memory_pattern", "memory", "words read back wrong"),
    ("slow_gpu", "degraded", "degraded", "below the Simulated H200 floor"),
    ("hw_slowdown_under_load", "clock_slowdown", "clocks", "hw_slowdown in"),
    ("xid_under_load", "xid", "events", "Xid 119"),
])
def test_each_load_fault_fails_its_test_on_its_gpu_only(fault, kind, test, words):
    nv = SimulatedNvml("n2", gpus=4)
    nv.inject(fault, gpu=2)
    assert probe_nvml(nv).findings == []  # invisible to every status query
    r = battery(nv)
    assert not r.passed
    mine = [f for f in r.findings if f.kind.value == kind]
    assert mine and {f.gpu_index for f in r.findings} == {2}, r.findings
    f = mine[0]
    assert (f.uuid, f.serial) == (nv.gpus[2].uuid, nv.gpus[2].serial)
    assert f.message.startswith(f"{test} under load (quick tier) on GPU 2 ({nv.gpus[2].uuid}") and words in f.message
    assert test in r.gpus[2].failed and all(not g.failed for g in r.gpus if g.index != 2)


def test_memory_fault_found_at_its_cells_in_one_polarity_each():
    nv = SimulatedNvml("n3", gpus=1)
    nv.inject("hbm_cells", gpu=0)
    r = battery(nv)
    passes = r.gpus[0].figures["hbm_passes"]
    assert r.gpus[0].figures["hbm_mismatches"] == 3 * passes  # 3 stuck cells, seen once per pass


def test_seventy_percent_gpu_is_degraded_against_its_fleet_median():
    nv = SimulatedNvml("n4", gpus=2)
    nv.inject("slow_gpu", gpu=1)
    fleet = SkuReference(sku="Simulated H200", nodes=12, medians={"tflops_sustained": 734, "d2d_tbps": 1.9})
    r = battery(nv, references={"Simulated H200": fleet})
    (f,) = [f for f in r.findings if f.kind.value == "degraded"]
    assert f.gpu_index == 1 and "tflops_sustained 514 is 70% of the Simulated H200 fleet median 734 (12 nodes)" in f.message


def test_judged_against_floors_until_enough_nodes_then_the_median():
    policy = LoadTestPolicy()
    gpu = GpuLoadResult(index=0, uuid="u", sku="NVIDIA H200", figures={"tflops_sustained": 560.0})
    assert judge_against_kind(gpu, policy, None) == []  # above the 530 floor
    few = SkuReference(sku="NVIDIA H200", nodes=2, medians={"tflops_sustained": 700.0})
    assert judge_against_kind(gpu, policy, few) == []  # two nodes are no fleet yet
    many = few.model_copy(update={"nodes": 5})
    assert judge_against_kind(gpu, policy, many) == [
        "tflops_sustained 560 is 80% of the NVIDIA H200 fleet median 700 (5 nodes)"]
    slow = gpu.model_copy(update={"figures": {"tflops_sustained": 500.0}})
    assert "below the NVIDIA H200 floor 530" in judge_against_kind(slow, policy, None)[0]


def test_fails_closed_when_no_load_test_is_possible():
    nv = SimulatedNvml("n5", gpus=2)

    def no_cupy(_):
        raise LoadTestUnavailable("CuPy is not installed")
    r = run_battery(no_cupy, nv, LOAD, "quick")
    assert not r.passed and [f.kind.value for f in r.findings] == ["probe_broken"]
    assert "could not run: CuPy is not installed" in r.findings[0].message
    nv.inject("gpu_lost", gpu=1)
    assert "GPU 1 cannot be used" in battery(nv).findings[0].message


def test_never_beside_gpu_processes():
    nv = SimulatedNvml("n6", gpus=2)
    nv.gpus[1].processes = [(4242, 1 << 30)]
    r = battery(nv)
    assert not r.passed and "GPU processes still present ([4242])" in r.findings[0].message


def test_past_its_deadline_is_probe_broken():
    policy = LoadTestPolicy()  # 30 s of simulated GEMM per GPU cannot finish in 50 ms of wall clock
    policy.quick.time_limit = policy.quick.time_limit / 3600
    r = battery(SimulatedNvml("n7", gpus=2), policy=policy)
    assert not r.passed and r.findings[0].kind.value == "probe_broken" and "time limit passed" in r.findings[0].message


def test_gpus_subset():
    nv = SimulatedNvml("n8", gpus=4)
    assert [g.index for g in battery(nv, gpus=[0, 3]).gpus] == [0, 3]


# --- the tools' own output ---------------------------------------------------------------------
DCGM3 = {"DCGM GPU Diagnostic": {"test_categories": [
    {"category": "Deployment", "tests": [{"name": "Blacklist", "results": [{"gpu_ids": "0,1", "status": "PASS"}]}]},
    {"category": "Hardware", "tests": [{"name": "Memory", "results": [
        {"gpu_ids": "0", "status": "Pass"}, {"gpu_ids": "1", "status": "Fail",
                                              "warnings": ["ecc_dbe_volatile_total"]}]}]}]}}
DCGM4 = {"DCGM Diagnostic": {"test_categories": [{"category": "Stress", "tests": [{"name": "targeted_stress", "results": [
    {"entity_group": "GPU", "entity_id": 0, "status": "Fail"}, {"entity_group": "GPU", "entity_id": 1, "status": "Pass"}]}]}]}}


def test_dcgm_diag_parsed_per_test_and_gpu():
    assert tools.dcgm_failures(tools.parse_dcgm_diag("noise\n" + json.dumps(DCGM3))) == [(1, "Memory: Fail")]
    assert tools.parse_dcgm_diag(json.dumps(DCGM4)) == {"targeted_stress": {0: "Fail", 1: "Pass"}}
    with pytest.raises(ValueError, match="no JSON"):
        tools.parse_dcgm_diag("Error: unable to connect to host engine")


def test_all_reduce_and_nvbandwidth_parsed():
    assert tools.parse_all_reduce("#  Out of bounds values : 0 OK\n# Avg bus bandwidth    : 461.275 \n#\n") == 461.275
    text = "memcpy CE CPU(row) -> GPU(column) bandwidth (GB/s)\n 0  55.12\nSUM host_to_device_memcpy_ce 55.12\n" \
           "SUM device_to_host_memcpy_ce 54.90\n"
    assert tools.parse_nvbandwidth(text) == {"host_to_device_memcpy_ce": 55.12, "device_to_host_memcpy_ce": 54.90}
    with pytest.raises(ValueError):
        tools.parse_all_reduce("NCCL WARN ...")


def test_dcgm_run_by_the_tier_names_the_failing_gpu(tmp_path: Path):
    dcgmi = tmp_path / "dcgmi"
    dcgmi.write_text(f"#!/bin/sh\ncat <<'EOF'\n{json.dumps(DCGM3)}\nEOF\nexit 226\n")
    dcgmi.chmod(0o755)
    policy = LOAD.model_copy(deep=True)
    policy.quick.dcgm_level = 2
    r = battery(SimulatedNvml("n9", gpus=2), policy=policy, tool_names={"dcgmi": str(dcgmi)})
    assert "dcgm-r2" in r.tests and [(f.gpu_index, f.kind.value) for f in r.findings] == [(1, "load_test_failed")]
    assert "dcgm under load (quick tier) on GPU 1" in r.findings[0].message and "Memory: Fail" in r.findings[0].message


def test_a_run_that_ends_past_its_time_limit_fails_even_when_every_test_passed(monkeypatch):
    import health.load.battery as b

    monkeypatch.setattr(b, "_one_gpu", lambda dev, policy, tier, deadline: ({}, {}, None))  # every test "passed"
    monkeypatch.setattr(b, "_past", lambda deadline: True)  # ... but the clock ran out
    r = battery(SimulatedNvml("n10", gpus=2))
    assert not r.passed and [f.kind.value for f in r.findings] == ["probe_broken"]
    assert "past the tier's time limit of 0:00:10" in r.findings[0].message
