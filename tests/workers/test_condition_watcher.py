"""Node conditions from other detectors become the same reports, through the fake API server."""

import asyncio

from kubernetes import client

from policies.loader import default_policy
from sim.fake_kube import FakeKubeServer
from tests.workflows.fakes import FakeFleet, FakeNode
from workers.condition_watcher import ConditionRule, ConditionWatcher, WatcherConfig
from workflows.node_remediation import NodeRemediation


class Clock:
    t = 0.0

    def __call__(self):
        return self.t


async def test_condition_held_long_enough_reports_then_recovers(ts_env, uniq):
    policy = default_policy()
    policy.ladder.reset.requires_approval = True  # park the episode: this test is about the watcher
    node = f"npd-{uniq}"
    server = FakeKubeServer().start()
    api = client.ApiClient(server.configuration())
    core = client.CoreV1Api(api)
    fleet = FakeFleet(client=ts_env.client, task_queue=f"tq-{uniq}", policy=policy, cluster=f"c-{uniq}")
    fleet.add(FakeNode(node, []))
    clock = Clock()
    watcher = ConditionWatcher(ts_env.client, core, WatcherConfig(
        rules=[ConditionRule(type="XidCriticalError", for_s=60)], policy=policy, cluster=fleet.cluster,
        task_queue=fleet.task_queue), clock=clock)
    server.kube.add_node(node)
    try:
        async with fleet.workers():
            server.kube.patch("Node", "", node, {"status": {"conditions": [
                {"type": "XidCriticalError", "status": "True", "reason": "Xid79", "message": "GPU fell off the bus"}]}},
                "application/strategic-merge-patch+json", "status")
            assert await watcher.observe(core.read_node(node)) is None, "not held long enough yet"
            clock.t = 61
            report = await watcher.observe(core.read_node(node))
            assert report is not None and report.source == "watcher"
            assert [f.kind for f in report.findings] == ["node_condition"] and "Xid79" in report.findings[0].message
            assert await watcher.observe(core.read_node(node)) is None, "unchanged: no second signal"
            handle = ts_env.client.get_workflow_handle(f"remediate/{node}")
            for _ in range(100):
                status = await handle.query(NodeRemediation.status)
                if status.triage is not None:
                    break
                await asyncio.sleep(0.05)
            assert status.triage.fault_class == "node_condition" and status.rejected_total == 0
            server.kube.patch("Node", "", node, {"status": {"conditions": [
                {"type": "XidCriticalError", "status": "False"}]}}, "application/strategic-merge-patch+json", "status")
            clock.t = 62
            cleared = await watcher.observe(core.read_node(node))
            assert cleared is not None and cleared.findings == []
            await handle.terminate("test over")
    finally:
        api.close()
        server.stop()
    assert watcher.sent == 2
