"""The agent against the time-skipping server: one signal per transition, re-sends while unhealthy."""

import asyncio

from temporalio.api.enums.v1 import EventType

from api.names import admission_workflow_id, remediation_workflow_id
from health.nics import NicExpectation
from health.runner import ProbeConfig
from policies.loader import default_policy
from sim.nvml import SimulatedNvml
from tests.workflows.fake_node import FakeNode
from tests.workflows.fakes import FakeFleet
from workers.agent import Agent, AgentConfig
from workflows.node_remediation import NodeRemediation


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


async def signals(handle) -> int:
    """The agent's reports in the episode's history (the guard's answers are signals too)."""
    events = [e async for e in handle.fetch_history_events()]
    return sum(1 for e in events if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED
               and e.workflow_execution_signaled_event_attributes.signal_name == "report")


async def test_agent_signals_once_per_transition_and_resends(ts_env, uniq, tmp_path):
    policy = default_policy()
    policy.ladder.reset.requires_approval = True  # park the episode: this test is about the agent
    node = f"agent-{uniq}"
    fleet = FakeFleet(client=ts_env.client, task_queue=f"tq-{uniq}", policy=policy, cluster=f"c-{uniq}")
    fleet.add(FakeNode(node, []))  # the cluster side of the node, for the workflow's activities
    nv, clock = SimulatedNvml(node, gpus=8), Clock()
    probe = ProbeConfig(expected_gpus=8, nics=NicExpectation(ports=0), require_nvidia_smi=False,
                        sysfs_infiniband=tmp_path)
    agent = Agent(ts_env.client, AgentConfig(node=node, policy=policy, cluster=fleet.cluster, task_queue=fleet.task_queue,
                                             probe=probe, persist_polls=3, resend_interval_s=300, kmsg=None, admit_on_start=False),
                  nv, boot_id="boot-1", clock=clock)
    async with fleet.workers():
        assert await agent.step() is None, "healthy at start: nothing to say"
        nv.inject("row_remap_pending", gpu=1)  # non-fatal: needs 3 polls in a row
        assert await agent.step() is None
        assert await agent.step() is None
        first = await agent.step()
        assert first is not None and [f.kind for f in first.findings] == ["row_remap_pending"]
        handle = ts_env.client.get_workflow_handle(remediation_workflow_id(node, fleet.cluster))
        for _ in range(3):
            clock.t += 10
            assert await agent.step() is None, "same findings: no new signal"
        nv.inject("ecc_dbe", gpu=3)  # fatal: at once, and the findings changed
        changed = await agent.step()
        assert changed is not None and {f.kind for f in changed.findings} == {"row_remap_pending", "ecc_dbe"}
        clock.t += 301
        resent = await agent.step()
        # Sequences follow the wall clock (a spoofed huge one blocks nothing past the skew): later is larger.
        assert resent is not None and resent.seq > changed.seq, "re-sent while unhealthy"
        assert agent.signals == 3
        for _ in range(40):  # the test server records a signal a moment after accepting it
            if await signals(handle) >= 3:
                break
            await asyncio.sleep(0.05)
        assert await signals(handle) == 3
        status = await handle.query(NodeRemediation.status)
        assert status.rejected_total == 0
        nv.clear()
        recovered = await agent.step()
        assert recovered is not None and recovered.findings == []
        assert await agent.step() is None
        await handle.terminate("test over")
    assert agent.signals == 4


async def test_agent_reports_kernel_log_xid_and_fails_closed_on_unreadable_log(ts_env, uniq, tmp_path):
    policy = default_policy()
    policy.ladder.reboot.requires_approval = True
    node = f"kmsg-{uniq}"
    fleet = FakeFleet(client=ts_env.client, task_queue=f"tq-{uniq}", policy=policy, cluster=f"c-{uniq}")
    fleet.add(FakeNode(node, []))
    log = tmp_path / "kmsg.log"
    log.write_text("NVRM: loading driver\n")
    probe = ProbeConfig(expected_gpus=8, nics=NicExpectation(ports=0), require_nvidia_smi=False,
                        sysfs_infiniband=tmp_path)
    nv = SimulatedNvml(node, gpus=8)
    agent = Agent(ts_env.client, AgentConfig(node=node, policy=policy, cluster=fleet.cluster,
                                             task_queue=fleet.task_queue, probe=probe, kmsg=log, admit_on_start=False),
                  nv, boot_id="boot-1", clock=Clock())
    async with fleet.workers():
        assert await agent.step() is None
        with log.open("a") as fh:  # GPU 2 of the simulated node sits at bus 0000:38:00
            fh.write("[ 99.1] NVRM: Xid (PCI:0000:38:00): 79, GPU has fallen off the bus.\n")
        report = await agent.step()
        assert report is not None
        [f] = report.findings
        assert (f.xid, f.gpu_index, f.uuid) == (79, 2, f"GPU-{node}-02")
        log.unlink()
        broken = await agent.step()
        assert broken is not None and any(f.kind == "probe_broken" for f in broken.findings)
        await ts_env.client.get_workflow_handle(remediation_workflow_id(node, fleet.cluster)).terminate("test over")


async def test_first_report_of_a_new_node_starts_admission_once(ts_env, uniq, tmp_path):
    from api.admission import AdmissionResult

    policy = default_policy().scaled(0.001)
    node = f"fresh-{uniq}"
    fleet = FakeFleet(client=ts_env.client, task_queue=f"tq-{uniq}", policy=policy, cluster=f"c-{uniq}")
    fake = fleet.add(FakeNode(node, [], faulty=False))
    probe = ProbeConfig(expected_gpus=8, nics=NicExpectation(ports=0), require_nvidia_smi=False,
                        sysfs_infiniband=tmp_path)
    nv = SimulatedNvml(node, gpus=8)
    config = AgentConfig(node=node, policy=policy, cluster=fleet.cluster, task_queue=fleet.task_queue, probe=probe,
                         kmsg=None)
    with ts_env.auto_time_skipping_disabled():
        async with fleet.workers():
            assert await Agent(ts_env.client, config, nv, boot_id="boot-1").step() is None
            handle = ts_env.client.get_workflow_handle(admission_workflow_id(node, fleet.cluster), result_type=AdmissionResult)
            result = await asyncio.wait_for(handle.result(), 90)
            assert await Agent(ts_env.client, config, nv, boot_id="boot-2").step() is None  # agent restart
    assert (result.outcome, result.validations) == ("healthy", 2)
    assert fake.calls.count("kube.quarantine") == 1, "admitted once, not again on the agent's restart"


def test_restarted_agent_sequence_never_goes_backwards(tmp_path):
    """An open episode rejects a lower sequence from the same sender and boot: a restarted agent
    must start above its predecessor."""
    from policies.loader import default_policy
    from workers.agent import Agent, AgentConfig

    config = AgentConfig(node="seq-node", policy=default_policy(), kmsg=None)
    import time

    before = Agent(None, config, boot_id="boot-1")
    before.seq += 3  # it sent three reports (one a poll at most: far below one a microsecond)
    time.sleep(0.01)
    after = Agent(None, config, boot_id="boot-1")
    assert after.seq > before.seq
