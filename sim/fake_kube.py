"""A fake Kubernetes API server over HTTP: the real `kubernetes` client talks to it unmodified.

Implements what gpuheal uses, with real semantics: nodes, pods, events, namespaces and
PodDisruptionBudgets; uid, creationTimestamp and a global resourceVersion with 409 on stale
writes; strategic-merge, JSON merge and JSON patches; the status subresources; label and field
selectors; the Eviction subresource (201, or 429 when a budget would be broken); watch from a
resourceVersion. Hooks inject errors and latency, flip nodes NotReady, and record every eviction.
"""

from __future__ import annotations

import copy
import json
import random
import re
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

# kind -> (api prefix, plural, namespaced)
RESOURCES = {
    "Node": ("/api/v1", "nodes", False),
    "Namespace": ("/api/v1", "namespaces", False),
    "Pod": ("/api/v1", "pods", True),
    "Event": ("/api/v1", "events", True),
    "PodDisruptionBudget": ("/apis/policy/v1", "poddisruptionbudgets", True),
    "DaemonSet": ("/apis/apps/v1", "daemonsets", True),
}
API_VERSION = {"Node": "v1", "Namespace": "v1", "Pod": "v1", "Event": "v1", "PodDisruptionBudget": "policy/v1",
               "DaemonSet": "apps/v1"}
_BY_PLURAL = {plural: kind for kind, (_, plural, _) in RESOURCES.items()}
# Strategic merge strategies of the fields served, from the `patchStrategy`/`patchMergeKey` struct
# tags in k8s.io/api/core/v1/types.go and k8s.io/apimachinery/pkg/apis/meta/v1/types.go:
#   NodeStatus.Conditions   patchStrategy:"merge" patchMergeKey:"type"
#   NodeStatus.Addresses    patchStrategy:"merge" patchMergeKey:"type"
#   PodSpec.Containers, .Volumes, Container.Env   patchStrategy:"merge" patchMergeKey:"name"
#   ObjectMeta.OwnerReferences   patchStrategy:"merge" patchMergeKey:"uid"
#   ObjectMeta.Finalizers   patchStrategy:"merge" (a list of strings: union)
#   NodeSpec.Taints         no patch strategy: atomic, a patch's list replaces the node's whole list
#   ObjectMeta.Labels/Annotations: maps, merged key by key; NodeSpec.Unschedulable: a scalar
MERGE_KEYS = {"conditions": ("type",), "containers": ("name",), "addresses": ("type",),
              "ownerReferences": ("uid",), "volumes": ("name",), "env": ("name",)}
MERGE_PRIMITIVES = {"finalizers"}
WATCH_LOG_LIMIT = 10000


