"""The load-test battery's quick tier on 8 simulated GPUs: its wall time and its own overhead.

Run: .venv/bin/python bench/load_battery.py. Prints figures and appends them to bench/RESULTS.md.
Measured, never asserted. The simulated GPUs do the checks' arithmetic for real (products of
64 x 64, a 1 MiB pattern buffer) and model the time of the work they stand for (an 8192^3 GEMM
at the reference H200's rate), so the wall time here is the battery's own cost: threads, checks,
NVML sampling, judging. Also: the ABFT and known-answer checks' cost next to the product they
check, in numpy at a size where that ratio means something (n = 1024).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.results import append_result  # noqa: E402
from health.load import checks  # noqa: E402
from health.load.battery import run_battery  # noqa: E402
from policies.load import LoadTestPolicy  # noqa: E402
from policies.model import Policy  # noqa: E402
from sim.load_device import sim_opener  # noqa: E402
from sim.nvml import SimulatedNvml  # noqa: E402


def tier_run(policy: LoadTestPolicy, label: str) -> str:
    nv = SimulatedNvml("bench", gpus=8)
    t0 = time.perf_counter()
    r = run_battery(sim_opener(nv), nv, policy, "quick")
    wall = time.perf_counter() - t0
    assert r.passed, r.findings
    g = r.gpus[0].figures
    checks_s = max(x.figures["checks_wall_s"] for x in r.gpus)
    return (f"{label}: wall {wall:.2f} s for {g['products']:.0f} products/GPU ({g['compute_s']:.2f} s of modelled "
            f"GEMM), battery overhead {r.overhead_s:.3f} s outside the tests, checks {checks_s:.2f} s/GPU; "
            f"{g['tflops_sustained']:.0f} TFLOP/s, HBM {g['hbm_read_tbps']:.1f} TB/s modelled")


def check_cost(n: int = 1024) -> str:
    rng = np.random.default_rng(0)
    a, b = (rng.uniform(-1, 1, (n, n)).astype(np.float32) for _ in range(2))
    t0 = time.perf_counter()
    for _ in range(5):
        c = a @ b
    gemm = (time.perf_counter() - t0) / 5
    t0 = time.perf_counter()
    for _ in range(5):
        checks.abft_error(np, a, b, c)
    abft = (time.perf_counter() - t0) / 5
    t0 = time.perf_counter()
    for _ in range(5):
        checks.bitwise_mismatches(np, c, c.copy())
    kat = (time.perf_counter() - t0) / 5
    policy = LoadTestPolicy()
    share = (abft / policy.abft_every + (gemm + kat) / policy.known_answer_every) / gemm
    return (f"numpy n={n} fp32: product {gemm * 1000:.1f} ms, ABFT {abft * 1000:.1f} ms, bitwise compare "
            f"{kat * 1000:.2f} ms; at abft_every={policy.abft_every}, known_answer_every={policy.known_answer_every}: "
            f"{share:.1%} of the GEMM time")


def main() -> None:
    print("command: .venv/bin/python bench/load_battery.py")
    lines = [tier_run(LoadTestPolicy(), "quick tier as shipped (30 s GEMM/GPU)"),
             tier_run(Policy().scaled(0.002).validation.load, "quick tier at the demo's time_scale 0.002"),
             check_cost()]
    for line in lines:
        print(line)
    print(append_result("load_battery", "8 simulated GPUs (sim/load_device.py), 2 shared cores", "; ".join(lines),
                        "quick tier in seconds on the simulated device; checks a few % of the load"))


if __name__ == "__main__":
    main()
