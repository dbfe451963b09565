"""Simulated GPUs for the load-test battery: numpy-backed devices behind health/load/device.py.

The arithmetic is real (products, checksums and memory patterns are computed and compared on
small numpy arrays, so a checker that misses planted corruption fails here as on a GPU); the
time is modelled: each product stands for one of the policy's size and is charged at the
simulated kind's throughput, each pattern pass for the memory it stands for. The kind is the
reference H200 (gpu-load.md). Faults come from the GPU's `load_faults` in sim/nvml.py, so a
scenario injects them like any other and a cure clears them:

- corrupt_under_load: once loaded, each product comes back with one exponent bit flipped;
- hbm_cells: three cells whose bit 5 is stuck at 1 (one polarity of the pattern shows each);
- slow_gpu: 70% of the kind's throughput and bandwidth;
- hw_slowdown_under_load: under load NVML reports HW slowdown, and the clocks halve;
- xid_under_load: an Xid event (119 unless the scenario gives one) once the load starts.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pynvml

from health.load.device import GpuDevice, GpuInfo, LoadTestUnavailable
from sim.nvml import SimulatedNvml


@dataclass(frozen=True)
class SimKind:
    sku: str = "Simulated H200"
    burst_tflops: float = 734.0  # fp16 cupy.matmul on the reference H200
    sustained_tflops: float = 626.0  # bf16 fell from ~780 to ~657 after ~5 s under the 700 W cap
    burst_s: float = 5.0
    hbm_write_tbps: float = 4.2
    hbm_read_tbps: float = 3.6
    d2d_tbps: float = 1.9
    host_gbps: float = 55.4  # pinned, PCIe Gen5 x16, each way
    peer_gbps: float = 350.0  # NVLink between the GPUs of an 8-GPU HGX board
    free_bytes: int = 139 << 30
    real_n: int = 64  # the side of the matrices actually multiplied
    real_words: int = 1 << 18  # the words actually written and read per pattern pass


SLOW_FACTOR, SLOWDOWN_FACTOR = 0.7, 0.5
_STUCK_BIT = np.uint32(1 << 5)


class SimDevice(GpuDevice):
    xp = np

    def __init__(self, nv: SimulatedNvml, index: int, kind: SimKind = SimKind()):
        self.nv, self.kind, self.gpu = nv, kind, nv.gpus[index]
        self.info = GpuInfo(index=index, uuid=self.gpu.uuid, serial=self.gpu.serial, sku=kind.sku, pci=self.gpu.pci)
        self.t = 0.0  # the device's clock, advanced by the modelled cost of each piece of work
        self.loaded_at: float | None = None
        self.products_loaded = 0
        self.logical_n = kind.real_n

    @property
    def faults(self) -> set[str]:
        return self.gpu.load_faults

    def _speed(self) -> float:
        speed = SLOW_FACTOR if "slow_gpu" in self.faults else 1.0
        if self.loaded_at is not None and "hw_slowdown_under_load" in self.faults:
            speed *= SLOWDOWN_FACTOR
        return speed

    def now(self) -> float:
        return self.t

    # --- compute -------------------------------------------------------------------------------
    def operands(self, n: int, dtype: str, seed: int):
        self.logical_n = n
        rng = np.random.default_rng(seed)
        side = min(n, self.kind.real_n)
        a, b = (rng.uniform(-1, 1, (side, side)).astype(dtype) for _ in range(2))
        return a, b

    def product(self, a, b):
        c = (a.astype(np.float32) @ b.astype(np.float32)).astype(a.dtype)
        loaded_s = self.t - self.loaded_at if self.loaded_at is not None else 0.0
        rate = self.kind.burst_tflops if loaded_s < self.kind.burst_s else self.kind.sustained_tflops
        self.t += self.flops(self.logical_n) / (rate * 1e12 * self._speed())
        if self.loaded_at is not None:
            self.products_loaded += 1
            if "corrupt_under_load" in self.faults and self.products_loaded > 3:
                flat = c.reshape(-1).view({2: np.uint16, 4: np.uint32, 8: np.uint64}[c.dtype.itemsize])
                bit = {2: 13, 4: 28, 8: 60}[c.dtype.itemsize]  # an exponent bit: the value jumps
                flat[self.products_loaded % flat.size] ^= flat.dtype.type(1 << bit)
        return c

    # --- memory --------------------------------------------------------------------------------
    def free_bytes(self) -> int:
        return self.kind.free_bytes

    def words(self, count: int):
        self.logical_words = count
        return np.zeros(min(count, self.kind.real_words), dtype=np.uint32)

    def tested_bytes(self, buf) -> int:
        return 4 * self.logical_words

    def write_pattern(self, buf, start: int, seed: int, invert: bool) -> None:
        super().write_pattern(buf, start, seed, invert)
        if "hbm_cells" in self.faults:
            cells = [(k * 7919 + 13) % buf.size for k in range(1, 4)]
            buf[cells] |= _STUCK_BIT
        self.t += self._share(buf) / (self.kind.hbm_write_tbps * 1e12 * self._speed())

    def check_pattern(self, buf, start: int, seed: int, invert: bool) -> tuple[int, int | None]:
        self.t += self._share(buf) / (self.kind.hbm_read_tbps * 1e12 * self._speed())
        return super().check_pattern(buf, start, seed, invert)

    def _share(self, buf) -> float:
        """The logical bytes a chunk stands for (the whole buffer stands for the tested memory)."""
        return buf.nbytes * self.tested_bytes(buf) / (4 * min(self.logical_words, self.kind.real_words))

    # --- bandwidth -----------------------------------------------------------------------------
    def _copy(self, nbytes: int, per_s: float) -> float:
        took = nbytes / (per_s * self._speed())
        self.t += took
        return took

    def copy_device(self, nbytes: int) -> float:
        return self._copy(nbytes, self.kind.d2d_tbps * 1e12)

    def copy_to_device(self, nbytes: int) -> float:
        return self._copy(nbytes, self.kind.host_gbps * 1e9)

    def copy_to_host(self, nbytes: int) -> float:
        return self._copy(nbytes, self.kind.host_gbps * 1e9)

    def copy_peer(self, other: GpuDevice, nbytes: int) -> float | None:
        slowest = min(self._speed(), other._speed()) if isinstance(other, SimDevice) else self._speed()
        took = nbytes / (self.kind.peer_gbps * 1e9 * slowest)
        self.t += took
        return took

    # --- load ----------------------------------------------------------------------------------
    def load_started(self) -> None:
        self.loaded_at, self.products_loaded = self.t, 0
        reasons = pynvml.nvmlClocksEventReasonSwPowerCap  # normal at full load (gpu-load.md)
        if "hw_slowdown_under_load" in self.faults:
            reasons |= pynvml.nvmlClocksEventReasonHwSlowdown
        self.gpu.clock_reasons |= reasons
        self._load_reasons = reasons
        if "xid_under_load" in self.faults:
            self.nv.inject("xid", gpu=self.info.index, xid=self.gpu.load_xid)

    def load_ended(self) -> None:
        self.loaded_at = None
        self.gpu.clock_reasons &= ~getattr(self, "_load_reasons", 0)


def sim_opener(nv: SimulatedNvml, kind: SimKind = SimKind()):
    """The device opener the node activities take: every simulated GPU that still answers."""
    def open_devices(indices: list[int] | None) -> list[GpuDevice]:
        if not nv.loadable:
            raise LoadTestUnavailable("the simulated driver is not loaded (NVML missing)")
        wanted = indices if indices else list(range(len(nv.gpus)))
        out = []
        for i in wanted:
            if i >= len(nv.gpus) or nv.gpus[i].lost or i in nv.hidden:
                raise LoadTestUnavailable(f"GPU {i} cannot be used: not on the bus")
            out.append(SimDevice(nv, i, kind))
        return out
    return open_devices
