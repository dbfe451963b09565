"""Kubernetes activities against the fake API server over HTTP, through the real client."""

import dataclasses

import pytest
from kubernetes import client
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

import api as c
from activities.kube import KubeActivities
from activities.kube_client import CALL_TRIES
from activities.kube_pods import ATTRIBUTION_ANNOTATION
from sim.fake_kube import FakeKubeServer


def run(fn, *args):
    return ActivityEnvironment().run(fn, *args)


def retry(fn, *args):
    """The same call as a retried attempt (attempt 2), as Temporal runs it after a failure."""
    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, attempt=2)
    return env.run(fn, *args)


def taints(core, node):
    return [(t.key, t.value, t.effect) for t in core.read_node(node).spec.taints or []]


async def test_quarantine_and_return_verified_and_idempotent(kube):
    k, core, acts = kube
    k.add_node("n1")
    core.patch_node("n1", {"spec": {"taints": [{"key": "other", "value": "x", "effect": "NoSchedule"}]}})
    r = await run(acts.quarantine, c.QuarantineRequest(node="n1", fault_class="gpu_lost", reason="Xid 79 on GPU 2"))
    assert r.changed
    n = core.read_node("n1")
    assert n.spec.unschedulable is True
    assert sorted(taints(core, "n1")) == [("gpuheal.io/quarantine", "gpu_lost", "NoSchedule"), ("other", "x", "NoSchedule")]
    assert {x.type: x.status for x in n.status.conditions}["GpuHealthy"] == "False"
    again = await retry(acts.quarantine, c.QuarantineRequest(node="n1", fault_class="gpu_lost", reason="retry"))
    assert not again.changed
    back = await run(acts.return_to_service, c.ReturnToServiceRequest(node="n1", reason="validated twice"))
    assert back.changed
    n = core.read_node("n1")
    assert not n.spec.unschedulable and taints(core, "n1") == [("other", "x", "NoSchedule")]
    assert {x.type: x.status for x in n.status.conditions} == {"Ready": "True", "GpuHealthy": "True"}
    assert not (await run(acts.return_to_service, c.ReturnToServiceRequest(node="n1", reason="again"))).changed
    reasons = [e.reason for e in core.list_namespaced_event("default").items]
    assert sorted(reasons) == ["GpuQuarantined", "GpuReturned"]  # the API lists by name, not by time


async def test_missing_node_is_node_gone(kube):
    _, _, acts = kube
    with pytest.raises(ApplicationError) as err:
        await run(acts.quarantine, c.QuarantineRequest(node="ghost", fault_class="x", reason="y"))
    assert err.value.type == "NodeGone" and err.value.non_retryable


async def test_forbidden_names_verb_and_resource(kube):
    k, _, acts = kube
    k.add_node("n1")
    k.inject("PATCH", r"/nodes/n1$", status=403)
    with pytest.raises(ApplicationError) as err:
        await run(acts.quarantine, c.QuarantineRequest(node="n1", fault_class="x", reason="y"))
    assert err.value.type == "PermissionDenied" and "patch nodes/n1" in str(err.value)


async def test_transient_errors_are_retryable(kube):
    k, _, acts = kube
    k.add_node("n1")
    k.inject("PATCH", r"/nodes/n1$", status=500, count=2)  # one flaky call: tried again within the attempt
    assert (await run(acts.quarantine, c.QuarantineRequest(node="n1", fault_class="x", reason="y"))).changed
    k.inject("GET", r"/nodes/n1$", status=503, count=CALL_TRIES)  # still failing: the attempt fails, retryably
    with pytest.raises(client.rest.ApiException):
        await retry(acts.quarantine, c.QuarantineRequest(node="n1", fault_class="x", reason="y"))
    assert not (await retry(acts.quarantine, c.QuarantineRequest(node="n1", fault_class="x", reason="y"))).changed


async def test_dry_run_changes_nothing(kube):
    k, core, acts = kube
    k.add_node("n1")
    k.add_pod("p", "n1")
    rv = core.read_node("n1").metadata.resource_version
    await run(acts.quarantine, c.QuarantineRequest(node="n1", fault_class="x", reason="y", dry_run=True))
    d = await run(acts.drain, c.DrainRequest(node="n1", episode="e", checkpoint_grace_s=0, deadline_s=1, dry_run=True))
    assert d.remaining == ["default/p"] and d.dry_run
    assert core.read_node("n1").metadata.resource_version == rv
    assert core.read_namespaced_pod("p", "default").metadata.deletion_timestamp is None


async def test_attribution_annotates_pods_on_the_node(kube):
    k, core, acts = kube
    k.add_node("n1")
    k.add_pod("train-0", "n1")
    k.add_pod("elsewhere", "n2")
    k.add_pod("ds", "n1", owner_kind="DaemonSet")
    r = await run(acts.attribute_pods, c.AttributePodsRequest(node="n1", attribution="platform", fault="Xid 79 on GPU 2",
                                                             episode="e1"))
    assert r.pods == ["default/train-0"]
    ann = core.read_namespaced_pod("train-0", "default").metadata.annotations
    assert ann[ATTRIBUTION_ANNOTATION] == "platform" and ann["gpuheal.io/fault"] == "Xid 79 on GPU 2"
    assert ATTRIBUTION_ANNOTATION not in (core.read_namespaced_pod("elsewhere", "default").metadata.annotations or {})


