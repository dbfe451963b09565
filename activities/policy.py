"""The controller's policy, handed to workflows through an activity: whoever sends a report or
starts an episode cannot choose it (the episode's input carries no policy)."""

from __future__ import annotations

import hashlib
import json

from temporalio import activity

import api as c
from policies.model import Policy


def policy_hash(policy: Policy) -> str:
    """sha256 of the policy's canonical JSON (sorted keys), so one file gives one hash everywhere."""
    text = json.dumps(policy.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


class PolicyActivities:
    def __init__(self, policy: Policy, source: str, cluster: str):
        self.snapshot = c.PolicySnapshot(name=policy.name, sha256=policy_hash(policy), source=source, policy=policy,
                                         cluster=cluster)

    @activity.defn(name=c.POLICY_CURRENT)
    async def current(self, req: c.PolicyRequest) -> c.PolicySnapshot:
        return self.snapshot
