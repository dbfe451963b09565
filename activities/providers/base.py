"""What a provider implements, and the Node reads and writes every provider shares.

A provider is one module: a class with `name`, `can_reboot`, `from_settings`, and `reboot`,
`replace` and `boot_id` (the boot id for a node whose kubelet reports none). Each checks ownership
itself (its own notion: an instance tag, a Machine's cluster label), verifies its effect, and is
idempotent under retry; activities/cloud.py holds the activities and calls it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from kubernetes import client
from kubernetes.client.rest import ApiException
from temporalio.exceptions import ApplicationError

import api as c
from activities.errors import NO_EFFECT, NODE_GONE, fail
from activities.kube_client import call_api


@dataclass
class ProviderSettings:
    """What a provider may need from the controller's flags (each takes what it uses)."""

    cluster: str = "default"  # Cluster API: the Machines' cluster.x-k8s.io/cluster-name must say this
    kubeconfig: str | None = None  # Cluster API: the management cluster's, when the Machines are not beside the Nodes
    boto3_session: Any = None  # AWS: None, boto3's standard lookup
    extra: dict[str, str] = field(default_factory=dict)


class CloudProvider(Protocol):
    name: ClassVar[str]
    can_reboot: ClassVar[bool]

    async def reboot(self, req: c.RebootRequest) -> c.RebootResult: ...

    async def replace(self, req: c.ReplaceRequest) -> c.ReplaceResult: ...

    async def boot_id(self, n: client.V1Node) -> str | None: ...


async def read_node(core: client.CoreV1Api, node: str) -> client.V1Node:
    try:
        return await call_api(core.read_node, node)
    except ApiException as err:
        if err.status == 404:
            raise fail(NODE_GONE, f"node {node} not found") from None
        raise


def kubelet_boot_id(n: client.V1Node) -> str | None:
    """The boot id the kubelet reports: a reboot moves it on (Ready or not proves nothing)."""
    return n.status.node_info.boot_id if n.status and n.status.node_info else None


async def mark_replaced(core: client.CoreV1Api, node: str, by: str) -> bool:
    """Annotates the Node replaced, with the kubelet's boot id of the host going away: reports from
    that host start nothing (kube.check_node). Verified on the answer; a Node already gone is fine."""
    try:
        n = await read_node(core, node)
    except ApplicationError:
        return False  # NodeGone: no Node, no reports to tell apart
    ann = {c.REPLACED_ANNOTATION: by[:253], c.REPLACED_BOOT_ANNOTATION: kubelet_boot_id(n) or ""}
    try:
        after = await call_api(core.patch_node, node, {"metadata": {"annotations": ann}})
    except ApiException as err:
        if err.status == 404:
            return False
        raise
    if any((after.metadata.annotations or {}).get(k) != v for k, v in ann.items()):
        raise fail(NO_EFFECT, f"node {node}: replaced annotation did not stick")
    return True
