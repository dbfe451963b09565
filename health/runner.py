"""One probe cycle: every probe under a timeout, plus the dependencies a remedy needs; fails closed."""

from __future__ import annotations

import concurrent.futures
import logging
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pynvml

from health.kmsg import KmsgParser
from health.nics import SYSFS_INFINIBAND, check_nics
from health.nvml import PcieExpectation, ProbeResult, probe_nvml
from policies.baseline import NodeBaseline, NodeInventory
from policies.findings import Finding, FindingKind, GpuIds
from policies.profile_model import NetworkProfile, NodeProfile, PcieProfile


@dataclass
class ProbeConfig:
    """What this node should have, and where to look. Nothing is guessed: an unset figure is not
    checked, except against what the node had when admitted (`baseline`). The agent fills it from
    the profile the controller gives it (or `--profile`); node activities share the same object."""

    expected_gpus: int | None = None  # exactly this many (the profile's); None: not declared
    generation: str = "hopper"  # the Xid catalog's column for this node (the profile's, else --generation)
    nics: NetworkProfile | None = None  # the profile's adapters; None: not declared
    pcie: PcieProfile | None = None  # the profile's PCIe link; None: not declared
    baseline: NodeBaseline | None = None  # what the node had at admission (or learned at its first healthy cycle)
    profile_name: str = ""
    sysfs_infiniband: Path = SYSFS_INFINIBAND
    kmsg_path: Path | None = None  # read by the agent's follower; here only checked for readability
    require_nvidia_smi: bool = True  # a reset without it would be a silent no-op
    probe_timeout_s: float = 10.0

    _local: tuple | None = None  # what this config was started with (flags), before any profile

    def apply_profile(self, name: str | None, profile: NodeProfile | None, baseline: NodeBaseline | None) -> None:
        """Take the node's expectations (from the controller, or --profile outside a cluster): what the
        profile declares replaces what the agent was started with; what it leaves null does not."""
        if self._local is None:
            self._local = (self.expected_gpus, self.nics, self.pcie, self.generation)
        gpus, nics, pcie, generation = self._local
        self.profile_name = name or ""
        self.expected_gpus = profile.gpus if profile and profile.gpus is not None else gpus
        self.nics = profile.network if profile and profile.network is not None else nics
        self.pcie = profile.pcie if profile and profile.pcie is not None else pcie
        self.generation = profile.generation.value if profile and profile.generation else generation
        self.baseline = baseline

    def pcie_expectation(self) -> PcieExpectation:
        """The stricter of the profile's link and the one the node had at admission."""
        gens = [(self.pcie.generation, f"profile {self.profile_name}")] if self.pcie and self.pcie.generation else []
        widths = [(self.pcie.width, f"profile {self.profile_name}")] if self.pcie and self.pcie.width else []
        if self.baseline is not None:
            gens += [(self.baseline.pcie_generation, self.baseline.origin())] if self.baseline.pcie_generation else []
            widths += [(self.baseline.pcie_width, self.baseline.origin())] if self.baseline.pcie_width else []
        gen, width = max(gens, default=(None, "")), max(widths, default=(None, ""))
        return PcieExpectation(generation=gen[0], width=width[0], why="; ".join(sorted({gen[1], width[1]} - {""})))


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


def probe_nvml_for(config: ProbeConfig, nv=pynvml) -> ProbeResult:
    """The NVML probes against what this node should have (its profile, its baseline)."""
    b = config.baseline
    why = f"profile {config.profile_name}" if config.expected_gpus is not None else (b.origin() if b else "")
    return probe_nvml(nv, config.expected_gpus, min_gpus=b.gpus if b else None, pcie=config.pcie_expectation(),
                      gpus_why=why)


@dataclass(frozen=True)
class Probe:
    """One probe of the cycle: `run(config, nv)` in a thread under the cycle's timeout, `take`
    folding what it returned into the cycle's result. A new probe is its module plus one entry
    in PROBES."""

    name: str
    run: Callable[[ProbeConfig, Any], Any]
    take: Callable[[ProbeResult, Any], None]


def _take_nvml(snap: ProbeResult, r: ProbeResult) -> None:
    snap.findings += r.findings
    snap.gpus, snap.mig_enabled, snap.pcie = r.gpus, r.mig_enabled, r.pcie


def _take_nics(snap: ProbeResult, r: tuple[list[Finding], Any]) -> None:
    snap.findings += r[0]
    snap.nics = r[1]


def _take_findings(snap: ProbeResult, found: list[Finding]) -> None:
    snap.findings += found


PROBES = (
    Probe("nvml", probe_nvml_for, _take_nvml),
    Probe("nics", lambda cfg, nv: check_nics(cfg.nics, cfg.sysfs_infiniband, cfg.baseline), _take_nics),
    Probe("dependencies", lambda cfg, nv: dependency_findings(cfg), _take_findings),
)


def run_cycle(config: ProbeConfig, nv=pynvml, pool: concurrent.futures.Executor | None = None) -> ProbeResult:
    """All probes; one that raises or hangs past its timeout is a probe_broken finding naming it."""
    own = pool is None
    pool = pool or concurrent.futures.ThreadPoolExecutor(max_workers=len(PROBES), thread_name_prefix="probe")
    snap = ProbeResult(checks=[p.name for p in PROBES])
    futures = [(probe, pool.submit(probe.run, config, nv)) for probe in PROBES]
    try:
        for probe, fut in futures:
            try:
                result = fut.result(timeout=config.probe_timeout_s)
            except concurrent.futures.TimeoutError:
                snap.findings.append(Finding(kind=FindingKind.PROBE_BROKEN,
                                             message=f"probe {probe.name} hung past {config.probe_timeout_s:g}s"))
                continue
            except Exception as err:  # noqa: BLE001 - a crashing probe is a finding, never "healthy"
                snap.findings.append(Finding(kind=FindingKind.PROBE_BROKEN,
                                             message=f"probe {probe.name} raised {type(err).__name__}: {err}"))
                continue
            probe.take(snap, result)
    finally:
        if own:
            pool.shutdown(wait=False, cancel_futures=True)
    if snap.nics is not None and snap.gpus:
        snap.inventory = NodeInventory(gpus=len(snap.gpus), nics=snap.nics,
                                       pcie_generation=min((g for g, _ in snap.pcie), default=None),
                                       pcie_width=min((w for _, w in snap.pcie), default=None))
    return snap


def kmsg_findings(lines, gpus: list[GpuIds]) -> list[Finding]:
    """Kernel-log lines, with bus ids mapped to the GPUs NVML enumerated."""
    parser = KmsgParser(uuid_by_bus={g.pci: g.uuid for g in gpus if g.pci},
                        index_by_bus={g.pci: g.index for g in gpus if g.pci})
    found = parser.parse(lines)
    for line, why in parser.rejected:
        logging.getLogger("gpuheal.kmsg").warning("kernel-log line rejected (%s): %s", why, line)
    return found
