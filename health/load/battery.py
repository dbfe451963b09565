"""A tier of the load-test battery on every GPU of the node at once, failing closed.

No load test possible (no CuPy or driver, a GPU that cannot be used, GPU processes present, the
deadline passed) is a probe_broken finding: the caller fails the validation, never passes it on
a status query. Every figure is kept per GPU, named by index, UUID and serial.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pynvml

from health.load import tools
from health.load.bandwidth import run_bandwidth, run_peer
from health.load.compute import run_compute
from health.load.device import GpuDevice, LoadTestUnavailable
from health.load.memory import run_memory
from health.load.watch import LoadWatch
from policies.findings import Finding
from policies.load import GpuLoadResult, LoadReport, LoadTestPolicy, SkuReference, judge_against_kind

Opener = Callable[[list[int] | None], list[GpuDevice]]
_XID = re.compile(r"Xid (\d+)")
_THERMAL = {"hw_thermal", "sw_thermal"}


def run_battery(open_devices: Opener, nv, policy: LoadTestPolicy, tier_name: str, gpus: list[int] | None = None,
                references: dict[str, SkuReference] | None = None, tool_names: dict[str, str] | None = None) -> LoadReport:
    tier = policy.tier(tier_name)
    began = time.monotonic()
    deadline = began + tier.time_limit.total_seconds()
    report = LoadReport(tier=tier_name, passed=False)

    def broken(why: str) -> LoadReport:
        report.findings.append(Finding(kind="probe_broken", message=f"load test ({tier_name}) could not run: {why}"))
        report.wall_s, report.passed = time.monotonic() - began, False
        return report

    try:
        if busy := _gpu_processes(nv, gpus):
            return broken(f"GPU processes still present ({busy}): the test runs only on a drained node")
        devs = open_devices(gpus)
    except LoadTestUnavailable as err:
        return broken(str(err))
    except pynvml.NVMLError as err:
        return broken(f"NVML: {err}")
    if not devs:
        return broken("no GPU to test")
    results = {d.info.index: GpuLoadResult(index=d.info.index, uuid=d.info.uuid, serial=d.info.serial, sku=d.info.sku)
               for d in devs}
    why: dict[int, dict[str, str]] = {d.info.index: {} for d in devs}
    tested_s = 0.0
    try:
        with LoadWatch(nv, [d.info for d in devs], policy.clock_sample_interval.total_seconds()) as watch:
            for d in devs:
                d.load_started()
            t0 = time.monotonic()
            with ThreadPoolExecutor(max_workers=len(devs), thread_name_prefix="load-gpu") as pool:
                outcomes = list(pool.map(lambda d: _one_gpu(d, policy, tier, deadline), devs))
            if tier.peer and len(devs) > 1 and not _past(deadline):
                slowest, unreachable = run_peer(devs, policy.copy_bytes)
                for i, gbps in slowest.items():
                    results[i].figures["peer_gbps_min"] = gbps
                if unreachable:
                    report.notes.append(f"no peer access between GPUs {', '.join(unreachable)}")
            tested_s = time.monotonic() - t0
            watch.sample()
            for d in devs:
                d.load_ended()
        report.tests = ["compute", "memory", *(["bandwidth"] if tier.bandwidth else []),
                        *(["peer"] if tier.peer and len(devs) > 1 else []), "clocks", "events"]
        for d, (figures, failures, error) in zip(devs, outcomes, strict=True):
            i = d.info.index
            results[i].figures.update(figures)
            why[i].update(failures)
            if error:
                return broken(f"GPU {i} ({d.info.uuid}): {error}")
            w = watch.gpus[i]
            results[i].figures.update(watch.figures(w))
            for test, reasons in watch.verdict(w, policy.fail_clock_reasons).items():
                why[i][test] = "; ".join(reasons)
        report.notes += watch.notes
        t1 = time.monotonic()
        if tier.tools:
            _external(report, devs, why, tool_names or {}, tier, deadline)
        if tier.dcgm_level:
            _dcgm(report, devs, why, (tool_names or {}).get("dcgmi", "dcgmi"), tier.dcgm_level, deadline)
        tested_s += time.monotonic() - t1
    finally:
        for d in devs:
            d.close()
    for d in devs:
        r = results[d.info.index]
        degraded = judge_against_kind(r, policy, (references or {}).get(r.sku))
        if degraded:
            why[r.index]["degraded"] = "; ".join(degraded)
        r.failed = sorted(why[r.index])
        report.findings += [_finding(d, test, text, tier_name) for test, text in sorted(why[r.index].items())]
    report.gpus = [results[d.info.index] for d in devs]
    report.wall_s = time.monotonic() - began
    report.overhead_s = max(report.wall_s - tested_s, 0.0)
    report.passed = not report.findings
    if _past(deadline):
        return broken(f"past the tier's time limit of {tier.time_limit}")
    return report


def _past(deadline: float) -> bool:
    return time.monotonic() > deadline


def _gpu_processes(nv, gpus: list[int] | None) -> list[int]:
    nv.nvmlInit()
    try:
        pids = []
        for i in gpus or list(range(nv.nvmlDeviceGetCount())):
            try:
                pids += [p.pid for p in nv.nvmlDeviceGetComputeRunningProcesses(nv.nvmlDeviceGetHandleByIndex(i))]
            except pynvml.NVMLError as err:
                raise LoadTestUnavailable(f"GPU {i} cannot be used: {err}") from None
        return pids
    finally:
        nv.nvmlShutdown()


def _one_gpu(dev: GpuDevice, policy: LoadTestPolicy, tier, deadline: float) -> tuple[dict, dict, str | None]:
    """(figures, {test: why it failed}, an error that made the GPU unusable)."""
    figures: dict[str, float] = {}
    failures: dict[str, str] = {}
    past = lambda: _past(deadline)  # noqa: E731
    try:
        f, bad = run_compute(dev, policy.gemm_n, policy.gemm_dtype, tier.compute.total_seconds(), policy.abft_every,
                             policy.known_answer_every, policy.abft_ulps.get(policy.gemm_dtype, 1.0), past)
        figures.update(f)
        if bad:
            failures["compute"] = bad
        if tier.memory_passes:
            f, bad = run_memory(dev, policy.memory_fraction, tier.memory_passes, past)
            figures.update(f)
            if bad:
                failures["memory"] = bad
        if tier.bandwidth:
            figures.update(run_bandwidth(dev, policy.copy_bytes))
    except TimeoutError as err:
        return figures, failures, str(err)
    except Exception as err:  # noqa: BLE001 - a CUDA error is a GPU that cannot be used: fail closed
        return figures, failures, f"{type(err).__name__}: {err}"
    return figures, failures, None


def _external(report: LoadReport, devs: list[GpuDevice], why, names: dict[str, str], tier, deadline: float) -> None:
    """nccl-tests and nvbandwidth, when installed: figures recorded, failures named."""
    left = lambda: deadline - time.monotonic()  # noqa: E731
    if len(devs) > 1:
        ran = tools.run_tool([names.get("all_reduce_perf", "all_reduce_perf"), "-b", "8M", "-e", "1G", "-f", "2",
                              "-g", str(len(devs))], left())
        if ran is not None:
            report.tests.append("nccl")
            try:
                report.node_figures["allreduce_busbw_gbps"] = tools.parse_all_reduce(ran[1])
            except ValueError as err:
                why[devs[0].info.index]["nccl"] = f"all_reduce_perf exited {ran[0]}: {err}"
    ran = tools.run_tool([names.get("nvbandwidth", "nvbandwidth")], left())
    if ran is not None:
        report.tests.append("nvbandwidth")
        try:
            for name, gbps in tools.parse_nvbandwidth(ran[1]).items():
                report.node_figures[f"nvbandwidth_{name}_gbps"] = gbps
        except ValueError as err:
            why[devs[0].info.index]["nvbandwidth"] = f"nvbandwidth exited {ran[0]}: {err}"


def _dcgm(report: LoadReport, devs: list[GpuDevice], why, dcgmi: str, level: int, deadline: float) -> None:
    ran = tools.run_tool([dcgmi, "diag", "-r", str(level), "-j"], deadline - time.monotonic())
    if ran is None:
        return
    report.tests.append(f"dcgm-r{level}")
    by_index = {d.info.index: d for d in devs}
    try:
        failed = tools.dcgm_failures(tools.parse_dcgm_diag(ran[1]))
    except ValueError as err:
        failed = [(None, f"unreadable output (exit {ran[0]}): {err}")]
    for gpu, text in failed:
        target = gpu if gpu in by_index else devs[0].info.index
        prev = why[target].get("dcgm")
        why[target]["dcgm"] = f"{prev}; {text}" if prev else (text if gpu in by_index else f"node-wide: {text}")


def _finding(dev: GpuDevice, test: str, text: str, tier: str) -> Finding:
    kind = {"compute": "silent_data_corruption", "memory": "memory_pattern", "degraded": "degraded",
            "clocks": "clock_slowdown"}.get(test, "load_test_failed")
    xid = None
    if test == "clocks" and any(t in text for t in _THERMAL):
        kind = "thermal"
    if test == "events":
        m = _XID.search(text)
        kind = ("xid" if m else "ecc_dbe" if "ECC" in text else "row_remap_failure" if "remap failure" in text
                else "row_remap_pending" if "remap pending" in text else "gpu_lost" if "lost" in text else kind)
        xid = int(m.group(1)) if m else None
    i = dev.info
    return Finding(kind=kind, xid=xid, gpu_index=i.index, uuid=i.uuid, serial=i.serial, pci=i.pci or None,
                   message=f"{test} under load ({tier} tier) on GPU {i.index} ({i.uuid}, serial {i.serial}): {text}"[:2000])
