"""The load-test battery's policy (tiers, tolerances, floors) and its results: pure data.

Figures come from gpu-load.md (a real H200): fp16 GEMM 734 TFLOP/s burst, ~654 sustained for
bf16 under the 700 W cap; HBM read-and-verify 3.6 TB/s; device copy 1.9 TB/s; pinned host
copies 55 GB/s each way. Floors sit about 15% under those: two healthy boards differ by a few
percent, a power-capped one by more; the fleet median takes over once enough nodes are measured.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from policies.durations import Duration
from policies.findings import Finding

TierName = Literal["quick", "repair", "admission"]
TESTS = ("compute", "memory", "bandwidth", "peer", "clocks", "events", "dcgm", "nccl", "nvbandwidth")
# Figures judged against the SKU (higher is better); the rest are recorded only.
JUDGED = ("tflops_sustained", "hbm_read_tbps", "d2d_tbps", "h2d_gbps", "d2h_gbps", "peer_gbps_min")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class LoadTier(_Strict):
    compute: Duration = Field(description="Sustained GEMM time per GPU (all GPUs at once).")
    memory_passes: int = Field(ge=0, le=1000, description="Pattern passes over the tested memory, each both polarities.")
    bandwidth: bool = Field(default=True, description="Device copy and pinned host<->device copies per GPU.")
    peer: bool = Field(default=True, description="All-pairs peer copies when the node has more than one GPU.")
    tools: bool = Field(default=True, description="Run all_reduce_perf / nvbandwidth when installed and judge their figures.")
    dcgm_level: int | None = Field(default=None, ge=1, le=4, description="`dcgmi diag -r N -j` when installed; null: none.")
    time_limit: Duration = Field(description="The whole tier, init included: past it the run is probe_broken (not scaled below 10 s).")


class SkuFloors(_Strict):
    """Shipped floors for one GPU product: below one is degraded even before the fleet has a median."""

    tflops_sustained: float | None = None
    hbm_read_tbps: float | None = None
    d2d_tbps: float | None = None
    h2d_gbps: float | None = None
    d2h_gbps: float | None = None
    peer_gbps_min: float | None = None


def _default_floors() -> dict[str, SkuFloors]:
    h200 = SkuFloors(tflops_sustained=530, hbm_read_tbps=3.0, d2d_tbps=1.6, h2d_gbps=46, d2h_gbps=46)
    return {
        "NVIDIA H200": h200,
        "Simulated H200": h200,  # sim_device.py models the reference H200
        # From spec sheets, not measured here [?]: dense fp16 under a power cap, HBM, PCIe Gen5/Gen4.
        "NVIDIA H100 80GB HBM3": SkuFloors(tflops_sustained=480, hbm_read_tbps=2.5, d2d_tbps=1.2, h2d_gbps=46, d2h_gbps=46),
        "NVIDIA A100-SXM4-80GB": SkuFloors(tflops_sustained=220, hbm_read_tbps=1.5, d2d_tbps=0.7, h2d_gbps=20, d2h_gbps=20),
    }


class LoadTestPolicy(_Strict):
    quick: LoadTier = Field(
        default=LoadTier(compute=timedelta(seconds=30), memory_passes=2, time_limit=timedelta(minutes=3)),
        description="About a minute: the first validation after a kill, reset or reboot.")
    repair: LoadTier = Field(
        default=LoadTier(compute=timedelta(minutes=3), memory_passes=8, dcgm_level=2, time_limit=timedelta(minutes=10)),
        description="A few minutes: the second validation, after the soak.")
    admission: LoadTier = Field(
        default=LoadTier(compute=timedelta(minutes=4), memory_passes=40, dcgm_level=3, time_limit=timedelta(minutes=25)),
        description="Up to about 20 minutes (DCGM r3 is ~15 of them): new nodes and replaced machines.")
    gemm_n: int = Field(default=8192, ge=64, le=65536, description="Square GEMM size (n x n x n).")
    gemm_dtype: Literal["float16", "float32", "float64"] = Field(
        default="float16", description="Product dtype (fp32 accumulate for float16, as cuBLAS does).")
    abft_every: int = Field(default=8, ge=1, description="Check every Nth product's checksums while loaded.")
    known_answer_every: int = Field(default=32, ge=1, description="Recompute the fixed known-answer product every Nth product.")
    abft_ulps: dict[str, float] = Field(
        default_factory=lambda: {"float64": 8.0, "float32": 8.0, "float16": 1.0},
        description="ABFT tolerance per dtype, in machine epsilons over sqrt(n) (health/load/checks.py): healthy "
                    "products measure 0.3-1.3 (fp32, fp64; 1.2e-9 for fp32 at n=8192 on an H200) and ~0.06 (fp16).")
    memory_fraction: float = Field(default=0.5, gt=0, le=0.9, description="Share of free GPU memory the pattern covers.")
    copy_bytes: int = Field(default=1 << 30, ge=1 << 20, description="Bytes per copy in the bandwidth tests.")
    clock_sample_interval: Duration = Field(default=timedelta(seconds=1), description="How often clock-event reasons are read under load.")
    fail_clock_reasons: list[str] = Field(
        default_factory=lambda: ["hw_slowdown", "hw_thermal", "sw_thermal", "hw_power_brake"],
        description="Clock-event reasons that fail the test when seen under load (the SW power cap is normal: 30 of 31 "
                    "samples on a healthy H200).")
    degraded_fraction: float = Field(default=0.9, gt=0, le=1, description="Below this share of the SKU's fleet median is degraded.")
    min_nodes_for_median: int = Field(default=5, ge=1, description="Nodes of a SKU measured before its median replaces the floors.")
    floors: dict[str, SkuFloors] = Field(default_factory=_default_floors, description="Shipped floors per GPU product name.")

    def tier(self, name: str) -> LoadTier:
        if name not in ("quick", "repair", "admission"):
            raise ValueError(f"unknown load-test tier {name!r}: quick, repair or admission")
        return getattr(self, name)


class GpuLoadResult(_Strict):
    """One GPU's figures under load, named by its immutable ids."""

    index: int
    uuid: str
    serial: str | None = None
    sku: str = ""
    figures: dict[str, float] = Field(default_factory=dict, description="name_unit -> value, e.g. tflops_sustained.")
    failed: list[str] = Field(default_factory=list, description="Tests this GPU failed.")


