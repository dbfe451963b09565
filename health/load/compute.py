"""Compute under sustained load: products of the policy's size for the tier's duration.

Sustained TFLOP/s is the work over the time the products took (checks excluded). Correctness
is checked while loaded, two ways: the ABFT checksums of every Nth product judged normwise
(checks.abft_error), and a fixed known-answer product, computed cold before the load, recomputed
every Mth product and compared bitwise (a healthy GPU repeats it bit for bit). Either one failing
is silent data corruption on that GPU, and the test stops there.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from health.load import checks
from health.load.device import GpuDevice

KNOWN_SEED, LOAD_SEED, BATCH = 0xC0FFEE, 0xBEEF, 8


def run_compute(dev: GpuDevice, n: int, dtype: str, duration_s: float, abft_every: int, known_every: int,
                ulps: float, past_deadline: Callable[[], bool]) -> tuple[dict[str, float], str | None]:
    """The figures and, when the GPU corrupted a result, what it got wrong."""
    xp = dev.xp
    ka, kb = dev.operands(n, dtype, KNOWN_SEED)
    tolerance = checks.abft_tolerance(xp, dtype, ka.shape[0], ulps)
    want = dev.product(ka, kb)
    first_error = checks.abft_error(xp, ka, kb, want)
    if first_error > tolerance:
        return {"abft_max_error": first_error}, f"ABFT residual {first_error:.3g} > {tolerance:.3g} on the cold known-answer product"
    a, b = dev.operands(n, dtype, LOAD_SEED)
    products, busy, worst, known_checks, burst, checks_s = 0, 0.0, first_error, 0, 0.0, 0.0
    start = dev.now()
    why = None
    while dev.now() - start < duration_s and why is None:
        if past_deadline():
            raise TimeoutError("compute: the tier's time limit passed")
        t0 = dev.now()
        for _ in range(BATCH):
            c = dev.product(a, b)
        took = dev.now() - t0
        busy += took
        products += BATCH
        burst = max(burst, BATCH * dev.flops(n) / took / 1e12 if took > 0 else 0.0)
        checking = time.perf_counter()
        if products % abft_every < BATCH:
            err = checks.abft_error(xp, a, b, c)
            worst = max(worst, err)
            if err > tolerance:
                why = f"ABFT residual {err:.3g} > {tolerance:.3g} after {products} products under load"
        if why is None and products % known_every < BATCH:
            why = _known_answer(dev, ka, kb, want, products)
            known_checks += 1
        checks_s += time.perf_counter() - checking
    if why is None:
        why = _known_answer(dev, ka, kb, want, products)
        known_checks += 1
    figures = {"tflops_sustained": products * dev.flops(n) / busy / 1e12 if busy > 0 else 0.0,
               "tflops_burst": burst, "products": float(products), "abft_max_error": worst,
               "known_answer_checks": float(known_checks), "abft_tolerance": tolerance,
               "compute_s": dev.now() - start, "checks_wall_s": checks_s}
    return figures, why


def _known_answer(dev: GpuDevice, ka, kb, want, products: int) -> str | None:
    count, first = checks.bitwise_mismatches(dev.xp, dev.product(ka, kb), want)
    if count:
        return (f"known-answer product differs bitwise from its cold result in {count} elements "
                f"(first at {first}) after {products} products under load")
    return None
