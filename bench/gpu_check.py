"""The checkers' self-test on a real GPU: mismatches planted in device buffers must be caught.

Run by bench/gpu_check.sh on a machine with an NVIDIA GPU and CuPy; elsewhere it exits 2 saying
why (the same fail-closed path as validation). Prints one JSON document.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pynvml  # noqa: E402

from health.load import checks  # noqa: E402
from health.load.cupy_device import cupy_opener  # noqa: E402
from health.load.device import LoadTestUnavailable  # noqa: E402


def main() -> int:
    try:
        dev = cupy_opener(pynvml)([0])[0]
    except (LoadTestUnavailable, pynvml.NVMLError) as err:
        print(json.dumps({"self_test": "could not run", "reason": str(err)}))
        return 2
    cp, out = dev.xp, {"gpu": dev.info.__dict__}
    # Pattern: a flipped bit in a device buffer, found at its exact index in one polarity.
    buf = dev.words(1 << 26)  # 256 MiB
    dev.write_pattern(buf, 0, 7, False)
    buf[12_345_678] ^= cp.uint32(1 << 9)
    out["pattern"] = dict(zip(("count", "first"), dev.check_pattern(buf, 0, 7, False), strict=True))
    # Known answer: one last-mantissa-bit flip in a device product is a bitwise mismatch; ABFT
    # catches an exponent flip. Determinism: the same product twice, bit for bit.
    a, b = dev.operands(8192, "float16", 1)
    want = dev.product(a, b)
    again = dev.product(a, b)
    out["deterministic"] = checks.bitwise_mismatches(cp, again, want)[0] == 0
    bad = again.copy()
    bad.reshape(-1).view(cp.uint16)[1000] ^= cp.uint16(1)
    out["known_answer"] = dict(zip(("count", "first"), checks.bitwise_mismatches(cp, bad, want), strict=True))
    tol = checks.abft_tolerance(cp, "float16", 8192, 1.0)
    healthy = checks.abft_error(cp, a, b, want)
    bad.reshape(-1).view(cp.uint16)[2000] ^= cp.uint16(1 << 14)
    out["abft"] = {"healthy": healthy, "tolerance": tol, "planted": checks.abft_error(cp, a, b, bad)}
    t0 = dev.now()
    for _ in range(20):
        dev.product(a, b)
    out["tflops_burst"] = 20 * dev.flops(8192) / (dev.now() - t0) / 1e12
    dev.close()
    ok = (out["pattern"] == {"count": 1, "first": 12_345_678} and out["deterministic"]
          and out["known_answer"] == {"count": 1, "first": 1000}
          and healthy < tol < out["abft"]["planted"])
    out["self_test"] = "passed" if ok else "FAILED"
    print(json.dumps(out, default=str))
    return 0 if ok else 1


if __name__ == "__main__":
    t = time.perf_counter()
    code = main()
    print(f"self-test took {time.perf_counter() - t:.1f} s", file=sys.stderr)
    sys.exit(code)
