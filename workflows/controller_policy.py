"""The policy a workflow acts on is the controller's, taken through a local activity (recorded in
the history, so replay sees the same one), never the one a sender put in the start input."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    import api as c
    from workflows.calls import call

async def take_controller_policy(node: str, check: bool = False, boot_id: str | None = None) -> c.PolicySnapshot:
    """Retried until the controller answers: an episode must not act on a policy it was not given.
    `check`: the node checked as well, from the same read (the answer's `node_check`)."""
    return await call(c.POLICY_CURRENT, c.PolicyRequest(node=node, check=check, boot_id=boot_id), c.PolicySnapshot,
                      summary="the controller's policy",
                      timeout=timedelta(seconds=10), max_interval=timedelta(seconds=10), local=True)


def policy_taken(snap: c.PolicySnapshot, ignored: list[str]) -> tuple[str, bool, str]:
    """The step record (summary, ok, detail) of a policy taken from the controller."""
    return (f"policy {snap.name} ({snap.sha256[:12]}) from the controller", True,
            f"ignored what the start input set: {', '.join(ignored)}" if ignored else "")


def ignored_fields(inp, trusted: dict) -> list[str]:
    """The start input's fields a sender set that the workflow replaces with its own: said in the history."""
    return [k for k, v in trusted.items() if getattr(inp, k) is not None and getattr(inp, k) != v]
