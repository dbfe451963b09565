"""The fake API server against a client nobody here wrote: kubectl. Each command's result is
checked against what the Kubernetes documentation says the command does (kubectl reference:
cordon, uncordon, taint, drain, describe; "Safely Drain a Node"), and gpuheal's own writes are
read back through kubectl. Runs when kubectl is on the PATH (`.ci/run` installs it); `make test`
says in one line when it is not."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
from kubernetes import client
from temporalio.testing import ActivityEnvironment

import api as c
from activities.kube import KubeActivities
from sim.fake_kube import FakeKubeServer

pytestmark = pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not on the PATH")


@pytest.fixture
def cluster(tmp_path):
    server = FakeKubeServer().start()
    cfg = server.write_kubeconfig(tmp_path / "kubeconfig")

    def kubectl(*argv: str, ok: bool = True) -> subprocess.CompletedProcess:
        run = subprocess.run(["kubectl", "--kubeconfig", str(cfg), *argv], capture_output=True, text=True, timeout=60)
        if ok:
            assert run.returncode == 0, (argv, run.stderr)
        return run

    yield server, kubectl
    server.stop()


def node(server, name: str) -> dict:
    return server.kube.get("Node", "", name)


def test_get_nodes_json(cluster):
    server, kubectl = cluster
    server.kube.add_node("g1", labels={"nvidia.com/gpu.present": "true"})
    server.kube.add_node("g2")
    doc = json.loads(kubectl("get", "nodes", "-o", "json").stdout)
    assert doc["kind"] == "List" and sorted(i["metadata"]["name"] for i in doc["items"]) == ["g1", "g2"]
    labelled = json.loads(kubectl("get", "nodes", "-l", "nvidia.com/gpu.present=true", "-o", "json").stdout)
    assert [i["metadata"]["name"] for i in labelled["items"]] == ["g1"], "label selectors filter on the server"


def test_cordon_and_uncordon(cluster):
    """`kubectl cordon`: mark node as unschedulable; `kubectl uncordon`: mark node as schedulable."""
    server, kubectl = cluster
    server.kube.add_node("n1")
    assert "cordoned" in kubectl("cordon", "n1").stdout
    assert node(server, "n1")["spec"]["unschedulable"] is True
    kubectl("uncordon", "n1")
    assert not node(server, "n1")["spec"].get("unschedulable")


def test_taint_add_and_remove_beside_another_taint(cluster):
    """`kubectl taint nodes NODE key=value:Effect` adds; `key:Effect-` removes that taint only."""
    server, kubectl = cluster
    server.kube.add_node("n1")
    kubectl("taint", "nodes", "n1", "dedicated=infer:NoSchedule")
    kubectl("taint", "nodes", "n1", "gpu=broken:NoExecute")
    assert sorted((t["key"], t.get("value"), t["effect"]) for t in node(server, "n1")["spec"]["taints"]) == [
        ("dedicated", "infer", "NoSchedule"), ("gpu", "broken", "NoExecute")]
    kubectl("taint", "nodes", "n1", "gpu:NoExecute-")
    assert [(t["key"], t["effect"]) for t in node(server, "n1")["spec"]["taints"]] == [("dedicated", "NoSchedule")]


def test_drain_honours_a_refusing_budget_then_evicts(cluster):
    """`kubectl drain --ignore-daemonsets`: cordons, leaves DaemonSet pods, evicts the rest through
    the Eviction API, and retries while a PodDisruptionBudget refuses (429) until its timeout."""
    server, kubectl = cluster
    k = server.kube
    k.add_node("n1")
    k.add_pod("train-0", "n1", labels={"job": "train"}, owner_kind="ReplicaSet", grace_seconds=1)
    k.add_pod("train-1", "n2", labels={"job": "train"}, owner_kind="ReplicaSet", grace_seconds=1)
    k.add_pod("agent", "n1", owner_kind="DaemonSet")
    k.add_pdb("train", {"job": "train"}, min_available=2)
    refused = kubectl("drain", "n1", "--ignore-daemonsets", "--timeout=4s", ok=False)
    assert refused.returncode != 0 and "disruption budget" in refused.stderr, refused.stderr
    assert node(server, "n1")["spec"]["unschedulable"] is True, "drain cordons first"
    assert {p["metadata"]["name"] for p in k.list("Pod", "default")} == {"train-0", "train-1", "agent"}
    assert k.evictions and not any(e.allowed for e in k.evictions if e.pod == "train-0")
    k.add_pod("train-2", "n3", labels={"job": "train"}, owner_kind="ReplicaSet")  # a spare: the budget allows one
    done = kubectl("drain", "n1", "--ignore-daemonsets", "--timeout=30s")
    assert "evicting pod default/train-0" in done.stderr + done.stdout and "drained" in done.stdout
    names = {p["metadata"]["name"] for p in k.list("Pod", "default")}
    assert "train-0" not in names and "agent" in names, "evicted and gone; the DaemonSet pod stays"


def test_describe_shows_gpuheal_quarantine(cluster):
    """What gpuheal writes is what an operator reads with `kubectl describe node`."""
    server, kubectl = cluster
    server.kube.add_node("n1")
    api = server.api_client()
    try:
        ActivityEnvironment().run  # noqa: B018 - the activity environment below runs the real activity
        acts = KubeActivities(client.CoreV1Api(api))
        import asyncio

        asyncio.run(ActivityEnvironment().run(acts.quarantine, c.QuarantineRequest(
            node="n1", fault_class="gpu_lost", reason="Xid 79 on GPU 2")))
    finally:
        api.close()
    out = kubectl("describe", "node", "n1").stdout
    assert "Unschedulable:      true" in out
    assert "gpuheal.io/quarantine=gpu_lost:NoSchedule" in out
    assert "GpuHealthy" in out and "GpuQuarantined" in out, out


def test_get_nodes_prints_the_servers_columns(cluster):
    """`kubectl get nodes` prints the API server's Table: a cordoned node reads Ready,SchedulingDisabled,
    as against a real server; `-o wide` adds the priority-1 columns."""
    server, kubectl = cluster
    server.kube.add_node("g1", boot_id="b1", labels={"node-role.kubernetes.io/gpu": ""})
    server.kube.add_node("g2", boot_id="b2")
    kubectl("cordon", "g2")
    lines = kubectl("get", "nodes").stdout.splitlines()
    assert lines[0].split() == ["NAME", "STATUS", "ROLES", "AGE", "VERSION"], lines
    rows = {line.split()[0]: line.split() for line in lines[1:]}
    assert rows["g1"][1:3] == ["Ready", "gpu"] and rows["g1"][4] == "v1.31.0"
    assert rows["g2"][1:3] == ["Ready,SchedulingDisabled", "<none>"]
    wide = kubectl("get", "node", "g2", "-o", "wide").stdout.splitlines()
    assert "KERNEL-VERSION" in wide[0] and "6.8.0-gpuheal" in wide[1], wide
    assert json.loads(kubectl("get", "node", "g2", "-o", "json").stdout)["kind"] == "Node", "-o json is the object"


def test_get_nodes_watch_shows_a_cordon(cluster, tmp_path):
    """`kubectl get nodes -w` prints each change as a row of the server's Table."""
    import threading
    import time

    server, kubectl = cluster
    server.kube.add_node("g1", boot_id="b1")
    threading.Timer(1.5, lambda: server.kube.patch("Node", "", "g1", {"spec": {"unschedulable": True}}, "application/merge-patch+json")).start()
    cfg = server.write_kubeconfig(tmp_path / "watch-kubeconfig")
    run = subprocess.Popen(["kubectl", "--kubeconfig", cfg, "get", "nodes", "-w"],
                           stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 20
    seen: list[str] = []
    try:
        while time.monotonic() < deadline and not any("SchedulingDisabled" in line for line in seen):
            seen.append(run.stdout.readline())
    finally:
        run.kill()
    assert seen[0].split()[:2] == ["NAME", "STATUS"] and any("Ready,SchedulingDisabled" in s for s in seen), seen


def test_cluster_api_machines(cluster):
    """kubectl finds Machines through discovery (cluster.x-k8s.io/v1beta1), and `kubectl delete`
    of a Machine holding its finalizer leaves it terminating, as the API server does, until the
    finalizer goes: what the Cluster API provider's replace relies on."""
    from tests.activities.test_clusterapi import MERGE, NS, add_machine

    server, kubectl = cluster
    name = add_machine(server.kube, "n1")
    doc = json.loads(kubectl("get", "machines", "-n", NS, "-o", "json").stdout)
    assert [i["metadata"]["name"] for i in doc["items"]] == [name]
    assert name in kubectl("get", "machine.cluster.x-k8s.io", name, "-n", NS).stdout
    kubectl("delete", "machine", name, "-n", NS, "--wait=false")
    left = server.kube.get("Machine", NS, name)
    assert "deletionTimestamp" in left["metadata"], "a finalizer holds it: terminating, not gone"
    server.kube.patch("Machine", NS, name, {"metadata": {"finalizers": None}}, MERGE)
    assert "NotFound" in kubectl("get", "machine", name, "-n", NS, ok=False).stderr
