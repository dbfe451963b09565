"""Kubernetes side effects on the Node: cordon and taint, return to service, conditions, events,
the checks an episode and the guard make. Pods: activities/kube_pods.py; the API: kube_client.py."""

from __future__ import annotations

import json

from kubernetes import client
from kubernetes.client.rest import ApiException
from temporalio import activity

import api as c
from activities.errors import NO_EFFECT, fail
from activities.kube_client import call_api, now_utc
from activities.kube_pods import PodActivities

# Annotations recording what a quarantine changed, one per gpuheal taint (named like the taint).
QUARANTINE_RECORD_KEYS = (c.QUARANTINE_TAINT, c.UNVALIDATED_TAINT)


class KubeActivities(PodActivities):
    """Every kube activity the controller registers (the pods' from PodActivities)."""

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
                    {"was_unschedulable": was, "taint": taint, "at": now_utc().isoformat()})}}
            return patch

        if req.dry_run:
            await self._node(req.node)
            return c.QuarantineResult(node=req.node, changed=False, cordoned_at=now_utc(), dry_run=True)
        n, wrote = await self._rewrite_node(req.node, change)
        # The PATCH answer (or the read) is the stored object: it is what verifies the cordon stuck.
        if not (n.spec.unschedulable and self._has_taint(n, req.taint_key)):
            raise fail(NO_EFFECT, f"cordon of {req.node} did not stick")
        cordoned_at = now_utc()
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
                n = None
            else:
                self._raise_mapped("get", f"nodes/{req.node}", err)
        return await self.node_check(req, n)

    async def node_check(self, req: c.NodeCheckRequest, n: client.V1Node | None) -> c.NodeCheckResult:
        """`check_node`'s answer on a Node already read (None: not found); `policy.current` answers it
        from its own read (activities/node_profile.py)."""
        if n is None:
            return c.NodeCheckResult(exists=False, ours=False, reason=f"node {req.node} does not exist")
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
