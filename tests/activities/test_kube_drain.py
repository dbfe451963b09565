"""Drain against the fake API server over HTTP, through the real client: evictions, PodDisruptionBudgets,
checkpoint notices and the deadline."""

import asyncio

from temporalio.testing import ActivityEnvironment

import api as c
from activities.kube_pods import DRAIN_DEADLINE_ANNOTATION, DRAIN_EPISODE_ANNOTATION
from tests.activities.test_kube import run


async def test_drain_waits_for_pods_to_be_gone(kube):
    """An accepted eviction starts the pod's graceful shutdown; the drain returns once the pod is
    gone, not when it merely has a deletion timestamp."""
    k, core, acts = kube
    k.add_node("n1")
    k.add_pod("solo", "n1")
    loop = asyncio.get_running_loop()
    start = loop.time()
    r = await run(acts.drain, c.DrainRequest(node="n1", episode="e", checkpoint_grace_s=0, deadline_s=5,
                                             pod_grace_seconds=2))
    assert r.evicted == ["default/solo"] and not r.lingering
    assert loop.time() - start >= 1.5, "returned before the pod's grace ran"
    assert not core.list_pod_for_all_namespaces(field_selector="spec.nodeName=n1").items


async def test_drain_notice_belongs_to_its_episode(kube):
    """A second episode gives its own checkpoint notice instead of reusing the first one's deadline."""
    k, core, acts = kube
    k.add_node("n1")
    k.add_pod("w", "n1", annotations={DRAIN_DEADLINE_ANNOTATION: "2020-01-01T00:00:00+00:00",
                                      DRAIN_EPISODE_ANNOTATION: "remediate/n1/old-run"})
    k.add_pdb("w", {}, min_available=1)  # the eviction is refused, so the pod stays to be read
    loop = asyncio.get_running_loop()
    start = loop.time()
    await run(acts.drain, c.DrainRequest(node="n1", episode="remediate/n1/new-run", checkpoint_grace_s=1,
                                         deadline_s=0.2, pod_grace_seconds=0))
    assert loop.time() - start >= 0.9, "the new episode's checkpoint grace was given"
    ann = core.read_namespaced_pod("w", "default").metadata.annotations
    assert ann[DRAIN_EPISODE_ANNOTATION] == "remediate/n1/new-run" and ann[DRAIN_DEADLINE_ANNOTATION] > "2021"


async def test_drain_respects_pdb_then_escalates(kube):
    k, core, acts = kube
    k.add_node("n1")
    for i in range(3):
        k.add_pod(f"w{i}", f"n{i}", labels={"job": "train"})
    k.add_pod("solo", "n1")
    k.add_pod("ds", "n1", owner_kind="DaemonSet")
    k.add_pod("mirror", "n1", annotations={"kubernetes.io/config.mirror": "abc"})
    k.add_pdb("train", {"job": "train"}, min_available=3)
    beats = []
    env = ActivityEnvironment()
    env.on_heartbeat = beats.append
    r = await env.run(acts.drain, c.DrainRequest(node="n1", episode="e", checkpoint_grace_s=0.5, deadline_s=1.5,
                                                 pod_grace_seconds=0))
    assert r.evicted == ["default/solo"]
    assert r.remaining == ["default/w1"] and r.timed_out and r.pdb_blocked >= 1
    assert beats, "the drain heartbeats while blocked"
    assert DRAIN_DEADLINE_ANNOTATION in core.read_namespaced_pod("w1", "default").metadata.annotations
    assert all(e.respected_budget for e in k.evictions)
    assert {p.metadata.name for p in core.list_pod_for_all_namespaces(field_selector="spec.nodeName=n1").items} == \
        {"w1", "ds", "mirror"}


async def test_drain_succeeds_once_budget_allows(kube):
    k, core, acts = kube
    k.add_node("n1")
    for i in range(3):
        k.add_pod(f"w{i}", "n1" if i == 0 else f"m{i}", labels={"job": "train"})
    k.add_pdb("train", {"job": "train"}, min_available=3)

    async def replacement_comes_up():
        await asyncio.sleep(0.8)
        k.add_pod("w3", "m3", labels={"job": "train"})  # the job's controller schedules a spare

    asyncio.get_running_loop().create_task(replacement_comes_up())
    r = await run(acts.drain, c.DrainRequest(node="n1", episode="e", checkpoint_grace_s=0, deadline_s=10,
                                             pod_grace_seconds=0))
    assert r.evicted == ["default/w0"] and not r.timed_out and r.pdb_blocked >= 1
    assert all(e.respected_budget for e in k.evictions)


async def test_drain_force_only_when_allowed(kube):
    k, core, acts = kube
    k.add_node("n1")
    k.add_pod("w0", "n1", labels={"job": "t"})
    k.add_pdb("t", {"job": "t"}, min_available=1)
    r = await run(acts.drain, c.DrainRequest(node="n1", episode="e", checkpoint_grace_s=0, deadline_s=0.3,
                                             timeout_action="force", allow_force=False, pod_grace_seconds=0))
    assert r.remaining == ["default/w0"] and not r.forced
    r = await run(acts.drain, c.DrainRequest(node="n1", episode="e", checkpoint_grace_s=0, deadline_s=0.3,
                                             timeout_action="force", allow_force=True, pod_grace_seconds=0))
    assert r.forced == ["default/w0"]
