"""Do no harm on the simulated fleet: the real agent (its held events and scaled re-sends), the real
activities against the fake API server and moto, and the controller's workflows."""

from __future__ import annotations

import contextlib

import pytest

from api.episode import RemediationResult
from api.names import remediation_workflow_id
from sim.fleet import SimulatedFleet
from sim.scenario import load_scenario
from workflows.node_remediation import NodeRemediation


async def result_of(client, node: str, cluster: str) -> RemediationResult:
    return await client.get_workflow_handle(remediation_workflow_id(node, cluster), result_type=RemediationResult).result()


@pytest.mark.timeout(240)
async def test_user_bugs_are_killed_only_despite_resends(dev_env, moto_url, aws, uniq):
    """Xid 13 on three nodes, cured by killing the job. The agent keeps the kernel-log event and
    re-sends it (every 3 s at this scale) all through probation (18 s): each re-send is the same
    event, so no node is cordoned, drained or reset."""
    sc, policy = load_scenario(text="""
name: user-bugs
time_scale: 0.01
fleet: {nodes: 4}
faults:
  - {node: gpu-node-0, kind: xid, xid: 13, gpu: 1, cured_by: kill}
  - {node: gpu-node-1, kind: xid, xid: 13, gpu: 3, cured_by: kill}
  - {node: gpu-node-2, kind: xid, xid: 13, gpu: 5, cured_by: kill}
""")
    assert policy.probation.total_seconds() > 3 * sc.time_scale * 300, "re-sends must fall inside probation"
    fleet = SimulatedFleet(sc, policy, dev_env.client, task_queue=f"harm-{uniq}", cluster=f"harm-{uniq}")
    async with fleet.running(moto_url):
        await fleet.play(deadline_s=200)
        results = {n: await result_of(dev_env.client, n, fleet.cluster) for n in ("gpu-node-0", "gpu-node-1", "gpu-node-2")}
        resends = {n: fleet.hosts[n].agent.signals for n in results}
        cordoned = [n for n in results if fleet.kube.get("Node", "", n)["spec"].get("unschedulable")]
    for node, r in results.items():
        assert (r.outcome, r.rungs, r.attribution) == ("returned", ["kill"], "application"), (node, r)
    assert all(count >= 3 for count in resends.values()), f"the agent re-sent during probation: {resends}"
    assert cordoned == [] and fleet.kube.evictions == []


@pytest.mark.timeout(240)
async def test_agent_stopped_mid_episode_is_quarantined_not_replaced(dev_env, moto_url, aws, uniq):
    """The agent dies after the cordon. The ladder reboots through the cloud API, sees the kubelet
    come back on a new boot with no agent, and leaves the node quarantined for a person."""
    sc, policy = load_scenario(text="""
name: agent-dies
time_scale: 0.01
fleet: {nodes: 2}
faults:
  - {node: gpu-node-1, kind: ecc_dbe, gpu: 2, cured_by: reset}
""")
    fleet = SimulatedFleet(sc, policy, dev_env.client, task_queue=f"dies-{uniq}", cluster=f"dies-{uniq}")
    host = None

    async def kill_agent_after_cordon(fl) -> None:
        nonlocal host
        if host is not None:
            return
        with contextlib.suppress(Exception):  # the episode may not have started yet
            status = await fl.temporal.get_workflow_handle(fl.episode_id("gpu-node-1")).query(
                NodeRemediation.status)
            if status.quarantined:
                host = fl.hosts["gpu-node-1"]
                await host.stop_agent()

    async with fleet.running(moto_url):
        await fleet.play(deadline_s=200, on_tick=kill_agent_after_cordon)
        result = await result_of(dev_env.client, "gpu-node-1", fleet.cluster)
        node = fleet.kube.get("Node", "", "gpu-node-1")
        state = fleet.ec2.describe_instances(InstanceIds=[host.iid])["Reservations"][0]["Instances"][0]["State"]
        denied = fleet.ledger.denied([f"GPU-{i}" for i in range(8)] + [g.uuid for g in host.nv.gpus])
    assert host is not None, "the agent was stopped mid-episode"
    assert result.outcome == "quarantined" and result.reason.startswith("agent_missing"), result
    assert "reboot" in result.rungs and "replace" not in result.rungs
    assert state["Name"] == "running", "the instance was not terminated"
    assert denied == {}, "nothing was denylisted"
    assert node["spec"].get("unschedulable"), "still cordoned for a person"
