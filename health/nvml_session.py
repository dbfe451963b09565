"""One NVML session per process and NVML module: initialised on first use, initialised again after
the errors that leave it stale (a reloaded driver, a lost GPU), shared by the probes and the Xid
watch thread."""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Any

import pynvml

from policies.findings import GpuIds

# Errors that mean the GPU itself is gone or wedged, not that our check failed.
GPU_LOST_ERRORS = (pynvml.NVMLError_GpuIsLost, pynvml.NVMLError_ResetRequired)
# Errors after which NVML is initialised again: it was never (or no longer) initialised, the driver
# was reloaded under us, or a GPU was lost (its enumeration is stale until NVML is initialised again).
REINIT_ERRORS = (pynvml.NVMLError_Uninitialized, pynvml.NVMLError_DriverNotLoaded, pynvml.NVMLError_Unknown,
                 *GPU_LOST_ERRORS)


class NvmlSession:
    """nvmlInit once per process, never per probe cycle (it costs ~10 ms of CPU on a real node), and
    again after an error that says the library's state is stale. Thread-safe: probes, the Xid
    watcher and node activities share one."""

    def __init__(self, nv=pynvml):
        self.nv = nv
        self.inits = 0  # how often nvmlInit ran (the bench prints it)
        # Facts that hold until NVML is initialised again: each GPU's ids, the NVLink links it has.
        self.ids: dict[int, GpuIds] = {}
        self.links: dict[int, list[int]] = {}
        self._ready = False
        self._lock = threading.Lock()

    def ensure(self):
        """The module, initialised. Raises what nvmlInit raises (NVML missing: the caller fails closed)."""
        with self._lock:
            if not self._ready:
                if self.inits:
                    try:
                        self.nv.nvmlShutdown()  # nvmlInit counts references: drop the stale one
                    except pynvml.NVMLError:
                        pass
                self.ids, self.links = {}, {}
                self.nv.nvmlInit()
                self.inits += 1
                self._ready = True
        return self.nv

    def failed(self, err: BaseException) -> None:
        """Note an NVML error: one of REINIT_ERRORS makes the next ensure() initialise again."""
        if isinstance(err, REINIT_ERRORS):
            self.stale()

    def stale(self) -> None:
        """The next ensure() initialises again (GPUs are enumerated at init: a missing one may be back)."""
        with self._lock:
            self._ready = False

    @contextmanager
    def use(self):
        nv = self.ensure()
        try:
            yield nv
        except pynvml.NVMLError as err:
            self.failed(err)
            raise


_sessions: dict[int, NvmlSession] = {}
_sessions_lock = threading.Lock()


def nvml_session(nv=pynvml) -> NvmlSession:
    """The process's one session for this NVML module (the real one, or a simulated one per host)."""
    with _sessions_lock:
        session = _sessions.get(id(nv))
        if session is None or session.nv is not nv:
            session = _sessions[id(nv)] = NvmlSession(nv)
        return session


def text(value: Any) -> str:
    """An NVML string: bytes from older bindings, str from newer."""
    return value.decode() if isinstance(value, bytes) else str(value)
