"""The checkers on numpy arrays with planted corruption: what they must catch, what they must pass."""

import numpy as np
import pytest

from health.load import checks
from policies.load import LoadTestPolicy

ULPS = LoadTestPolicy().abft_ulps


def tol(dtype: str, n: int) -> float:
    return checks.abft_tolerance(np, dtype, n, ULPS[dtype])


def product(n: int, dtype: str, seed: int = 1):
    rng = np.random.default_rng(seed)
    a, b = (rng.uniform(-1, 1, (n, n)).astype(dtype) for _ in range(2))
    c = (a.astype(np.float32) @ b.astype(np.float32)).astype(dtype) if dtype == "float16" else a @ b
    return a, b, c


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_abft_passes_healthy_products_within_tolerance(dtype):
    for n in (64, 256):
        a, b, c = product(n, dtype)
        assert checks.abft_error(np, a, b, c) < tol(dtype, n) / 5, (dtype, n)


@pytest.mark.parametrize("dtype,relative", [("float64", 1e-6), ("float32", 1e-3)])
def test_abft_catches_one_slightly_changed_element(dtype, relative):
    a, b, c = product(256, dtype)
    c[37, 101] += c.dtype.type(relative * float(np.abs(c).mean()))
    assert checks.abft_error(np, a, b, c) > tol(dtype, 256)


def test_abft_catches_an_exponent_flip_in_half_precision_but_the_known_answer_sees_more():
    a, b, c = product(128, "float16")
    bad = c.copy()
    bits = bad.reshape(-1).view(np.uint16)
    bits[500] ^= np.uint16(1 << 13)  # the value jumps 256x (or shrinks as much)
    bits[900] ^= np.uint16(1 << 13)
    assert checks.abft_error(np, a, b, bad) > tol("float16", 128)
    # A last-mantissa-bit flip hides in the output's own rounding: only the bitwise compare sees it.
    subtle = c.copy()
    subtle.reshape(-1).view(np.uint16)[500] ^= np.uint16(1)
    assert checks.abft_error(np, a, b, subtle) < tol("float16", 128)
    assert checks.bitwise_mismatches(np, subtle, c) == (1, 500)


def test_abft_is_normwise_not_elementwise():
    """A column whose checksum is near zero must not blow the residual up."""
    a, b, c = product(64, "float64")
    b[:, 5] = 0.0
    c = a @ b
    c[0, 5] = 1e-13  # tiny absolute error where the column sum is zero
    assert checks.abft_error(np, a, b, c) < tol("float64", 64)


def test_known_answer_is_bitwise():
    _, _, want = product(64, "float32")
    got = want.copy()
    assert checks.bitwise_mismatches(np, got, want) == (0, None)
    got.reshape(-1).view(np.uint32)[77] ^= np.uint32(1)  # the last mantissa bit: no tolerance hides it
    assert checks.bitwise_mismatches(np, got, want) == (1, 77)
    with pytest.raises(ValueError, match="known answer"):
        checks.bitwise_mismatches(np, got.astype(np.float64), want)


def test_known_answer_nan_in_both_is_no_mismatch():
    want = np.array([np.nan, 1.0], dtype=np.float32)
    assert checks.bitwise_mismatches(np, want.copy(), want) == (0, None)


def test_pattern_is_address_derived_and_polarities_cover_every_bit():
    p = checks.pattern(np, 1000, 4096, seed=7, invert=False)
    q = checks.pattern(np, 1000, 4096, seed=7, invert=True)
    assert p.dtype == np.uint32 and len(set(p.tolist())) > 4000  # neighbours differ
    assert np.all(p ^ q == np.uint32(0xFFFFFFFF))
    assert np.array_equal(checks.pattern(np, 1000 + 5, 10, 7, False), p[5:15])  # depends on the address only
    assert not np.array_equal(checks.pattern(np, 1000, 4096, 8, False), p)


@pytest.mark.parametrize("invert", [False, True])
def test_pattern_compare_finds_a_planted_flip_at_its_index(invert):
    buf = checks.pattern(np, 4096, 1 << 16, seed=3, invert=invert)
    assert checks.pattern_mismatches(np, buf, 4096, 3, invert) == (0, None)
    buf[12345] ^= np.uint32(1 << 17)
    buf[40000] ^= np.uint32(1)
    assert checks.pattern_mismatches(np, buf, 4096, 3, invert) == (2, 4096 + 12345)


def test_stuck_bit_shows_in_exactly_one_polarity():
    hits = []
    for invert in (False, True):
        buf = checks.pattern(np, 0, 1024, seed=1, invert=invert)
        buf[100] |= np.uint32(1 << 5)  # stuck at 1
        hits.append(checks.pattern_mismatches(np, buf, 0, 1, invert)[0])
    assert sorted(hits) == [0, 1]


def test_mismatch_tally_keeps_the_first_index():
    t = checks.PatternMismatch()
    t.add(0, None)
    t.add(3, 500)
    t.add(2, 10)
    assert (t.count, t.first) == (5, 500)
