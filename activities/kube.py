"""Kubernetes side effects: cordon, taint, drain, conditions, events, failure attribution."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import urllib3
from kubernetes import client
from kubernetes.client.rest import ApiException
from temporalio import activity

import api as c
from activities.errors import NO_EFFECT, NODE_GONE, PERMISSION_DENIED, fail

ATTRIBUTION_ANNOTATION = "gpuheal.io/failure-attribution"
FAULT_ANNOTATION = "gpuheal.io/fault"
DRAIN_DEADLINE_ANNOTATION = "gpuheal.io/drain-deadline"
DRAIN_EPISODE_ANNOTATION = "gpuheal.io/drain-episode"  # whose notice the deadline is
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
EVENT_SOURCE = "gpuheal"
TRANSIENT = (429, 500, 502, 503, 504)
GONE_SLACK = timedelta(seconds=5)  # past a pod's deletionTimestamp before it counts as lingering
# Threads for blocking cluster calls, and so the HTTP connections the client may keep per host
# (urllib3 drops and warns about any beyond its pool: "connection pool is full").
CLUSTER_CALL_THREADS = 64
CALL_TRIES = 4
CONFLICT_TRIES = 5  # read-modify-write rounds when someone else writes the node in between (409)
# Annotations recording what a quarantine changed, one per gpuheal taint (named like the taint).
QUARANTINE_RECORD_KEYS = (c.QUARANTINE_TAINT, c.UNVALIDATED_TAINT)  # per API call, for 429 / 5xx / dropped connections, before the activity attempt fails


def _now() -> datetime:
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


class KubeActivities:
    """Holds its client; the worker builds it from in-cluster config or a kubeconfig."""

    def __init__(self, core: client.CoreV1Api, namespace_for_events: str = "default",
                 gpu_node_selector: str | None = None):
        self.core = core
        self.events_ns = namespace_for_events
        self.gpu_node_selector = gpu_node_selector

    # --- plumbing ------------------------------------------------------------------------------
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
        ts = _now()
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
                "message": message[:1024], "lastTransitionTime": _now().isoformat(), "lastHeartbeatTime": _now().isoformat()}
        await self._call("patch", f"nodes/{node}/status", self.core.patch_node_status, node,
                         {"status": {"conditions": [cond]}})

    @staticmethod
    def _has_taint(n: client.V1Node, key: str) -> bool:
        return any(t.key == key and t.effect == "NoSchedule" for t in n.spec.taints or [])

    @staticmethod
    def _condition(n: client.V1Node) -> str | None:
        return next((x.status for x in (n.status.conditions or []) if x.type == c.CONDITION_TYPE), None)

    # --- quarantine / return -------------------------------------------------------------------
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

    @staticmethod
    def _records(n: client.V1Node) -> dict[str, dict]:
        """gpuheal's quarantine records on the node: taint key -> what the quarantine changed."""
        out = {}
        for key, value in (n.metadata.annotations or {}).items():
            if key in QUARANTINE_RECORD_KEYS:
                try:
                    out[key] = json.loads(value)
                except ValueError:
                    out[key] = {"was_unschedulable": False}
        return out

    @activity.defn(name=c.KUBE_QUARANTINE)
    async def quarantine(self, req: c.QuarantineRequest) -> c.QuarantineResult:
        taint = {"key": req.taint_key, "value": req.fault_class[:63], "effect": "NoSchedule"}

        def change(n: client.V1Node) -> dict | None:
            records = self._records(n)
            if n.spec.unschedulable and self._has_taint(n, req.taint_key) and req.taint_key in records:
                return None  # done already (a retry, or a second episode on a quarantined node)
            patch = {"spec": {"unschedulable": True, "taints": [
                *(t for t in self._taint_dicts(n) if not (t["key"] == req.taint_key and t["effect"] == "NoSchedule")),
                taint]}}
            if req.taint_key not in records:
                # What this quarantine changes, so return to service undoes only that: a node someone
                # else had cordoned (an operator, Karpenter, an upgrade) stays cordoned afterwards.
                was = any(r.get("was_unschedulable") for r in records.values()) if records else bool(n.spec.unschedulable)
                patch["metadata"] = {"annotations": {req.taint_key: json.dumps(
                    {"was_unschedulable": was, "taint": taint, "at": _now().isoformat()})}}
            return patch

        if req.dry_run:
            await self._node(req.node)
            return c.QuarantineResult(node=req.node, changed=False, cordoned_at=_now(), dry_run=True)
        n, wrote = await self._rewrite_node(req.node, change)
        # The PATCH answer (or the read) is the stored object: it is what verifies the cordon stuck.
        if not (n.spec.unschedulable and self._has_taint(n, req.taint_key)):
            raise fail(NO_EFFECT, f"cordon of {req.node} did not stick")
        cordoned_at = _now()
        if self._condition(n) != "False":
            await self._set_condition(req.node, False, "GpuFault", req.reason)
        if wrote:
            await self._event("Node", req.node, self.events_ns, "GpuQuarantined",
                              f"cordoned and tainted {req.taint_key}={req.fault_class}: {req.reason}", "Warning",
                              n.metadata.uid)
        return c.QuarantineResult(node=req.node, changed=wrote, cordoned_at=cordoned_at)

    @activity.defn(name=c.KUBE_RETURN_TO_SERVICE)
    async def return_to_service(self, req: c.ReturnToServiceRequest) -> c.ReturnToServiceResult:
        outcome = {}

        def change(n: client.V1Node) -> dict | None:
            records = self._records(n)
            mine = {k: v for k, v in records.items() if k in req.taint_keys}
            others = {k: v for k, v in records.items() if k not in req.taint_keys}
            # Stay cordoned if it was before gpuheal came, or another gpuheal quarantine still holds it.
            keep = any(r.get("was_unschedulable") for r in mine.values()) or bool(others)
            outcome["unschedulable"] = keep
            taints = self._taint_dicts(n)
            kept_taints = [t for t in taints if t["key"] not in req.taint_keys]
            if len(kept_taints) == len(taints) and not mine and bool(n.spec.unschedulable) == keep:
                return None
            patch = {"spec": {"unschedulable": keep, "taints": kept_taints}}
            if mine:
                patch["metadata"] = {"annotations": {k: None for k in mine}}
            return patch

        if req.dry_run:
            await self._node(req.node)
            return c.ReturnToServiceResult(node=req.node, changed=False, dry_run=True)
        n, wrote = await self._rewrite_node(req.node, change)
        if bool(n.spec.unschedulable) != outcome["unschedulable"] or any(
                t.key in req.taint_keys for t in n.spec.taints or []):
            raise fail(NO_EFFECT, f"uncordon of {req.node} did not stick")
        if self._condition(n) != "True":
            await self._set_condition(req.node, True, "Validated", req.reason)
        if wrote:
            said = ("taint removed; left cordoned as it was before gpuheal quarantined it"
                    if outcome["unschedulable"] else "uncordoned")
            await self._event("Node", req.node, self.events_ns, "GpuReturned", f"{said}: {req.reason}", "Normal",
                              n.metadata.uid)
        return c.ReturnToServiceResult(node=req.node, changed=wrote, left_cordoned=outcome["unschedulable"])

    @activity.defn(name=c.KUBE_EVENT)
    async def event(self, req: c.EventRequest) -> None:
        if not req.dry_run:
            await self._event("Node", req.node, self.events_ns, req.reason, req.message, req.type)

    @activity.defn(name=c.KUBE_CHECK_NODE)
    async def check_node(self, req: c.NodeCheckRequest) -> c.NodeCheckResult:
        """Whether a report names a node that exists and is one of ours, before anything is done to it."""
        try:
            n = await call_api(self.core.read_node, req.node)
        except ApiException as err:
            if err.status == 404:
                return c.NodeCheckResult(exists=False, ours=False, reason=f"node {req.node} does not exist")
            self._raise_mapped("get", f"nodes/{req.node}", err)
        if n.metadata.deletion_timestamp is not None:
            # Being deleted (a Karpenter replacement's finalizer holds it while the instance goes).
            return c.NodeCheckResult(exists=True, ours=False, reason=f"node {req.node} is being deleted "
                                     f"(since {n.metadata.deletion_timestamp}): no node to remediate")
        if (why := replaced_host(n, req.boot_id)) is not None:
            return c.NodeCheckResult(exists=True, ours=False, reason=why)
        if self.gpu_node_selector:
            found = await self._call("list", "nodes", self.core.list_node, field_selector=f"metadata.name={req.node}",
                                     label_selector=self.gpu_node_selector)
            if not found.items:
                return c.NodeCheckResult(exists=True, ours=False,
                                         reason=f"node {req.node} does not match the GPU node selector {self.gpu_node_selector}")
        # gpuheal's taint on a Node it replaced (a new host registered under the name) was the old
        # host's: it holds nothing for the new one.
        held = None if c.REPLACED_ANNOTATION in (n.metadata.annotations or {}) else next(
            (t.value or "fault" for t in (n.spec.taints or []) if t.key == c.QUARANTINE_TAINT), None)
        return c.NodeCheckResult(exists=True, ours=True, quarantined=held)

    @activity.defn(name=c.KUBE_FLEET_SIZE)
    async def fleet_size(self) -> int:
        nodes = await self._call("list", "nodes", self.core.list_node, label_selector=self.gpu_node_selector)
        return len(nodes.items)

    @activity.defn(name=c.KUBE_QUARANTINED_NODES)
    async def quarantined_nodes(self) -> list[str]:
        """GPU nodes carrying gpuheal's quarantine taint now: what the guard counts as unhealthy
        beyond its running episodes (a node a person uncordoned and untainted is not)."""
        nodes = await self._call("list", "nodes", self.core.list_node, label_selector=self.gpu_node_selector)
        return sorted(n.metadata.name for n in nodes.items
                      if any(t.key == c.QUARANTINE_TAINT for t in (n.spec.taints or [])))

    # --- pods ----------------------------------------------------------------------------------
    async def _pods_on(self, node: str) -> list[client.V1Pod]:
        pods = await self._call("list", "pods", self.core.list_pod_for_all_namespaces,
                                field_selector=f"spec.nodeName={node}")
        return [p for p in pods.items if not _is_daemon_or_mirror(p)]

    @activity.defn(name=c.KUBE_ATTRIBUTE_PODS)
    async def attribute_pods(self, req: c.AttributePodsRequest) -> c.AttributePodsResult:
        pods = await self._pods_on(req.node)
        result = c.AttributePodsResult()
        for p in pods:
            ann = p.metadata.annotations or {}
            name = f"{p.metadata.namespace}/{p.metadata.name}"
            mark = c.UNAFFECTED if _unaffected(p, req) else req.attribution
            (result.unaffected if mark == c.UNAFFECTED else result.pods).append(name)
            if req.dry_run or (ann.get(ATTRIBUTION_ANNOTATION) == mark and ann.get(FAULT_ANNOTATION) == req.fault):
                continue
            await self._call("patch", f"pods/{name}", self.core.patch_namespaced_pod, p.metadata.name,
                             p.metadata.namespace, {"metadata": {"annotations": {
                                 ATTRIBUTION_ANNOTATION: mark, FAULT_ANNOTATION: req.fault[:256]}}})
            if mark != c.UNAFFECTED:
                await self._event("Pod", p.metadata.name, p.metadata.namespace, "GpuFailureAttributed",
                                  f"{req.attribution} fault on node {req.node}: {req.fault}", "Warning", p.metadata.uid)
        return result

    @activity.defn(name=c.KUBE_DRAIN)
    async def drain(self, req: c.DrainRequest) -> c.DrainResult:
        pods = await self._pods_on(req.node)
        if req.dry_run:
            return c.DrainResult(remaining=[f"{p.metadata.namespace}/{p.metadata.name}" for p in pods], dry_run=True)
        await self._notice(req, pods)
        result = c.DrainResult()
        deadline = time.monotonic() + req.deadline_s
        backoff = 0.2
        while True:
            present = await self._pods_on(req.node)
            pending = [p for p in present if p.metadata.deletion_timestamp is None]
            if not pending:
                # Evictions accepted is not pods gone: a pod's own shutdown runs until its grace
                # (deletionTimestamp) has passed, and the rung after the drain must not cut it. The
                # timestamp has whole seconds and the kubelet confirms a moment later: some slack.
                leaving = [p for p in present if p.metadata.deletion_timestamp + GONE_SLACK > _now()]
                if not leaving:
                    result.lingering = [f"{p.metadata.namespace}/{p.metadata.name}" for p in present]
                    return result
                activity.heartbeat({"evicted": len(result.evicted), "terminating": len(leaving)})
                await asyncio.sleep(0.2)
                continue
            for p in pending:
                name = f"{p.metadata.namespace}/{p.metadata.name}"
                try:
                    # A 429 here is a PodDisruptionBudget's "not now", which the drain's backoff handles.
                    await self._call("create", f"pods/{name}/eviction", self.core.create_namespaced_pod_eviction,
                                     p.metadata.name, p.metadata.namespace, client.V1Eviction(
                                         metadata=client.V1ObjectMeta(name=p.metadata.name, namespace=p.metadata.namespace),
                                         delete_options=client.V1DeleteOptions(grace_period_seconds=req.pod_grace_seconds)),
                                     retry_on=(500, 502, 503, 504))
                    result.evicted.append(name)
                except ApiException as err:
                    if err.status == 404:
                        continue  # already gone
                    if err.status != 429:
                        raise
                    result.pdb_blocked += 1  # the budget says not now: back off, heartbeat, try again
            activity.heartbeat({"evicted": len(result.evicted), "pdb_blocked": result.pdb_blocked})
            if time.monotonic() >= deadline and req.timeout_action != "wait":
                left = [p for p in await self._pods_on(req.node) if p.metadata.deletion_timestamp is None]
                if req.timeout_action == "force" and req.allow_force:
                    for p in left:
                        await self._call("delete", f"pods/{p.metadata.namespace}/{p.metadata.name}",
                                         self.core.delete_namespaced_pod, p.metadata.name, p.metadata.namespace,
                                         grace_period_seconds=req.pod_grace_seconds)
                        result.forced.append(f"{p.metadata.namespace}/{p.metadata.name}")
                    return result
                result.remaining = [f"{p.metadata.namespace}/{p.metadata.name}" for p in left]
                result.timed_out = bool(left)
                return result
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 5.0)

    async def _notice(self, req: c.DrainRequest, pods: list[client.V1Pod]) -> None:
        """Tell the pods first, so elastic jobs can checkpoint and shrink; a retry does not wait again."""
        deadline = _now() + timedelta(seconds=req.checkpoint_grace_s)
        latest = None
        for p in pods:
            ann = p.metadata.annotations or {}
            existing = ann.get(DRAIN_DEADLINE_ANNOTATION)
            if existing and ann.get(DRAIN_EPISODE_ANNOTATION) == req.episode:
                latest = max(latest or existing, existing)
                continue  # this episode's notice, given by an earlier attempt
            await self._call("patch", f"pods/{p.metadata.namespace}/{p.metadata.name}", self.core.patch_namespaced_pod,
                             p.metadata.name, p.metadata.namespace,
                             {"metadata": {"annotations": {DRAIN_DEADLINE_ANNOTATION: deadline.isoformat(),
                                                           DRAIN_EPISODE_ANNOTATION: req.episode[:256]}}})
            await self._event("Pod", p.metadata.name, p.metadata.namespace, "GpuDrainNotice",
                              f"node {req.node} drains at {deadline.isoformat()}: checkpoint now", "Warning",
                              p.metadata.uid)
            latest = max(latest or deadline.isoformat(), deadline.isoformat())
        if latest is None:
            return
        wait = (datetime.fromisoformat(latest) - _now()).total_seconds()
        while wait > 0:
            activity.heartbeat("checkpoint grace")
            await asyncio.sleep(min(wait, 1.0))
            wait -= 1.0