async def test_attribution_marks_pods_on_healthy_gpus_unaffected(kube):
    """Only the pods whose GPUs failed carry the fault; a pod seen on other GPUs only is unaffected,
    and one with no GPU process seen keeps the fault (its process may have died of it)."""
    k, core, acts = kube
    k.add_node("n1")
    uid = {name: k.add_pod(name, "n1")["metadata"]["uid"] for name in ("on-gpu2", "on-gpu5", "no-process")}
    pod_gpus = {f"uid:{uid['on-gpu2']}": [2, 3], f"uid:{uid['on-gpu5']}": [5]}
    r = await run(acts.attribute_pods, c.AttributePodsRequest(node="n1", attribution="platform", fault="Xid 79 on GPU 2",
                                                             gpus=[2], pod_gpus=pod_gpus, episode="e1"))
    assert sorted(r.pods) == ["default/no-process", "default/on-gpu2"] and r.unaffected == ["default/on-gpu5"]
    marks = {n: core.read_namespaced_pod(n, "default").metadata.annotations[ATTRIBUTION_ANNOTATION] for n in uid}
    assert marks == {"on-gpu2": "platform", "on-gpu5": "unaffected", "no-process": "platform"}
    reasons = {e["involvedObject"]["name"] for e in k.list("Event", "default")}
    assert "on-gpu5" not in reasons, "no failure event for a pod the fault did not touch"


async def test_check_node_exists_and_is_ours(kube):
    k, core, _ = kube
    k.add_node("g1", labels={"nvidia.com/gpu.present": "true"})
    k.add_node("cpu1")
    acts = KubeActivities(core, gpu_node_selector="nvidia.com/gpu.present=true")
    assert (await run(acts.check_node, c.NodeCheckRequest(node="g1"))).ours
    ghost = await run(acts.check_node, c.NodeCheckRequest(node="ghost"))
    assert not ghost.exists and "does not exist" in ghost.reason
    cpu = await run(acts.check_node, c.NodeCheckRequest(node="cpu1"))
    assert cpu.exists and not cpu.ours and "GPU node selector" in cpu.reason


async def test_policy_answers_the_node_check_from_its_own_read(kube):
    """`policy.current` with `check` answers what `kube.check_node` would, node by node: a GPU node of
    ours, one left quarantined, a CPU node, a node that is not there, and a late report from a host
    gpuheal replaced. Without `check` it says nothing of the node."""
    from activities.node_profile import NodeProfileActivities
    from policies.loader import default_policy

    k, core, _ = kube
    k.add_node("g1", labels={"nvidia.com/gpu.present": "true"})
    k.add_node("cpu1")
    k.add_node("held", labels={"nvidia.com/gpu.present": "true"})
    k.add_node("swapped", labels={"nvidia.com/gpu.present": "true"})
    acts = KubeActivities(core, gpu_node_selector="nvidia.com/gpu.present=true")
    await run(acts.quarantine, c.QuarantineRequest(node="held", fault_class="hardware", reason="Xid 79"))
    k.patch("Node", "", "swapped", {"metadata": {"annotations": {c.REPLACED_ANNOTATION: "i-old",
                                                                  c.REPLACED_BOOT_ANNOTATION: "boot-old"}}},
            "application/merge-patch+json")
    seen = {}
    for policy in (default_policy(), default_policy().model_copy(update={"profiles": {}})):
        profiles = NodeProfileActivities(core, policy, kube=acts)
        for node, boot in (("g1", "b1"), ("cpu1", None), ("held", None), ("ghost", None), ("swapped", "boot-old")):
            snap = await run(profiles.current, c.PolicyRequest(node=node, check=True, boot_id=boot))
            assert snap.node_check == await run(acts.check_node, c.NodeCheckRequest(node=node, boot_id=boot)), node
            seen[node] = snap.node_check
        assert (await run(profiles.current, c.PolicyRequest(node="g1"))).node_check is None
    assert seen["g1"].ours and seen["held"].quarantined == "hardware" and not seen["ghost"].exists
    assert not seen["cpu1"].ours and not seen["swapped"].ours and "replaced" in seen["swapped"].reason


