"""The test fleet's ledger (sim/memory_ledger.py, with an episode's close held on demand) and the
controller's policy as the test set it."""

from __future__ import annotations

from temporalio import activity

import api as c
from activities.policy import PolicyActivities
from sim.memory_ledger import MemoryLedger


class FakeLedger(MemoryLedger):
    """Mixed into FakeFleet, which holds the records, the denylist and the admitted hardware."""

    async def _before_record(self, rec: c.RemediationRecord) -> None:
        if self.record_hold is not None:  # the episode is closing: tests send reports meanwhile
            self.record_started.set()
            await self.record_hold.wait()

    @activity.defn(name=c.POLICY_CURRENT)
    async def current_policy(self, req: c.PolicyRequest) -> c.PolicySnapshot:
        """The controller's policy: whatever the test set on the fleet, read at each episode's start."""
        policy = self.policy
        if self.history_limit is not None:  # the limit is the controller's policy's, never a sender's
            policy = policy.model_copy(update={"history_limit": self.history_limit})
        return await self._with_node_check(PolicyActivities(policy, "test", self.cluster).snapshot, req)

    async def _with_node_check(self, snap: c.PolicySnapshot, req: c.PolicyRequest) -> c.PolicySnapshot:
        """As the controller's policy.current (activities/node_profile.py): asked with `check`, it
        answers what kube.check_node would from its own read of the Node. Where that read fails (a
        kube.check_node failure injected: one API server fails both), it says nothing, and the
        episode asks kube.check_node itself. Nothing is recorded as a call: the read changes nothing."""
        if not req.check:
            return snap
        n = self.nodes.get(req.node)
        failing = n is not None and n.exists and "kube.check_node" in n.fail
        return snap.model_copy(update={"node_check": None if failing else self._checked(req.node, req.boot_id)})
