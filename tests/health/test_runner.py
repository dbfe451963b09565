import time

from health.nics import NicExpectation
from health.runner import ProbeConfig, kmsg_findings, run_cycle
from sim.nvml import SimulatedNvml


def config(tmp_path, **kw) -> ProbeConfig:
    return ProbeConfig(nics=NicExpectation(ports=0), require_nvidia_smi=False, sysfs_infiniband=tmp_path, **kw)


def test_healthy_cycle(tmp_path):
    snap = run_cycle(config(tmp_path), SimulatedNvml("r1"))
    assert snap.findings == [] and len(snap.gpus) == 8


def test_missing_nvidia_smi_fails_closed(tmp_path):
    cfg = config(tmp_path)
    cfg.require_nvidia_smi = True  # not installed on this machine
    kinds = [(f.kind, f.message) for f in run_cycle(cfg, SimulatedNvml("r2")).findings]
    assert ("probe_broken", "nvidia-smi missing: a GPU reset cannot be done") in kinds


def test_unreadable_kernel_log_fails_closed(tmp_path):
    snap = run_cycle(config(tmp_path, kmsg_path=tmp_path / "no-kmsg"), SimulatedNvml("r3"))
    assert any(f.kind == "probe_broken" and "unreadable" in f.message for f in snap.findings)


class HangingNvml(SimulatedNvml):
    def nvmlDeviceGetCount(self):  # noqa: N802
        time.sleep(2)
        return 8


class CrashingNvml(SimulatedNvml):
    def nvmlDeviceGetCount(self):  # noqa: N802
        raise RuntimeError("driver exploded")


def test_hung_probe_is_a_finding(tmp_path):
    snap = run_cycle(config(tmp_path, probe_timeout_s=0.2), HangingNvml("r4"))
    assert [f.message for f in snap.findings] == ["probe nvml hung past 0.2s"]


def test_crashing_probe_is_a_finding(tmp_path):
    [f] = run_cycle(config(tmp_path), CrashingNvml("r5")).findings
    assert f.kind == "probe_broken" and "driver exploded" in f.message


def test_kmsg_mapped_to_nvml_gpus(tmp_path):
    snap = run_cycle(config(tmp_path), SimulatedNvml("r6"))
    [f] = kmsg_findings(["NVRM: Xid (PCI:0000:38:00): 79, GPU has fallen off the bus."], snap.gpus)
    assert (f.gpu_index, f.uuid) == (2, "GPU-r6-02")
