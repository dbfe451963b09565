"""A simulated NVML with the `pynvml` call names and error types, driven by injected faults."""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass, field
from types import SimpleNamespace

import pynvml

GENERATION_PCI_WIDTH = 16
NO_INSTANCE = 0xFFFFFFFF  # NVML's "no MIG instance"
NVLINKS = {"ampere": 12, "hopper": 18, "blackwell": 18}
PCIE_GEN = {"ampere": 4, "hopper": 5, "blackwell": 5}


@dataclass
class SimGpu:
    index: int
    uuid: str
    serial: str
    pci: str
    nvlinks: int = 18
    ecc_uncorrected: int = 0
    remap_pending: bool = False
    remap_failure: bool = False
    recovery_action: int = 0
    pcie_width: int = GENERATION_PCI_WIDTH
    pcie_gen_gpu: int = 5  # what the GPU supports (nvmlDeviceGetGpuMaxPcieLinkGeneration)
    pcie_gen_link: int = 5  # what the GPU and the slot together reach (nvmlDeviceGetMaxPcieLinkGeneration)
    pcie_gen: int = 5  # the generation the link trained at, seen while the GPU is busy
    idle_gen: int | None = None  # what an idle GPU reports (power saving downtrains it); None: as busy
    utilization: int = 0  # percent busy (nvmlDeviceGetUtilizationRates().gpu)
    links_down: set[int] = field(default_factory=set)
    clock_reasons: int = 0
    temperature: int = 45
    mig: bool = False
    lost: bool = False
    processes: list[tuple] = field(default_factory=list)  # (pid, used bytes) or, MIG on, (pid, bytes, gi, ci)
    load_faults: set[str] = field(default_factory=set)  # seen only by the load test (sim/load_device.py)
    load_xid: int = 119


