"""`python -m sim.safety`: run schedules (a range of seeds, or one to replay) and print violations."""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import sys
import time

from sim.safety.mutants import MUTANTS
from sim.safety.run import run_schedules


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m sim.safety", description=__doc__)
    p.add_argument("--schedules", type=int, default=int(os.environ.get("SCHEDULES", "300")))
    p.add_argument("--first-seed", type=int, default=int(os.environ.get("FIRST_SEED", "1")))
    p.add_argument("--seed", type=int, default=int(os.environ["SEED"]) if os.environ.get("SEED") else None,
                   help="replay one schedule: its steps, its side effects and its violations")
    p.add_argument("--batch", type=int, default=int(os.environ.get("BATCH", "30")), help="schedules at once")
    p.add_argument("--mutant", choices=MUTANTS, default=os.environ.get("MUTANT") or None,
                   help="switch one safeguard off (see sim/safety/mutants.py)")
    a = p.parse_args(argv)
    if a.seed is not None:
        return asyncio.run(_replay(a.seed, a.mutant))
    seeds = list(range(a.first_seed, a.first_seed + a.schedules))
    started, totals = time.monotonic(), collections.Counter()
    failing: list = []

    def on_batch(done) -> None:
        for o in done:
            totals["schedules"] += 1
            totals["stalled"] += o.stalled
            totals["effects"] += o.effects
            totals["reruns"] += o.reruns
            totals["room_taken"] += o.room_taken
            if o.violations:
                failing.append(o)
                for inv, what in o.violations:
                    print(f"seed {o.seed}: VIOLATION {inv}: {what}", flush=True)
            if o.stalled and os.environ.get("SAFETY_DEBUG"):
                for line in o.stall:
                    print(f"seed {o.seed}: stalled: {line}", flush=True)
        print(f"{totals['schedules']}/{len(seeds)} schedules, {len(failing)} with violations, "
              f"{totals['stalled']} stalled, {time.monotonic() - started:.0f}s", file=sys.stderr, flush=True)

    asyncio.run(run_schedules(seeds, a.batch, a.mutant, on_batch))
    by_inv = collections.Counter(inv for o in failing for inv, _ in {*o.violations})
    print(f"{totals['schedules']} schedules ({seeds[0]}..{seeds[-1]}), {totals['effects']} effects recorded, "
          f"{len(failing)} with violations {dict(by_inv)}, {totals['stalled']} stalled, {totals['reruns']} re-runs, "
          f"{totals['room_taken']} cordons in room reserved ahead, "
          f"{time.monotonic() - started:.0f}s{f', mutant {a.mutant}' if a.mutant else ''}")
    if failing:
        print("replay one with: make safety SEED=<seed>" + (f" MUTANT={a.mutant}" if a.mutant else ""))
    return 1 if failing or totals["stalled"] else 0


async def _replay(seed: int, mutant: str | None) -> int:
    from sim.safety.schedule import make_schedule

    print(make_schedule(seed).describe())
    out = (await run_schedules([seed], 1, mutant, keep_worlds=True))[0]
    print("side effects:")
    for e in out.world.log:
        print(f"  {e}")
    for inv, what in out.violations:
        print(f"VIOLATION {inv}: {what}")
    for line in out.stall:
        print(f"stalled: {line}")
    print(f"seed {seed}: {len(out.violations)} violations{', STALLED' if out.stalled else ''}")
    return 1 if out.violations or out.stalled else 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # without interpreter finalization: the SDK's native threads can hang it
