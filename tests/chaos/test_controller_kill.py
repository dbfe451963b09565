"""The controller process SIGKILLed during each step of a full ladder in turn, and started again:
every episode completes, and the fake API's and AWS's records show nothing done twice that hurts
(one reboot per rung attempt, one termination)."""

from __future__ import annotations

import asyncio

import pytest

from tests.chaos.conftest import ControllerProcess, outcome, scenario

SCENARIO = """
name: controller-kill
time_scale: 0.005
budget: 2
fleet:
  nodes: 6  # two faults stay under the guard's max_unhealthy (50%)
  jobs: [{name: train, nodes: [gpu-node-0, gpu-node-2, gpu-node-3], min_available: 1}]
faults:
  - {node: gpu-node-0, kind: ecc_dbe, gpu: 1, cured_by: reboot}       # reset fails, reboot cures
  - {node: gpu-node-1, kind: row_remap_failure, gpu: 4, cured_by: none} # reset, reboot, replace
"""


@pytest.mark.timeout(480)
async def test_sigkill_at_every_step_of_the_ladder(server, aws_proxy, moto_url, aws, tmp_path):
    sc, policy = scenario(SCENARIO)
    from sim.fleet import SimulatedFleet

    fleet = SimulatedFleet(sc, policy, server.client, task_queue="chaos-kill", cluster="chaos-kill")
    async with fleet.running(moto_url, controller=False):
        ctl = ControllerProcess(fleet, server.address, aws_proxy.url, tmp_path)
        ctl.start()
        a, b = fleet.hosts["gpu-node-0"], fleet.hosts["gpu-node-1"]
        node = lambda: fleet.kube.get("Node", "", a.name)["spec"]  # noqa: E731
        steps = [
            ("quarantine", lambda: node().get("unschedulable")),
            ("drain", lambda: any(e.node == a.name for e in fleet.kube.evictions)),
            ("reset", lambda: "node.reset_gpu" in a.calls),
            ("reboot wait", lambda: a.boots >= 2),
            ("validation", lambda: a.calls.count("node.validate") >= 2),
            ("uncordon", lambda: a.boots >= 2 and not node().get("unschedulable")),
            ("replace", lambda: b.replaced),
        ]
        killed = []

        async def killer():
            for name, reached in steps:
                while not reached():
                    await asyncio.sleep(0.05)
                await ctl.kill_and_restart()
                killed.append(name)

        task = asyncio.create_task(killer())
        try:
            await fleet.play(deadline_s=420)
            await asyncio.wait_for(task, 30)
        finally:
            task.cancel()
            ctl.stop()
        assert killed == [s for s, _ in steps]
        ra, rb = await outcome(server.client, a.name, fleet.cluster), await outcome(server.client, b.name, fleet.cluster)
    assert (ra.outcome, [r.value for r in ra.rungs]) == ("returned", ["reset", "reboot"]), ra
    assert (rb.outcome, [r.value for r in rb.rungs]) == ("replaced", ["reset", "reboot", "replace"]), rb
    assert aws_proxy.count("RebootInstances", a.iid) == 1, "node 0 rebooted twice"
    assert aws_proxy.count("RebootInstances", b.iid) == 1, "node 1 rebooted twice"
    assert aws_proxy.count("TerminateInstances", b.iid) <= 1 and aws_proxy.count("TerminateInstances", a.iid) == 0
    assert all(e.respected_budget for e in fleet.kube.evictions)
    assert ctl.starts == len(steps) + 1
