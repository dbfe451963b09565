"""Fleet what-if at scale: 1,000 nodes for 30 days, two policies, on the shipped fault model.

Run: .venv/bin/python bench/whatif.py [--nodes 1000 --days 30 --jobs 2]. Each policy runs on its
own time-skipping server in its own process (the goal is under 10 minutes on a 2-core machine).
Prints the table, the wall clock and the history events per episode, and appends them to
bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.results import append_result  # noqa: E402
from sim.whatif.engine import run_whatif  # noqa: E402
from sim.whatif.faultmodel import load_fault_model  # noqa: E402
from sim.whatif.report import outcome_table  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--days", type=float, default=30)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--policy", action="append", dest="policies")
    args = ap.parse_args()
    policies = args.policies or ["default", "replace-only"]
    model = load_fault_model("large-cluster")
    started = time.monotonic()
    outs = run_whatif(model, policies, args.nodes, args.days, args.seed, count_events=True, jobs=args.jobs)
    wall = time.monotonic() - started
    print(outcome_table(outs))
    figures = (f"wall {wall:.0f} s for {len(outs)} policies; " + "; ".join(
        f"{o.policy}: {o.wall_s:.0f} s, {sum(o.episodes.values())} episodes, {o.events_per_episode} events/episode, "
        f"availability {o.availability * 100:.3f}%, {o.node_hours_lost} node-hours lost" for o in outs))
    print(figures)
    print(append_result("whatif", f"large-cluster, {args.nodes} nodes x {args.days:g} days, seed {args.seed}, "
                        f"{args.jobs} processes", figures, "goal: two policies < 10 min on 2 cores"))


if __name__ == "__main__":
    main()
