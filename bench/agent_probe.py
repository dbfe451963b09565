"""CPU time per probe cycle, how NVML was called, and the agent's memory, on 8 simulated GPUs.

Run: .venv/bin/python bench/agent_probe.py [--cycles N]. Prints figures (goals: <= 2 ms CPU per
cycle for 8 GPUs, <= 80 MB for the agent process) and appends them to bench/RESULTS.md. Measured,
never asserted. The simulated NVML answers from memory: on a real node each NVML call costs more
(gpu-load.md measured 1.5 ms per cycle with NVML kept initialised, 14 ms with init + shutdown per cycle).
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def rss_mb() -> tuple[float, float]:
    """(current, peak) resident set size in MB."""
    current = int(Path("/proc/self/statm").read_text().split()[1]) * resource.getpagesize() / 2**20
    return current, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


async def live_agent(nv, probe, seconds: float) -> str:
    """The agent as deployed: a Temporal client, the node worker and the probe loop, in this process
    (the dev server is another process), for `seconds`. Returns the cycles' CPU while serving."""
    from temporalio.contrib.pydantic import pydantic_data_converter
    from temporalio.testing import WorkflowEnvironment

    from policies.loader import default_policy
    from workers.agent import AgentConfig, run_agent
    from workers.embedded_temporal import binary

    env = await WorkflowEnvironment.start_local(dev_server_existing_path=binary("temporal"),
                                                data_converter=pydantic_data_converter)
    try:
        config = AgentConfig(node="bench", policy=default_policy(), probe=probe, poll_interval_s=1.0, kmsg=None,
                             admit_on_start=False)
        stop = asyncio.Event()
        cpu0 = time.process_time()
        task = asyncio.create_task(run_agent(env.client, config, stop, nv))
        await asyncio.sleep(seconds)
        stop.set()
        await task
        cpu = time.process_time() - cpu0
    finally:
        await env.shutdown()
    return f"; serving {seconds:g} s (1 s polls, one report sent): {cpu / seconds * 1000:.1f} ms CPU per second"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cycles", type=int, default=2000)
    ap.add_argument("--live-s", type=float, default=20.0,
                    help="then run the real agent (probe loop + node worker) this long against a dev server; 0: skip")
    args = ap.parse_args()

    from health.nvml_session import nvml_session
    from health.runner import ProbeConfig, run_cycle
    from policies.loader import default_policy
    from sim.nvml import SimulatedNvml
    from sim.sysfs import PORT_UP, write_ib_ports

    probe_only = rss_mb()[0]
    import workers.agent  # noqa: F401 - the agent process's imports (temporalio, the activities, the client)
    from bench.results import append_result

    sysfs = write_ib_ports(Path(tempfile.mkdtemp()), [PORT_UP] * 8)
    nv = SimulatedNvml("bench", gpus=8)
    nv.inject("row_remap_pending", gpu=3)  # one finding, so the finding path is exercised too
    cfg = ProbeConfig(require_nvidia_smi=False, sysfs_infiniband=sysfs)
    cfg.apply_profile("hopper-ib-8x400", default_policy().profiles["hopper-ib-8x400"], None)
    with concurrent.futures.ThreadPoolExecutor(max_workers=3) as pool:
        for _ in range(50):
            run_cycle(cfg, nv, pool)  # warm-up
        calls0 = nv.calls
        cpu0, wall0 = time.process_time(), time.perf_counter()
        for _ in range(args.cycles):
            snap = run_cycle(cfg, nv, pool)
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
        calls = (nv.calls - calls0) / args.cycles
    assert len(snap.findings) == 1, snap.findings
    idle_rss = rss_mb()[0]
    live = asyncio.run(live_agent(nv, cfg, args.live_s)) if args.live_s > 0 else ""
    current, peak = rss_mb()
    nvml = (f"nvmlInit {nvml_session(nv).inits}x in {args.cycles + 50} cycles (once per process, no nvmlShutdown), "
            f"{calls:.0f} NVML calls per cycle")
    print(f"command: .venv/bin/python bench/agent_probe.py --cycles {args.cycles}")
    print(f"NVML: {nvml}")
    print(append_result(
        "agent_probe", f"8 simulated GPUs + 8 sysfs IB ports (profile hopper-ib-8x400), {args.cycles} cycles",
        f"CPU {cpu / args.cycles * 1000:.3f} ms/cycle, wall {wall / args.cycles * 1000:.3f} ms/cycle; "
        f"RSS {current:.1f} MB {'serving as the agent' if live else 'with the agent imports'} (peak {peak:.1f} MB; "
        f"{idle_rss:.1f} MB imported, not serving; {probe_only:.1f} MB probes only){live}; {nvml}",
        "goal <= 2 ms CPU per cycle, <= 80 MB"))


if __name__ == "__main__":
    main()
