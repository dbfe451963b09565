"""Node profiles on the controller's side: which profile a node gets (from its labels), the policy
as it applies to that node, and the node's baseline kept in its `gpuheal.io/baseline` annotation."""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError
from temporalio import activity

import api as c
from activities.errors import NODE_GONE, fail
from activities.kube_client import call_api
from activities.policy import PolicyActivities, policy_hash
from policies.baseline import BASELINE_ANNOTATION, NodeBaseline, NodeExpectations
from policies.profiles import for_node, select_profile

log = logging.getLogger("gpuheal.profiles")


def read_baseline(annotations: dict | None) -> NodeBaseline | None:
    """The node's baseline; an annotation someone garbled is ignored (and said), never trusted."""
    text = (annotations or {}).get(BASELINE_ANNOTATION)
    if not text:
        return None
    try:
        return NodeBaseline.model_validate_json(text)
    except ValidationError as err:
        log.warning("ignoring a malformed %s annotation: %s", BASELINE_ANNOTATION, err.errors()[0]["msg"])
        return None


class NodeProfileActivities(PolicyActivities):
    """The controller's policy, resolved per node: `policy.current` answers with the node's profile
    applied (its ladder, finding rungs and mode), so an episode acts as the node's kind asks."""

    def __init__(self, core, policy, source: str = "default", cluster: str | None = None, kube=None):
        super().__init__(policy, source, cluster)
        self.core, self.policy = core, policy
        self.kube = kube  # KubeActivities: answers `check` from the same read (None: not answered)

    async def _node(self, name: str):
        try:
            return await call_api(self.core.read_node, name)
        except ApiException as err:
            if err.status == 404:
                return None
            raise

    @activity.defn(name=c.POLICY_CURRENT)
    async def current(self, req: c.PolicyRequest) -> c.PolicySnapshot:
        checking = req.check and bool(req.node) and self.kube is not None
        if not req.node or not (self.policy.profiles or checking):
            return self.snapshot
        try:
            node = await self._node(req.node)
        except ApiException:
            if self.policy.profiles:
                raise
            return self.snapshot  # not checked: the episode asks `kube.check_node`, which says what failed
        # One read for both: the check is what `kube.check_node` would answer on this Node. One the
        # API cannot finish (its selector listing) is left to `kube.check_node`, whose failure holds
        # the node for a person; the policy itself never fails for it.
        check = None
        if checking:
            try:
                check = await self.kube.node_check(c.NodeCheckRequest(node=req.node, boot_id=req.boot_id), node)
            except Exception as err:  # noqa: BLE001 - any failure: the episode checks on its own
                log.info("node check for %s left to kube.check_node: %s", req.node, err)
        if node is None or not self.policy.profiles:  # not there (the episode rejects it): the policy as written
            return self.snapshot.model_copy(update={"node_check": check})
        sel = select_profile(self.policy, node.metadata.labels or {}, req.node)
        policy = for_node(self.policy, sel.profile)
        return c.PolicySnapshot(name=policy.name, sha256=policy_hash(policy), source=self.snapshot.source,
                                policy=policy, profile=sel.profile, profile_reason=sel.reason,
                                cluster=self.snapshot.cluster, node_check=check)

    @activity.defn(name=c.PROFILE_EXPECTATIONS)
    async def expectations(self, req: c.ExpectationsRequest) -> NodeExpectations:
        """What the node's agent must expect: its profile and baseline. A node without a baseline gets
        the one its agent observed on a healthy cycle, marked learned, not validated."""
        for _ in range(5):
            node = await self._node(req.node)
            if node is None:
                raise fail(NODE_GONE, f"nodes/{req.node} not found")
            sel = select_profile(self.policy, node.metadata.labels or {}, req.node)
            baseline, recorded = read_baseline(node.metadata.annotations), ""
            if baseline is None and req.observed is not None:
                baseline = NodeBaseline(**req.observed.model_dump(), learned_at=datetime.now(UTC), validated=False,
                                        boot_id=req.boot_id[:64])
                if not await self._write(req.node, baseline, node.metadata.resource_version):
                    continue  # the node changed under us (admission may have just recorded one): read again
                recorded = f"learned baseline recorded (not validated): {baseline.summary()}"
            return NodeExpectations(node=req.node, profile_name=sel.profile, reason=sel.reason,
                                    profile=self.policy.profiles.get(sel.profile) if sel.profile else None,
                                    baseline=baseline, recorded=recorded)
        raise RuntimeError(f"nodes/{req.node} kept changing while its baseline was recorded")

    @activity.defn(name=c.PROFILE_RECORD_BASELINE)
    async def record_baseline(self, req: c.RecordBaselineRequest) -> NodeBaseline:
        """At admission: what the node had when it passed validation twice. Verified by reading back."""
        baseline = NodeBaseline(**req.inventory.model_dump(), learned_at=datetime.now(UTC), validated=req.validated,
                                boot_id=req.boot_id[:64])
        if req.dry_run:
            return baseline
        await self._write(req.node, baseline, None)
        node = await self._node(req.node)
        kept = read_baseline(node.metadata.annotations if node else None)
        if kept is None or kept.model_dump(exclude={"learned_at"}) != baseline.model_dump(exclude={"learned_at"}):
            raise RuntimeError(f"the {BASELINE_ANNOTATION} annotation on {req.node} did not take")
        return kept

    async def _write(self, node: str, baseline: NodeBaseline, resource_version: str | None) -> bool:
        """Patch the annotation; with a resource version, only onto that version (False on conflict)."""
        meta: dict = {"annotations": {BASELINE_ANNOTATION: baseline.model_dump_json()}}
        if resource_version:
            meta["resourceVersion"] = resource_version
        try:
            await call_api(self.core.patch_node, node, {"metadata": meta})
        except ApiException as err:
            if err.status == 409 and resource_version:
                return False
            if err.status == 404:
                raise fail(NODE_GONE, f"nodes/{node} not found") from None
            raise
        return True
