"""The Cluster API provider: a node's Machine (cluster.x-k8s.io/v1beta1) is found from the
annotations Cluster API sets on its Node; replace deletes the Machine, and the MachineSet that owns
it creates a new one. Cluster API has no reboot, so `can_reboot` is False.

Ownership: the Machine's `cluster.x-k8s.io/cluster-name` label must name the controller's cluster,
its `status.nodeRef` must name this node (an annotation alone is not trusted), and a MachineSet
must own it (a Machine nothing owns would not come back: deleting it is no replacement). Control
plane Machines are never touched."""

from __future__ import annotations

from kubernetes import client
from kubernetes.client.rest import ApiException
from temporalio.exceptions import ApplicationError

import api as c
from activities.errors import NO_EFFECT, NODE_GONE, NOT_OWNED, fail
from activities.kube_client import call_api
from activities.providers.base import ProviderSettings, mark_replaced, read_node

GROUP, VERSION, PLURAL = "cluster.x-k8s.io", "v1beta1", "machines"
MACHINE_ANNOTATION = "cluster.x-k8s.io/machine"  # on the Node: its Machine's name
NAMESPACE_ANNOTATION = "cluster.x-k8s.io/cluster-namespace"  # on the Node: the Machine's namespace
CLUSTER_LABEL = "cluster.x-k8s.io/cluster-name"  # on the Machine
CONTROL_PLANE_LABEL = "cluster.x-k8s.io/control-plane"


class ClusterApiProvider:
    name = "clusterapi"
    can_reboot = False

    def __init__(self, core: client.CoreV1Api, cluster: str, machines: client.ApiClient | None = None):
        """`core`: the workload cluster's API (the Nodes); `machines`: the management cluster's,
        where the Machines are (None: the same API, a self-hosted cluster)."""
        self.core, self.cluster = core, cluster
        self.custom = client.CustomObjectsApi(machines or core.api_client)

    @classmethod
    def from_settings(cls, core: client.CoreV1Api, settings: ProviderSettings) -> ClusterApiProvider:
        from activities.kube_client import load_core_api

        machines = load_core_api(settings.kubeconfig).api_client if settings.kubeconfig else None
        return cls(core, settings.cluster, machines)

    async def _machine_of(self, node: str) -> tuple[str, str, dict | None]:
        """(namespace, name, the Machine or None when it is gone), checked to be ours."""
        n = await read_node(self.core, node)
        ann = n.metadata.annotations or {}
        name, ns = ann.get(MACHINE_ANNOTATION), ann.get(NAMESPACE_ANNOTATION)
        if not name or not ns:
            raise fail(NOT_OWNED, f"node {node} has no {MACHINE_ANNOTATION} and {NAMESPACE_ANNOTATION} annotations: "
                       "not a Cluster API machine")
        try:
            machine = await call_api(self.custom.get_namespaced_custom_object, GROUP, VERSION, ns, PLURAL, name)
        except ApiException as err:
            if err.status == 404:
                return ns, name, None
            raise
        meta, status = machine.get("metadata") or {}, machine.get("status") or {}
        labels = meta.get("labels") or {}
        where = f"Machine {ns}/{name}"
        if labels.get(CLUSTER_LABEL) != self.cluster:
            raise fail(NOT_OWNED, f"{where} is in cluster {labels.get(CLUSTER_LABEL)!r}, not {self.cluster!r}: "
                       "gpuheal does not touch it")
        if CONTROL_PLANE_LABEL in labels:
            raise fail(NOT_OWNED, f"{where} is a control-plane machine: gpuheal does not replace it")
        if ((status.get("nodeRef") or {}).get("name")) != node:
            raise fail(NOT_OWNED, f"{where} names node {(status.get('nodeRef') or {}).get('name')!r}, not {node}: "
                       "the annotation is not trusted alone")
        ref_uid = (status.get("nodeRef") or {}).get("uid")
        if ref_uid and ref_uid != n.metadata.uid:
            # A kubelet may edit its own Node's annotations; the uid Cluster API recorded it cannot.
            raise fail(NOT_OWNED, f"{where}'s nodeRef is Node uid {ref_uid}, not {node}'s ({n.metadata.uid}): "
                       "another Node of that name")
        if not any(o.get("kind") == "MachineSet" for o in meta.get("ownerReferences") or []):
            raise fail(NOT_OWNED, f"{where} has no MachineSet owner: deleting it would bring no replacement")
        return ns, name, machine

    async def replace(self, req: c.ReplaceRequest) -> c.ReplaceResult:
        try:
            ns, name, machine = await self._machine_of(req.node)
        except ApplicationError as err:
            if err.type != NODE_GONE:
                raise
            # A retry after Cluster API drained and deleted the Node: the replacement is under way or done.
            return c.ReplaceResult(instance_id=f"(node {req.node} gone)", action="already_terminated")
        if machine is None:
            return c.ReplaceResult(instance_id=f"{ns}/{name}", action="already_terminated")
        if req.dry_run:
            return c.ReplaceResult(instance_id=f"{ns}/{name}", action="dry_run")
        if "deletionTimestamp" not in machine["metadata"]:
            try:
                await call_api(self.custom.delete_namespaced_custom_object, GROUP, VERSION, ns, PLURAL, name)
            except ApiException as err:
                if err.status != 404:
                    raise  # nothing marked: a refused delete leaves the node's reports counting
        # Marked once the delete took (a retry marks it if this failed): Cluster API drains before it
        # deletes the Node, and the old host's reports meanwhile must start nothing.
        marked = await mark_replaced(self.core, req.node, req.idempotency_key)
        try:
            after = await call_api(self.custom.get_namespaced_custom_object, GROUP, VERSION, ns, PLURAL, name)
        except ApiException as err:
            if err.status != 404:
                raise
            after = None
        if after is not None and "deletionTimestamp" not in (after.get("metadata") or {}):
            raise fail(NO_EFFECT, f"Machine {ns}/{name} not being deleted after the delete")
        return c.ReplaceResult(instance_id=f"{ns}/{name}", action="machine_deleted", marked=marked)

    async def reboot(self, req: c.RebootRequest) -> c.RebootResult:
        raise NotImplementedError("Cluster API has no reboot (can_reboot is False)")

    async def boot_id(self, n: client.V1Node) -> str | None:
        return None  # only the kubelet's: Cluster API has no way onto the machine
