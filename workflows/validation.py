"""Validate twice with a soak between: the gate before any node takes work (remediated or new)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from activities import contracts as c
    from policies.model import ValidationPolicy
    from workflows.calls import agent_gone, call

# Called with (step, summary, ok, detail) so the caller keeps its own action log.
Recorder = Callable[[str, str, bool, str], None]


class AgentMissing(Exception):
    """No agent picked a node-local task up within its schedule-to-start timeout."""


async def validate_once(node: str, policy: ValidationPolicy, expected_gpus: int | None, label: str,
                        record: Recorder, dry_run: bool = False, strict_agent: bool = False) -> bool:
    """Whether the node passed; with `strict_agent`, an agent that never picked the run up raises
    AgentMissing instead of counting as a failed validation."""
    summary = f"validate {node} ({label}): fresh probes + dcgm r{policy.dcgm_level}"
    try:
        # A dead agent never picks the task up: that is a failed validation (or AgentMissing), not a hang.
        result = await call(
            c.NODE_VALIDATE,
            c.ValidateRequest(node=node, dcgm_level=policy.dcgm_level, dcgm_required=policy.dcgm_required,
                              expected_gpus=expected_gpus, dry_run=dry_run),
            c.ValidationResult, summary=summary, timeout=policy.timeout, attempts=2,
            task_queue=c.node_task_queue(node), schedule_to_start=policy.agent_timeout)
    except ActivityError as err:
        if strict_agent and agent_gone(err):
            record("validate", summary, False, f"agent_missing: no agent polled {c.node_task_queue(node)} "
                                               f"within {policy.agent_timeout}")
            raise AgentMissing(node) from None
        record("validate", summary, False, f"could not run: {err.cause or err}")
        return False
    detail = "passed" if result.passed else "failed: " + ", ".join(f.label() for f in result.findings)
    record("validate", summary, result.passed, f"{detail} ({', '.join(result.checks)})")
    return result.passed


async def validate_twice(node: str, policy: ValidationPolicy, expected_gpus: int | None, record: Recorder,
                         dry_run: bool = False, strict_agent: bool = False) -> int:
    """Returns how many validations passed: 2 means the node may take work."""
    if not await validate_once(node, policy, expected_gpus, "1 of 2", record, dry_run, strict_agent):
        return 0
    await workflow.sleep(max(policy.soak, timedelta(milliseconds=1)),
                         summary=f"soak {node} before the second validation")
    if not await validate_once(node, policy, expected_gpus, "2 of 2", record, dry_run, strict_agent):
        return 1
    return 2
