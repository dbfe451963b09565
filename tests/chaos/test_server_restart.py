"""The Temporal dev server (SQLite file) stopped and started again mid-remediation: the episode
picks up where it was, nothing lost, and completes."""

from __future__ import annotations

import asyncio

import pytest

from sim.fleet import SimulatedFleet
from tests.chaos.conftest import outcome, scenario

SCENARIO = """
name: server-restart
time_scale: 0.005
budget: 2
fleet: {nodes: 6}  # two faults stay under the guard's max_unhealthy (50%)
faults:
  - {node: gpu-node-0, kind: xid, xid: 79, gpu: 2, cured_by: reboot}
  - {node: gpu-node-1, kind: ecc_dbe, gpu: 0, cured_by: reset}
"""


@pytest.mark.timeout(300)
async def test_server_restart_mid_remediation(server, moto_url, aws):
    sc, policy = scenario(SCENARIO)
    fleet = SimulatedFleet(sc, policy, server.client, task_queue="chaos-restart", cluster="chaos-restart")
    async with fleet.running(moto_url):
        a = fleet.hosts["gpu-node-0"]
        outage = {}

        async def restart_when_cordoned():
            while not fleet.kube.get("Node", "", a.name)["spec"].get("unschedulable"):
                await asyncio.sleep(0.05)
            await server.stop()
            outage["down"] = True
            await asyncio.sleep(2.0)  # agents' reports and workers' polls fail meanwhile
            await server.start()
            outage["up"] = True

        task = asyncio.create_task(restart_when_cordoned())
        await fleet.play(deadline_s=240)
        await asyncio.wait_for(task, 30)
        assert outage == {"down": True, "up": True}
        results = {n: await outcome(server.client, n, fleet.cluster) for n in ("gpu-node-0", "gpu-node-1")}
    assert (results["gpu-node-0"].outcome, [r.value for r in results["gpu-node-0"].rungs]) == ("returned", ["reboot"])
    assert (results["gpu-node-1"].outcome, [r.value for r in results["gpu-node-1"].rungs]) == ("returned", ["reset"])
    assert results["gpu-node-0"].validations == 2 and results["gpu-node-1"].validations == 2
