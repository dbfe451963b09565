"""CPU time per probe cycle and peak RSS of the agent's probes on 8 simulated GPUs.

Run: .venv/bin/python bench/agent_probe.py [--cycles N]. Prints figures (goal: <= 5 ms CPU per
cycle, <= 80 MB peak RSS) and appends them to bench/RESULTS.md. Measured, never asserted.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.results import append_result  # noqa: E402
from health.nics import NicExpectation  # noqa: E402
from health.runner import ProbeConfig, run_cycle  # noqa: E402
from sim.nvml import SimulatedNvml  # noqa: E402
from sim.sysfs import PORT_UP, write_ib_ports  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cycles", type=int, default=2000)
    args = ap.parse_args()
    sysfs = write_ib_ports(Path(tempfile.mkdtemp()), [PORT_UP] * 8)
    nv = SimulatedNvml("bench", gpus=8)
    nv.inject("row_remap_pending", gpu=3)  # one finding, so the finding path is exercised too
    cfg = ProbeConfig(expected_gpus=8, nics=NicExpectation(), require_nvidia_smi=False, sysfs_infiniband=sysfs)
    with concurrent.futures.ThreadPoolExecutor(max_workers=3) as pool:
        for _ in range(50):
            run_cycle(cfg, nv, pool)  # warm-up
        cpu0, wall0 = time.process_time(), time.perf_counter()
        for _ in range(args.cycles):
            snap = run_cycle(cfg, nv, pool)
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    assert len(snap.findings) == 1
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"command: .venv/bin/python bench/agent_probe.py --cycles {args.cycles}")
    print(append_result("agent_probe", f"8 simulated GPUs + 8 sysfs IB ports, {args.cycles} cycles",
                        f"CPU {cpu / args.cycles * 1000:.3f} ms/cycle, wall {wall / args.cycles * 1000:.3f} ms/cycle, "
                        f"peak RSS {rss_mb:.1f} MB", "goal <= 5 ms, <= 80 MB"))


if __name__ == "__main__":
    main()
