"""The Cluster API provider against the fake API server serving Machines (cluster.x-k8s.io/v1beta1)
over HTTP, through the real kubernetes client: replace deletes the node's Machine (its finalizer
keeps it while Cluster API drains), only a Machine of this cluster that a MachineSet owns and whose
nodeRef names the node, idempotent under retry; no reboot."""

from __future__ import annotations

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

import api as c
from activities.cloud import CloudActivities
from activities.errors import INVALID_REQUEST, NOT_OWNED
from activities.providers import PROVIDERS, make_provider
from activities.providers.base import ProviderSettings
from activities.providers.clusterapi import (
    CLUSTER_LABEL,
    CONTROL_PLANE_LABEL,
    MACHINE_ANNOTATION,
    NAMESPACE_ANNOTATION,
    ClusterApiProvider,
)
from sim.fake_kube import FakeKubeServer

NS = "capi-system"
FINALIZER = "machine.cluster.x-k8s.io"
MERGE = "application/merge-patch+json"


def add_machine(kube, node: str, cluster: str = "gpu-a", owner: str | None = "MachineSet", labels: dict | None = None,
                node_ref: str | None = None, boot_id: str | None = None) -> str:
    """A Node and its Machine as Cluster API leaves them: the Node annotated with its Machine, the
    Machine labelled with its cluster, owned by a MachineSet, holding its finalizer."""
    name = f"{cluster}-md-0-{node}"
    if ("Namespace", "", NS) not in kube.objects:
        kube.put("Namespace", {"metadata": {"name": NS}})
    if not any(k == ("MachineSet", NS, f"{cluster}-md-0") for k in kube.objects):
        kube.put("MachineSet", {"metadata": {"name": f"{cluster}-md-0", "namespace": NS, "labels": {CLUSTER_LABEL: cluster}},
                                "spec": {"clusterName": cluster, "replicas": 2}})
    owners = [{"apiVersion": "cluster.x-k8s.io/v1beta1", "kind": owner, "name": f"{cluster}-md-0", "uid": "u-1",
               "controller": True}] if owner else []
    kube.put("Machine", {
        "metadata": {"name": name, "namespace": NS, "labels": {CLUSTER_LABEL: cluster, **(labels or {})},
                     "finalizers": [FINALIZER], "ownerReferences": owners},
        "spec": {"clusterName": cluster, "providerID": f"aws:///us-east-1a/i-{node}"},
        "status": {"nodeRef": {"kind": "Node", "name": node_ref or node}, "phase": "Running"}})
    if ("Node", "", node) not in kube.objects:
        kube.add_node(node)
    kube.patch("Node", "", node, {"metadata": {"annotations": {MACHINE_ANNOTATION: name, NAMESPACE_ANNOTATION: NS,
                                                               CLUSTER_LABEL: cluster}}}, MERGE)
    if boot_id:
        kube.set_boot_id(node, boot_id)
    return name


@pytest.fixture
def capi():
    server = FakeKubeServer().start()
    api = server.api_client()
    core = client.CoreV1Api(api)
    yield CloudActivities(ClusterApiProvider(core, "gpu-a"), core), server.kube
    api.close()
    server.stop()


def run(fn, *args):
    return ActivityEnvironment().run(fn, *args)


def machine(kube, name: str) -> dict | None:
    return kube.objects.get(("Machine", NS, name))


async def test_replace_deletes_the_machine_and_marks_the_node(capi):
    acts, kube = capi
    name = add_machine(kube, "n1", boot_id="boot-1")
    out = await run(acts.replace, c.ReplaceRequest(node="n1", idempotency_key="ep/replace"))
    assert out.action == "machine_deleted" and out.instance_id == f"{NS}/{name}" and out.marked
    m = machine(kube, name)
    assert m is not None and "deletionTimestamp" in m["metadata"], "its finalizer holds it while Cluster API drains"
    ann = kube.get("Node", "", "n1")["metadata"]["annotations"]
    assert ann[c.REPLACED_ANNOTATION] == "ep/replace" and ann[c.REPLACED_BOOT_ANNOTATION] == "boot-1"


async def test_replace_is_idempotent_and_ends_already_terminated_once_the_machine_is_gone(capi):
    acts, kube = capi
    name = add_machine(kube, "n1")
    req = c.ReplaceRequest(node="n1", idempotency_key="ep/replace")
    await run(acts.replace, req)
    stamp = machine(kube, name)["metadata"]["deletionTimestamp"]
    again = await run(acts.replace, req)  # a retry while Cluster API drains
    assert again.action == "machine_deleted" and machine(kube, name)["metadata"]["deletionTimestamp"] == stamp
    deletes = [r for r in kube.requests if r[0] == "DELETE" and "/machines/" in r[1]]
    assert len(deletes) == 1, "a Machine already being deleted is not deleted again"
    # Cluster API finishes: it removes its finalizer, and the Machine is gone.
    kube.patch("Machine", NS, name, {"metadata": {"finalizers": []}}, MERGE)
    assert machine(kube, name) is None
    done = await run(acts.replace, req)
    assert done.action == "already_terminated"
    kube.delete("Node", "", "n1")  # Cluster API deletes the Node too: a retry then is still done
    assert (await run(acts.replace, req)).action == "already_terminated"


@pytest.mark.parametrize("case", ["other cluster", "control plane", "no MachineSet", "nodeRef elsewhere", "no annotation",
                                  "nodeRef uid elsewhere"])