class LoadReport(_Strict):
    tier: str
    passed: bool
    tests: list[str] = Field(default_factory=list, description="What ran.")
    wall_s: float = 0.0
    overhead_s: float = Field(default=0.0, description="Wall time not spent in the tests' own load (setup, checks, joins).")
    gpus: list[GpuLoadResult] = Field(default_factory=list)
    node_figures: dict[str, float] = Field(default_factory=dict, description="all_reduce busbw, nvbandwidth ...")
    notes: list[str] = Field(default_factory=list, description="What the run could not cover, and why.")
    findings: list[Finding] = Field(default_factory=list)


class SkuReference(_Strict):
    """What a SKU's GPUs are judged against: the fleet median once enough nodes are measured."""

    sku: str
    nodes: int = 0
    medians: dict[str, float] = Field(default_factory=dict)


def judge_against_kind(gpu: GpuLoadResult, policy: LoadTestPolicy, ref: SkuReference | None) -> list[str]:
    """Why a GPU is degraded (empty: it is not): below its SKU's floor, or below the policy share of
    its SKU's fleet median once `min_nodes_for_median` nodes have been measured."""
    floors = policy.floors.get(gpu.sku, SkuFloors())
    why = []
    for name in JUDGED:
        value = gpu.figures.get(name)
        if value is None:
            continue
        floor = getattr(floors, name)
        median = ref.medians.get(name) if ref is not None and ref.nodes >= policy.min_nodes_for_median else None
        if median is not None:
            if value < policy.degraded_fraction * median:
                why.append(f"{name} {value:.3g} is {value / median:.0%} of the {gpu.sku} fleet median {median:.3g} "
                           f"({ref.nodes} nodes)")
        elif floor is not None and value < floor:
            why.append(f"{name} {value:.3g} is below the {gpu.sku} floor {floor:.3g}")
    return why


def describe(report: LoadReport) -> str:
    """What the load test measured, one short line per GPU: what history and `gpuheal validate` show."""
    def fig(g: GpuLoadResult, name: str, fmt: str = ".0f") -> str:
        return f"{g.figures[name]:{fmt}}" if name in g.figures else "-"

    lines = [f"load {report.tier} {'passed' if report.passed else 'FAILED'} in {report.wall_s:.1f}s "
             f"(overhead {report.overhead_s:.2f}s): GPU serial TFLOP/s HBM-TB/s bad-words copy-TB/s H2D/D2H/peer-GB/s"]
    for g in report.gpus:
        lines.append(f"{g.index} {g.serial or g.uuid} {fig(g, 'tflops_sustained')} {fig(g, 'hbm_read_tbps', '.2f')} "
                     f"{fig(g, 'hbm_mismatches')} {fig(g, 'd2d_tbps', '.2f')} {fig(g, 'h2d_gbps')}/{fig(g, 'd2h_gbps')}/"
                     f"{fig(g, 'peer_gbps_min')}" + (f" FAILED {','.join(g.failed)}" if g.failed else ""))
    lines += [f"{name} {value:.3g}" for name, value in sorted(report.node_figures.items())]
    lines += [f"note: {n}" for n in report.notes]
    return "\n".join(lines)
