"""Done-when checks of node profiles, on the simulated NVML and sysfs: what a healthy node of each
kind looks like, and what is flagged against its profile or its baseline."""

from datetime import UTC, datetime

import pynvml

from health.nvml import probe_nvml
from health.nvml_session import nvml_session
from health.runner import ProbeConfig, run_cycle
from policies.baseline import NodeBaseline
from policies.loader import default_policy
from sim.nvml import SimulatedNvml
from sim.sysfs import EFA_UP, PORT_DOWN, PORT_UP, write_efa_ports, write_ib_ports


def config_for(profile: str, sysfs, baseline=None) -> ProbeConfig:
    cfg = ProbeConfig(sysfs_infiniband=sysfs, require_nvidia_smi=False)
    cfg.apply_profile(profile, default_policy().profiles[profile] if profile else None, baseline)
    return cfg


def test_single_gpu_h200_without_rdma_is_healthy(tmp_path):
    # The reference machine: one H200, /sys/class/infiniband present and empty (gpu-load.md).
    (tmp_path / "ib").mkdir()
    snap = run_cycle(config_for("h200-1gpu-no-rdma", tmp_path / "ib"), SimulatedNvml("h200", gpus=1))
    assert snap.findings == []
    # ... and with no infiniband directory at all: the same meaning, healthy.
    snap = run_cycle(config_for("h200-1gpu-no-rdma", tmp_path / "absent"), SimulatedNvml("h200b", gpus=1))
    assert snap.findings == []
    assert snap.inventory.summary() == "1 GPUs, no RDMA ports, PCIe Gen5 x16"


def test_no_expectation_is_guessed_from_the_generation(tmp_path):
    # No profile, no baseline: an 8-GPU Hopper node without adapters is not sent to reboot.
    snap = run_cycle(ProbeConfig(sysfs_infiniband=tmp_path / "absent", require_nvidia_smi=False),
                     SimulatedNvml("bare", gpus=8))
    assert snap.findings == []


def test_p5_like_efa_node_is_healthy(tmp_path):
    root = write_efa_ports(tmp_path / "ib", [EFA_UP] * 32)
    snap = run_cycle(config_for("aws-p5", root), SimulatedNvml("p5", gpus=8))
    assert snap.findings == []
    assert snap.inventory.summary() == "8 GPUs, 32x100 Gb/s efa, PCIe Gen5 x16"


def test_infiniband_node_losing_one_of_eight_ports_is_flagged(tmp_path):
    root = write_ib_ports(tmp_path / "ib", [PORT_UP] * 7 + [PORT_DOWN])
    [f] = run_cycle(config_for("hopper-ib-8x400", root), SimulatedNvml("ib", gpus=8)).findings
    assert f.kind == "nic_ports_down" and "7 of 8 infiniband ports up at >= 400 Gb/s (the profile)" in f.message


def test_node_without_profile_flagged_against_its_admission(tmp_path):
    nv = SimulatedNvml("learned", gpus=8)
    root = write_ib_ports(tmp_path / "ib", [PORT_UP] * 8)
    first = run_cycle(ProbeConfig(sysfs_infiniband=root, require_nvidia_smi=False), nv)
    assert first.findings == []
    baseline = NodeBaseline(**first.inventory.model_dump(), learned_at=datetime(2026, 12, 1, tzinfo=UTC), validated=True)
    assert baseline.summary() == "8 GPUs, 8x400 Gb/s infiniband, PCIe Gen5 x16"
    write_ib_ports(root, [PORT_UP] * 7 + [PORT_DOWN])
    [f] = run_cycle(config_for(None, root, baseline), nv).findings
    assert f.kind == "nic_ports_down" and "7 of 8" in f.message and "at admission" in f.message


def test_fewer_gpus_or_a_narrower_link_than_at_admission(tmp_path):
    nv = SimulatedNvml("shrunk", gpus=8)
    baseline = NodeBaseline(gpus=8, pcie_generation=5, pcie_width=16, learned_at=datetime(2026, 12, 1, tzinfo=UTC),
                            validated=False)
    nv.hidden = {7}
    [f] = run_cycle(config_for(None, tmp_path, baseline), nv).findings
    assert f.kind == "gpu_count_mismatch" and "had 8" in f.message and "learned (not validated)" in f.message


def test_pcie_gen4_where_the_profile_says_gen5_is_flagged(tmp_path):
    nv = SimulatedNvml("gen4", gpus=8)
    nv.inject("pcie_gen_degraded", gpu=5)
    (tmp_path / "ib").mkdir()
    cfg = config_for("h200-1gpu-no-rdma", tmp_path / "ib")
    cfg.expected_gpus = 8
    [f] = run_cycle(cfg, nv).findings
    assert (f.kind, f.gpu_index) == ("pcie_degraded", 5)
    assert "reaches Gen4 at most, expected Gen5 (profile h200-1gpu-no-rdma)" in f.message


def test_pcie_generation_idle_downtraining_is_not_a_fault_but_under_load_it_is():
    nv = SimulatedNvml("idle", gpus=2)
    for g in nv.gpus:
        g.idle_gen = 1  # power saving: an idle GPU's link reports Gen1
    assert probe_nvml(nv).findings == []
    nv.gpus[1].utilization, nv.gpus[1].pcie_gen = 90, 3  # busy, and trained at Gen3 on a Gen5 link
    [f] = probe_nvml(nv).findings
    assert (f.kind, f.gpu_index) == ("pcie_degraded", 1) and "Gen3 under load" in f.message


def test_throttling_but_not_the_software_power_cap():
    nv = SimulatedNvml("thr", gpus=2)
    nv.gpus[0].clock_reasons = pynvml.nvmlClocksEventReasonSwPowerCap  # normal under full load
    assert probe_nvml(nv).findings == []
    nv.inject("power_brake", gpu=1)
    [f] = probe_nvml(nv).findings
    assert (f.kind, f.gpu_index) == ("thermal", 1) and "hardware power brake" in f.message


def test_nvml_initialised_once_then_again_after_uninitialized():
    nv = SimulatedNvml("init", gpus=2)
    for _ in range(5):
        assert probe_nvml(nv).findings == []
    assert nv.inits == 1 and nvml_session(nv).inits == 1
    nv.driver_reload()  # every call now raises NVMLError_Uninitialized
    [f] = probe_nvml(nv).findings
    assert f.kind == "probe_broken" and "Uninitialized" in f.message
    assert probe_nvml(nv).findings == [] and nv.inits == 2


def test_nvml_initialised_again_after_a_lost_gpu():
    nv = SimulatedNvml("lost", gpus=4)
    assert probe_nvml(nv, 4).findings == []
    nv.hidden = {3}  # falls off the bus: still enumerated until NVML is initialised again
    [f] = probe_nvml(nv, 4).findings
    assert (f.kind, f.gpu_index) == ("gpu_lost", 3)
    [f] = probe_nvml(nv, 4).findings  # re-initialised: the GPU is gone from the count
    assert f.kind == "gpu_count_mismatch" and "sees 3" in f.message
    nv.clear()  # a reset brought it back: a GPU short re-enumerates on the next cycle, which sees it
    assert probe_nvml(nv, 4).findings == [] and nv.inits == 3
    assert probe_nvml(nv, 4).findings == [] and nv.inits == 3, "healthy again: no more initialising"


def test_nvml_missing_then_installed_initialises():
    nv = SimulatedNvml("missing", gpus=1)
    nv.loadable = False
    assert [f.kind for f in probe_nvml(nv).findings] == ["probe_broken"]
    nv.loadable = True
    assert probe_nvml(nv).findings == [] and nv.inits == 1