def _unaffected(p: client.V1Pod, req: c.AttributePodsRequest) -> bool:
    """A pod whose processes run only on GPUs that did not fail. A pod with no process seen may
    have lost it to the fault, so it keeps the fault's attribution (the safe side for the job)."""
    if not req.gpus or req.pod_gpus is None:
        return False
    used = req.pod_gpus.get(f"uid:{p.metadata.uid}")
    return bool(used) and not set(used) & set(req.gpus)


def _is_daemon_or_mirror(p: client.V1Pod) -> bool:
    if MIRROR_ANNOTATION in (p.metadata.annotations or {}):
        return True
    return any(o.kind == "DaemonSet" for o in p.metadata.owner_references or [])


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


def replaced_host(n: client.V1Node, report_boot: str | None = None) -> str | None:
    """Why a Node is the host gpuheal replaced (its instance runs on a while after the terminate), or
    None. A new host registered under the same name reports another kubelet boot id: it is ours.
    `report_boot`, the boot a report came from: the replaced host's, or any but the kubelet's now
    (the old host reporting late once the new one took the name), is refused."""
    ann = n.metadata.annotations or {}
    if c.REPLACED_ANNOTATION not in ann:
        return None
    boot = n.status.node_info.boot_id if n.status and n.status.node_info else None
    replaced_boot = ann.get(c.REPLACED_BOOT_ANNOTATION) or ""
    if report_boot and (report_boot == replaced_boot or (boot and report_boot != boot)):
        return (f"node {n.metadata.name} was replaced ({ann[c.REPLACED_ANNOTATION]}, boot {replaced_boot or 'unknown'}) "
                f"and the report comes from boot {report_boot}, not the kubelet's {boot or '(none)'}: "
                "reports from its old host start nothing")
    if boot and replaced_boot and boot != replaced_boot:
        return None
    return (f"node {n.metadata.name} was replaced ({ann[c.REPLACED_ANNOTATION]}, boot {replaced_boot or 'unknown'}): "
            "reports from its old host start nothing")
