"""End to end on the dev server: real kube, cloud, ledger, guard and node activities, simulated host.

A node with a PDB-protected training pod gets a reboot-class fault: it is cordoned and tainted in
the fake API, drained without breaking the budget, rebooted in moto, validated twice, uncordoned.
"""

import asyncio
import contextlib
import json
from dataclasses import dataclass
from datetime import timedelta

import pytest
from kubernetes import client
from temporalio.api.enums.v1 import EventType
from temporalio.service import RPCError
from temporalio.worker import Worker

from activities.cloud import CloudActivities
from activities.guard import GuardActivities
from activities.kube import KubeActivities
from activities.ledger import LedgerActivities, SqliteLedger
from activities.node import NodeActivities
from activities.policy import PolicyActivities
from activities.providers.aws import REBOOT_KEY_TAG, REBOOT_STATE_TAG
from api.episode import RemediationResult
from api.names import guard_workflow_id, node_task_queue, remediation_workflow_id
from health.nics import NicExpectation
from health.runner import ProbeConfig
from policies.loader import default_policy
from sim.fake_kube import FakeKubeServer
from sim.load_device import sim_opener
from sim.nvml import SimulatedNvml
from workers.agent import Agent, AgentConfig
from workers.controller import CONTROLLER_WORKFLOWS, controller_activities
from workflows.node_remediation import NodeRemediation


