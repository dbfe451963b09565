"""The controller's RBAC grants exactly the API calls the code makes: read from the code, and seen on
the wire when the activities run against the fake API server."""

import ast
import asyncio
import re

from kubernetes import client
from temporalio.testing import ActivityEnvironment

import api as c
from activities.cloud import CloudActivities
from activities.kube import KubeActivities
from activities.providers.clusterapi import ClusterApiProvider
from sim.fake_kube import FakeKubeServer
from tests.deploy.test_manifests import ROOT, manifests
from workers.condition_watcher import ConditionRule, ConditionWatcher, WatcherConfig

METHOD = re.compile(r"^(list|read|create|patch|delete|replace)_(namespaced_)?([a-z_]+?)(_for_all_namespaces)?$")
PLURAL = {"node": "nodes", "pod": "pods", "event": "events"}


def _rule_for(method: str) -> tuple[str, str]:
    """kubernetes client method -> (resource[/subresource], RBAC verb), by the client's naming."""
    verb, _, kind, _ = METHOD.match(method).groups()
    sub = None
    for suffix in ("_status", "_eviction"):
        if kind.endswith(suffix):
            kind, sub = kind.removesuffix(suffix), suffix[1:]
    resource = PLURAL[kind] + (f"/{sub}" if sub else "")
    return resource, {"read": "get", "replace": "update"}.get(verb, verb)


CUSTOM = re.compile(r"^(get|list|delete|patch)_namespaced_custom_object$")


def calls_in_code() -> set[tuple[str, str]]:
    """Every `core.<method>` (or `self.core.<method>`) the controller's code touches, every custom
    object call (the Cluster API provider's Machines); a watch stream adds `watch`."""
    from activities.providers import clusterapi

    out = set()
    files = [*(ROOT / "activities").rglob("*.py"), *(ROOT / "workers").glob("*.py")]
    for f in files:
        tree = ast.parse(f.read_text())
        for node in ast.walk(tree):
            on = node.value if isinstance(node, ast.Attribute) else None
            if (isinstance(on, ast.Attribute) and on.attr == "core") or (isinstance(on, ast.Name) and on.id == "core"):
                if METHOD.match(node.attr):
                    out.add(_rule_for(node.attr))
            if isinstance(on, ast.Attribute) and on.attr == "custom" and CUSTOM.match(node.attr):
                out.add((f"{clusterapi.GROUP}/{clusterapi.PLURAL}", CUSTOM.match(node.attr)[1]))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "stream":
                for arg in node.args[:1]:
                    if isinstance(arg, ast.Attribute):
                        out.add((_rule_for(arg.attr)[0], "watch"))
    return out


def granted() -> set[tuple[str, str]]:
    role = next(d for d in manifests() if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "gpuheal-controller")
    out = set()
    for rule in role["rules"]:
        assert len(rule["apiGroups"]) == 1, "one API group per rule"
        group = rule["apiGroups"][0]
        out |= {(f"{group}/{r}" if group else r, v) for r in rule["resources"] for v in rule["verbs"]}
    return out


def test_rbac_is_exactly_what_the_code_calls():
    code = calls_in_code()
    assert ("pods/eviction", "create") in code and ("nodes", "watch") in code  # the scan sees what it must
    assert granted() == code, f"missing: {sorted(code - granted())}, unused: {sorted(granted() - code)}"


def _wire_rule(verb: str, path: str, query: str) -> tuple[str, str]:
    group = ""
    if path.startswith("/apis/"):  # /apis/<group>/<version>/...
        group, _, rest = path.removeprefix("/apis/").partition("/")
        path = "/api/v1/" + rest.partition("/")[2]
    parts = path.removeprefix("/api/v1/").split("/")
    if parts[0] == "namespaces" and len(parts) > 2:
        parts = parts[2:]
    resource = parts[0] + (f"/{parts[2]}" if len(parts) > 2 else "")
    named = len(parts) > 1
    k8s = {"POST": "create", "PATCH": "patch", "DELETE": "delete", "PUT": "update"}.get(verb)
    if verb == "GET":
        k8s = "get" if named else ("watch" if "watch=" in query.lower() else "list")
    return (f"{group}/{resource}" if group else resource), k8s


async def test_rbac_covers_every_request_the_activities_send():
    server = FakeKubeServer().start()
    api = server.api_client()
    core = client.CoreV1Api(api)
    k = server.kube
    try:
        k.add_node("n1", labels={"nvidia.com/gpu.present": "true"})
        k.add_node("n2", labels={"nvidia.com/gpu.present": "true"})
        k.add_pod("w0", "n1", labels={"job": "train"})
        k.add_pod("w1", "n2", labels={"job": "train"})
        k.add_pod("solo", "n1")
        k.add_pdb("train", {"job": "train"}, min_available=2)
        acts, env = KubeActivities(core), ActivityEnvironment()
        await env.run(acts.quarantine, c.QuarantineRequest(node="n1", fault_class="memory", reason="Xid 48"))
        await env.run(acts.attribute_pods, c.AttributePodsRequest(node="n1", attribution="platform", fault="Xid 48",
                                                                  episode="e"))
        await env.run(acts.drain, c.DrainRequest(node="n1", episode="e", checkpoint_grace_s=0, deadline_s=0.5,
                                                 timeout_action="force", allow_force=True, pod_grace_seconds=0))
        await env.run(acts.event, c.EventRequest(node="n1", reason="GpuRemediation", message="reset"))
        await env.run(acts.return_to_service, c.ReturnToServiceRequest(node="n1", reason="validated twice"))
        await env.run(acts.fleet_size)
        watcher = ConditionWatcher(None, core, WatcherConfig(rules=[ConditionRule(type="XidCriticalError")]))
        stop = asyncio.Event()
        task = asyncio.create_task(watcher.run(stop, timeout_s=1))
        await asyncio.sleep(0.5)
        stop.set()
        await asyncio.wait_for(task, 10)
        from tests.activities.test_clusterapi import add_machine

        add_machine(k, "n2", cluster="rbac")
        await env.run(CloudActivities(ClusterApiProvider(core, "rbac"), core).replace,
                      c.ReplaceRequest(node="n2", idempotency_key="e/replace"))
    finally:
        api.close()
        server.stop()
    wire = {_wire_rule(verb, path, query) for verb, path, query in k.requests}
    assert ("pods/eviction", "create") in wire and ("pods", "delete") in wire and ("nodes", "watch") in wire, wire
    assert ("cluster.x-k8s.io/machines", "delete") in wire, wire
    assert wire <= granted(), f"sent but not granted: {sorted(wire - granted())}"
