import time

import pynvml
import pytest

from health.nvml import probe_nvml
from health.xid_watch import XidWatcher
from sim.nvml import SimulatedNvml


def test_real_pynvml_without_driver_is_probe_broken_not_healthy():
    # This machine has no NVIDIA driver: the real module raises NVMLError_LibraryNotFound.
    result = probe_nvml(pynvml)
    assert [f.kind for f in result.findings] == ["probe_broken"]
    assert "NVMLError_LibraryNotFound" in result.findings[0].message or "not loadable" in result.findings[0].message


def test_healthy_simulated_node():
    nv = SimulatedNvml("n1", gpus=8)
    result = probe_nvml(nv, expected_gpus=8)
    assert result.findings == []
    assert [g.index for g in result.gpus] == list(range(8))
    assert result.gpus[3].uuid == "GPU-n1-03" and result.gpus[3].serial == "SN-n1-1"


@pytest.mark.parametrize("kind,expected", [
    ("ecc_dbe", "ecc_dbe"), ("row_remap_failure", "row_remap_failure"), ("row_remap_pending", "row_remap_pending"),
    ("gpu_lost", "gpu_lost"), ("pcie_degraded", "pcie_degraded"), ("nvlink_down", "nvlink_down"),
    ("thermal", "thermal"), ("recovery_action", "recovery_action"),
])
def test_each_fault_maps_to_its_finding(kind, expected):
    nv = SimulatedNvml("n2", gpus=4)
    nv.inject(kind, gpu=2)
    [f] = probe_nvml(nv, expected_gpus=4).findings
    assert (f.kind, f.gpu_index) == (expected, 2)
    if kind != "gpu_lost":
        assert f.uuid == "GPU-n2-02" and f.pci == "00000000:38:00.0" and f.serial == "SN-n2-1"
    if kind == "recovery_action":
        assert f.recovery_action == "NODE_REBOOT"


def test_nvml_missing_fails_closed():
    nv = SimulatedNvml("n3")
    nv.inject("nvml_missing")
    [f] = probe_nvml(nv).findings
    assert f.kind == "probe_broken"


def test_gpu_count_mismatch():
    nv = SimulatedNvml("n4", gpus=8)
    nv.hidden = {7}
    kinds = [f.kind for f in probe_nvml(nv, expected_gpus=8).findings]
    assert kinds == ["gpu_count_mismatch"]


def test_clear_cures():
    nv = SimulatedNvml("n5", gpus=2)
    nv.inject("ecc_dbe", 1)
    nv.clear()
    assert probe_nvml(nv).findings == []


def test_mig_mode_reported():
    nv = SimulatedNvml("n6", gpus=2)
    nv.gpus[1].mig = True
    assert probe_nvml(nv).mig_enabled == [1]


def test_xid_watcher_delivers_events_and_idles_quietly():
    nv = SimulatedNvml("n7", gpus=4)
    w = XidWatcher(nv, wait_ms=50).start()
    try:
        time.sleep(0.2)  # several idle timeouts: not errors
        nv.inject("xid", gpu=3, xid=79)
        for _ in range(40):
            if not w.events.empty():
                break
            time.sleep(0.05)
        [f] = w.drain()
    finally:
        w.stop()
    assert (f.kind, f.xid, f.gpu_index, f.uuid) == ("xid", 79, 3, "GPU-n7-03")
    assert w.error is None


def test_xid_watcher_without_driver_reports_error():
    w = XidWatcher(pynvml, wait_ms=10).start()
    w.stop()
    assert w.error and "NVML" in w.error


def test_cli_probe_nvml_on_a_machine_without_gpu():
    import json
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-m", "workers.cli", "probe", "nvml", "--json"], capture_output=True, text=True)
    assert run.returncode == 1
    doc = json.loads(run.stdout)
    assert [f["kind"] for f in doc["findings"]] == ["probe_broken"]
    assert doc["triage"]["start_rung"] == "reset"
    npd = subprocess.run([sys.executable, "-m", "workers.cli", "probe", "nvml", "--npd"], capture_output=True, text=True)
    assert npd.returncode == 2  # NPD's "unknown": the check could not run, which is not "OK"
    assert 0 < len(npd.stdout.strip()) <= 80


def test_xid_event_carries_its_mig_instance():
    """NVML's event data names the MIG instance (0xFFFFFFFF: none): the kill stops only that tenant."""
    nv = SimulatedNvml("n8", gpus=4)
    nv.gpus[1].mig = True
    w = XidWatcher(nv, wait_ms=50).start()
    try:
        nv.inject("xid", gpu=1, xid=13, gi=2, ci=0)
        nv.inject("xid", gpu=3, xid=13)
        found = []
        for _ in range(40):
            found += w.drain()
            if len(found) == 2:
                break
            time.sleep(0.05)
    finally:
        w.stop()
    assert [(f.gpu_index, f.gpu_instance_id, f.compute_instance_id) for f in found] == [(1, 2, 0), (3, None, None)]
