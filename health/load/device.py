"""What a load test needs from one GPU: one interface, two backends (cupy_device.py, sim_device.py).

Arrays live on the device and are worked on with `xp` (cupy or numpy), so the checkers in
checks.py run where the data is. `now()` is the device's clock: it waits for queued work first,
so a figure measured between two calls covers the work, not its launch.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

from health.load import checks


class LoadTestUnavailable(Exception):
    """No load test possible here (no CuPy, no CUDA driver, a GPU that cannot be used): the
    validation fails closed as probe_broken with this reason."""


@dataclass(frozen=True)
class GpuInfo:
    index: int  # NVML index
    uuid: str
    serial: str | None
    sku: str  # product name as NVML gives it, the key of the SKU's figures
    pci: str = ""


class GpuDevice(ABC):
    info: GpuInfo
    xp = None  # the array module

    # --- time ----------------------------------------------------------------------------------
    @abstractmethod
    def now(self) -> float:
        """Seconds on the device's clock, after everything queued on it has finished."""

    # --- compute -------------------------------------------------------------------------------
    @abstractmethod
    def operands(self, n: int, dtype: str, seed: int):
        """Two n x n matrices of the dtype, uniform in [-1, 1), the same for the same seed."""

    @abstractmethod
    def product(self, a, b):
        """a @ b as the tensor cores do it (fp32 accumulate for half types)."""

    def flops(self, n: int) -> float:
        """The floating-point work one product of the policy's size counts for."""
        return 2.0 * n ** 3

    # --- memory --------------------------------------------------------------------------------
    @abstractmethod
    def free_bytes(self) -> int: ...

    @abstractmethod
    def words(self, count: int):
        """A uint32 buffer of `count` words in device memory."""

    def write_pattern(self, buf, start: int, seed: int, invert: bool) -> None:
        buf[...] = checks.pattern(self.xp, start, buf.size, seed, invert)

    def check_pattern(self, buf, start: int, seed: int, invert: bool) -> tuple[int, int | None]:
        return checks.pattern_mismatches(self.xp, buf, start, seed, invert)

    def tested_bytes(self, buf) -> int:
        """The memory a buffer's pattern pass covers."""
        return buf.nbytes

    # --- bandwidth (each returns the seconds one copy of nbytes took) ---------------------------
    @abstractmethod
    def copy_device(self, nbytes: int) -> float: ...

    @abstractmethod
    def copy_to_device(self, nbytes: int) -> float:
        """From pinned host memory."""

    @abstractmethod
    def copy_to_host(self, nbytes: int) -> float:
        """Into pinned host memory."""

    @abstractmethod
    def copy_peer(self, other: GpuDevice, nbytes: int) -> float | None:
        """To another GPU of the node directly; None when the two cannot reach each other as peers."""

    # --- load hooks (the simulated GPUs' faults act here) ---------------------------------------
    def load_started(self) -> None:
        """The battery's sustained load begins on this GPU."""
        return None

    def load_ended(self) -> None:
        """... and ends."""
        return None

    def close(self) -> None:
        """Give the memory back."""
        return None
