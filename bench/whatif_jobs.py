"""What the fleet's users feel, in the what-if: the Llama 3 calibration and the seed's claim.

Run: .venv/bin/python bench/whatif_jobs.py [--full-llama3] [--plot docs/whatif-jobs.png]
1. The Llama 3-shaped run (2,080 nodes: 2,048 in the job and 32 spares, 54 days) on the fast
   job-level model, five seeds: interruptions per 1,000 node-days and ETTR against [L3]'s 3.79
   and "above 90%". With --full-llama3, one seed on the full what-if too (the real workflows).
2. The seed's claim on the full what-if: the shipped large-cluster model, 1,000 nodes for 30 days,
   three policies, the same fleet with plain jobs and with checkpointed, elastic ones.
Prints the tables (markdown for the README) and appends the figures to bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.results import append_result  # noqa: E402
from policies.loader import load_policy  # noqa: E402
from sim.whatif.engine import run_whatif  # noqa: E402
from sim.whatif.faultmodel import draw_faults, load_fault_model  # noqa: E402
from sim.whatif.jobs import simulate_jobs  # noqa: E402
from sim.whatif.outages import analytic_outages  # noqa: E402
from sim.whatif.report import outcome_table, plot  # noqa: E402
from sim.whatif.workload import load_workload  # noqa: E402


def llama3(full: bool) -> str:
    model, work = load_fault_model("llama3"), load_workload("llama3-pretrain")
    nodes, started = work.nodes_needed, time.monotonic()
    runs = []
    for seed in range(1, 6):
        outages = analytic_outages(model, draw_faults(model, nodes, 54, seed), load_policy("default"))
        runs.append(simulate_jobs(work, outages, nodes, 54, model.durations.detect.total_seconds()))
    wall = time.monotonic() - started
    rates = [j.interruptions_per_1000_node_days for j in runs]
    ettr = [j.ettr for j in runs]
    text = (f"fast model, 5 seeds, {wall:.1f} s: interruptions {min(j.interruptions for j in runs)}-"
            f"{max(j.interruptions for j in runs)} (published 419), per 1,000 node-days mean "
            f"{statistics.mean(rates):.2f} (published 3.79), ETTR mean {statistics.mean(ettr) * 100:.1f}% "
            f"(min {min(ettr) * 100:.1f}%, published > 90%)")
    if full:
        started = time.monotonic()
        [out] = run_whatif(model, ["default"], nodes, 54, 1, workloads=[work], jobs=1)
        j = out.jobs[0]
        text += (f"; full what-if, seed 1, {time.monotonic() - started:.0f} s: {j.interruptions} interruptions, "
                 f"{j.interruptions_per_1000_node_days:.2f} per 1,000 node-days, ETTR {j.ettr * 100:.1f}%")
    print(text)
    append_result("whatif_jobs (llama3)", f"llama3 model, llama3-pretrain workload, {nodes} nodes x 54 days", text,
                  "interruptions and ETTR in the published range")
    return text


def seed_claim(png: str | None, jobs: int) -> None:
    model = load_fault_model("large-cluster")
    workloads = [load_workload("training"), load_workload("training-checkpointed")]
    started = time.monotonic()
    outs = run_whatif(model, ["default", "reboot-then-replace", "replace-only"], 1000, 30, 1, workloads=workloads,
                      jobs=jobs)
    wall = time.monotonic() - started
    print(outcome_table(outs, markdown=True))
    if png:
        plot(outs, png)
        print(f"plot: {png}")
    figures = "; ".join(
        f"{o.policy}: " + ", ".join(f"{j.workload} success {j.job_success_rate * 100:.2f}% ETTR {j.ettr * 100:.2f}%"
                                    for j in o.jobs) for o in outs)
    print(f"wall {wall:.0f} s; {figures}")
    append_result("whatif_jobs (seed claim)", f"large-cluster, 1000 nodes x 30 days, seed 1, {jobs} processes",
                  f"wall {wall:.0f} s; {figures}", "job success: plain about 98%, checkpointed/elastic above 99.5%")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--full-llama3", action="store_true", help="also run the Llama 3 shape on the full what-if")
    ap.add_argument("--plot", default=None, metavar="OUT.png")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--no-llama3", action="store_true", help="only the seed's claim")
    args = ap.parse_args()
    if not args.no_llama3:
        llama3(args.full_llama3)
    seed_claim(args.plot, args.jobs)


if __name__ == "__main__":
    main()
