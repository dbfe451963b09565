"""How a test shapes the fake API server: injected faults (status, latency, a racing writer), and
nodes, pods and budgets put in place as a kubelet and a controller would."""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from sim.fake_kube.errors import now_iso

POD_READY = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}


@dataclass
class InjectedFault:
    verb: str  # GET, POST, PUT, PATCH, DELETE or *
    path: re.Pattern
    status: int | None = None  # None: latency only
    rate: float = 1.0
    latency_s: float = 0.0
    remaining: int | None = None  # None: forever
    after: Callable[[], None] | None = None  # run once the request is answered (a racing writer)


class KubeHooks:
    """Mixed into FakeKube, whose store (put, get, patch, replace) and lock they use."""

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


def _node_info(name: str, boot_id: str) -> dict:
    """status.nodeInfo as a kubelet fills it (the client's model needs every field)."""
    return {"architecture": "amd64", "bootID": boot_id, "containerRuntimeVersion": "containerd://1.7.20",
            "kernelVersion": "6.8.0-gpuheal", "kubeProxyVersion": "v1.31.0", "kubeletVersion": "v1.31.0",
            "machineID": name, "operatingSystem": "linux", "osImage": "gpuheal fake node", "systemUUID": name}