class SimulatedNvml:
    """Drop-in for the `pynvml` module in the probes: same function names, same exceptions."""

    FAULT_KINDS = ("xid", "ecc_dbe", "row_remap_failure", "row_remap_pending", "gpu_lost", "pcie_degraded",
                   "nvlink_down", "thermal", "nvml_missing", "recovery_action", "pcie_gen_degraded", "power_brake")
    # Faults no status query sees: they show only when the load test makes the GPU work.
    LOAD_FAULT_KINDS = ("corrupt_under_load", "hbm_cells", "slow_gpu", "hw_slowdown_under_load", "xid_under_load")

    def __init__(self, node: str = "sim", gpus: int = 8, generation: str = "hopper"):
        gen = PCIE_GEN[generation]
        self.generation = generation
        self.gpus = [SimGpu(index=i, uuid=f"GPU-{node}-{i:02d}", serial=f"SN-{node}-{i // 2}",
                            pci=f"00000000:{0x18 + 0x10 * i:02x}:00.0", nvlinks=NVLINKS[generation],
                            pcie_gen_gpu=gen, pcie_gen_link=gen, pcie_gen=gen)
                     for i in range(gpus)]
        self.loadable = True
        self.hidden: set[int] = set()  # GPUs that fell off the bus and no longer enumerate
        # NVML's own state, as the real library keeps it: nvmlInit counts references, calls before it
        # (or after the last nvmlShutdown, or a driver reload) raise Uninitialized, and the GPUs are
        # enumerated at init: one that fell off the bus stays counted (and lost) until the next init.
        self.refs = 0
        self.inits = 0
        self.calls = 0
        self.enumerated: list[SimGpu] = []
        self._events: queue.Queue = queue.Queue()
        self._event_sets: list[queue.Queue] = []  # as NVML: every set created gets each later event
        self._first_taken = False
        self._lock = threading.Lock()

    # --- fault injection (scenario kinds) ------------------------------------------------------
    def inject(self, kind: str, gpu: int = 0, xid: int | None = None, gi: int = 0xFFFFFFFF, ci: int = 0xFFFFFFFF) -> None:
        """`gi`/`ci`: the MIG instance an Xid event names (NVML's 0xFFFFFFFF: none)."""
        g = self.gpus[gpu]
        with self._lock:
            if kind in self.LOAD_FAULT_KINDS:
                g.load_faults.add(kind)
                g.load_xid = xid or g.load_xid
            elif kind == "xid":
                self._emit(SimpleNamespace(device=g.index, eventType=pynvml.nvmlEventTypeXidCriticalError,
                                           eventData=xid, gpuInstanceId=gi, computeInstanceId=ci))
            elif kind == "ecc_dbe":
                g.ecc_uncorrected += 1
                self._emit(SimpleNamespace(device=g.index, eventType=pynvml.nvmlEventTypeDoubleBitEccError,
                                           eventData=0, gpuInstanceId=NO_INSTANCE, computeInstanceId=NO_INSTANCE))
            elif kind == "row_remap_failure":
                g.remap_failure = True
            elif kind == "row_remap_pending":
                g.remap_pending = True
            elif kind == "gpu_lost":
                g.lost = True
            elif kind == "pcie_degraded":
                g.pcie_width = 8
            elif kind == "nvlink_down":
                g.links_down = {0, 1}
            elif kind == "thermal":
                g.clock_reasons, g.temperature = pynvml.nvmlClocksEventReasonHwThermalSlowdown, 92
            elif kind == "nvml_missing":
                self.loadable = False
            elif kind == "recovery_action":
                g.recovery_action = 2  # NODE_REBOOT
            elif kind == "pcie_gen_degraded":
                g.pcie_gen_link = g.pcie_gen = g.pcie_gen_gpu - 1  # trained a generation down (a bad riser)
            elif kind == "power_brake":
                g.clock_reasons = pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown
            else:
                kinds = (*self.FAULT_KINDS, *self.LOAD_FAULT_KINDS)
                raise ValueError(f"unknown simulated fault kind {kind!r}: one of {', '.join(kinds)}")

    def _emit(self, event) -> None:
        self._events.put(event)
        for es in self._event_sets:
            es.put(event)

    def clear(self) -> None:
        """What a cure does: every GPU healthy again."""
        with self._lock:
            for g in self.gpus:
                g.ecc_uncorrected, g.remap_pending, g.remap_failure, g.recovery_action = 0, False, False, 0
                g.pcie_width, g.links_down, g.clock_reasons, g.temperature, g.lost = GENERATION_PCI_WIDTH, set(), 0, 45, False
                g.pcie_gen_link = g.pcie_gen = g.pcie_gen_gpu
                g.load_faults = set()
            self.loadable, self.hidden = True, set()
            for es in (self._events, *self._event_sets):  # drained, not replaced: listeners hold them
                while not es.empty():
                    es.get_nowait()

    # --- the pynvml API ------------------------------------------------------------------------
    def driver_reload(self) -> None:
        """The driver was unloaded and loaded again: NVML must be initialised again."""
        with self._lock:
            self.refs = 0

    def nvmlInit(self) -> None:  # noqa: N802 - pynvml's names
        if not self.loadable:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
        with self._lock:
            if self.refs == 0:
                self.enumerated = [g for g in self.gpus if g.index not in self.hidden]
            self.refs += 1
            self.inits += 1

    def nvmlShutdown(self) -> None:  # noqa: N802
        with self._lock:
            self._ready()
            self.refs -= 1

    def _ready(self) -> None:
        self.calls += 1
        if self.refs <= 0:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        self._ready()
        return len(self.enumerated)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> SimGpu:  # noqa: N802
        self._ready()
        if index >= len(self.enumerated):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self.enumerated[index]

    def nvmlDeviceGetIndex(self, h) -> int:  # noqa: N802
        return h if isinstance(h, int) else h.index

    def _alive(self, h: SimGpu) -> SimGpu:
        self._ready()
        if h.lost or h.index in self.hidden:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        return h

    def nvmlDeviceGetUUID(self, h) -> str:  # noqa: N802
        return self._alive(h).uuid

    def nvmlDeviceGetSerial(self, h) -> str:  # noqa: N802
        return self._alive(h).serial

    def nvmlDeviceGetPciInfo(self, h):  # noqa: N802
        return SimpleNamespace(busId=self._alive(h).pci)

    def nvmlDeviceGetTotalEccErrors(self, h, error_type, counter_type) -> int:  # noqa: N802
        return self._alive(h).ecc_uncorrected

    def nvmlDeviceGetRemappedRows(self, h):  # noqa: N802
        g = self._alive(h)
        return (0, 1 if g.remap_failure else 0, int(g.remap_pending), int(g.remap_failure))

    def nvmlDeviceGetRetiredPagesPendingStatus(self, h) -> int:  # noqa: N802
        return 0

    def nvmlDeviceGetFieldValues(self, h, field_ids):  # noqa: N802
        g = self._alive(h)
        return [SimpleNamespace(fieldId=f, nvmlReturn=pynvml.NVML_SUCCESS, value=SimpleNamespace(uiVal=g.recovery_action))
                for f in field_ids]

    def nvmlDeviceGetCurrPcieLinkWidth(self, h) -> int:  # noqa: N802
        return self._alive(h).pcie_width

    def nvmlDeviceGetMaxPcieLinkWidth(self, h) -> int:  # noqa: N802
        self._alive(h)
        return GENERATION_PCI_WIDTH

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h) -> int:  # noqa: N802
        g = self._alive(h)
        return g.pcie_gen if g.utilization > 0 or g.idle_gen is None else g.idle_gen

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h) -> int:  # noqa: N802
        return self._alive(h).pcie_gen_link

    def nvmlDeviceGetGpuMaxPcieLinkGeneration(self, h) -> int:  # noqa: N802
        return self._alive(h).pcie_gen_gpu

    def nvmlDeviceGetUtilizationRates(self, h):  # noqa: N802
        return SimpleNamespace(gpu=self._alive(h).utilization, memory=0)

    def nvmlDeviceGetNvLinkState(self, h, link: int) -> int:  # noqa: N802
        g = self._alive(h)
        if link >= g.nvlinks:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return 0 if link in g.links_down else 1

    def nvmlDeviceGetCurrentClocksEventReasons(self, h) -> int:  # noqa: N802
        return self._alive(h).clock_reasons

    def nvmlDeviceGetTemperature(self, h, sensor) -> int:  # noqa: N802
        return self._alive(h).temperature

    def nvmlDeviceGetMigMode(self, h):  # noqa: N802
        g = self._alive(h)
        return [int(g.mig), int(g.mig)]

    def nvmlDeviceGetComputeRunningProcesses(self, h):  # noqa: N802
        # nvmlProcessInfo_t: gpuInstanceId/computeInstanceId are 0xFFFFFFFF unless MIG is enabled.
        return [SimpleNamespace(pid=p[0], usedGpuMemory=p[1], gpuInstanceId=p[2] if len(p) > 2 else NO_INSTANCE,
                                computeInstanceId=p[3] if len(p) > 3 else NO_INSTANCE) for p in self._alive(h).processes]

    def nvmlEventSetCreate(self):  # noqa: N802
        self._ready()
        # The first set is the one faults injected before anyone listened wait in (the agent's).
        with self._lock:
            if not self._first_taken:
                self._first_taken = True
                return self._events
            es: queue.Queue = queue.Queue()
            self._event_sets.append(es)
            return es

    def nvmlEventSetFree(self, es) -> None:  # noqa: N802
        with self._lock:
            if es in self._event_sets:
                self._event_sets.remove(es)

    def nvmlDeviceRegisterEvents(self, h, mask, es) -> None:  # noqa: N802
        self._alive(h)

    def nvmlEventSetWait_v2(self, es, timeout_ms: int):  # noqa: N802
        self._ready()
        try:
            return es.get(timeout=timeout_ms / 1000)
        except queue.Empty:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT) from None
