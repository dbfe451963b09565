"""Real GPUs through CuPy (the optional extra `gpuheal[gpu]`: cupy-cuda12x, or cupy-cuda13x for a
CUDA 13 driver). CuPy is imported only here and only when a load test runs; its absence, or a
driver that will not start, is LoadTestUnavailable (probe_broken), never a pass.

GPUs are matched to NVML by PCI bus id (CUDA's own order may differ from NVML's), so each result
names the NVML index, UUID and serial the rest of gpuheal uses.
"""

from __future__ import annotations

import os
import time

import pynvml

from health.load.device import GpuDevice, GpuInfo, LoadTestUnavailable


def _import_cupy():
    os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    try:
        import cupy
    except ImportError as err:
        raise LoadTestUnavailable(f"CuPy is not installed ({err}): install gpuheal[gpu] (cupy-cuda12x or "
                                  "cupy-cuda13x, matching the driver)") from None
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as err:  # noqa: BLE001 - cudaErrorNoDevice, InsufficientDriver, ... all fail closed
        raise LoadTestUnavailable(f"the CUDA driver cannot be used: {err}") from None
    return cupy, count


def _norm_bus(bus: str) -> str:
    """'00000000:18:00.0' (NVML) and '0000:18:00.0' (CUDA) alike."""
    b = bus.strip().lower()
    domain, rest = b.split(":", 1) if b.count(":") == 2 else ("0", b)
    return f"{int(domain, 16):04x}:{rest}"


class CupyDevice(GpuDevice):
    chunk_words = 1 << 26

    def __init__(self, cupy, cuda_index: int, info: GpuInfo):
        self.cp, self.xp, self.cuda_index, self.info = cupy, cupy, cuda_index, info
        self.device = cupy.cuda.Device(cuda_index)
        self._pinned = None

    def _on(self):
        return self.device

    def now(self) -> float:
        with self._on():
            self.cp.cuda.Device().synchronize()
        return time.perf_counter()

    def operands(self, n: int, dtype: str, seed: int):
        with self._on():
            rng = self.cp.random.default_rng(seed)
            return tuple(rng.uniform(-1, 1, (n, n), dtype=self.cp.float32).astype(dtype) for _ in range(2))

    def product(self, a, b):
        with self._on():
            return self.cp.matmul(a, b)  # cuBLAS; half types accumulate in fp32

    def free_bytes(self) -> int:
        with self._on():
            return self.cp.cuda.runtime.memGetInfo()[0]

    def words(self, count: int):
        with self._on():
            return self.cp.empty(count, dtype=self.cp.uint32)

    def write_pattern(self, buf, start: int, seed: int, invert: bool) -> None:
        with self._on():
            super().write_pattern(buf, start, seed, invert)

    def check_pattern(self, buf, start: int, seed: int, invert: bool):
        with self._on():
            return super().check_pattern(buf, start, seed, invert)

    def _timed(self, copy) -> float:
        with self._on():
            self.cp.cuda.Device().synchronize()
            t0 = time.perf_counter()
            copy()
            self.cp.cuda.Device().synchronize()
            return time.perf_counter() - t0

    def copy_device(self, nbytes: int) -> float:
        with self._on():
            src, dst = self.cp.empty(nbytes, self.cp.uint8), self.cp.empty(nbytes, self.cp.uint8)
            return self._timed(lambda: dst.data.copy_from_device(src.data, nbytes))

    def _host(self, nbytes: int):
        if self._pinned is None or self._pinned.size < nbytes:
            self._pinned = self.cp.cuda.alloc_pinned_memory(nbytes)  # pageable would measure 7-11 GB/s
        return self._pinned

    def copy_to_device(self, nbytes: int) -> float:
        with self._on():
            host, dst = self._host(nbytes), self.cp.empty(nbytes, self.cp.uint8)
            return self._timed(lambda: dst.data.copy_from_host(host.ptr, nbytes))

    def copy_to_host(self, nbytes: int) -> float:
        with self._on():
            host, src = self._host(nbytes), self.cp.empty(nbytes, self.cp.uint8)
            return self._timed(lambda: src.data.copy_to_host(host.ptr, nbytes))

    def copy_peer(self, other: GpuDevice, nbytes: int) -> float | None:
        if not isinstance(other, CupyDevice):
            return None
        rt = self.cp.cuda.runtime
        if not rt.deviceCanAccessPeer(self.cuda_index, other.cuda_index):
            return None
        with self._on():
            try:
                rt.deviceEnablePeerAccess(other.cuda_index)
            except self.cp.cuda.runtime.CUDARuntimeError:
                pass  # already enabled
            src = self.cp.empty(nbytes, self.cp.uint8)
        with other._on():
            dst = other.cp.empty(nbytes, other.cp.uint8)
        return self._timed(lambda: rt.memcpyPeer(dst.data.ptr, other.cuda_index, src.data.ptr, self.cuda_index, nbytes))

    def close(self) -> None:
        with self._on():
            self.cp.get_default_memory_pool().free_all_blocks()
        self._pinned = None


def cupy_opener(nv=pynvml):
    """The device opener for real GPUs: every NVML index asked for (all when None), or fail closed."""
    def open_devices(indices: list[int] | None) -> list[GpuDevice]:
        cp, count = _import_cupy()
        by_bus = {}
        for c in range(count):
            by_bus[_norm_bus(cp.cuda.Device(c).pci_bus_id)] = c
        nv.nvmlInit()
        try:
            wanted = indices if indices else list(range(nv.nvmlDeviceGetCount()))
            out = []
            for i in wanted:
                try:
                    h = nv.nvmlDeviceGetHandleByIndex(i)
                    bus = nv.nvmlDeviceGetPciInfo(h).busId
                    bus = bus.decode() if isinstance(bus, bytes) else bus
                    info = GpuInfo(index=i, uuid=nv.nvmlDeviceGetUUID(h), serial=_serial(nv, h),
                                   sku=nv.nvmlDeviceGetName(h), pci=bus)
                except pynvml.NVMLError as err:
                    raise LoadTestUnavailable(f"GPU {i} cannot be used: {err}") from None
                if _norm_bus(bus) not in by_bus:
                    raise LoadTestUnavailable(f"GPU {i} ({bus}) is not visible to CUDA")
                out.append(CupyDevice(cp, by_bus[_norm_bus(bus)], info))
            return out
        finally:
            nv.nvmlShutdown()
    return open_devices


def _serial(nv, h) -> str | None:
    try:
        return nv.nvmlDeviceGetSerial(h)
    except pynvml.NVMLError:
        return None
