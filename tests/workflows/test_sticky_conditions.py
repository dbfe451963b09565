"""A sticky node condition sent by two condition-watcher replicas counts once (issue 22: 7): in
probation the second replica's copy is no recurrence, and after the episode a restarted replica's
re-send starts nothing. The watchers are the real ConditionWatcher, fed the Node objects a watch
would hand them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from kubernetes import client as k8s

from api.names import remediation_workflow_id
from policies.loader import default_policy
from policies.terms import Generation
from tests.workflows.fake_node import FakeNode
from tests.workflows.test_node_remediation import make_fleet, wait_for
from workers.condition_watcher import ConditionRule, ConditionWatcher, WatcherConfig
from workflows.node_remediation import NodeRemediation


def node_with_condition(name: str, since: datetime) -> k8s.V1Node:
    cond = k8s.V1NodeCondition(type="XidCriticalError", status="True", last_transition_time=since,
                               reason="Xid79", message="GPU has fallen off the bus")
    return k8s.V1Node(metadata=k8s.V1ObjectMeta(name=name), status=k8s.V1NodeStatus(conditions=[cond]))


def replica(fleet) -> ConditionWatcher:
    return ConditionWatcher(fleet.client, None, WatcherConfig(
        rules=[ConditionRule(type="XidCriticalError")], cluster=fleet.cluster, task_queue=fleet.task_queue,
        generation=Generation.HOPPER))


async def test_two_watcher_replicas_send_a_sticky_condition_once(ts_env, uniq):
    fleet = make_fleet(ts_env, uniq, default_policy().scaled(0.001))  # polled in real time: a day's policy in seconds
    n = fleet.add(FakeNode(f"npd-{uniq}", [], cured_by="reset"))
    node = node_with_condition(n.name, datetime.now(UTC) - timedelta(minutes=1))
    async with fleet.workers():
        await replica(fleet).observe(node)
        handle = ts_env.client.get_workflow_handle_for(NodeRemediation.run, remediation_workflow_id(n.name, fleet.cluster))

        async def in_probation() -> bool:
            return (await handle.query(NodeRemediation.status)).stage in ("probation", "done")

        await wait_for(in_probation, timeout=30)
        await replica(fleet).observe(node)  # the second replica, a moment behind
        st = await handle.query(NodeRemediation.status)
        first = await handle.result()
        assert first.outcome == "returned", (first.outcome, first.reason, st.stage)
        assert first.rungs == ["reset"], "the second copy was no recurrence"
        resets = n.calls.count("node.reset_gpu")
        await replica(fleet).observe(node)  # a restarted replica, the condition still set
        again = await ts_env.client.get_workflow_handle_for(NodeRemediation.run, remediation_workflow_id(n.name, fleet.cluster)).result()
    assert n.calls.count("node.reset_gpu") == resets, f"no second reset for the same condition ({again.reason})"
    assert again.outcome == "healthy" and "re-send" in again.reason, again.reason
