"""One probe cycle: every probe under a timeout, plus the dependencies a remedy needs; fails closed."""

from __future__ import annotations

import concurrent.futures
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path

import pynvml

from health.kmsg import KmsgParser
from health.nics import DEFAULT_EXPECTATIONS, NicExpectation, probe_nics
from health.nvml import ProbeResult, probe_nvml
from policies.findings import Finding, FindingKind, GpuIds


@dataclass
class ProbeConfig:
    """What a node should look like, and where to look. Defaults suit an 8-GPU Hopper node."""

    expected_gpus: int | None = 8
    generation: str = "hopper"
    nics: NicExpectation | None = None  # None: the generation's default (gpu-faults.md section 4)
    sysfs_infiniband: Path = Path("/sys/class/infiniband")
    kmsg_path: Path | None = None  # read by the agent's follower; here only checked for readability
    require_nvidia_smi: bool = True  # a reset without it would be a silent no-op
    probe_timeout_s: float = 10.0

    def nic_expectation(self) -> NicExpectation:
        return self.nics if self.nics is not None else DEFAULT_EXPECTATIONS.get(self.generation, NicExpectation())


def dependency_findings(config: ProbeConfig) -> list[Finding]:
    out = []
    if config.require_nvidia_smi and shutil.which("nvidia-smi") is None:
        out.append(Finding(kind=FindingKind.PROBE_BROKEN, message="nvidia-smi missing: a GPU reset cannot be done"))
    if config.kmsg_path is not None:
        try:
            with open(config.kmsg_path, "rb"):
                pass
        except OSError as err:
            out.append(Finding(kind=FindingKind.PROBE_BROKEN,
                               message=f"kernel log {config.kmsg_path} unreadable: {err.strerror}"))
    return out


def run_cycle(config: ProbeConfig, nv=pynvml, pool: concurrent.futures.Executor | None = None) -> ProbeResult:
    """All probes; one that raises or hangs past its timeout is a probe_broken finding naming it."""
    own = pool is None
    pool = pool or concurrent.futures.ThreadPoolExecutor(max_workers=3, thread_name_prefix="probe")
    snap = ProbeResult(checks=["nvml", "nics", "dependencies"])
    futures = {
        "nvml": pool.submit(probe_nvml, nv, config.expected_gpus),
        "nics": pool.submit(probe_nics, config.nic_expectation(), config.sysfs_infiniband),
        "dependencies": pool.submit(dependency_findings, config),
    }
    try:
        for name, fut in futures.items():
            try:
                result = fut.result(timeout=config.probe_timeout_s)
            except concurrent.futures.TimeoutError:
                snap.findings.append(Finding(kind=FindingKind.PROBE_BROKEN,
                                             message=f"probe {name} hung past {config.probe_timeout_s:g}s"))
                continue
            except Exception as err:  # noqa: BLE001 - a crashing probe is a finding, never "healthy"
                snap.findings.append(Finding(kind=FindingKind.PROBE_BROKEN,
                                             message=f"probe {name} raised {type(err).__name__}: {err}"))
                continue
            if name == "nvml":
                snap.findings += result.findings
                snap.gpus, snap.mig_enabled = result.gpus, result.mig_enabled
            else:
                snap.findings += result
    finally:
        if own:
            pool.shutdown(wait=False, cancel_futures=True)
    return snap


def kmsg_findings(lines, gpus: list[GpuIds]) -> list[Finding]:
    """Kernel-log lines, with bus ids mapped to the GPUs NVML enumerated."""
    parser = KmsgParser(uuid_by_bus={g.pci: g.uuid for g in gpus if g.pci},
                        index_by_bus={g.pci: g.index for g in gpus if g.pci})
    found = parser.parse(lines)
    for line, why in parser.rejected:
        logging.getLogger("gpuheal.kmsg").warning("kernel-log line rejected (%s): %s", why, line)
    return found
