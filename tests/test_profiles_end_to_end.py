"""Node profiles through the real controller activities, agent and fake API server: observe mode
records and never cordons; a node's baseline is learned (or recorded at admission) and held
against it; the controller tells the agent its profile."""

import asyncio
import json

from api.admission import AdmissionResult
from api.episode import RemediationResult
from api.names import admission_workflow_id, remediation_workflow_id
from policies.baseline import BASELINE_ANNOTATION, NodeBaseline
from policies.loader import default_policy, policy_from_mapping
from sim.sysfs import PORT_DOWN, PORT_UP, write_ib_ports
from tests.test_end_to_end import gpu_cluster
from workers.agent import Agent, AgentConfig
from workers.reporting import start_admission
from workflows.node_remediation import NodeRemediation

P5 = {"node.kubernetes.io/instance-type": "p5.48xlarge"}


def label(st, labels: dict) -> None:
    st.kube.patch("Node", "", st.node, {"metadata": {"labels": labels}}, "application/merge-patch+json")


def baseline_of(st) -> NodeBaseline | None:
    text = (st.kube.get("Node", "", st.node)["metadata"].get("annotations") or {}).get(BASELINE_ANNOTATION)
    return NodeBaseline.model_validate_json(text) if text else None


def looking_agent(dev_env, st, policy, tmp_path) -> Agent:
    old = st.host.agent.config
    config = AgentConfig(node=st.node, policy=policy, cluster=old.cluster, task_queue=old.task_queue, probe=old.probe,
                         kmsg=None, admit_on_start=False, lookup_expectations=True)
    return Agent(dev_env.client, config, st.nv, boot_id="boot-0")


async def step_and_look(agent: Agent):
    report = await agent.step()
    if agent._lookup is not None:
        await asyncio.wait_for(agent._lookup, 60)
    return report


async def test_observe_profile_records_and_never_cordons(dev_env, aws, tmp_path, uniq):
    policy = policy_from_mapping({"profiles": {"aws-p5": {"mode": "observe"}}}).scaled(0.002)
    async with gpu_cluster(dev_env, aws, tmp_path, uniq, policy) as st:
        label(st, P5)
        st.nv.inject("gpu_lost", gpu=2)  # fatal, would start at reboot
        report = await st.host.agent.step()
        assert [f.kind for f in report.findings] == ["gpu_lost"]
        handle = dev_env.client.get_workflow_handle(remediation_workflow_id(st.node, st.cluster), result_type=RemediationResult)
        result = await asyncio.wait_for(handle.result(), 60)
        node = st.kube.get("Node", "", st.node)
        assert result.outcome == "observed" and "would start at reboot" in result.reason, result
        assert not node["spec"].get("unschedulable") and not node["spec"].get("taints"), node["spec"]
        assert result.rungs == [] and result.detect_to_cordon_ms is None
        status = await handle.query(NodeRemediation.status)
        assert not status.quarantined and status.policy_name == "default/aws-p5"
        steps = [a.step for a in status.actions]
        assert "triage" in steps and not any("quarantine" in s or "drain" in s for s in steps), steps


async def test_agent_learns_its_baseline_then_flags_a_lost_port(dev_env, aws, tmp_path, uniq):
    policy = default_policy().scaled(0.002)
    async with gpu_cluster(dev_env, aws, tmp_path, uniq, policy) as st:
        write_ib_ports(tmp_path / "ib", [PORT_UP] * 8)  # no profile names these: only the baseline will
        agent = looking_agent(dev_env, st, policy, tmp_path)
        assert baseline_of(st) is None
        # The first cycle waits for the controller's answer (no profile, no baseline yet), is healthy,
        # and sends what it saw: recorded as the node's baseline, learned, not validated.
        assert await step_and_look(agent) is None
        assert agent.expectations.profile_name is None and "learned baseline only" in agent.expectations.reason
        base = baseline_of(st)
        assert base is not None and not base.validated and base.summary() == "8 GPUs, 8x400 Gb/s infiniband, PCIe Gen5 x16"
        assert agent.expectations.baseline == base and "learned baseline recorded" in agent.expectations.recorded
        write_ib_ports(tmp_path / "ib", [PORT_UP] * 7 + [PORT_DOWN])
        report = await agent.step()
        [f] = report.findings
        assert f.kind == "nic_ports_down" and "7 of 8 infiniband" in f.message and "learned (not validated)" in f.message


async def test_controller_tells_the_agent_its_profile(dev_env, aws, tmp_path, uniq):
    policy = default_policy().scaled(0.002)
    async with gpu_cluster(dev_env, aws, tmp_path, uniq, policy) as st:
        label(st, P5)  # aws-p5: 32 EFA ports expected, and the node has none
        agent = looking_agent(dev_env, st, policy, tmp_path)
        report = await step_and_look(agent)  # the first cycle already probes against the profile
        assert agent.expectations.profile_name == "aws-p5" and "instance type p5.48xlarge" in agent.expectations.reason
        assert agent.config.probe.nics.kind == "efa" and agent.config.probe.expected_gpus == 8
        assert [f.kind for f in report.findings] == ["nic_ports_down"]
        assert "0 of 32 efa ports" in report.findings[0].message
        assert baseline_of(st) is None, "an unhealthy node learns no baseline"


async def test_admission_records_the_validated_baseline(dev_env, aws, tmp_path, uniq):
    policy = default_policy().scaled(0.002)
    async with gpu_cluster(dev_env, aws, tmp_path, uniq, policy) as st:
        write_ib_ports(tmp_path / "ib", [PORT_UP] * 8)
        tq = st.host.agent.config.task_queue
        assert await start_admission(dev_env.client, node=st.node, hardware_ids=["GPU-x"], cluster=st.cluster, task_queue=tq)
        handle = dev_env.client.get_workflow_handle(admission_workflow_id(st.node, st.cluster), result_type=AdmissionResult)
        result = await asyncio.wait_for(handle.result(), 90)
        assert result.outcome == "healthy", result
        base = baseline_of(st)
        assert base is not None and base.validated and base.summary() == "8 GPUs, 8x400 Gb/s infiniband, PCIe Gen5 x16"
        rec = next(a for a in result.actions if a.step == "baseline")
        assert rec.ok and rec.detail == base.summary()
        # what `kubectl get node -o json` shows, verifiable by anyone
        assert json.loads(st.kube.get("Node", "", st.node)["metadata"]["annotations"][BASELINE_ANNOTATION])["validated"]
