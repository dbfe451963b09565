#!/usr/bin/env bash
# The device check for issue 24, prepared here (no GPU on the build machine) for a session that
# has one: the quick tier on the real GPU, then the checkers' self-test on device buffers.
# Usage (repository root): bash bench/gpu_check.sh [OUT_DIR]
# Needs python3 with numpy, pyyaml, nvidia-ml-py and CuPy (cupy-cuda12x or -cuda13x), and pydantic:
# from ./.whl when the machine has none (pydantic, pydantic-core, annotated-types, typing-inspection,
# typing-extensions wheels; see ../shared/reference/gpu-load.md s.4). Neither temporalio nor
# kubernetes is imported by `gpuheal validate`.
# Exit: 0 both passed, 1 a check failed, 2 could not run. Figures to compare with gpu-load.md:
# fp16 GEMM ~734 TFLOP/s burst, sustained ~650; HBM read-and-verify 3.6 TB/s; copy 1.9 TB/s; pinned 55 GB/s.
set -u
OUT=${1:-${OUT:-/tmp/gpu_check}}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
if ! $PY -c 'import pydantic' 2>/dev/null && [ -d .whl ]; then
  $PY -m pip install -q --no-index --find-links .whl --target /tmp/gpuheal-deps \
    pydantic >"$OUT/pip.log" 2>&1 || echo "pip install from .whl failed: see $OUT/pip.log" >&2
  export PYTHONPATH=/tmp/gpuheal-deps:${PYTHONPATH:-}
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-}
nvidia-smi --query-gpu=index,name,serial,driver_version,power.limit --format=csv >"$OUT/nvidia-smi.csv" 2>&1 || true

timeout 300 $PY -m workers.cli validate --tier quick --json >"$OUT/validate.json" 2>"$OUT/validate.err"
v=$?
timeout 180 $PY bench/gpu_check.py >"$OUT/self_test.json" 2>"$OUT/self_test.err"
s=$?
echo "validate --tier quick: exit $v ($(head -c 300 "$OUT/validate.err"))"
echo "checker self-test: exit $s"
cat "$OUT/self_test.json"
$PY - "$OUT/validate.json" <<'PY' || true
import json, sys
try:
    doc = json.load(open(sys.argv[1]))
except ValueError:
    sys.exit("validate printed no JSON")
if "gpus" in doc:
    print("load", doc["tier"], "passed" if doc["passed"] else "FAILED", f"wall {doc['wall_s']:.1f}s overhead {doc['overhead_s']:.2f}s")
    for g in doc["gpus"]:
        f = g["figures"]
        print(g["index"], g["serial"], g["sku"], {k: round(f[k], 3) for k in sorted(f) if k in (
            "tflops_sustained", "tflops_burst", "abft_max_error", "hbm_read_tbps", "hbm_write_tbps", "hbm_mismatches",
            "d2d_tbps", "h2d_gbps", "d2h_gbps", "clock_samples", "clock_sw_power_cap_samples")}, g["failed"])
    for f in doc["findings"]:
        print("finding:", f["message"])
else:
    print(doc)
PY
if [ $v -eq 2 ] || [ $s -eq 2 ]; then exit 2; fi
if [ $v -ne 0 ] || [ $s -ne 0 ]; then exit 1; fi
exit 0
