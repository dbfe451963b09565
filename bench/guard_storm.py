"""The fleet guard under a mass failure (issue 25): 2,000 of 10,000 nodes struck at one instant (a
bad driver push), the real NodeRemediation, FleetGuard and NodeAdmission on a time-skipping
server, the what-if's stand-in fleet.

Run: .venv/bin/python bench/guard_storm.py [--nodes 10000 --failing 2000 --days 4]. Prints the
most nodes quarantined at once against max_unhealthy, the breaker's trips, the canaries, the
episodes' outcomes, the nodes still out at the end and the wall clock, and appends them to
bench/RESULTS.md. The guard's policy is the default's except for the limits given here.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.results import append_result  # noqa: E402
from sim.whatif.engine import run_whatif  # noqa: E402
from sim.whatif.faultmodel import load_fault_model, mass_failure  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=10000)
    ap.add_argument("--failing", type=int, default=2000)
    ap.add_argument("--days", type=float, default=4)
    ap.add_argument("--fault-class", default="gsp", help="a class of the shipped large-cluster model")
    ap.add_argument("--max-unhealthy", default="10%")
    ap.add_argument("--max-disruptive", default="5%")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    model = load_fault_model("large-cluster")
    faults = mass_failure(model, args.nodes, args.failing, args.fault_class, seed=args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        policy = Path(tmp) / "storm.yaml"
        policy.write_text(f"guard: {{max_unhealthy: '{args.max_unhealthy}', max_disruptive: '{args.max_disruptive}'}}\n")
        started = time.monotonic()
        (out,) = run_whatif(model, [str(policy)], args.nodes, args.days, args.seed, faults=faults)
        wall = time.monotonic() - started
    proven = sum(1 for c in out.canaries if c.startswith("proven"))
    figures = (f"peak quarantined {out.peak_quarantined} (max_unhealthy {out.max_unhealthy}); breaker trips "
               f"{out.guard_trips}; canaries (newest 32) {proven} proven, {len(out.canaries) - proven} failed; "
               f"episodes {out.episodes}; resets {out.resets}, reboots {out.reboots}, replacements "
               f"{out.replacements}; down at the end {out.down_at_end}; p95 back in service {out.p95_return_h} h; "
               f"wall {wall:.0f} s (clock restarts {out.clock_restarts})")
    print(figures)
    within = out.max_unhealthy is not None and out.peak_quarantined <= out.max_unhealthy
    print(("max_unhealthy held" if within else "max_unhealthy unknown" if out.max_unhealthy is None
           else "max_unhealthy EXCEEDED")
          + ("; every node back" if out.down_at_end == 0 else f"; {out.down_at_end} nodes still out"))
    print(append_result("guard storm", f"{args.failing} of {args.nodes} nodes struck at once ({args.fault_class}), "
                        f"max_unhealthy {args.max_unhealthy}, max_disruptive {args.max_disruptive}, "
                        f"{args.days:g} virtual days, time-skipping server, one process", figures,
                        "goal: at most max_unhealthy quarantined, canaries step up, every node back"))


if __name__ == "__main__":
    main()
