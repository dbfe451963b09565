"""Workflow ids carry the cluster (`remediate/<cluster>/<node>`): two fleets with a node of one name
on one namespace stay apart, an id naming another cluster than the controller's acts on nothing,
and an episode started before the change (`remediate/<node>`) keeps its reports and operators until
it ends."""

from __future__ import annotations

import asyncio

import pytest
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.worker import Worker

import api as c
from api.episode import RemediationInput, RemediationResult
from api.names import legacy_remediation_workflow_id, remediation_workflow_id
from tests.workflows.fake_node import FakeNode
from tests.workflows.fakes import FakeFleet, xid
from tests.workflows.test_node_remediation import make_fleet, wait_for
from workers import operator as op
from workers.reporting import episode_id
from workflows.node_remediation import NodeRemediation


def test_ids_name_cluster_and_node_and_refuse_a_slash():
    assert remediation_workflow_id("gpu-1", "east") == "remediate/east/gpu-1"
    assert c.node_in_workflow_id("remediate/east/gpu-1", "remediate") == "gpu-1"
    assert c.node_in_workflow_id("remediate/gpu-1", "remediate") == "gpu-1"  # the legacy id
    assert c.cluster_in_workflow_id("remediate/east/gpu-1", "remediate") == "east"
    assert c.cluster_in_workflow_id("remediate/gpu-1", "remediate") is None
    assert c.node_in_workflow_id("admit/east/gpu-1", "remediate") is None
    with pytest.raises(ValueError, match="without '/'"):
        remediation_workflow_id("gpu-1", "a/b")
    for odd in ("remediate/a/b/gpu-1", "remediate/east/", "remediate//gpu-1", "remediate/", "remediate"):
        assert c.node_in_workflow_id(odd, "remediate") is None and c.cluster_in_workflow_id(odd, "remediate") is None


@pytest.mark.parametrize("shape", ["remediate/{c}/x/{n}", "remediate/{c}/", "remediate//{n}"])
async def test_an_id_of_another_shape_acts_on_nothing(ts_env, uniq, shape):
    """Empty parts or more slashes: no node the id names, so no node to act on (the start input's
    node is a sender's word)."""
    fleet = make_fleet(ts_env, uniq)
    n = fleet.add(FakeNode(f"shape-{uniq}", [xid(48)], cured_by="reset"))
    async with fleet.workers():
        handle = await ts_env.client.start_workflow(
            NodeRemediation.run, RemediationInput(node=n.name, cluster=fleet.cluster),
            id=shape.format(c=fleet.cluster, n=n.name), task_queue=fleet.task_queue, result_type=RemediationResult,
            start_signal="report", start_signal_args=[n.report().model_dump(mode="json")])
        result = await handle.result()
    assert result.outcome == "rejected" and "is not remediate/<cluster>/<node>" in result.reason, result
    assert n.calls == []


async def test_two_clusters_with_one_node_name_get_two_episodes(ts_env, uniq):
    """The same node name in two fleets on one namespace: each report reaches its own cluster's episode."""
    east = make_fleet(ts_env, f"e{uniq}")
    west = FakeFleet(client=ts_env.client, task_queue=f"tq-w{uniq}", policy=east.policy, cluster=f"w-{uniq}")
    name = f"twin-{uniq}"
    a = east.add(FakeNode(name, [xid(48)], cured_by="reset"))
    b = west.add(FakeNode(name, [xid(13)], cured_by="kill"))
    async with east.workers(), west.workers():
        ha, hb = await east.report(name), await west.report(name)
        ra, rb = await ha.result(), await hb.result()
    assert ha.id != hb.id
    assert (ra.outcome, ra.rungs, rb.outcome, rb.rungs) == ("returned", ["reset"], "returned", ["kill"])
    assert "node.reset_gpu" in a.calls and "node.reset_gpu" not in b.calls


async def test_an_id_naming_another_cluster_acts_on_nothing(ts_env, uniq):
    """A sender on the controller's queue that names another cluster in the id would start a second
    episode beside the node's real one: refused before any side effect."""
    fleet = make_fleet(ts_env, uniq)
    n = fleet.add(FakeNode(f"spoof-{uniq}", [xid(48)], cured_by="reset"))
    async with fleet.workers():
        handle = await ts_env.client.start_workflow(
            NodeRemediation.run, RemediationInput(node=n.name, cluster=fleet.cluster),
            id=remediation_workflow_id(n.name, f"other-{uniq}"), task_queue=fleet.task_queue,
            start_signal="report", start_signal_args=[n.report().model_dump(mode="json")])
        result = await handle.result()
    assert result.outcome == "rejected" and f"names cluster other-{uniq}" in result.reason
    assert [k for k in n.calls if not k.startswith(("policy", "ledger"))] == [], n.calls


async def test_an_episode_started_under_the_old_id_keeps_its_reports_until_it_ends(ts_env, uniq):
    """The upgrade path: an episode running as `remediate/<node>` gets the node's reports and the
    operator's commands; a second one is never started beside it; the node's next spell starts under
    the new id."""
    fleet = make_fleet(ts_env, uniq)
    n = fleet.add(FakeNode(f"old-{uniq}", [xid(48)], cured_by="reset", hold=asyncio.Event()))
    legacy = legacy_remediation_workflow_id(n.name)
    # The upgraded agent serves both queues: the old episode schedules on `node/<node>`.
    old_queue = Worker(ts_env.client, task_queue=c.legacy_node_task_queue(n.name), activities=fleet.activities())
    async with fleet.workers(), old_queue:
        old = await ts_env.client.start_workflow(  # what a sender from before the change started
            NodeRemediation.run, RemediationInput(node=n.name, cluster=fleet.cluster), id=legacy,
            task_queue=fleet.task_queue, id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            start_signal="report", start_signal_args=[n.report().model_dump(mode="json")],
            result_type=RemediationResult)

        async def draining() -> bool:
            return "kube.drain" in n.calls

        await wait_for(draining)
        assert await episode_id(ts_env.client, n.name, fleet.cluster) == legacy
        again = await fleet.report(n.name)
        assert again.id == legacy
        st = await op.node_status(ts_env.client, n.name, fleet.cluster)
        assert st.node == n.name and st.stage.value == "ladder"
        n.hold.set()
        first = await old.result()
        assert (first.outcome, first.rungs) == ("returned", ["reset"])
        n.faulty = True
        n.hold = None
        nxt = await fleet.report(n.name)
        assert nxt.id == remediation_workflow_id(n.name, fleet.cluster)
        await nxt.result()
    assert n.calls.count("kube.drain") == 2, "one drain per spell, never two episodes at once"
    assert [r.node for r in n.requests["node.reset_gpu"]] == [n.name] * 2
