"""What NVML says while the load runs: clock-event reasons sampled, Xid and double-bit ECC events
caught, ECC counters and row remapping read before and after. Works on `pynvml` and on
sim/nvml.py alike."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import pynvml

from health.load.device import GpuInfo

# nvmlClocksEventReason* bits, by the names the policy uses.
REASONS = {"gpu_idle": 0x1, "app_clocks": 0x2, "sw_power_cap": 0x4, "hw_slowdown": 0x8, "sync_boost": 0x10,
           "sw_thermal": 0x20, "hw_thermal": 0x40, "hw_power_brake": 0x80, "display_clocks": 0x100}
_EVENTS = pynvml.nvmlEventTypeXidCriticalError | pynvml.nvmlEventTypeDoubleBitEccError


@dataclass
class GpuWatch:
    info: GpuInfo
    handle: object = None
    samples: int = 0
    reasons: dict[str, int] = field(default_factory=dict)  # reason -> samples it was seen in
    before: tuple | None = None  # (uncorrected ECC, remap pending, remap failure)
    after: tuple | None = None
    events: list[str] = field(default_factory=list)
    lost: str | None = None


class LoadWatch:
    def __init__(self, nv, gpus: list[GpuInfo], interval_s: float):
        self.nv, self.interval_s = nv, max(interval_s, 0.005)
        self.gpus = {g.index: GpuWatch(g) for g in gpus}
        self.notes: list[str] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._es = None

    def __enter__(self) -> LoadWatch:
        self.nv.nvmlInit()
        for w in self.gpus.values():
            w.handle = self.nv.nvmlDeviceGetHandleByIndex(w.info.index)
            w.before = self._counters(w)
        try:
            self._es = self.nv.nvmlEventSetCreate()
            for w in self.gpus.values():
                self.nv.nvmlDeviceRegisterEvents(w.handle, _EVENTS, self._es)
        except pynvml.NVMLError as err:
            self._es = None
            self.notes.append(f"NVML events unavailable ({err}): ECC counters compared instead")
        self._thread = threading.Thread(target=self._run, name="load-watch", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.sample()
        self._drain_events(0)
        for w in self.gpus.values():
            w.after = self._counters(w)
        if self._es is not None and hasattr(self.nv, "nvmlEventSetFree"):
            self.nv.nvmlEventSetFree(self._es)
        self.nv.nvmlShutdown()

    def _counters(self, w: GpuWatch) -> tuple | None:
        try:
            ecc = self.nv.nvmlDeviceGetTotalEccErrors(w.handle, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                                                      pynvml.NVML_VOLATILE_ECC)
        except pynvml.NVMLError as err:
            if isinstance(err, pynvml.NVMLError_GpuIsLost):
                w.lost = str(err)
                return None
            ecc = None  # ECC off or not supported: the events and the remap state still count
        try:
            _, _, pending, failure = self.nv.nvmlDeviceGetRemappedRows(w.handle)
        except pynvml.NVMLError:
            pending = failure = None
        return ecc, pending, failure

    def sample(self) -> None:
        """One reading of every GPU's clock-event reasons."""
        for w in self.gpus.values():
            try:
                bits = self.nv.nvmlDeviceGetCurrentClocksEventReasons(w.handle)
            except pynvml.NVMLError as err:
                if isinstance(err, pynvml.NVMLError_GpuIsLost):
                    w.lost = str(err)
                continue
            with self._lock:
                w.samples += 1
                for name, bit in REASONS.items():
                    if bits & bit:
                        w.reasons[name] = w.reasons.get(name, 0) + 1

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._drain_events(int(self.interval_s * 1000))

    def _drain_events(self, wait_ms: int) -> None:
        if self._es is None:
            self._stop.wait(self.interval_s)
            return
        while True:
            try:
                ev = self.nv.nvmlEventSetWait_v2(self._es, wait_ms)
            except pynvml.NVMLError:
                return  # timeout: nothing more now
            index = self._index_of(ev.device)
            what = (f"Xid {ev.eventData}" if ev.eventType & pynvml.nvmlEventTypeXidCriticalError
                    else "double-bit ECC error")
            with self._lock:
                if index in self.gpus:
                    self.gpus[index].events.append(what)
            wait_ms = 0

    def _index_of(self, device) -> int | None:
        try:
            return self.nv.nvmlDeviceGetIndex(device)
        except pynvml.NVMLError:
            return None

    def verdict(self, w: GpuWatch, fail_reasons: list[str]) -> dict[str, list[str]]:
        """What failed, by test: clocks (reasons that fail), events (Xid, ECC, remap under load)."""
        out: dict[str, list[str]] = {}
        bad = {r: n for r, n in w.reasons.items() if r in fail_reasons}
        if bad:
            out["clocks"] = [f"{r} in {n} of {w.samples} samples under load" for r, n in sorted(bad.items())]
        events = list(w.events)
        if w.lost:
            events.append(f"GPU lost during the load: {w.lost}")
        if w.before and w.after:
            if None not in (w.before[0], w.after[0]) and w.after[0] > w.before[0]:
                events.append(f"uncorrectable ECC errors {w.before[0]} -> {w.after[0]}")
            if w.after[1] and not w.before[1]:
                events.append("row remap pending after the load")
            if w.after[2] and not w.before[2]:
                events.append("row remap failure after the load")
        if events:
            out["events"] = events
        return out

    def figures(self, w: GpuWatch) -> dict[str, float]:
        return {"clock_samples": float(w.samples),
                **{f"clock_{r}_samples": float(n) for r, n in sorted(w.reasons.items())}}
