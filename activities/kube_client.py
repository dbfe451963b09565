"""The Kubernetes API as every kube activity calls it: off the event loop, throttling and dropped
connections retried per call, failures mapped to what a retry can and cannot fix, Node
read-modify-write, events and the GpuHealthy condition."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime

import urllib3
from kubernetes import client
from kubernetes.client.rest import ApiException

import api as c
from activities.errors import NODE_GONE, PERMISSION_DENIED, fail

EVENT_SOURCE = "gpuheal"
TRANSIENT = (429, 500, 502, 503, 504)
# Threads for blocking cluster calls, and so the HTTP connections the client may keep per host
# (urllib3 drops and warns about any beyond its pool: "connection pool is full").
CLUSTER_CALL_THREADS = 64
CALL_TRIES = 4  # per API call, for 429 / 5xx / dropped connections, before the activity attempt fails
CONFLICT_TRIES = 5  # read-modify-write rounds when someone else writes the node in between (409)


def now_utc() -> datetime:
    return datetime.now(UTC)


async def call_api(fn: Callable, *args, retry_on=TRANSIENT, **kwargs):
    """A blocking kubernetes-client call off the event loop. A throttled (429), failing (5xx) or
    dropped call is tried again a few times here, as client-go does, so that one flaky request
    does not cost a whole activity attempt."""
    for attempt in range(CALL_TRIES):
        try:
            return await asyncio.to_thread(fn, *args, **kwargs)
        except ApiException as err:
            if err.status not in retry_on or attempt == CALL_TRIES - 1:
                raise
        except (urllib3.exceptions.HTTPError, ConnectionError):
            if attempt == CALL_TRIES - 1:
                raise
        await asyncio.sleep(min(2.0, 0.1 * 2**attempt))


class KubeClient:
    """Holds its client; the worker builds it from in-cluster config or a kubeconfig."""

    def __init__(self, core: client.CoreV1Api, namespace_for_events: str = "default",
                 gpu_node_selector: str | None = None):
        self.core = core
        self.events_ns = namespace_for_events
        self.gpu_node_selector = gpu_node_selector

    async def _call(self, verb: str, resource: str, fn: Callable, *args, retry_on=TRANSIENT, **kwargs):
        """One API call off the event loop, its failure mapped to what a retry can and cannot fix."""
        try:
            return await call_api(fn, *args, retry_on=retry_on, **kwargs)
        except ApiException as err:
            self._raise_mapped(verb, resource, err)

    @staticmethod
    def _raise_mapped(verb: str, resource: str, err: ApiException):
        if err.status == 404 and resource.startswith("node"):
            raise fail(NODE_GONE, f"{resource} not found") from None
        if err.status == 403:
            raise fail(PERMISSION_DENIED, f"forbidden: {verb} {resource} ({err.reason})", verb=verb,
                       resource=resource) from None
        raise err  # 409 (re-read on retry), 429, 5xx: the activity's retry policy takes it from here

    async def _node(self, name: str) -> client.V1Node:
        return await self._call("get", f"nodes/{name}", self.core.read_node, name)

    async def _event(self, kind: str, name: str, namespace: str, reason: str, message: str, type_: str = "Normal",
                     uid: str | None = None) -> None:
        ts = now_utc()
        body = client.CoreV1Event(
            metadata=client.V1ObjectMeta(generate_name=f"{name}.", namespace=namespace),
            # A Node is cluster-scoped: its reference has no namespace, or `kubectl describe node`
            # (which selects involvedObject.namespace="") never shows the event.
            involved_object=client.V1ObjectReference(kind=kind, name=name, uid=uid,
                                                     namespace=None if kind == "Node" else namespace or None),
            reason=reason, message=message[:1024], type=type_, first_timestamp=ts, last_timestamp=ts, count=1,
            source=client.V1EventSource(component=EVENT_SOURCE), reporting_component=EVENT_SOURCE,
        )
        await self._call("create", f"events in {namespace}", self.core.create_namespaced_event, namespace, body)

    async def _set_condition(self, node: str, healthy: bool, reason: str, message: str) -> None:
        cond = {"type": c.CONDITION_TYPE, "status": "True" if healthy else "False", "reason": reason,
                "message": message[:1024], "lastTransitionTime": now_utc().isoformat(), "lastHeartbeatTime": now_utc().isoformat()}
        await self._call("patch", f"nodes/{node}/status", self.core.patch_node_status, node,
                         {"status": {"conditions": [cond]}})

    @staticmethod
    def _has_taint(n: client.V1Node, key: str) -> bool:
        return any(t.key == key and t.effect == "NoSchedule" for t in n.spec.taints or [])

    @staticmethod
    def _condition(n: client.V1Node) -> str | None:
        return next((x.status for x in (n.status.conditions or []) if x.type == c.CONDITION_TYPE), None)

    async def _rewrite_node(self, name: str, change: Callable[[client.V1Node], dict | None]) -> tuple[client.V1Node, bool]:
        """Read-modify-write of a Node: the patch carries the resourceVersion it was computed from,
        so a write by someone else in between is a 409 and the change is computed again from what
        is there now. Taints are an atomic list on the API server: only a whole list computed from
        a fresh read keeps the taints other controllers own. Returns the node and whether it wrote."""
        for attempt in range(CONFLICT_TRIES):
            n = await self._node(name)
            patch = change(n)
            if patch is None:
                return n, False
            patch.setdefault("metadata", {})["resourceVersion"] = n.metadata.resource_version
            try:
                return await call_api(self.core.patch_node, name, patch), True
            except ApiException as err:
                if err.status == 409 and attempt < CONFLICT_TRIES - 1:
                    continue
                self._raise_mapped("patch", f"nodes/{name}", err)
        raise AssertionError("unreachable")

    @staticmethod
    def _taint_dicts(n: client.V1Node) -> list[dict]:
        """The node's taints as the API takes them back, unchanged (timeAdded included)."""
        out = []
        for t in n.spec.taints or []:
            d = {"key": t.key, "effect": t.effect, **({"value": t.value} if t.value is not None else {})}
            if t.time_added is not None:
                d["timeAdded"] = t.time_added.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            out.append(d)
        return out


def load_core_api(kubeconfig: str | None = None) -> client.CoreV1Api:
    """In-cluster config when running in a pod, else the kubeconfig, as the client loads them."""
    from kubernetes import config

    cfg = client.Configuration()
    loaded = False
    if kubeconfig is None:
        try:
            config.load_incluster_config(client_configuration=cfg)
            loaded = True
        except config.ConfigException:
            pass
    if not loaded:
        config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
    cfg.connection_pool_maxsize = CLUSTER_CALL_THREADS
    return client.CoreV1Api(client.ApiClient(cfg))