async def test_a_machine_not_ours_is_never_deleted(capi, case):
    acts, kube = capi
    if case == "no annotation":
        kube.add_node("n1")
        name = None
    else:
        name = add_machine(kube, "n1", cluster="gpu-b" if case == "other cluster" else "gpu-a",
                           labels={CONTROL_PLANE_LABEL: ""} if case == "control plane" else None,
                           owner=None if case == "no MachineSet" else "MachineSet",
                           node_ref="n9" if case == "nodeRef elsewhere" else None)
        if case == "nodeRef uid elsewhere":  # a Node re-registered under the name: not the Machine's
            kube.objects[("Machine", NS, name)]["status"]["nodeRef"]["uid"] = "uid-of-the-node-it-made"
    with pytest.raises(ApplicationError) as err:
        await run(acts.replace, c.ReplaceRequest(node="n1", idempotency_key="ep/replace"))
    assert err.value.type == NOT_OWNED and err.value.non_retryable
    if name:
        assert "deletionTimestamp" not in machine(kube, name)["metadata"]
    assert c.REPLACED_ANNOTATION not in (kube.get("Node", "", "n1")["metadata"].get("annotations") or {})
    assert not [r for r in kube.requests if r[0] == "DELETE"]


async def test_the_nodes_own_uid_in_the_noderef_is_accepted(capi):
    acts, kube = capi
    name = add_machine(kube, "n1")
    kube.objects[("Machine", NS, name)]["status"]["nodeRef"]["uid"] = kube.get("Node", "", "n1")["metadata"]["uid"]
    out = await run(acts.replace, c.ReplaceRequest(node="n1", idempotency_key="ep/replace"))
    assert out.action == "machine_deleted"


async def test_a_refused_delete_leaves_no_replaced_mark_and_a_retry_does_both(capi):
    acts, kube = capi
    name = add_machine(kube, "n1")
    kube.inject("DELETE", "/machines/", status=403, count=1)
    with pytest.raises(ApiException):
        await run(acts.replace, c.ReplaceRequest(node="n1", idempotency_key="ep/replace"))
    assert c.REPLACED_ANNOTATION not in (kube.get("Node", "", "n1")["metadata"].get("annotations") or {}), \
        "a node not being replaced must not be marked: its reports would start nothing"
    out = await run(acts.replace, c.ReplaceRequest(node="n1", idempotency_key="ep/replace"))
    assert out.action == "machine_deleted" and out.marked and "deletionTimestamp" in machine(kube, name)["metadata"]


async def test_dry_run_deletes_nothing(capi):
    acts, kube = capi
    name = add_machine(kube, "n1")
    out = await run(acts.replace, c.ReplaceRequest(node="n1", idempotency_key="ep/replace", dry_run=True))
    assert out.action == "dry_run" and "deletionTimestamp" not in machine(kube, name)["metadata"]


async def test_no_reboot_and_the_kubelets_boot_id_only(capi):
    acts, kube = capi
    add_machine(kube, "n1", boot_id="boot-7")
    with pytest.raises(ApplicationError) as err:
        await run(acts.reboot, c.RebootRequest(node="n1", idempotency_key="ep/reboot"))
    assert err.value.type == INVALID_REQUEST and "has no reboot" in str(err.value)
    assert await run(acts.boot_id, c.BootIdRequest(node="n1")) == "boot-7"
    kube.patch("Node", "", "n1", {"status": {"nodeInfo": None}}, MERGE, "status")
    assert await run(acts.boot_id, c.BootIdRequest(node="n1")) is None


def test_providers_by_name():
    server = FakeKubeServer().start()
    api = server.api_client()
    try:
        p = make_provider("clusterapi", client.CoreV1Api(api), ProviderSettings(cluster="gpu-a"))
        assert isinstance(p, ClusterApiProvider) and p.cluster == "gpu-a" and not p.can_reboot
        assert set(PROVIDERS) == {"aws", "clusterapi"}
        with pytest.raises(ValueError, match="not one of aws, clusterapi"):
            make_provider("gcp", client.CoreV1Api(api))
    finally:
        api.close()
        server.stop()


def test_the_fake_refuses_a_strategic_merge_patch_on_a_custom_resource(capi):
    """As the API server does for resources served from a CustomResourceDefinition (415)."""
    _, kube = capi
    name = add_machine(kube, "n1")
    from sim.fake_kube.errors import ApiError

    with pytest.raises(ApiError) as err:
        kube.patch("Machine", NS, name, {"metadata": {"labels": {"x": "y"}}}, "application/strategic-merge-patch+json")
    assert err.value.code == 415


async def test_machines_in_a_management_cluster_nodes_in_the_workload_cluster():
    """The usual Cluster API layout: the Machines are served by the management cluster, the Nodes
    by the workload cluster; each read and write goes to its own API server."""
    workload, management = FakeKubeServer().start(), FakeKubeServer().start()
    w_api, m_api = workload.api_client(), management.api_client()
    try:
        name = add_machine(management.kube, "n1")
        workload.kube.add_node("n1")
        ann = management.kube.get("Node", "", "n1")["metadata"]["annotations"]
        workload.kube.patch("Node", "", "n1", {"metadata": {"annotations": ann}}, MERGE)
        core = client.CoreV1Api(w_api)
        acts = CloudActivities(ClusterApiProvider(core, "gpu-a", machines=m_api), core)
        out = await run(acts.replace, c.ReplaceRequest(node="n1", idempotency_key="ep/replace"))
        assert out.action == "machine_deleted" and out.marked
        assert "deletionTimestamp" in management.kube.get("Machine", NS, name)["metadata"]
        assert c.REPLACED_ANNOTATION in workload.kube.get("Node", "", "n1")["metadata"]["annotations"]
        assert not [r for r in workload.kube.requests if "machines" in r[1]], "no Machine asked of the workload API"
    finally:
        w_api.close()
        m_api.close()
        workload.stop()
        management.stop()
