"""Load figures in the ledger (SQLite, and DynamoDB on moto's server) and each SKU's median."""

from datetime import UTC, datetime, timedelta

from temporalio.testing import ActivityEnvironment

import api as c
from activities.load_ledger import LoadFigureActivities, outliers
from policies.load import GpuLoadResult

AT = datetime(2026, 12, 1, tzinfo=UTC)


def gpu(node: str, i: int, tflops: float, failed=(), sku="NVIDIA H200") -> GpuLoadResult:
    return GpuLoadResult(index=i, uuid=f"GPU-{node}-{i}", serial=f"SN-{node}-{i}", sku=sku,
                         figures={"tflops_sustained": tflops}, failed=list(failed))


async def test_figures_per_serial_and_the_median_of_gpus_that_passed(ledger):
    acts = LoadFigureActivities(ledger)
    env = ActivityEnvironment()
    for n, tflops in enumerate([640.0, 650.0, 660.0]):
        await env.run(acts.load_figures, c.LoadFiguresRecord(node=f"n{n}", episode=f"e{n}", tier="quick", at=AT,
                                                             gpus=[gpu(f"n{n}", 0, tflops)]))
    # A GPU that corrupted results: its figures are kept, but never in its kind's median.
    await env.run(acts.load_figures, c.LoadFiguresRecord(node="n3", episode="e3", tier="quick", at=AT, gpus=[
        gpu("n3", 0, 100.0, failed=["compute"])]))
    # A later measurement of n0's GPU replaces its first one.
    await env.run(acts.load_figures, c.LoadFiguresRecord(node="n0", episode="e4", tier="repair",
                                                         at=AT + timedelta(hours=1), gpus=[gpu("n0", 0, 700.0)]))
    await env.run(acts.load_figures, c.LoadFiguresRecord(node="a0", episode="e5", tier="quick", at=AT,
                                                         gpus=[gpu("a0", 0, 250.0, sku="NVIDIA A100-SXM4-80GB")]))
    refs = (await env.run(acts.baseline, c.BaselineRequest())).references
    h200 = refs["NVIDIA H200"]
    assert (h200.nodes, h200.medians) == (3, {"tflops_sustained": 660.0})
    assert refs["NVIDIA A100-SXM4-80GB"].medians == {"tflops_sustained": 250.0}
    only = (await env.run(acts.baseline, c.BaselineRequest(skus=["NVIDIA H200"]))).references
    assert set(only) == {"NVIDIA H200"}
    rows = acts.store.rows()
    assert len(rows) == 6 and outliers(rows, refs, 0.9) == [
        "n3 GPU-n3-0: tflops_sustained 100 = 15% of the NVIDIA H200 median"]
