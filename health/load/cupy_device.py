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


# checks.pattern, word for word: ((i ^ seed) * 0x9E3779B1 mod 2^32), then x ^= x >> 15, then ^ inv.
_PATTERN_CUDA = r"""
__device__ __forceinline__ unsigned int word(unsigned long long i, unsigned long long seed) {
    unsigned long long w = ((i ^ seed) * 0x9E3779B1ULL) & 0xFFFFFFFFULL;
    return (unsigned int)(w ^ (w >> 15));
}
extern "C" __global__ void pattern_write(unsigned int* buf, unsigned long long n, unsigned long long start,
                                         unsigned long long seed, unsigned int inv) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)blockDim.x * gridDim.x)
        buf[i] = word(start + i, seed) ^ inv;
}
extern "C" __global__ void pattern_check(const unsigned int* buf, unsigned long long n, unsigned long long start,
                                         unsigned long long seed, unsigned int inv,
                                         unsigned long long* count, unsigned long long* first) {
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)blockDim.x * gridDim.x)
        if (buf[i] != (word(start + i, seed) ^ inv)) {
            atomicAdd(count, 1ULL);
            atomicMin(first, i);
        }
}
"""


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
            rng = self.cp.random.RandomState(seed)
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

    def _kernels(self):
        """The pattern as two fused kernels (one pass over memory each, as the reference's 4.2 and
        3.6 TB/s were measured); None, and the array-API path, if they will not compile."""
        if not hasattr(self, "_pattern_kernels"):
            try:
                module = self.cp.RawModule(code=_PATTERN_CUDA)
                self._pattern_kernels = (module.get_function("pattern_write"), module.get_function("pattern_check"))
                self._blocks = 32 * self.device.attributes["MultiProcessorCount"]
            except Exception:  # noqa: BLE001 - slower, still correct: the figures will say so
                self._pattern_kernels = None
        return self._pattern_kernels

    def write_pattern(self, buf, start: int, seed: int, invert: bool) -> None:
        with self._on():
            if (k := self._kernels()) is None:
                return super().write_pattern(buf, start, seed, invert)
            u64, u32 = self.cp.uint64, self.cp.uint32
            k[0]((self._blocks,), (256,), (buf, u64(buf.size), u64(start), u64(seed), u32(0xFFFFFFFF if invert else 0)))

    def check_pattern(self, buf, start: int, seed: int, invert: bool):
        with self._on():
            if (k := self._kernels()) is None:
                return super().check_pattern(buf, start, seed, invert)
            u64, u32 = self.cp.uint64, self.cp.uint32
            found = self.cp.array([0, 2 ** 64 - 1], dtype=u64)  # count, first index
            k[1]((self._blocks,), (256,), (buf, u64(buf.size), u64(start), u64(seed),
                                           u32(0xFFFFFFFF if invert else 0), found[0:1], found[1:2]))
            count, first = (int(x) for x in found.get())
            return count, (start + first if count else None)

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
        if self._pinned is None or self._pinned_bytes < nbytes:
            self._pinned = self.cp.cuda.alloc_pinned_memory(nbytes)  # pageable would measure 7-11 GB/s
            self._pinned_bytes = nbytes
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
                    name = nv.nvmlDeviceGetName(h)
                    info = GpuInfo(index=i, uuid=nv.nvmlDeviceGetUUID(h), serial=_serial(nv, h),
                                   sku=name.decode() if isinstance(name, bytes) else name, pci=bus)
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
