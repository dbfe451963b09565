"""bench/RESULTS.md: every benchmark appends its figures here, one table row a run."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"


def append_result(bench: str, setup: str, figures: str, goal: str) -> str:
    line = f"| {datetime.now(UTC):%Y-%m-%d} | {bench} | {setup} | {figures} | {goal} |"
    if not RESULTS.exists():
        RESULTS.write_text("# Benchmark results\n\n| date | bench | setup | figures | goal |\n|---|---|---|---|---|\n")
    with RESULTS.open("a") as fh:
        fh.write(line + "\n")
    return line