class SimHost:
    """The machine behind a node: reboots when EC2 says so, and its agent reports from the new boot."""

    def __init__(self, node, ec2, iid, kube, nv, proc, make_agent):
        self.node, self.ec2, self.iid, self.kube, self.nv, self.proc = node, ec2, iid, kube, nv, proc
        self.make_agent, self.boots, self.seen_key = make_agent, 1, None
        self.agent = make_agent("boot-1")
        (proc / "sys/kernel/random").mkdir(parents=True)
        (proc / "sys/kernel/random/boot_id").write_text("boot-1\n")

    async def watch_for_reboot(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            found = await asyncio.to_thread(self.ec2.describe_tags,
                                            Filters=[{"Name": "resource-id", "Values": [self.iid]}])
            tags = {t["Key"]: t["Value"] for t in found["Tags"]}
            key = tags.get(REBOOT_KEY_TAG)
            if key and key != self.seen_key and tags.get(REBOOT_STATE_TAG) == "sent":
                self.seen_key = key
                self.kube.set_node_ready(self.node, False)
                await asyncio.sleep(0.2)
                self.nv.clear()  # the reboot cured the fault
                self.boots += 1
                boot = f"boot-{self.boots}"
                (self.proc / "sys/kernel/random/boot_id").write_text(boot + "\n")
                self.kube.set_node_ready(self.node, True)
                self.agent = self.make_agent(boot)
                await self.agent.step()
            await asyncio.sleep(0.1)


@dataclass
class Stack:
    node: str
    cluster: str
    kube: object
    ec2: object
    iid: str
    nv: SimulatedNvml
    host: SimHost
    core: client.CoreV1Api


@contextlib.asynccontextmanager
async def gpu_cluster(dev_env, aws, tmp_path, uniq, policy):
    """One GPU node (instance in moto, Node in the fake API, simulated GPUs), a PDB-protected job
    across it and two other nodes, and the controller and node workers with the real activities."""
    node, tq, cluster = f"e2e-{uniq}", f"tq-{uniq}", f"c-{uniq}"
    server = FakeKubeServer().start()
    api = server.api_client()
    core, kube = client.CoreV1Api(api), server.kube
    ec2 = aws("ec2")
    ami = ec2.describe_images()["Images"][0]["ImageId"]
    iid = ec2.run_instances(ImageId=ami, MinCount=1, MaxCount=1, InstanceType="p5.48xlarge",
                            TagSpecifications=[{"ResourceType": "instance",
                                                "Tags": [{"Key": "gpuheal.io/managed", "Value": "true"}]}])[
        "Instances"][0]["InstanceId"]
    kube.add_node(node, provider_id=f"aws:///us-east-1a/{iid}")
    for i, where in enumerate([node, "other-1", "other-2"]):
        kube.add_pod(f"train-{i}", where, labels={"job": "train-a"})
    kube.add_pdb("train-a", {"job": "train-a"}, min_available=2)
    nv = SimulatedNvml(node, gpus=8)
    probe = ProbeConfig(expected_gpus=8, nics=NicExpectation(ports=0), require_nvidia_smi=False,
                        sysfs_infiniband=tmp_path / "ib")
    config = AgentConfig(node=node, policy=policy, cluster=cluster, task_queue=tq, probe=probe, kmsg=None, admit_on_start=False)
    host = SimHost(node, ec2, iid, kube, nv, tmp_path / "proc",
                   lambda boot: Agent(dev_env.client, config, nv, boot_id=boot))
    node_acts = NodeActivities(probe, nv, proc=tmp_path / "proc", open_devices=sim_opener(nv))  # no CuPy here
    kube_acts = KubeActivities(core)
    cloud_acts = CloudActivities.aws(ec2, aws("autoscaling"), aws("ssm"), core)
    ledger = LedgerActivities(SqliteLedger(tmp_path / "ledger.db"))
    guard = GuardActivities(dev_env.client)
    controller = Worker(dev_env.client, task_queue=tq, workflows=CONTROLLER_WORKFLOWS,
                        activities=controller_activities(kube_acts, cloud_acts, ledger, guard,
                                                                  PolicyActivities(policy, "test", cluster)))
    agent_worker = Worker(dev_env.client, task_queue=node_task_queue(node, cluster), activities=node_acts.activities())
    stop = asyncio.Event()
    try:
        async with controller, agent_worker:
            watcher = asyncio.get_running_loop().create_task(host.watch_for_reboot(stop))
            try:
                yield Stack(node, cluster, kube, ec2, iid, nv, host, core)
            finally:
                stop.set()
                await watcher
                with contextlib.suppress(RPCError):
                    await dev_env.client.get_workflow_handle(guard_workflow_id(cluster)).terminate("test over")
    finally:
        api.close()
        server.stop()


def instance_tags(ec2, iid) -> dict:
    return {t["Key"]: t["Value"] for t in ec2.describe_tags(Filters=[{"Name": "resource-id", "Values": [iid]}])["Tags"]}


@pytest.mark.parametrize("cordoned_before", [False, True], ids=["schedulable", "cordoned-by-hand"])
async def test_reboot_class_fault_end_to_end(dev_env, aws, tmp_path, uniq, cordoned_before):
    """The node carries a dedicated-pool taint (and, in one case, an operator's cordon) before its
    fault: the episode ends with exactly that taint, and cordoned only if it was before."""
    policy = default_policy().scaled(0.002)
    policy.ladder.reboot.return_timeout = timedelta(seconds=30)  # real seconds: moto and the host sim poll
    async with gpu_cluster(dev_env, aws, tmp_path, uniq, policy) as st:
        foreign = [{"key": "dedicated", "value": "training", "effect": "NoSchedule"}]
        st.kube.patch("Node", "", st.node, {"spec": {"taints": foreign, "unschedulable": cordoned_before}},
                      "application/strategic-merge-patch+json")
        st.nv.inject("gpu_lost", gpu=2)
        report = await st.host.agent.step()
        assert [f.kind for f in report.findings] == ["gpu_lost"]
        handle = dev_env.client.get_workflow_handle(remediation_workflow_id(st.node, st.cluster), result_type=RemediationResult)
        result = await asyncio.wait_for(handle.result(), 120)
        events = [e async for e in handle.fetch_history_events()]
        status = await handle.query(NodeRemediation.status)
    node, kube = st.node, st.kube
    assert (result.outcome, result.rungs, result.validations) == ("returned", ["reboot"], 2), status.actions
    n = kube.get("Node", "", node)
    assert bool(n["spec"].get("unschedulable")) is cordoned_before
    assert n["spec"].get("taints") == foreign, "exactly the taints it had"
    assert {c["type"]: c["status"] for c in n["status"]["conditions"]}["GpuHealthy"] == "True"
    evicted = [e for e in kube.evictions if e.allowed]
    assert [e.pod for e in evicted] == ["train-0"] and all(e.respected_budget for e in kube.evictions)
    assert "train-0" not in {p["metadata"]["name"] for p in kube.list("Pod", "default")}, "the drain waited for it to go"
    marked = [e for e in kube.list("Event", "default") if e["reason"] == "GpuFailureAttributed"]
    assert [e["involvedObject"]["name"] for e in marked] == ["train-0"] and "platform fault" in marked[0]["message"]
    assert instance_tags(st.ec2, st.iid)[REBOOT_STATE_TAG] == "sent"
    summaries = [json.loads(e.user_metadata.summary.data) for e in events
                 if e.event_type in (EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED, EventType.EVENT_TYPE_TIMER_STARTED)
                 and e.HasField("user_metadata")]
    for expected in (f"drain {node}", f"reboot {node}", f"validate {node} (1 of 2)",
                     f"soak {node}", f"validate {node} (2 of 2)", f"probation of {node}"):
        assert any(s.startswith(expected) for s in summaries), (expected, summaries)
    # Cordon and uncordon run as local activities: a marker each, named by activity type.
    local = [json.loads(e.marker_recorded_event_attributes.details["data"].payloads[0].data)["activity_type"]
             for e in events if e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED
             and e.marker_recorded_event_attributes.marker_name == "core_local_activity"]
    assert local.index("kube.quarantine") < local.index("kube.return_to_service"), local
    # The node was checked with the policy, from one read (one local activity fewer before the cordon).
    assert "kube.check_node" not in local and local[0] == "policy.current", local
    assert any(a.step == "kube.check_node" and a.ok for a in status.actions), status.actions
    assert not [e for e in events if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED]


async def test_dry_run_changes_nothing(dev_env, aws, tmp_path, uniq):
    policy = default_policy().scaled(0.002)
    policy.dry_run = True
    async with gpu_cluster(dev_env, aws, tmp_path, uniq, policy) as st:
        before_node = st.kube.get("Node", "", st.node)
        before_pods = st.kube.list("Pod", None)
        st.nv.inject("gpu_lost", gpu=2)
        await st.host.agent.step()
        handle = dev_env.client.get_workflow_handle(remediation_workflow_id(st.node, st.cluster), result_type=RemediationResult)
        result = await asyncio.wait_for(handle.result(), 120)
        status = await handle.query(NodeRemediation.status)
    assert result.outcome == "dry_run" and "would reboot" in result.reason
    assert any(a.summary.startswith(f"cordon and taint {st.node}") for a in status.actions), "recorded what it would do"
    assert st.kube.get("Node", "", st.node) == before_node
    assert st.kube.list("Pod", None) == before_pods and st.kube.evictions == []
    assert REBOOT_STATE_TAG not in instance_tags(st.ec2, st.iid)
    assert st.ec2.describe_instances(InstanceIds=[st.iid])["Reservations"][0]["Instances"][0]["State"]["Name"] == "running"
