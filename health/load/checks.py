"""The checkers, written against the array API numpy and CuPy share (`xp`), so the very code that
judges a GPU's buffers is unit-tested on numpy arrays with planted corruption.

- ABFT: the column sums of C = A @ B must equal (column sums of A) @ B. Judged normwise, never
  elementwise (a column sum near zero blows an elementwise ratio up): the largest checksum
  difference over the largest entry of colsum(|A|) @ |B|, the magnitude every rounding error is
  bounded by. A healthy H200 shows 1.2e-9 (fp32) and 2.7e-18 (fp64) (gpu-load.md).
- Known answer: the same product of the same inputs is bitwise identical run after run (30 of 30
  repeats on the reference H200, every dtype); any differing bit under load is corruption.
- Pattern: an address-derived 32-bit word (a multiplicative hash of the index and a seed), so a
  stuck cell, a decoder fault or a stale read shows at its exact index; written in both
  polarities so every bit is tested at 0 and at 1.
"""

from __future__ import annotations

from dataclasses import dataclass

_HASH_MUL = 0x9E3779B1  # Knuth's golden-ratio multiplier: neighbouring addresses get unrelated words


def abft_error(xp, a, b, c) -> float:
    """Normwise ABFT residual of c against a @ b (0 for an exact product), computed in float64 on
    the device where the inputs live (one row-vector product: O(n^2), cheap next to the GEMM)."""
    a64, b64 = a.astype(xp.float64), b.astype(xp.float64)
    want = xp.sum(a64, axis=0) @ b64
    got = xp.sum(c.astype(xp.float64), axis=0)
    bound = xp.sum(xp.abs(a64), axis=0) @ xp.abs(b64)
    scale = float(xp.max(bound))
    if scale == 0.0:
        return 0.0 if float(xp.max(xp.abs(got))) == 0.0 else float("inf")
    return float(xp.max(xp.abs(got - want))) / scale


def bitwise_mismatches(xp, got, want) -> tuple[int, int | None]:
    """How many elements of `got` differ from `want` in any bit, and the first flat index that does
    (NaNs compare by bits too: a NaN where the known answer had one is no mismatch)."""
    if got.shape != want.shape or got.dtype != want.dtype:
        raise ValueError(f"known answer is {want.dtype}{want.shape}, got {got.dtype}{got.shape}")
    view = {1: xp.uint8, 2: xp.uint16, 4: xp.uint32, 8: xp.uint64}[got.dtype.itemsize]
    diff = got.reshape(-1).view(view) != want.reshape(-1).view(view)
    count = int(xp.count_nonzero(diff))
    return count, (int(xp.argmax(diff.astype(xp.uint8))) if count else None)


def pattern(xp, start: int, count: int, seed: int, invert: bool):
    """The words expected at indices start .. start+count-1 (uint32)."""
    idx = xp.arange(start, start + count, dtype=xp.uint64)
    words = ((idx ^ xp.uint64(seed)) * xp.uint64(_HASH_MUL)) & xp.uint64(0xFFFFFFFF)
    words = words ^ (words >> xp.uint64(15))
    words = words.astype(xp.uint32)
    return ~words if invert else words


@dataclass
class PatternMismatch:
    count: int = 0
    first: int | None = None  # absolute word index of the first mismatch

    def add(self, count: int, first: int | None) -> None:
        if count and self.first is None:
            self.first = first
        self.count += count


def pattern_mismatches(xp, buf, start: int, seed: int, invert: bool) -> tuple[int, int | None]:
    """Compare a chunk read back from memory with the pattern; (count, absolute first index)."""
    diff = buf != pattern(xp, start, buf.size, seed, invert)
    count = int(xp.count_nonzero(diff))
    return count, (start + int(xp.argmax(diff.astype(xp.uint8))) if count else None)


def abft_tolerance(xp, dtype: str, n: int, ulps: float) -> float:
    """The residual a healthy n x n product stays under: `ulps` machine epsilons over sqrt(n).

    Healthy residuals measured (numpy here; an H200 for fp32/fp64 at n=8192): fp64 and fp32 sit
    at 0.3-1.3 eps/sqrt(n) (fp32 1.2e-9 at 8192, as the reference's), a half-precision output at
    0.03-0.07 eps/sqrt(n). Half-precision rounding of the output also bounds what ABFT can see
    (a change under ~sqrt(n) ulps of |C| hides in it): the bitwise known answer covers the rest."""
    return ulps * float(xp.finfo(getattr(xp, dtype)).eps) / max(n, 1) ** 0.5
