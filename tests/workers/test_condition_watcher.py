"""Node conditions from other detectors become the same reports, through the fake API server."""

import asyncio

from kubernetes import client

from api.names import remediation_workflow_id
from policies.loader import default_policy
from sim.fake_kube import FakeKubeServer
from tests.workflows.fake_node import FakeNode
from tests.workflows.fakes import FakeFleet
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
    api = server.api_client()
    core = client.CoreV1Api(api)
    fleet = FakeFleet(client=ts_env.client, task_queue=f"tq-{uniq}", policy=policy, cluster=f"c-{uniq}")
    fleet.add(FakeNode(node, []))
    clock = Clock()
    watcher = ConditionWatcher(ts_env.client, core, WatcherConfig(
        rules=[ConditionRule(type="XidCriticalError", for_s=60)], cluster=fleet.cluster,
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
            handle = ts_env.client.get_workflow_handle(remediation_workflow_id(node, fleet.cluster))
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


class SeenWatcher(ConditionWatcher):
    """The real list/watch loop; what it hands to `observe` is recorded instead of sent."""

    def __init__(self, core):
        super().__init__(None, core, WatcherConfig(rules=[ConditionRule(type="XidCriticalError")]))
        self.seen: list[tuple[str, str | None]] = []
        self.changed = asyncio.Event()

    async def observe(self, node):
        cond = next((x.status for x in node.status.conditions or [] if x.type == "XidCriticalError"), None)
        self.seen.append((node.metadata.name, cond))
        self.changed.set()


def set_condition(kube, node: str, status: str) -> None:
    kube.patch("Node", "", node, {"status": {"conditions": [{"type": "XidCriticalError", "status": status}]}},
               "application/strategic-merge-patch+json", "status")


async def until(watcher: SeenWatcher, entry) -> None:
    while entry not in watcher.seen:
        watcher.changed.clear()
        await watcher.changed.wait()


async def test_watch_streams_events_resumes_relists_on_410_and_stops_promptly():
    server = FakeKubeServer().start()
    api = server.api_client()
    watcher = SeenWatcher(client.CoreV1Api(api))
    server.kube.add_node("w1")
    stop = asyncio.Event()
    task = asyncio.get_running_loop().create_task(watcher.run(stop, timeout_s=30))
    try:
        await asyncio.wait_for(until(watcher, ("w1", None)), 10)  # the initial list
        set_condition(server.kube, "w1", "True")
        # Streamed as it happens, not when the 30 s watch call ends.
        await asyncio.wait_for(until(watcher, ("w1", "True")), 5)
        server.kube.add_node("w2")
        set_condition(server.kube, "w1", "False")
        await asyncio.wait_for(until(watcher, ("w1", "False")), 5)
        await asyncio.wait_for(until(watcher, ("w2", None)), 5)
        # A watch from a resourceVersion compacted away is told 410 Gone: the loop lists again.
        server.kube.compact()
        assert await asyncio.wait_for(watcher._watch_from("1", asyncio.Event(), 5), 5) is None
        stop.set()
        await asyncio.wait_for(task, 3)  # stops without waiting out the watch call
    finally:
        stop.set()
        api.close()
        server.stop()
