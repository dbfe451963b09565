"""The policy a workflow acts on is the controller's, taken through a local activity (recorded in
the history, so replay sees the same one), never the one a sender put in the start input."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from activities import contracts as c

# workflow.patched id: histories from before took the policy from their input.
PATCH_CONTROLLER_POLICY = "controller-policy"


def controller_policy_applies() -> bool:
    return workflow.patched(PATCH_CONTROLLER_POLICY)


async def take_controller_policy(node: str) -> c.PolicySnapshot:
    return await workflow.execute_local_activity(
        c.POLICY_CURRENT, c.PolicyRequest(node=node), result_type=c.PolicySnapshot,
        start_to_close_timeout=timedelta(seconds=10), retry_policy=RetryPolicy(maximum_interval=timedelta(seconds=10)))



def ignored_fields(inp, trusted: dict) -> list[str]:
    """The start input's fields a sender set that the workflow replaces with its own: said in the history."""
    return [k for k, v in trusted.items() if getattr(inp, k) is not None and getattr(inp, k) != v]