def now_iso(plus_seconds: float = 0) -> str:
    return (datetime.now(UTC) + timedelta(seconds=plus_seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str, details: dict | None = None):
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details

    def status(self) -> dict:
        body = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": self.message, "reason": self.reason, "code": self.code}
        if self.details:
            body["details"] = self.details
        return body


# --- patches -------------------------------------------------------------------------------------
def strategic_merge(target, patch, key: str | None = None):
    """Strategic merge as the API server does for built-in types: keyed lists merge, null deletes."""
    if isinstance(patch, dict) and isinstance(target, dict):
        out = dict(target)
        for k, v in patch.items():
            if k.startswith("$"):
                continue
            if v is None:
                out.pop(k, None)
            elif k in out:
                out[k] = strategic_merge(out[k], v, k)
            else:
                out[k] = _strip_directives(v)
        return out
    if isinstance(patch, list) and isinstance(target, list) and key in MERGE_PRIMITIVES:
        return [*target, *(x for x in patch if x not in target)]
    if isinstance(patch, list) and isinstance(target, list) and key in MERGE_KEYS:
        keys = MERGE_KEYS[key]
        out = list(target)
        for item in patch:
            if not isinstance(item, dict):
                continue
            ident = tuple(item.get(k) for k in keys)
            idx = next((i for i, t in enumerate(out) if isinstance(t, dict) and tuple(t.get(k) for k in keys) == ident), None)
            if item.get("$patch") == "delete":
                if idx is not None:
                    out.pop(idx)
            elif idx is None:
                out.append(_strip_directives(item))
            else:
                out[idx] = strategic_merge(out[idx], item)
        return out
    return _strip_directives(patch)


def _strip_directives(v):
    if isinstance(v, dict):
        return {k: _strip_directives(x) for k, x in v.items() if not k.startswith("$")}
    if isinstance(v, list):
        return [_strip_directives(x) for x in v]
    return v


def json_merge(target, patch):
    """RFC 7386: lists replace, null deletes."""
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = json_merge(out.get(k), v)
    return out


def json_patch(target, ops: list):
    """RFC 6902 (add, remove, replace, test)."""
    doc = copy.deepcopy(target)
    for op in ops:
        parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        parent = doc
        for p in parts[:-1]:
            parent = parent[int(p)] if isinstance(parent, list) else parent.setdefault(p, {})
        last = parts[-1] if parts else None
        kind = op["op"]
        if kind == "test":
            cur = parent[int(last)] if isinstance(parent, list) else parent.get(last)
            if cur != op["value"]:
                raise ApiError(422, "Invalid", f"json patch test failed at {op['path']}")
        elif kind == "remove":
            if isinstance(parent, list):
                parent.pop(int(last))
            elif last in parent:
                del parent[last]
            else:
                raise ApiError(422, "Invalid", f"json patch remove: {op['path']} does not exist")
        elif kind in ("add", "replace"):
            if isinstance(parent, list):
                if last == "-":
                    parent.append(op["value"])
                elif kind == "add":
                    parent.insert(int(last), op["value"])
                else:
                    parent[int(last)] = op["value"]
            else:
                parent[last] = op["value"]
        else:
            raise ApiError(422, "Invalid", f"json patch op {kind!r} not supported")
    return doc


# --- selectors -----------------------------------------------------------------------------------
_SET_EXPR = re.compile(r"^\s*([\w./-]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")


def _split_selector(text: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in text:
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    return [p for p in (*parts, cur) if p.strip()]


def label_matches(labels: dict, selector: str | None) -> bool:
    for term in _split_selector(selector or ""):
        if m := _SET_EXPR.match(term):
            values = {v.strip() for v in m.group(3).split(",")}
            present = labels.get(m.group(1)) in values
            if present != (m.group(2) == "in"):
                return False
        elif "!=" in term:
            k, v = (x.strip() for x in term.split("!=", 1))
            if labels.get(k) == v:
                return False
        elif "=" in term:
            k, v = (x.strip() for x in term.replace("==", "=").split("=", 1))
            if labels.get(k) != v:
                return False
        elif term.strip().startswith("!"):
            if term.strip()[1:] in labels:
                return False
        elif term.strip() not in labels:
            return False
    return True


def _field(obj: dict, path: str):
    cur = obj
    for p in path.split("."):
        cur = cur.get(p) if isinstance(cur, dict) else None
    return cur


def field_matches(obj: dict, selector: str | None) -> bool:
    for term in _split_selector(selector or ""):
        if "!=" in term:
            k, v = term.split("!=", 1)
            if str(_field(obj, k.strip()) or "") == v.strip():
                return False
        else:
            k, v = term.replace("==", "=").split("=", 1)
            if str(_field(obj, k.strip()) or "") != v.strip():
                return False
    return True


def match_pdb_selector(selector: dict, labels: dict) -> bool:
    for k, v in (selector.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for expr in selector.get("matchExpressions") or []:
        k, op, values = expr["key"], expr["operator"], set(expr.get("values") or [])
        if op == "In" and labels.get(k) not in values:
            return False
        if op == "NotIn" and labels.get(k) in values:
            return False
        if op == "Exists" and k not in labels:
            return False
        if op == "DoesNotExist" and k in labels:
            return False
    return True


# --- hooks ---------------------------------------------------------------------------------------
@dataclass
class InjectedFault:
    verb: str  # GET, POST, PUT, PATCH, DELETE or *
    path: re.Pattern
    status: int | None = None  # None: latency only
    rate: float = 1.0
    latency_s: float = 0.0
    remaining: int | None = None  # None: forever
    after: Callable[[], None] | None = None  # run once the request is answered (a racing writer)


@dataclass
class EvictionRecord:
    namespace: str
    pod: str
    node: str | None
    allowed: bool
    budget: str | None
    healthy_before: int | None = None
    desired_healthy: int | None = None
    at: float = field(default_factory=time.time)

    @property
    def respected_budget(self) -> bool:
        """An allowed eviction never takes a budget below its desired healthy count."""
        return not self.allowed or self.desired_healthy is None or self.healthy_before - 1 >= self.desired_healthy


class FakeKube:
    """The object store and semantics; FakeKubeServer puts it on HTTP."""

    def __init__(self, seed: int = 0):
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)
        self.objects: dict[tuple[str, str, str], dict] = {}  # (kind, namespace, name) -> object
        self.rv = 0
        self.log: list[tuple[int, str, str, dict]] = []  # (rv, type, kind, object)
        self.faults: list[InjectedFault] = []
        self.evictions: list[EvictionRecord] = []
        self.requests: list[tuple[str, str, str]] = []  # (verb, path, query) of every request served
        self.random = random.Random(seed)
        self._timers: list[threading.Timer] = []
        self.put(kind="Namespace", obj={"metadata": {"name": "default"}})

    # --- store ---------------------------------------------------------------------------------
    def _bump(self, kind: str, obj: dict, event: str) -> dict:
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        self.log.append((self.rv, event, kind, copy.deepcopy(obj)))
        del self.log[:-WATCH_LOG_LIMIT]
        self.changed.notify_all()
        return obj

    def compact(self) -> None:
        """Forget the event history, as etcd compaction does: a watch from an older
        resourceVersion is answered 410 Gone (reason Expired) and the client must list again."""
        with self.lock:
            del self.log[:-1]

    def put(self, kind: str, obj: dict, namespace: str | None = None) -> dict:
        """Create (tests and scenarios seed the cluster through this, or through the API)."""
        with self.lock:
            obj = copy.deepcopy(obj)
            meta = obj.setdefault("metadata", {})
            ns = (namespace or meta.get("namespace") or "default") if RESOURCES[kind][2] else ""
            if kind == "Event" and "name" not in meta and "generateName" in meta:
                meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
            if "name" not in meta:
                raise ApiError(422, "Invalid", f"{kind}: metadata.name is required")
            key = (kind, ns, meta["name"])
            if key in self.objects:
                raise ApiError(409, "AlreadyExists", f'{RESOURCES[kind][1]} "{meta["name"]}" already exists')
            if ns:
                meta["namespace"] = ns
                if ("Namespace", "", ns) not in self.objects:
                    raise ApiError(404, "NotFound", f'namespaces "{ns}" not found')
            meta.update(uid=str(uuid.uuid4()), creationTimestamp=now_iso())
            obj.update(kind=kind, apiVersion=API_VERSION[kind])
            if kind == "Pod":
                obj.setdefault("status", {}).setdefault("phase", "Running")
            self.objects[key] = obj
            return copy.deepcopy(self._bump(kind, obj, "ADDED"))

    def get(self, kind: str, namespace: str, name: str) -> dict:
        with self.lock:
            obj = self.objects.get((kind, namespace if RESOURCES[kind][2] else "", name))
            if obj is None:
                raise ApiError(404, "NotFound", f'{RESOURCES[kind][1]} "{name}" not found',
                               {"name": name, "kind": RESOURCES[kind][1]})
            return copy.deepcopy(obj)

    def list(self, kind: str, namespace: str | None, labels: str | None = None, fields: str | None = None) -> list[dict]:
        with self.lock:
            return [copy.deepcopy(o) for (k, ns, _), o in sorted(self.objects.items())
                    if k == kind and (namespace is None or ns == namespace)
                    and label_matches(o["metadata"].get("labels") or {}, labels) and field_matches(o, fields)]

    def replace(self, kind: str, namespace: str, name: str, new: dict, subresource: str | None = None) -> dict:
        with self.lock:
            cur = self.get(kind, namespace, name)
            rv = (new.get("metadata") or {}).get("resourceVersion")
            if rv and rv != cur["metadata"]["resourceVersion"]:
                raise ApiError(409, "Conflict", f'Operation cannot be fulfilled on {RESOURCES[kind][1]} "{name}": '
                               "the object has been modified; please apply your changes to the latest version and try again")
            merged = copy.deepcopy(cur)
            if subresource == "status":
                merged["status"] = new.get("status", {})
            else:
                status = merged.get("status")
                merged = copy.deepcopy(new)
                merged["status"] = status if status is not None else new.get("status")
                for k in ("uid", "creationTimestamp", "namespace", "name", "deletionTimestamp"):
                    if k in cur["metadata"]:
                        merged.setdefault("metadata", {})[k] = cur["metadata"][k]
            merged.update(kind=kind, apiVersion=API_VERSION[kind])
            self.objects[(kind, namespace if RESOURCES[kind][2] else "", name)] = merged
            return copy.deepcopy(self._bump(kind, merged, "MODIFIED"))

    def patch(self, kind: str, namespace: str, name: str, body, content_type: str, subresource: str | None = None):
        with self.lock:
            cur = self.get(kind, namespace, name)
            if "strategic-merge-patch" in content_type:
                new = strategic_merge(cur, body)
            elif "json-patch" in content_type:
                new = json_patch(cur, body)
            elif "merge-patch" in content_type:
                new = json_merge(cur, body)
            else:
                new = strategic_merge(cur, body)
            rv = (body.get("metadata") or {}).get("resourceVersion") if isinstance(body, dict) else None
            if rv and rv != cur["metadata"]["resourceVersion"]:
                raise ApiError(409, "Conflict", f'Operation cannot be fulfilled on {RESOURCES[kind][1]} "{name}": '
                               "the object has been modified")
            new.setdefault("metadata", {})["resourceVersion"] = cur["metadata"]["resourceVersion"]
            # replace() keeps the main resource from writing status, and the status one from the rest.
            return self.replace(kind, namespace, name, new, subresource)

    def delete(self, kind: str, namespace: str, name: str, grace_seconds: int | None = None) -> dict:
        with self.lock:
            cur = self.get(kind, namespace, name)
            if kind == "Pod" and (grace_seconds is None or grace_seconds < 0):
                # No grace given (or -1, "the default"): the pod's own terminationGracePeriodSeconds,
                # 30 s when unset, as the API server applies it.
                grace_seconds = (cur.get("spec") or {}).get("terminationGracePeriodSeconds", 30)
            if kind == "Pod" and grace_seconds:
                if "deletionTimestamp" not in cur["metadata"]:
                    # As the API server's graceful deletion (registry/rest/delete.go): the timestamp
                    # is now + the grace period, the time by which the pod is to be gone.
                    cur["metadata"].update(deletionTimestamp=now_iso(grace_seconds),
                                           deletionGracePeriodSeconds=grace_seconds)
                    self.objects[(kind, namespace, name)] = cur
                    self._bump(kind, cur, "MODIFIED")
                    t = threading.Timer(grace_seconds, self._finish_delete, args=(kind, namespace, name))
                    t.daemon = True
                    t.start()
                    self._timers.append(t)
                return copy.deepcopy(cur)
            return self._finish_delete(kind, namespace, name)

    def _finish_delete(self, kind: str, namespace: str, name: str) -> dict | None:
        with self.lock:
            obj = self.objects.pop((kind, namespace if RESOURCES[kind][2] else "", name), None)
            if obj is not None:
                self._bump(kind, obj, "DELETED")
            return obj

    # --- eviction ------------------------------------------------------------------------------
    def evict(self, namespace: str, name: str, body: dict) -> dict:
        with self.lock:
            pod = self.get("Pod", namespace, name)
            labels = pod["metadata"].get("labels") or {}
            pdbs = [p for p in self.list("PodDisruptionBudget", namespace)
                    if match_pdb_selector(p["spec"].get("selector") or {}, labels)]
            node = (pod.get("spec") or {}).get("nodeName")
            if len(pdbs) > 1:
                raise ApiError(500, "InternalError", "This pod has more than one PodDisruptionBudget, which the "
                               "eviction subresource does not support.")
            grace = ((body.get("deleteOptions") or {}).get("gracePeriodSeconds"))
            if not pdbs or "deletionTimestamp" in pod["metadata"]:
                self.evictions.append(EvictionRecord(namespace, name, node, True, None))
                self.delete("Pod", namespace, name, grace)
                return {"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 201}
            pdb = pdbs[0]
            covered = [p for p in self.list("Pod", namespace)
                       if match_pdb_selector(pdb["spec"].get("selector") or {}, p["metadata"].get("labels") or {})]
            healthy = [p for p in covered if _pod_healthy(p)]
            # Like a workload's scale: evicted pods are replaced by their controller, so the
            # expected count does not shrink as pods go (the disruption controller's expectedPods).
            expected = max(len(covered), int((pdb.get("status") or {}).get("expectedPods") or 0))
            if expected != (pdb.get("status") or {}).get("expectedPods"):
                self.replace("PodDisruptionBudget", namespace, pdb["metadata"]["name"],
                             {**pdb, "status": {**(pdb.get("status") or {}), "expectedPods": expected}}, "status")
            desired = _desired_healthy(pdb["spec"], expected)
            allowed = len(healthy) - desired > 0 if _pod_healthy(pod) else True
            record = EvictionRecord(namespace, name, node, allowed, pdb["metadata"]["name"], len(healthy), desired)
            self.evictions.append(record)
            if not allowed:
                raise ApiError(429, "TooManyRequests", "Cannot evict pod as it would violate the pod's disruption budget.",
                               {"causes": [{"reason": "DisruptionBudget",
                                            "message": f"The disruption budget {pdb['metadata']['name']} needs "
                                                       f"{desired} healthy pods and has {len(healthy)} currently"}]})
            self.delete("Pod", namespace, name, grace)
            return {"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 201}

    # --- hooks ---------------------------------------------------------------------------------
    def inject(self, verb: str = "*", path: str = ".*", status: int | None = 500, rate: float = 1.0,
               latency_s: float = 0.0, count: int | None = None, after: Callable[[], None] | None = None) -> InjectedFault:
        f = InjectedFault(verb.upper(), re.compile(path), status, rate, latency_s, count, after)
        with self.lock:
            self.faults.append(f)
        return f

    def clear_faults(self) -> None:
        with self.lock:
            self.faults.clear()

    def fault_for(self, verb: str, path: str) -> InjectedFault | None:
        with self.lock:
            for f in self.faults:
                if f.verb in ("*", verb) and f.path.search(path) and (f.remaining is None or f.remaining > 0):
                    if self.random.random() < f.rate:
                        if f.remaining is not None:
                            f.remaining -= 1
                        return f
        return None

    def set_node_ready(self, name: str, ready: bool) -> None:
        """What a reboot looks like from the API: Ready goes False, then True."""
        cond = {"type": "Ready", "status": "True" if ready else "False", "reason": "KubeletReady" if ready else
                "NodeStatusUnknown", "lastTransitionTime": now_iso()}
        self.patch("Node", "", name, {"status": {"conditions": [cond]}}, "strategic", subresource="status")

    def add_node(self, name: str, labels: dict | None = None, provider_id: str | None = None,
                 boot_id: str | None = None) -> dict:
        status = {"conditions": [{"type": "Ready", "status": "True"}]}
        if boot_id:
            status["nodeInfo"] = _node_info(name, boot_id)
        return self.put("Node", {"metadata": {"name": name, "labels": labels or {}},
                                 "spec": {"providerID": provider_id} if provider_id else {}, "status": status})

    def set_boot_id(self, name: str, boot_id: str) -> None:
        """What the kubelet reports after a reboot: a new status.nodeInfo.bootID."""
        self.patch("Node", "", name, {"status": {"nodeInfo": _node_info(name, boot_id)}}, "strategic",
                   subresource="status")

    def add_pod(self, name: str, node: str, labels: dict | None = None, namespace: str = "default",
                owner_kind: str | None = None, annotations: dict | None = None, ready: bool = True,
                grace_seconds: int | None = None) -> dict:
        meta = {"name": name, "namespace": namespace, "labels": labels or {}, "annotations": annotations or {}}
        if owner_kind:
            owner = {"apiVersion": "apps/v1", "kind": owner_kind, "name": f"{name}-owner", "uid": str(uuid.uuid4()),
                     "controller": True}
            meta["ownerReferences"] = [owner]
            if owner_kind == "DaemonSet":  # the controller object exists, as clients (kubectl drain) check
                self.put("DaemonSet", {"metadata": {"name": owner["name"], "namespace": namespace, "uid": owner["uid"]},
                                       "spec": {"selector": {"matchLabels": labels or {}}}})
        spec = {"nodeName": node, "containers": [{"name": "main", "image": "x"}]}
        if grace_seconds is not None:
            spec["terminationGracePeriodSeconds"] = grace_seconds
        return self.put("Pod", {"metadata": meta, "spec": spec, "status": POD_READY if ready else {"phase": "Pending"}})

    def set_pod_ready(self, name: str, namespace: str = "default") -> dict:
        """A started pod's kubelet reporting it Running and Ready."""
        pod = self.get("Pod", namespace, name)
        return self.replace("Pod", namespace, name, {**pod, "status": POD_READY}, subresource="status")

    def add_pdb(self, name: str, match_labels: dict, min_available=None, max_unavailable=None,
                namespace: str = "default") -> dict:
        spec = {"selector": {"matchLabels": match_labels}}
        if min_available is not None:
            spec["minAvailable"] = min_available
        if max_unavailable is not None:
            spec["maxUnavailable"] = max_unavailable
        return self.put("PodDisruptionBudget", {"metadata": {"name": name, "namespace": namespace}, "spec": spec})

    def close(self) -> None:
        for t in self._timers:
            t.cancel()


def _node_info(name: str, boot_id: str) -> dict:
    """status.nodeInfo as a kubelet fills it (the client's model needs every field)."""
    return {"architecture": "amd64", "bootID": boot_id, "containerRuntimeVersion": "containerd://1.7.20",
            "kernelVersion": "6.8.0-gpuheal", "kubeProxyVersion": "v1.31.0", "kubeletVersion": "v1.31.0",
            "machineID": name, "operatingSystem": "linux", "osImage": "gpuheal fake node", "systemUUID": name}


POD_READY = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}


def _pod_healthy(pod: dict) -> bool:
    if "deletionTimestamp" in pod["metadata"] or (pod.get("status") or {}).get("phase") != "Running":
        return False
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in (pod.get("status") or {}).get("conditions") or [])


def _resolve(value, expected: int, round_up: bool) -> int:
    if isinstance(value, str) and value.endswith("%"):
        pct = int(value[:-1]) * expected
        return -(-pct // 100) if round_up else pct // 100
    return int(value)


def _desired_healthy(spec: dict, expected: int) -> int:
    """The PDB controller's arithmetic: minAvailable rounds up, maxUnavailable rounds up too."""
    if "minAvailable" in spec:
        return _resolve(spec["minAvailable"], expected, round_up=True)
    if "maxUnavailable" in spec:
        return max(0, expected - _resolve(spec["maxUnavailable"], expected, round_up=True))
    return 0


# --- discovery -----------------------------------------------------------------------------------
# What clients such as kubectl read before they act (the legacy discovery documents; a client that
# asks for aggregated discovery gets these and falls back, as it does with an older API server).
_VERBS = ["create", "delete", "get", "list", "patch", "update", "watch"]


def _resource(name: str, kind: str, namespaced: bool, short: list[str] | None = None, verbs=None, **extra) -> dict:
    return {"name": name, "singularName": "" if "/" in name else kind.lower(), "namespaced": namespaced,
            "kind": kind, "verbs": verbs or _VERBS, **({"shortNames": short} if short else {}), **extra}


DISCOVERY = {
    "/version": {"major": "1", "minor": "31", "gitVersion": "v1.31.0-gpuheal-fake", "platform": "linux/amd64"},
    "/api": {"kind": "APIVersions", "versions": ["v1"],
             "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}]},
    "/apis": {"kind": "APIGroupList", "apiVersion": "v1", "groups": [
        {"name": group, "versions": [{"groupVersion": f"{group}/v1", "version": "v1"}],
         "preferredVersion": {"groupVersion": f"{group}/v1", "version": "v1"}} for group in ("apps", "policy")]},
    "/apis/apps/v1": {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "apps/v1", "resources": [
        _resource("daemonsets", "DaemonSet", True, ["ds"]),
    ]},
    "/api/v1": {"kind": "APIResourceList", "groupVersion": "v1", "resources": [
        _resource("nodes", "Node", False, ["no"]),
        _resource("nodes/status", "Node", False, verbs=["get", "patch", "update"]),
        _resource("pods", "Pod", True, ["po"]),
        _resource("pods/status", "Pod", True, verbs=["get", "patch", "update"]),
        _resource("pods/eviction", "Eviction", True, verbs=["create"], group="policy", version="v1"),
        _resource("namespaces", "Namespace", False, ["ns"]),
        _resource("events", "Event", True, ["ev"]),
    ]},
    "/apis/policy/v1": {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "policy/v1", "resources": [
        _resource("poddisruptionbudgets", "PodDisruptionBudget", True, ["pdb"]),
    ]},
}


# --- HTTP ----------------------------------------------------------------------------------------
_PATH = re.compile(
    r"^(?P<prefix>/api/v1|/apis/policy/v1|/apis/apps/v1)(?:/namespaces/(?P<ns>[^/]+))?/(?P<plural>[a-z]+)"
    r"(?:/(?P<name>[^/]+))?(?:/(?P<sub>status|eviction))?$"
)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    kube: FakeKube

    def log_message(self, *args) -> None:  # quiet
        pass

    def _body(self):
        # Always read the whole body: a leftover on a keep-alive connection corrupts the next request.
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        return json.loads(raw) if raw else None

    def _send(self, code: int, doc: dict) -> None:
        data = json.dumps(doc).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _handle(self, verb: str) -> None:
        try:
            body = self._body()
        except (ValueError, UnicodeDecodeError):
            return self._send(400, ApiError(400, "BadRequest", "request body is not JSON").status())
        url = urlparse(self.path)
        q = {k: v[0] for k, v in parse_qs(url.query).items()}
        self.kube.requests.append((verb, url.path, url.query))
        fault = self.kube.fault_for(verb, url.path)
        if fault is not None:
            if fault.latency_s:
                time.sleep(fault.latency_s)
            if fault.status:
                reason = {429: "TooManyRequests", 500: "InternalError", 503: "ServiceUnavailable",
                          403: "Forbidden"}.get(fault.status, "InternalError")
                return self._send(fault.status, ApiError(fault.status, reason, f"injected {fault.status}").status())
        try:
            self._route(verb, url.path, q, body)
        except ApiError as err:
            self._send(err.code, err.status())
        except (KeyError, TypeError, ValueError, IndexError) as err:
            self._send(422, ApiError(422, "Invalid", f"invalid request: {err}").status())
        if fault is not None and fault.after is not None:
            fault.after()

    def _route(self, verb: str, path: str, q: dict, body) -> None:
        m = _PATH.match(path)
        if m is None or m["plural"] not in _BY_PLURAL and not (m["plural"] == "namespaces"):
            if path in DISCOVERY:
                return self._send(200, DISCOVERY[path])
            raise ApiError(404, "NotFound", f"the server could not find the requested resource ({path})")
        kind = _BY_PLURAL[m["plural"]]
        ns, name, sub = m["ns"], m["name"], m["sub"]
        if kind == "Namespace" and ns and not name:
            name, ns = ns, None
        k = self.kube
        if verb == "GET" and name:
            return self._send(200, k.get(kind, ns or "", name))
        if verb == "GET":
            if (q.get("watch") or "").lower() in ("true", "1"):
                return self._watch(kind, ns, q)
            items = k.list(kind, ns, q.get("labelSelector"), q.get("fieldSelector"))
            return self._send(200, {"kind": f"{kind}List", "apiVersion": API_VERSION[kind],
                                    "metadata": {"resourceVersion": str(k.rv)}, "items": items})
        if verb == "POST" and sub == "eviction":
            return self._send(201, k.evict(ns, name, body or {}))
        if verb == "POST":
            return self._send(201, k.put(kind, body or {}, ns))
        if verb == "PUT":
            return self._send(200, k.replace(kind, ns or "", name, body or {}, sub))
        if verb == "PATCH":
            return self._send(200, k.patch(kind, ns or "", name, body, self.headers.get("Content-Type", ""), sub))
        if verb == "DELETE":
            grace = (body or {}).get("gracePeriodSeconds", q.get("gracePeriodSeconds"))
            return self._send(200, k.delete(kind, ns or "", name, int(grace) if grace is not None else None))
        raise ApiError(405, "MethodNotAllowed", f"{verb} not supported on {path}")

    def _watch(self, kind: str, ns: str | None, q: dict) -> None:
        k = self.kube
        since = int(q.get("resourceVersion") or k.rv)
        deadline = time.monotonic() + float(q.get("timeoutSeconds") or 30)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

        def chunk(doc: dict) -> None:
            data = (json.dumps(doc) + "\n").encode()
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

        try:
            with k.lock:
                oldest = k.log[0][0] if k.log else k.rv
            if since and since < oldest - 1:
                chunk({"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                                   "message": f"too old resource version: {since} ({oldest})",
                                                   "reason": "Expired", "code": 410}})
            else:
                while time.monotonic() < deadline:
                    with k.lock:
                        fresh = [(rv, t, o) for rv, t, kk, o in k.log if rv > since and kk == kind
                                 and (ns is None or o["metadata"].get("namespace") == ns)
                                 and label_matches(o["metadata"].get("labels") or {}, q.get("labelSelector"))
                                 and field_matches(o, q.get("fieldSelector"))]
                        if not fresh:
                            k.changed.wait(timeout=min(0.5, max(0.0, deadline - time.monotonic())))
                            continue
                    for rv, t, o in fresh:
                        chunk({"type": t, "object": o})
                        since = rv
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            pass

    def do_GET(self):  # noqa: N802
        self._handle("GET")

    def do_POST(self):  # noqa: N802
        self._handle("POST")

    def do_PUT(self):  # noqa: N802
        self._handle("PUT")

    def do_PATCH(self):  # noqa: N802
        self._handle("PATCH")

    def do_DELETE(self):  # noqa: N802
        self._handle("DELETE")


class FakeKubeServer:
    """FakeKube on 127.0.0.1:<port>, in a thread. `configuration()` gives a kubernetes client config."""

    def __init__(self, kube: FakeKube | None = None, port: int = 0):
        self.kube = kube or FakeKube()
        handler = type("Handler", (_Handler,), {"kube": self.kube})
        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="fake-kube", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def start(self) -> FakeKubeServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.kube.close()

    def write_kubeconfig(self, path) -> str:
        """A kubeconfig pointing at this server, for code that loads config the standard way."""
        from pathlib import Path

        Path(path).write_text(f"""apiVersion: v1
kind: Config
clusters: [{{name: fake, cluster: {{server: "{self.url}"}}}}]
users: [{{name: u, user: {{token: t}}}}]
contexts: [{{name: c, context: {{cluster: fake, user: u}}}}]
current-context: c
""")
        return str(path)

    def configuration(self):
        from kubernetes import client

        from activities.kube import CLUSTER_CALL_THREADS

        cfg = client.Configuration()
        cfg.host = self.url
        cfg.connection_pool_maxsize = CLUSTER_CALL_THREADS
        return cfg
