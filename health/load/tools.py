"""External tools, run when installed and parsed (never judged by exit code alone):
`dcgmi diag -r N -j` per test and per GPU, nccl-tests' `all_reduce_perf` bus bandwidth, and
`nvbandwidth`'s per-test sums."""

from __future__ import annotations

import json
import re
import shutil
import subprocess


def parse_dcgm_diag(text: str) -> dict[str, dict[int | None, str]]:
    """test name -> GPU (None: node-wide) -> status (Pass, Fail, Warn, Skip) from `dcgmi diag -j`.

    Both layouts: DCGM 3 ("DCGM GPU Diagnostic", results with "gpu_ids": "0,1") and DCGM 4
    ("DCGM Diagnostic", results with "entity_id"). Unparseable output raises ValueError."""
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end < start:
        raise ValueError("dcgmi diag printed no JSON")
    doc = json.loads(text[start:end + 1])
    body = doc.get("DCGM GPU Diagnostic") or doc.get("DCGM Diagnostic")
    if not isinstance(body, dict) or not isinstance(body.get("test_categories"), list):
        raise ValueError("dcgmi diag JSON has no test_categories")
    out: dict[str, dict[int | None, str]] = {}
    for category in body["test_categories"]:
        for test in category.get("tests", []):
            per_gpu = out.setdefault(str(test.get("name", "?")), {})
            for r in test.get("results", []):
                status = str(r.get("status", "?")).capitalize()
                ids = r.get("gpu_ids", r.get("gpu_id", r.get("entity_id")))
                gpus = [int(i) for i in str(ids).split(",") if i.strip().isdigit()] if ids is not None else [None]
                for g in gpus or [None]:
                    per_gpu[g] = status
    return out


def dcgm_failures(results: dict[str, dict[int | None, str]]) -> list[tuple[int | None, str]]:
    """(GPU, "test: status") for every test that failed somewhere."""
    return [(g, f"{test}: {status}") for test, per_gpu in results.items() for g, status in per_gpu.items()
            if status == "Fail"]


_ALLREDUCE = re.compile(r"#\s*Avg bus bandwidth\s*:\s*([0-9.]+)")
_NVBW_SUM = re.compile(r"^SUM\s+(\S+)\s+([0-9.]+)", re.M)


def parse_all_reduce(text: str) -> float:
    """The average bus bandwidth (GB/s) all_reduce_perf prints last."""
    m = _ALLREDUCE.search(text)
    if m is None:
        raise ValueError("all_reduce_perf printed no '# Avg bus bandwidth' line")
    return float(m.group(1))


def parse_nvbandwidth(text: str) -> dict[str, float]:
    """nvbandwidth's `SUM <testcase> <GB/s>` lines."""
    found = {name: float(v) for name, v in _NVBW_SUM.findall(text)}
    if not found:
        raise ValueError("nvbandwidth printed no SUM lines")
    return found


def run_tool(argv: list[str], timeout_s: float) -> tuple[int, str] | None:
    """(exit code, output) of an installed tool; None when it is not installed."""
    exe = shutil.which(argv[0])
    if exe is None:
        return None
    try:
        done = subprocess.run([exe, *argv[1:]], capture_output=True, text=True, timeout=max(timeout_s, 1))
    except subprocess.TimeoutExpired:
        return 124, f"{argv[0]} ran past {timeout_s:.0f} s"
    return done.returncode, done.stdout + done.stderr
