"""NVML probes through the `pynvml` API (the real module or sim/nvml.py's stand-in), failing closed.
The session is health/nvml_session.py; the Xid event thread health/xid_watch.py."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pynvml

from health.nvml_session import GPU_LOST_ERRORS, NvmlSession, nvml_session, text
from policies.findings import RECOVERY_ACTION_BY_CODE, Finding, FindingKind, GpuIds

# Clock-event reasons that mean the GPU is throttled by hardware or heat (gpu-faults.md section 3,
# gpu-load.md: SwPowerCap under full load is normal and is not among them).
THROTTLE_REASONS = {
    pynvml.nvmlClocksEventReasonHwSlowdown: "hardware slowdown",
    pynvml.nvmlClocksEventReasonHwThermalSlowdown: "hardware thermal slowdown",
    pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown: "hardware power brake",
    pynvml.nvmlClocksEventReasonSwThermalSlowdown: "thermal slowdown",
}
HW_SLOWDOWN_MASK = sum(THROTTLE_REASONS)


@dataclass
class PcieExpectation:
    """What each GPU's link must reach, and who said so (a profile, a baseline); None: not declared."""

    generation: int | None = None
    width: int | None = None
    why: str = ""




@dataclass
class ProbeResult:
    """What a probe (or a whole cycle of them) found, and the GPUs it saw."""

    findings: list[Finding] = field(default_factory=list)
    gpus: list[GpuIds] = field(default_factory=list)
    mig_enabled: list[int] = field(default_factory=list)
    checks: list[str] = field(default_factory=list)
    pcie: list[tuple[int, int]] = field(default_factory=list)  # per GPU: (link's max generation, width)
    nics: Any = None  # the adapters the NIC probe read (None: it could not)
    inventory: Any = None  # a whole cycle's NodeInventory (policies/baseline.py), when every probe could read


