"""Server-side printing: the meta.k8s.io/v1 Table a real API server returns when a client asks for one.

kubectl asks with `Accept: application/json;as=Table;v=v1;g=meta.k8s.io,...` and prints the server's
columns as they come (priority 0 by default, all of them with `-o wide`), so without this a cordoned node
shows as NAME and AGE only. Columns and cell values follow the API server's printers (kubernetes
pkg/printers/internalversion: nodes, pods; NAME and CREATED AT's AGE for the other kinds), and
ages follow apimachinery's duration.HumanDuration.
"""

from __future__ import annotations

from datetime import UTC, datetime


def wants_table(accept: str | None) -> bool:
    """True when the client's first acceptable form is a Table (kubectl get and its watch)."""
    return bool(accept) and "as=Table" in accept.split(",")[0]


def _col(name: str, description: str, priority: int = 0, fmt: str = "") -> dict:
    return {"name": name, "type": "string", "format": fmt, "description": description, "priority": priority}


_NAME = _col("Name", "Name must be unique within a namespace.", fmt="name")
_AGE = _col("Age", "CreationTimestamp is a timestamp representing the server time when this object was created.")

COLUMNS = {
    "Node": [_NAME, _col("Status", "The status of the node"), _col("Roles", "The roles of the node"), _AGE,
             _col("Version", "Kubelet Version reported by the node."),
             _col("Internal-IP", "List of addresses reachable to the node.", 1),
             _col("External-IP", "List of addresses reachable to the node.", 1),
             _col("OS-Image", "OS Image reported by the node from /etc/os-release.", 1),
             _col("Kernel-Version", "Kernel Version reported by the node from 'uname -r'.", 1),
             _col("Container-Runtime", "Container runtime version reported by the node.", 1)],
    "Pod": [_NAME, _col("Ready", "The aggregate readiness state of this pod for accepting traffic."),
            _col("Status", "The aggregate status of the containers in this pod."),
            _col("Restarts", "The number of times the containers in this pod have been restarted."), _AGE,
            _col("IP", "IP address allocated to the pod.", 1), _col("Node", "Name of the node the pod is assigned to.", 1)],
}


def human_duration(seconds: float) -> str:
    """apimachinery's duration.HumanDuration: 90s, 5m30s, 2h10m, 3d4h, ..."""
    s = int(seconds)
    if s < -1:
        return "<invalid>"
    if s < 0:
        return "0s"
    if s < 120:
        return f"{s}s"
    minutes = s // 60
    if minutes < 10:
        return f"{minutes}m" if s % 60 == 0 else f"{minutes}m{s % 60}s"
    if minutes < 180:
        return f"{minutes}m"
    hours = s // 3600
    if hours < 8:
        return f"{hours}h" if minutes % 60 == 0 else f"{hours}h{minutes % 60}m"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        return f"{hours // 24}d" if hours % 24 == 0 else f"{hours // 24}d{hours % 24}h"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    if hours < 24 * 365 * 8:
        days = (hours // 24) % 365
        return f"{hours // 24 // 365}y" if days == 0 else f"{hours // 24 // 365}y{days}d"
    return f"{hours // 24 // 365}y"


def _age(obj: dict) -> str:
    created = (obj.get("metadata") or {}).get("creationTimestamp")
    if not created:
        return "<unknown>"
    then = datetime.strptime(created, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    return human_duration((datetime.now(UTC) - then).total_seconds())


def _node_cells(node: dict) -> list:
    status, spec = node.get("status") or {}, node.get("spec") or {}
    ready = next((c.get("status") for c in status.get("conditions") or [] if c.get("type") == "Ready"), None)
    state = {"True": "Ready", "False": "NotReady"}.get(ready, "Unknown")
    if spec.get("unschedulable"):
        state += ",SchedulingDisabled"
    labels = (node.get("metadata") or {}).get("labels") or {}
    roles = sorted({k.split("/", 1)[1] for k in labels if k.startswith("node-role.kubernetes.io/") and "/" in k}
                   | ({labels["kubernetes.io/role"]} if labels.get("kubernetes.io/role") else set()))
    info = status.get("nodeInfo") or {}
    addresses = {a.get("type"): a.get("address") for a in status.get("addresses") or []}
    return [node["metadata"]["name"], state, ",".join(r for r in roles if r) or "<none>", _age(node),
            info.get("kubeletVersion", ""), addresses.get("InternalIP", "<none>"), addresses.get("ExternalIP", "<none>"),
            info.get("osImage") or "<unknown>", info.get("kernelVersion") or "<unknown>",
            info.get("containerRuntimeVersion") or "<unknown>"]


def _pod_cells(pod: dict) -> list:
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    containers = status.get("containerStatuses") or []
    total = len(spec.get("containers") or [])
    ready = sum(1 for c in containers if c.get("ready"))
    if not containers and any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or []):
        ready = total  # the fake's pods carry the Ready condition without per-container statuses
    phase = "Terminating" if "deletionTimestamp" in pod["metadata"] else status.get("reason") or status.get("phase", "")
    restarts = sum(int(c.get("restartCount") or 0) for c in containers)
    return [pod["metadata"]["name"], f"{ready}/{total}", phase, restarts, _age(pod), status.get("podIP") or "<none>",
            spec.get("nodeName") or "<none>"]


_CELLS = {"Node": _node_cells, "Pod": _pod_cells}


def _row(kind: str, obj: dict) -> dict:
    cells = _CELLS[kind](obj) if kind in _CELLS else [obj["metadata"]["name"], _age(obj)]
    # includeObject defaults to Metadata: each row carries the object's metadata as PartialObjectMetadata.
    return {"cells": cells, "object": {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                                       "metadata": obj["metadata"]}}


def table(kind: str, objects: list[dict], resource_version: str | None = None) -> dict:
    """The Table for `objects` (a list, a single get, or one watch event's object)."""
    return {"kind": "Table", "apiVersion": "meta.k8s.io/v1",
            "metadata": {"resourceVersion": resource_version} if resource_version else {},
            "columnDefinitions": COLUMNS.get(kind, [_NAME, _AGE]), "rows": [_row(kind, o) for o in objects]}
