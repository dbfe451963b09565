"""NVML is blocking C: node activities call it off the event loop, on the process's one NVML session."""

import asyncio
import time

from temporalio.testing import ActivityEnvironment

import api as c
from activities.node import NodeActivities
from health.nvml_session import nvml_session
from health.runner import ProbeConfig
from health.xid_watch import XidWatcher
from sim.nvml import SimulatedNvml


class SlowNvml(SimulatedNvml):
    """NVML whose process listing takes 0.5 s, as a busy driver's can."""

    def nvmlDeviceGetComputeRunningProcesses(self, h):  # noqa: N802
        time.sleep(0.5)
        return super().nvmlDeviceGetComputeRunningProcesses(h)


async def test_kill_and_reset_do_not_block_the_event_loop(tmp_path):
    nv = SlowNvml("slow", gpus=1)
    acts = NodeActivities(ProbeConfig(require_nvidia_smi=False, sysfs_infiniband=tmp_path), nv,
                          nvidia_smi=str(tmp_path / "none"))
    ticks = 0

    async def ticker():
        nonlocal ticks
        while True:
            await asyncio.sleep(0.05)
            ticks += 1

    task = asyncio.get_running_loop().create_task(ticker())
    try:
        result = await ActivityEnvironment().run(acts.kill_gpu_processes, c.KillRequest(node="slow", gpus=[0]))
    finally:
        task.cancel()
    assert result.killed == []
    assert ticks >= 5, f"the loop ran only {ticks} times during a 0.5 s NVML call: it was blocked"
    assert nv.inits == 1, "one NVML session, no init per call"


def test_xid_watcher_after_a_driver_reload_starts_again_on_a_fresh_session():
    nv = SimulatedNvml("reload", gpus=2)
    nvml_session(nv).ensure()
    nv.driver_reload()
    broken = XidWatcher(nv, wait_ms=50).start()
    broken._thread.join(timeout=5)
    assert broken.error and "Uninitialized" in broken.error  # the agent reports it as probe_broken ...
    fresh = XidWatcher(nv, wait_ms=50).start()  # ... and starts a watcher again, which initialises NVML
    try:
        nv.inject("xid", gpu=1, xid=79)
        deadline = time.monotonic() + 5
        while fresh.events.empty() and time.monotonic() < deadline:
            time.sleep(0.05)
        [f] = fresh.drain()
        assert (f.xid, f.gpu_index, fresh.error) == (79, 1, None) and nv.inits == 2
    finally:
        fresh.stop()