class _GpuChecks:
    """The per-GPU checks; each NVML call that fails in an unexpected way becomes a finding."""

    def __init__(self, nv, index: int, result: ProbeResult, pcie: PcieExpectation | None = None,
                 session: NvmlSession | None = None):
        self.nv, self.index, self.result = nv, index, result
        self.expect, self.session = pcie or PcieExpectation(), session
        self.ids: GpuIds | None = None

    def finding(self, kind: FindingKind, message: str, **extra) -> None:
        ids = self.ids
        self.result.findings.append(Finding(
            kind=kind, gpu_index=self.index, uuid=ids.uuid if ids else None, serial=ids.serial if ids else None,
            pci=ids.pci if ids else None, message=message, **extra))

    def call(self, fn, *args):
        """An NVML call; None when the GPU does not support it."""
        try:
            return fn(*args)
        except pynvml.NVMLError_NotSupported:
            return None

    def run(self) -> None:
        nv = self.nv
        try:
            h = nv.nvmlDeviceGetHandleByIndex(self.index)
            known = self.session.ids.get(self.index) if self.session else None
            if known is None:
                serial = self.call(nv.nvmlDeviceGetSerial, h)
                known = GpuIds(index=self.index, uuid=text(nv.nvmlDeviceGetUUID(h)),
                               serial=text(serial) if serial else None, pci=text(nv.nvmlDeviceGetPciInfo(h).busId))
            self.ids = known
            self.result.gpus.append(self.ids)
            for check in (self.ecc, self.memory_remap, self.recovery_action, self.pcie, self.nvlink, self.thermal,
                          self.mig):
                check(h)
            if self.session is not None:
                self.session.ids[self.index] = self.ids  # a GPU that answered every check: its ids hold
        except GPU_LOST_ERRORS as err:
            self._failed(err)
            self.finding(FindingKind.GPU_LOST, f"NVML: {err}")
        except pynvml.NVMLError as err:
            self._failed(err)
            self.finding(FindingKind.PROBE_BROKEN, f"NVML call failed on GPU {self.index}: {err}")

    def _failed(self, err: pynvml.NVMLError) -> None:
        if self.session is not None:
            self.session.failed(err)

    def ecc(self, h) -> None:
        count = self.call(self.nv.nvmlDeviceGetTotalEccErrors, h, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                          pynvml.NVML_VOLATILE_ECC)
        if count:
            self.finding(FindingKind.ECC_DBE, f"{count} uncorrectable ECC errors since the driver loaded")

    def memory_remap(self, h) -> None:
        rows = self.call(self.nv.nvmlDeviceGetRemappedRows, h)
        if rows is None:
            # Pre-Ampere boards retire pages instead of remapping rows.
            pending = self.call(self.nv.nvmlDeviceGetRetiredPagesPendingStatus, h)
            if pending:
                self.finding(FindingKind.RETIRED_PAGES_PENDING, "retired pages pending: reset to retire them")
            return
        corrected, uncorrected, pending, failure = rows
        if failure:
            self.finding(FindingKind.ROW_REMAP_FAILURE, f"row remap failed ({uncorrected} uncorrectable rows)")
        elif pending:
            self.finding(FindingKind.ROW_REMAP_PENDING, "row remap pending: reset the GPU to activate it")

    def recovery_action(self, h) -> None:
        values = self.call(self.nv.nvmlDeviceGetFieldValues, h, [pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION])
        if not values or values[0].nvmlReturn != pynvml.NVML_SUCCESS:
            return  # field 230 needs R565+: absent is not a fault
        action = RECOVERY_ACTION_BY_CODE.get(values[0].value.uiVal)
        if action is not None and action.value != "NONE":
            self.finding(FindingKind.RECOVERY_ACTION, f"driver recovery action {action.value}", recovery_action=action)

    def pcie(self, h) -> None:
        """Width below the GPU's maximum or the expected one; a link that cannot reach the expected
        generation; a generation below the link's best while the GPU is busy (idle GPUs downtrain the
        generation on purpose, so an idle one is not judged on it)."""
        nv, want = self.nv, self.expect
        cur = self.call(nv.nvmlDeviceGetCurrPcieLinkWidth, h)
        top = self.call(nv.nvmlDeviceGetMaxPcieLinkWidth, h)
        link_gen = self.call(nv.nvmlDeviceGetMaxPcieLinkGeneration, h)
        if link_gen is not None and cur is not None:
            self.result.pcie.append((link_gen, cur))
        why = f" ({want.why})" if want.why else ""
        if cur is not None and top is not None and cur < top:
            return self.finding(FindingKind.PCIE_DEGRADED, f"PCIe link x{cur} of x{top}")
        if cur is not None and want.width is not None and cur < want.width:
            return self.finding(FindingKind.PCIE_DEGRADED, f"PCIe link x{cur}, expected x{want.width}{why}")
        if link_gen is not None and want.generation is not None and link_gen < want.generation:
            return self.finding(FindingKind.PCIE_DEGRADED,
                                f"PCIe link reaches Gen{link_gen} at most, expected Gen{want.generation}{why}")
        gen = self.call(nv.nvmlDeviceGetCurrPcieLinkGeneration, h)
        if gen is not None and link_gen is not None and gen < link_gen:
            util = self.call(nv.nvmlDeviceGetUtilizationRates, h)
            if util is not None and util.gpu > 0:
                self.finding(FindingKind.PCIE_DEGRADED,
                             f"PCIe link at Gen{gen} under load ({util.gpu}% busy), the link reaches Gen{link_gen}")

    def nvlink(self, h) -> None:
        links = self.session.links.get(self.index) if self.session else None
        present, down = [], []
        for link in range(pynvml.NVML_NVLINK_MAX_LINKS) if links is None else links:
            try:
                state = self.nv.nvmlDeviceGetNvLinkState(h, link)
            except (pynvml.NVMLError_NotSupported, pynvml.NVMLError_InvalidArgument):
                continue  # links the board does not have (asked once per NVML session)
            present.append(link)
            if not state:
                down.append(link)
        if self.session is not None and links is None:
            self.session.links[self.index] = present
        if down:
            self.finding(FindingKind.NVLINK_DOWN, f"NVLink links down: {down}")

    def thermal(self, h) -> None:
        reasons = self.call(self.nv.nvmlDeviceGetCurrentClocksEventReasons, h) or 0
        if reasons & HW_SLOWDOWN_MASK:
            temp = self.call(self.nv.nvmlDeviceGetTemperature, h, pynvml.NVML_TEMPERATURE_GPU)
            what = ", ".join(name for bit, name in THROTTLE_REASONS.items() if reasons & bit)
            self.finding(FindingKind.THERMAL, f"throttled: {what} (reasons 0x{reasons:x}, {temp} C)")

    def mig(self, h) -> None:
        mode = self.call(self.nv.nvmlDeviceGetMigMode, h)
        if mode and mode[0]:
            self.result.mig_enabled.append(self.index)


def probe_nvml(nv=pynvml, expected_gpus: int | None = None, *, min_gpus: int | None = None,
               pcie: PcieExpectation | None = None, gpus_why: str = "") -> ProbeResult:
    """Every NVML check on this host, on the process's NVML session (initialised once). NVML missing
    is `probe_broken`, never healthy. `expected_gpus`: exactly this many (a profile); `min_gpus`: at
    least this many (what the node had at admission)."""
    result = ProbeResult(checks=["nvml"])
    session = nvml_session(nv)
    try:
        session.ensure()
    except pynvml.NVMLError as err:
        result.findings.append(Finding(kind=FindingKind.PROBE_BROKEN,
                                       message=f"NVML not loadable ({type(err).__name__}: {err})"))
        return result
    why = f" ({gpus_why})" if gpus_why else ""
    try:
        count = nv.nvmlDeviceGetCount()
        if expected_gpus is not None and count != expected_gpus:
            result.findings.append(Finding(kind=FindingKind.GPU_COUNT_MISMATCH,
                                           message=f"NVML sees {count} GPUs, the node should have {expected_gpus}{why}"))
        elif min_gpus is not None and count < min_gpus:
            result.findings.append(Finding(kind=FindingKind.GPU_COUNT_MISMATCH,
                                           message=f"NVML sees {count} GPUs, the node had {min_gpus}{why}"))
        if result.findings:
            session.stale()  # a GPU short: enumerate again next cycle, it may be back after a reset
        for index in range(count):
            _GpuChecks(nv, index, result, pcie, session).run()
    except pynvml.NVMLError as err:
        session.failed(err)
        result.findings.append(Finding(kind=FindingKind.PROBE_BROKEN, message=f"NVML failed: {err}"))
    return result