async def test_a_node_check_the_api_cannot_finish_leaves_the_policy_answered(kube):
    """A check that fails (the selector listing refused, say) is not the policy's failure: the
    snapshot comes without it, and the episode asks `kube.check_node`, whose failure holds the node."""
    from activities.node_profile import NodeProfileActivities
    from policies.loader import default_policy

    class Refused(KubeActivities):
        async def node_check(self, req, n):
            raise client.exceptions.ApiException(status=403, reason="Forbidden")

    k, core, _ = kube
    k.add_node("g1", labels={"nvidia.com/gpu.present": "true"})
    for policy in (default_policy(), default_policy().model_copy(update={"profiles": {}})):
        profiles = NodeProfileActivities(core, policy, kube=Refused(core, gpu_node_selector="nvidia.com/gpu.present=true"))
        snap = await run(profiles.current, c.PolicyRequest(node="g1", check=True))
        assert snap.node_check is None and snap.policy.name == policy.name


async def test_fleet_size_counts_gpu_nodes(kube):
    k, core, _ = kube
    for i in range(3):
        k.add_node(f"g{i}", labels={"nvidia.com/gpu.present": "true"})
    k.add_node("cpu")
    acts = KubeActivities(core, gpu_node_selector="nvidia.com/gpu.present=true")
    assert await run(acts.fleet_size) == 3


def test_load_core_api_from_kubeconfig(tmp_path):
    from activities.kube_client import load_core_api

    server = FakeKubeServer().start()
    try:
        server.kube.add_node("from-kubeconfig")
        cfg = server.write_kubeconfig(tmp_path / "kubeconfig")
        core = load_core_api(cfg)
        assert [n.metadata.name for n in core.list_node().items] == ["from-kubeconfig"]
    finally:
        server.stop()


async def test_someone_elses_cordon_and_taints_survive_the_episode(kube):
    """A node cordoned by hand and carrying a dedicated-pool taint before its fault ends the episode
    still cordoned, with the foreign taint in place: return to service undoes only what the
    quarantine did (recorded in the gpuheal.io/quarantine annotation)."""
    k, core, acts = kube
    k.add_node("n1")
    core.patch_node("n1", {"spec": {"unschedulable": True, "taints": [
        {"key": "dedicated", "value": "infer", "effect": "NoSchedule"}]}})
    await run(acts.quarantine, c.QuarantineRequest(node="n1", fault_class="gpu_lost", reason="Xid 79"))
    assert ("dedicated", "infer", "NoSchedule") in taints(core, "n1")
    assert "gpuheal.io/quarantine" in core.read_node("n1").metadata.annotations
    back = await run(acts.return_to_service, c.ReturnToServiceRequest(node="n1", reason="validated twice"))
    n = core.read_node("n1")
    assert back.left_cordoned and n.spec.unschedulable is True
    assert taints(core, "n1") == [("dedicated", "infer", "NoSchedule")]
    assert "gpuheal.io/quarantine" not in (n.metadata.annotations or {})


async def test_schedulable_node_ends_schedulable_with_exactly_its_taints(kube):
    k, core, acts = kube
    k.add_node("n1")
    mine = [{"key": "karpenter.sh/disrupted", "effect": "NoSchedule"}, {"key": "pool", "value": "a", "effect": "NoExecute"}]
    core.patch_node("n1", {"spec": {"taints": mine}})
    before = taints(core, "n1")
    await run(acts.quarantine, c.QuarantineRequest(node="n1", fault_class="memory", reason="DBE"))
    assert len(taints(core, "n1")) == 3
    back = await run(acts.return_to_service, c.ReturnToServiceRequest(node="n1", reason="validated twice"))
    n = core.read_node("n1")
    assert not back.left_cordoned and not n.spec.unschedulable and taints(core, "n1") == before


async def test_taint_write_conflict_is_read_again(kube):
    """Someone else writes the node between our read and our patch: the API server answers 409 for
    the stale resourceVersion and the change is computed again from a fresh read."""
    k, core, acts = kube
    k.add_node("n1")
    k.inject("GET", r"/nodes/n1$", status=None, count=1, after=lambda: k.patch(
        "Node", "", "n1", {"spec": {"taints": [{"key": "late", "effect": "NoSchedule"}]}},
        "application/strategic-merge-patch+json"))
    await run(acts.quarantine, c.QuarantineRequest(node="n1", fault_class="memory", reason="DBE"))
    assert [v for v, p, _ in k.requests if p == "/api/v1/nodes/n1"].count("GET") == 2, "read again after the 409"
    assert sorted(t[0] for t in taints(core, "n1")) == ["gpuheal.io/quarantine", "late"], "the racing taint kept"


async def test_check_node_says_when_gpuheal_left_it_quarantined(kube):
    """The quarantine hold reads it: a node an earlier episode cordoned and tainted, for a person."""
    k, core, acts = kube
    k.add_node("held")
    assert (await run(acts.check_node, c.NodeCheckRequest(node="held"))).quarantined is None
    await run(acts.quarantine, c.QuarantineRequest(node="held", fault_class="hardware", reason="Xid 79"))
    assert (await run(acts.check_node, c.NodeCheckRequest(node="held"))).quarantined == "hardware"
    await run(acts.return_to_service, c.ReturnToServiceRequest(node="held", reason="fixed"))
    assert (await run(acts.check_node, c.NodeCheckRequest(node="held"))).quarantined is None
