"""NVML probes through the `pynvml` API (the real module or sim/nvml.py's stand-in), failing closed."""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass, field
from typing import Any

import pynvml

from policies.findings import RECOVERY_ACTION_BY_CODE, Finding, FindingKind, GpuIds

# Errors that mean the GPU itself is gone or wedged, not that our check failed.
GPU_LOST_ERRORS = (pynvml.NVMLError_GpuIsLost, pynvml.NVMLError_ResetRequired)
# Clock-event reasons that mean the hardware is throttling itself (gpu-faults.md section 3).
HW_SLOWDOWN_MASK = (pynvml.nvmlClocksEventReasonHwSlowdown | pynvml.nvmlClocksEventReasonHwThermalSlowdown
                    | pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@dataclass
class ProbeResult:
    """What a probe (or a whole cycle of them) found, and the GPUs it saw."""

    findings: list[Finding] = field(default_factory=list)
    gpus: list[GpuIds] = field(default_factory=list)
    mig_enabled: list[int] = field(default_factory=list)
    checks: list[str] = field(default_factory=list)


class _GpuChecks:
    """The per-GPU checks; each NVML call that fails in an unexpected way becomes a finding."""

    def __init__(self, nv, index: int, result: ProbeResult):
        self.nv, self.index, self.result = nv, index, result
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
            serial = self.call(nv.nvmlDeviceGetSerial, h)
            self.ids = GpuIds(index=self.index, uuid=_text(nv.nvmlDeviceGetUUID(h)),
                              serial=_text(serial) if serial else None,
                              pci=_text(nv.nvmlDeviceGetPciInfo(h).busId))
            self.result.gpus.append(self.ids)
            for check in (self.ecc, self.memory_remap, self.recovery_action, self.pcie, self.nvlink, self.thermal,
                          self.mig):
                check(h)
        except GPU_LOST_ERRORS as err:
            self.finding(FindingKind.GPU_LOST, f"NVML: {err}")
        except pynvml.NVMLError as err:
            self.finding(FindingKind.PROBE_BROKEN, f"NVML call failed on GPU {self.index}: {err}")

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
        cur = self.call(self.nv.nvmlDeviceGetCurrPcieLinkWidth, h)
        top = self.call(self.nv.nvmlDeviceGetMaxPcieLinkWidth, h)
        # Width, not generation: idle GPUs downtrain the generation on purpose.
        if cur is not None and top is not None and cur < top:
            self.finding(FindingKind.PCIE_DEGRADED, f"PCIe link x{cur} of x{top}")

    def nvlink(self, h) -> None:
        down = []
        for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
            try:
                state = self.nv.nvmlDeviceGetNvLinkState(h, link)
            except (pynvml.NVMLError_NotSupported, pynvml.NVMLError_InvalidArgument):
                continue  # links the board does not have
            if not state:
                down.append(link)
        if down:
            self.finding(FindingKind.NVLINK_DOWN, f"NVLink links down: {down}")

    def thermal(self, h) -> None:
        reasons = self.call(self.nv.nvmlDeviceGetCurrentClocksEventReasons, h) or 0
        if reasons & HW_SLOWDOWN_MASK:
            temp = self.call(self.nv.nvmlDeviceGetTemperature, h, pynvml.NVML_TEMPERATURE_GPU)
            self.finding(FindingKind.THERMAL, f"hardware slowdown (reasons 0x{reasons:x}, {temp} C)")

    def mig(self, h) -> None:
        mode = self.call(self.nv.nvmlDeviceGetMigMode, h)
        if mode and mode[0]:
            self.result.mig_enabled.append(self.index)


def probe_nvml(nv=pynvml, expected_gpus: int | None = None) -> ProbeResult:
    """Every NVML check on this host. NVML missing is `probe_broken`, never healthy."""
    result = ProbeResult(checks=["nvml"])
    try:
        nv.nvmlInit()
    except pynvml.NVMLError as err:
        result.findings.append(Finding(kind=FindingKind.PROBE_BROKEN,
                                       message=f"NVML not loadable ({type(err).__name__}: {err})"))
        return result
    try:
        count = nv.nvmlDeviceGetCount()
        if expected_gpus is not None and count != expected_gpus:
            result.findings.append(Finding(kind=FindingKind.GPU_COUNT_MISMATCH,
                                           message=f"NVML sees {count} GPUs, the node should have {expected_gpus}"))
        for index in range(count):
            _GpuChecks(nv, index, result).run()
    except pynvml.NVMLError as err:
        result.findings.append(Finding(kind=FindingKind.PROBE_BROKEN, message=f"NVML failed: {err}"))
    finally:
        try:
            nv.nvmlShutdown()
        except pynvml.NVMLError:
            pass
    return result


NVML_NO_INSTANCE = 0xFFFFFFFF  # nvmlEventData_t / nvmlProcessInfo_t: no MIG instance (MIG off, or not attributable)


def mig_id(value: int | None) -> int | None:
    """A MIG instance id as NVML gives it, or None where it names none."""
    return None if value is None or value == NVML_NO_INSTANCE else int(value)


class XidWatcher:
    """Xid and double-bit ECC events from an NVML event set, on a thread; idle timeouts are normal."""

    def __init__(self, nv=pynvml, wait_ms: int = 1000):
        self.nv, self.wait_ms = nv, wait_ms
        self.events: queue.Queue[Finding] = queue.Queue()
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> XidWatcher:
        self._thread = threading.Thread(target=self._run, name="nvml-xid-events", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def drain(self) -> list[Finding]:
        out = []
        while not self.events.empty():
            out.append(self.events.get_nowait())
        return out

    def _run(self) -> None:
        nv = self.nv
        try:
            nv.nvmlInit()
            es = nv.nvmlEventSetCreate()
            uuids = {}
            for i in range(nv.nvmlDeviceGetCount()):
                h = nv.nvmlDeviceGetHandleByIndex(i)
                uuids[i] = _text(nv.nvmlDeviceGetUUID(h))
                nv.nvmlDeviceRegisterEvents(h, pynvml.nvmlEventTypeXidCriticalError | pynvml.nvmlEventTypeDoubleBitEccError, es)
            while not self._stop.is_set():
                try:
                    data = nv.nvmlEventSetWait_v2(es, self.wait_ms)
                except pynvml.NVMLError_Timeout:
                    continue
                index = nv.nvmlDeviceGetIndex(data.device)
                if data.eventType & pynvml.nvmlEventTypeDoubleBitEccError:
                    self.events.put(Finding(kind=FindingKind.ECC_DBE, gpu_index=index, uuid=uuids.get(index),
                                            message="NVML double-bit ECC event"))
                else:
                    self.events.put(Finding(kind=FindingKind.XID, xid=int(data.eventData), gpu_index=index,
                                            uuid=uuids.get(index), message=f"NVML Xid event {data.eventData}",
                                            gpu_instance_id=mig_id(getattr(data, "gpuInstanceId", None)),
                                            compute_instance_id=mig_id(getattr(data, "computeInstanceId", None))))
        except pynvml.NVMLError as err:
            # The caller reports this as probe_broken: no events must never read as "no faults".
            self.error = f"NVML event watch failed: {err}"
