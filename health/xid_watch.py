"""Xid and double-bit ECC events from NVML, watched on a thread (the agent drains them each cycle)."""

from __future__ import annotations

import queue
import threading

import pynvml

from health.nvml_session import nvml_session, text
from policies.findings import Finding, FindingKind

NVML_NO_INSTANCE = 0xFFFFFFFF  # nvmlEventData_t / nvmlProcessInfo_t: no MIG instance (MIG off, or not attributable)


def mig_id(value: int | None) -> int | None:
    """A MIG instance id as NVML gives it, or None where it names none."""
    return None if value is None or value == NVML_NO_INSTANCE else int(value)


class XidWatcher:
    """Xid and double-bit ECC events from an NVML event set, on a thread; idle timeouts are normal."""

    def __init__(self, nv=pynvml, wait_ms: int = 1000):
        self.nv, self.wait_ms = nv, wait_ms
        self.session = nvml_session(nv)
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
            self.session.ensure()
            es = nv.nvmlEventSetCreate()
            uuids = {}
            for i in range(nv.nvmlDeviceGetCount()):
                h = nv.nvmlDeviceGetHandleByIndex(i)
                uuids[i] = text(nv.nvmlDeviceGetUUID(h))
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
            self.session.failed(err)
            # The caller reports this as probe_broken: no events must never read as "no faults".
            self.error = f"NVML event watch failed: {err}"
