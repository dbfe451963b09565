"""The fake API server's own semantics, through the unmodified kubernetes client over HTTP."""

import threading

import pytest
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from sim.fake_kube import FakeKubeServer


@pytest.fixture
def kube():
    server = FakeKubeServer().start()
    api = server.api_client()
    yield server.kube, client.CoreV1Api(api), client.PolicyV1Api(api)
    api.close()
    server.stop()


def test_node_metadata_and_resource_version(kube):
    k, core, _ = kube
    k.add_node("n1", labels={"gpu": "h100"})
    n = core.read_node("n1")
    assert n.metadata.uid and n.metadata.creation_timestamp and int(n.metadata.resource_version) > 0
    with pytest.raises(ApiException) as err:
        core.read_node("missing")
    assert err.value.status == 404


def test_strategic_merge_taints_and_conditions(kube):
    k, core, _ = kube
    k.add_node("n1")
    core.patch_node("n1", {"spec": {"unschedulable": True, "taints": [{"key": "a", "value": "1", "effect": "NoSchedule"}]}})
    core.patch_node("n1", {"spec": {"taints": [{"key": "b", "value": "2", "effect": "NoSchedule"}]}})
    n = core.read_node("n1")
    assert n.spec.unschedulable is True
    # NodeSpec.Taints has no patch strategy: a strategic-merge patch's list replaces the whole list.
    assert [(t.key, t.value) for t in n.spec.taints] == [("b", "2")]
    core.patch_node("n1", {"metadata": {"labels": {"x": "1"}, "annotations": {"y": "2"}, "finalizers": ["f1"]}})
    core.patch_node("n1", {"metadata": {"labels": {"z": "3"}, "finalizers": ["f2", "f1"]}})
    meta = core.read_node("n1").metadata
    assert meta.labels == {"x": "1", "z": "3"} and meta.annotations == {"y": "2"}, "maps merge key by key"
    assert meta.finalizers == ["f1", "f2"], "finalizers merge as a set of strings"
    core.patch_node_status("n1", {"status": {"conditions": [{"type": "GpuHealthy", "status": "False", "reason": "Xid79"}]}})
    conds = {c.type: c.status for c in core.read_node("n1").status.conditions}
    assert conds == {"Ready": "True", "GpuHealthy": "False"}, "conditions merge by type"
    core.patch_node("n1", {"spec": {"unschedulable": None}})
    assert core.read_node("n1").spec.unschedulable is None, "null deletes the key"


def test_main_resource_cannot_write_status(kube):
    k, core, _ = kube
    k.add_node("n1")
    core.patch_node("n1", {"status": {"conditions": [{"type": "Ready", "status": "False"}]}})
    assert core.read_node("n1").status.conditions[0].status == "True"


