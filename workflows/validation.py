"""Validate twice with a soak between: the gate before any node takes work (remediated or new)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    import api as c
    from policies.load import describe
    from policies.model import ValidationPolicy
    from workflows.calls import agent_gone, call, call_or_none

# Called with (step, summary, ok, detail) so the caller keeps its own action log.
Recorder = Callable[[str, str, bool, str], None]


class AgentMissing(Exception):
    """No agent picked a node-local task up within its schedule-to-start timeout."""


# How a validation whose activity failed is recorded: it found nothing about the node (rungs.py reads it).
COULD_NOT_RUN = "could not run"


async def validate_once(node: str, policy: ValidationPolicy, expected_gpus: int | None, label: str,
                        record: Recorder, dry_run: bool = False, strict_agent: bool = False,
                        tier: str | None = None, found: list | None = None, *, queue: str) -> bool:
    """Whether the node passed; with `strict_agent`, an agent that never picked the run up raises
    AgentMissing instead of counting as a failed validation. With a `tier` the node is load-tested, judged against its SKU's fleet figures, and the figures are ledgered;
    `found` collects the findings of a failed run."""
    # The activity's summary says what is asked for; the step record says what actually ran.
    dcgm = f"dcgm r{policy.dcgm_level}" if policy.dcgm_required else f"dcgm r{policy.dcgm_level} where installed"
    summary = f"validate {node} ({label}): fresh probes, {dcgm}"
    extra, timeout = {}, policy.timeout
    if tier is not None:
        summary = f"validate {node} ({label}): fresh probes + {tier} load test"
        refs = await call_or_none(lambda why: record("baseline", f"SKU figures for {node}", False,
                                                     f"{why}: judged against the shipped floors"),
                                  c.LEDGER_BASELINE, c.BaselineRequest(), c.BaselineResult,
                                  summary=f"SKU figures to judge {node} against", timeout=timedelta(minutes=1),
                                  attempts=3)
        extra = {"tier": tier, "load": policy.load, "references": refs.references if refs else {}}
        timeout = max(timeout, policy.load.tier(tier).time_limit + timedelta(minutes=2))
    try:
        # A dead agent never picks the task up: that is a failed validation (or AgentMissing), not a hang.
        result = await call(
            c.NODE_VALIDATE,
            c.ValidateRequest(node=node, dcgm_level=policy.dcgm_level, dcgm_required=policy.dcgm_required,
                              expected_gpus=expected_gpus, dry_run=dry_run, **extra),
            c.ValidationResult, summary=summary, timeout=timeout, attempts=2,
            task_queue=queue, schedule_to_start=policy.agent_timeout)
    except ActivityError as err:
        if strict_agent and agent_gone(err):
            record("validate", summary, False, f"agent_missing: no agent polled {queue} "
                                               f"within {policy.agent_timeout}")
            raise AgentMissing(node) from None
        record("validate", summary, False, f"{COULD_NOT_RUN}: {err.cause or err}")
        return False
    if found is not None:
        found += result.findings
    detail = "passed" if result.passed else "failed: " + ", ".join(f.label() for f in result.findings)
    if result.load is not None:
        # Each finding names its GPU and test; the figures go to history here and to the ledger below.
        detail += "\n" + "\n".join([f.message for f in result.findings if f.gpu_index is not None][:16]
                                     + [describe(result.load)])
    elif tier is not None and not result.passed:
        detail += "\n" + "\n".join(f.message for f in result.findings[:16])
    ran = f"validate {node} ({label}): {', '.join(result.checks) or 'nothing ran'}"
    record("validate", ran, result.passed, detail)
    if result.load is not None and result.load.gpus:
        info = workflow.info()
        await call_or_none(lambda why: record("figures", f"record {node}'s load figures", False, why),
                           c.LEDGER_LOAD_FIGURES, c.LoadFiguresRecord(
                               node=node, episode=f"{info.workflow_id}/{info.run_id}", tier=result.load.tier,
                               at=workflow.now(), gpus=result.load.gpus),
                           None, summary=f"record {node}'s load figures in the ledger", timeout=timedelta(minutes=1),
                           attempts=5)
    return result.passed


async def validate_twice(node: str, policy: ValidationPolicy, expected_gpus: int | None, record: Recorder,
                         dry_run: bool = False, strict_agent: bool = False,
                         tiers: tuple[str, str] | tuple[None, None] = (None, None), *, queue: str) -> int:
    """Returns how many validations passed: 2 means the node may take work. `tiers`: the load-test
    tier of each (quick then repair after a rung, admission then repair for a new node)."""
    if not await validate_once(node, policy, expected_gpus, "1 of 2", record, dry_run, strict_agent, tiers[0],
                               queue=queue):
        return 0
    await workflow.sleep(max(policy.soak, timedelta(milliseconds=1)),
                         summary=f"soak {node} before the second validation")
    if not await validate_once(node, policy, expected_gpus, "2 of 2", record, dry_run, strict_agent, tiers[1],
                               queue=queue):
        return 1
    return 2
