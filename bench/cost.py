"""History events (Temporal actions, what a remediation costs) per ladder path.

Run: .venv/bin/python bench/cost.py. Plays each path of tests/workflows/record_histories.py on the
embedded dev server with the stand-in fleet, prints events per path and appends them to
bench/RESULTS.md. Goal: a full-ladder episode (reset, reboot, replace) <= 80 events.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from temporalio.contrib.pydantic import pydantic_data_converter  # noqa: E402
from temporalio.testing import WorkflowEnvironment  # noqa: E402

from bench.results import append_result  # noqa: E402
from tests.workflows.record_histories import PATHS, record  # noqa: E402
from workers.embedded_temporal import binary, search_attribute_flags  # noqa: E402


async def main() -> None:
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=binary("temporal"), data_converter=pydantic_data_converter,
        dev_server_extra_args=search_attribute_flags())
    try:
        rows = [await record(env, name, write=False) for name in PATHS]
    finally:
        await env.shutdown()
    print("command: .venv/bin/python bench/cost.py")
    print(f"{'path':<22} {'rungs':<24} {'outcome':<10} events")
    for r in rows:
        print(f"{r['path']:<22} {','.join(r['rungs']):<24} {r['outcome']:<10} {r['events']}")
    full = next(r for r in rows if r["path"] == "replace")
    print(append_result("cost", "history events per episode, stand-in fleet, dev server",
                        ", ".join(f"{r['path']} {r['events']}" for r in rows) + f" (full ladder {full['events']})",
                        "goal: full ladder <= 80"))


if __name__ == "__main__":
    asyncio.run(main())
