"""Pods on a failing node: failure attribution (which pods the fault touched) and the drain
(a notice with a deadline, then evictions that respect PodDisruptionBudgets)."""

from __future__ import annotations

import asyncio
import time
from datetime import datetime, timedelta

from kubernetes import client
from kubernetes.client.rest import ApiException
from temporalio import activity

import api as c
from activities.kube_client import KubeClient, now_utc

ATTRIBUTION_ANNOTATION = "gpuheal.io/failure-attribution"
FAULT_ANNOTATION = "gpuheal.io/fault"
DRAIN_DEADLINE_ANNOTATION = "gpuheal.io/drain-deadline"
DRAIN_EPISODE_ANNOTATION = "gpuheal.io/drain-episode"  # whose notice the deadline is
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
GONE_SLACK = timedelta(seconds=5)  # past a pod's deletionTimestamp before it counts as lingering


class PodActivities(KubeClient):
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
                leaving = [p for p in present if p.metadata.deletion_timestamp + GONE_SLACK > now_utc()]
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
        deadline = now_utc() + timedelta(seconds=req.checkpoint_grace_s)
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
        wait = (datetime.fromisoformat(latest) - now_utc()).total_seconds()
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
