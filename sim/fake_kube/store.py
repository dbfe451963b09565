"""The objects and their rules: resourceVersion and 409s, subresources, evictions against budgets, watches, and the test hooks (hooks.py)."""

from __future__ import annotations

import copy
import random
import threading
import time
import uuid
from dataclasses import dataclass, field

from sim.fake_kube.errors import ApiError, now_iso
from sim.fake_kube.hooks import InjectedFault, KubeHooks
from sim.fake_kube.patch import json_merge, json_patch, strategic_merge
from sim.fake_kube.selectors import field_matches, label_matches, match_pdb_selector

# kind -> (api prefix, plural, namespaced)
RESOURCES = {
    "Node": ("/api/v1", "nodes", False),
    "Namespace": ("/api/v1", "namespaces", False),
    "Pod": ("/api/v1", "pods", True),
    "Event": ("/api/v1", "events", True),
    "PodDisruptionBudget": ("/apis/policy/v1", "poddisruptionbudgets", True),
    "DaemonSet": ("/apis/apps/v1", "daemonsets", True),
    "Machine": ("/apis/cluster.x-k8s.io/v1beta1", "machines", True),
    "MachineSet": ("/apis/cluster.x-k8s.io/v1beta1", "machinesets", True),
}
API_VERSION = {"Node": "v1", "Namespace": "v1", "Pod": "v1", "Event": "v1", "PodDisruptionBudget": "policy/v1",
               "DaemonSet": "apps/v1", "Machine": "cluster.x-k8s.io/v1beta1", "MachineSet": "cluster.x-k8s.io/v1beta1"}
# Served from CustomResourceDefinitions: the API server takes no strategic merge patch for them (415).
CUSTOM_KINDS = {"Machine", "MachineSet"}
KIND_BY_PLURAL = {plural: kind for kind, (_, plural, _) in RESOURCES.items()}
WATCH_LOG_LIMIT = 10000


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


class FakeKube(KubeHooks):
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
            # Matched first, then sorted: sorting every object of every kind for each call made a
            # storm's pod listings the fake's largest cost (it shares the bench's process).
            found = [(key, o) for key, o in self.objects.items()
                     if key[0] == kind and (namespace is None or key[1] == namespace)
                     and label_matches(o["metadata"].get("labels") or {}, labels) and field_matches(o, fields)]
            return [copy.deepcopy(o) for _, o in sorted(found, key=lambda item: item[0])]

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
                # The system's fields: an update's own values are ignored (a deletionTimestamp sent in
                # a PUT or patch neither deletes nor undeletes, as on a real API server).
                for k in ("uid", "creationTimestamp", "namespace", "name", "deletionTimestamp", "deletionGracePeriodSeconds"):
                    if k in cur["metadata"]:
                        merged.setdefault("metadata", {})[k] = cur["metadata"][k]
                    else:
                        merged.setdefault("metadata", {}).pop(k, None)
            merged.update(kind=kind, apiVersion=API_VERSION[kind])
            self.objects[(kind, namespace if RESOURCES[kind][2] else "", name)] = merged
            out = copy.deepcopy(self._bump(kind, merged, "MODIFIED"))
            if "deletionTimestamp" in merged["metadata"] and not merged["metadata"].get("finalizers"):
                self._finish_delete(kind, namespace, name)  # the last finalizer removed: gone now
            return out

    def patch(self, kind: str, namespace: str, name: str, body, content_type: str, subresource: str | None = None):
        with self.lock:
            cur = self.get(kind, namespace, name)
            if kind in CUSTOM_KINDS and ("strategic-merge-patch" in content_type or not (
                    "json-patch" in content_type or "merge-patch" in content_type)):
                raise ApiError(415, "UnsupportedMediaType", f"the body of the request was in an unknown format - "
                               f"accepted media types include: application/json-patch+json, "
                               f"application/merge-patch+json, application/apply-patch+yaml ({content_type})")
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
            if cur["metadata"].get("finalizers"):
                # Kept until its finalizers are removed (each by the controller that set it).
                if "deletionTimestamp" not in cur["metadata"]:
                    cur["metadata"].update(deletionTimestamp=now_iso(0), deletionGracePeriodSeconds=0)
                    self.objects[(kind, namespace if RESOURCES[kind][2] else "", name)] = cur
                    self._bump(kind, cur, "MODIFIED")
                return copy.deepcopy(cur)
            return self._finish_delete(kind, namespace, name)

    def _finish_delete(self, kind: str, namespace: str, name: str) -> dict | None:
        with self.lock:
            key = (kind, namespace if RESOURCES[kind][2] else "", name)
            if (self.objects.get(key) or {}).get("metadata", {}).get("finalizers"):
                return copy.deepcopy(self.objects[key])  # a grace period ran out: finalizers still hold it
            obj = self.objects.pop(key, None)
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

    def close(self) -> None:
        for t in self._timers:
            t.cancel()


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