def test_an_update_carrying_a_deletion_timestamp_deletes_nothing(kube):
    """metadata.deletionTimestamp is the system's: set by a DELETE, ignored on update and patch."""
    k, core, _ = kube
    k.add_node("n1")
    n = core.read_node("n1")
    n.metadata.deletion_timestamp = "2026-01-01T00:00:00Z"
    core.replace_node("n1", n)
    core.patch_node("n1", {"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}})
    after = core.read_node("n1")
    assert after.metadata.deletion_timestamp is None


def test_json_patch_and_merge_patch(kube):
    k, core, _ = kube
    k.add_node("n1", labels={"x": "1"})
    core.patch_node("n1", [{"op": "add", "path": "/metadata/labels/y", "value": "2"},
                           {"op": "remove", "path": "/metadata/labels/x"}])
    assert core.read_node("n1").metadata.labels == {"y": "2"}
    k.patch("Node", "", "n1", {"metadata": {"labels": {"z": "3"}}}, "application/merge-patch+json")
    assert core.read_node("n1").metadata.labels == {"y": "2", "z": "3"}


def test_stale_resource_version_conflicts(kube):
    k, core, _ = kube
    k.add_node("n1")
    n = core.read_node("n1")
    core.patch_node("n1", {"metadata": {"labels": {"a": "b"}}})
    n.spec.unschedulable = True
    with pytest.raises(ApiException) as err:
        core.replace_node("n1", n)
    assert err.value.status == 409
    with pytest.raises(ApiException) as err:
        core.patch_node("n1", {"metadata": {"resourceVersion": n.metadata.resource_version, "labels": {"c": "d"}}})
    assert err.value.status == 409
    fresh = core.read_node("n1")
    fresh.spec.unschedulable = True
    assert core.replace_node("n1", fresh).spec.unschedulable is True


def test_label_and_field_selectors(kube):
    k, core, _ = kube
    for i, (node, app) in enumerate([("n1", "train"), ("n1", "infer"), ("n2", "train")]):
        k.add_pod(f"p{i}", node, labels={"app": app, "tier": "gpu"} if i else {"app": app})
    names = lambda pods: sorted(p.metadata.name for p in pods.items)  # noqa: E731
    assert names(core.list_pod_for_all_namespaces(field_selector="spec.nodeName=n1")) == ["p0", "p1"]
    assert names(core.list_namespaced_pod("default", label_selector="app=train")) == ["p0", "p2"]
    assert names(core.list_namespaced_pod("default", label_selector="app!=train")) == ["p1"]
    assert names(core.list_namespaced_pod("default", label_selector="app in (infer, other)")) == ["p1"]
    assert names(core.list_namespaced_pod("default", label_selector="tier")) == ["p1", "p2"]
    assert names(core.list_namespaced_pod("default", label_selector="!tier")) == ["p0"]
    assert names(core.list_namespaced_pod("default", field_selector="metadata.name=p2,spec.nodeName=n2")) == ["p2"]


@pytest.mark.parametrize("budget,allowed", [({"min_available": 2}, 1), ({"min_available": "50%"}, 1),
                                            ({"max_unavailable": 1}, 1), ({"max_unavailable": "33%"}, 1),
                                            ({"max_unavailable": "34%"}, 2),
                                            ({"min_available": 3}, 0)])
def test_eviction_honours_pdb(kube, budget, allowed):
    k, core, _ = kube
    for i in range(3):
        k.add_pod(f"w{i}", f"n{i}", labels={"job": "train"})
    k.add_pdb("train-pdb", {"job": "train"}, **budget)
    results = []
    for i in range(3):
        try:
            core.create_namespaced_pod_eviction(f"w{i}", "default", client.V1Eviction(
                metadata=client.V1ObjectMeta(name=f"w{i}", namespace="default"),
                delete_options=client.V1DeleteOptions(grace_period_seconds=0)))
            results.append(201)
        except ApiException as err:
            results.append(err.status)
            if err.status == 429:
                assert '"reason": "TooManyRequests"' in err.body.replace('":"', '": "') or "TooManyRequests" in err.body
                assert "DisruptionBudget" in err.body
    assert results.count(201) == allowed
    assert all(r.respected_budget for r in k.evictions)


def test_eviction_with_two_budgets_is_500(kube):
    k, core, _ = kube
    k.add_pod("p", "n1", labels={"a": "1"})
    k.add_pdb("b1", {"a": "1"}, min_available=0)
    k.add_pdb("b2", {"a": "1"}, min_available=0)
    with pytest.raises(ApiException) as err:
        core.create_namespaced_pod_eviction("p", "default", client.V1Eviction(metadata=client.V1ObjectMeta(name="p")))
    assert err.value.status == 500


def test_graceful_deletion(kube):
    k, core, _ = kube
    k.add_pod("p", "n1")
    core.delete_namespaced_pod("p", "default", grace_period_seconds=1)
    assert core.read_namespaced_pod("p", "default").metadata.deletion_timestamp is not None
    import time
    time.sleep(1.3)
    with pytest.raises(ApiException):
        core.read_namespaced_pod("p", "default")


def test_watch_from_resource_version(kube):
    k, core, _ = kube
    k.add_node("n1")
    rv = core.list_node().metadata.resource_version
    seen = []

    def consume():
        for ev in watch.Watch().stream(core.list_node, resource_version=rv, timeout_seconds=3):
            seen.append((ev["type"], ev["object"].metadata.name))
            if len(seen) == 2:
                break

    t = threading.Thread(target=consume)
    t.start()
    k.add_node("n2")
    core.patch_node("n1", {"spec": {"unschedulable": True}})
    t.join(timeout=5)
    assert seen == [("ADDED", "n2"), ("MODIFIED", "n1")]


def test_watch_closes_on_timeout(kube):
    _, core, _ = kube
    events = list(watch.Watch().stream(core.list_node, timeout_seconds=1))
    assert events == []


def test_injected_errors_and_keepalive_survive(kube):
    k, core, _ = kube
    k.add_node("n1")
    k.inject("PATCH", r"/nodes/n1$", status=429, count=1)
    with pytest.raises(ApiException) as err:
        core.patch_node("n1", {"metadata": {"labels": {"a": "1"}}})
    assert err.value.status == 429
    core.patch_node("n1", {"metadata": {"labels": {"a": "1"}}})  # same connection, next request clean
    assert core.read_node("n1").metadata.labels == {"a": "1"}


def test_node_ready_flip(kube):
    k, core, _ = kube
    k.add_node("n1")
    k.set_node_ready("n1", False)
    assert {c.type: c.status for c in core.read_node("n1").status.conditions}["Ready"] == "False"
    k.set_node_ready("n1", True)
    assert {c.type: c.status for c in core.read_node("n1").status.conditions}["Ready"] == "True"


def test_events_created(kube):
    _, core, _ = kube
    core.create_namespaced_event("default", client.CoreV1Event(
        metadata=client.V1ObjectMeta(generate_name="n1."), reason="GpuQuarantined", message="Xid 79", type="Warning",
        involved_object=client.V1ObjectReference(kind="Node", name="n1")))
    [ev] = core.list_namespaced_event("default").items
    assert ev.reason == "GpuQuarantined" and ev.metadata.name.startswith("n1.")
