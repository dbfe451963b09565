"""NodeAdmission, id `admit/<node>`: a new node stays tainted until its hardware passes twice."""

from __future__ import annotations

from datetime import timedelta

from pydantic import BaseModel, Field
from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from activities import contracts as c
    from policies.model import Policy
    from workflows.calls import call
    from workflows.controller_policy import (
        controller_policy_applies,
        ignored_fields,
        policy_taken,
        take_controller_policy,
    )
    from workflows.remediation_types import PATCH_NODE_PROFILES, ActionRecord, Outcome
    from workflows.validation import PATCH_LOAD_VALIDATION, validate_twice


class AdmissionInput(BaseModel):
    """The agent starts admission: the policy is the controller's (histories from before carry one here)."""

    node: str
    policy: Policy | None = None
    hardware_ids: list[str] = Field(description="GPU UUIDs and serials, the instance host id: checked against the denylist.")
    expected_gpus: int | None = None


class AdmissionResult(BaseModel):
    node: str
    outcome: Outcome
    reason: str
    validations: int
    actions: list[ActionRecord]


@workflow.defn(name=c.ADMISSION_WORKFLOW)
class NodeAdmission:
    @workflow.init
    def __init__(self, inp: AdmissionInput) -> None:
        self.inp = inp
        self.actions: list[ActionRecord] = []

    @workflow.query
    def actions_so_far(self) -> list[ActionRecord]:
        return self.actions

    @workflow.run
    async def run(self, inp: AdmissionInput) -> AdmissionResult:
        profiles = workflow.patched(PATCH_NODE_PROFILES)  # decided before the first local activity
        load = workflow.patched(PATCH_LOAD_VALIDATION)  # before the first local activity
        if controller_policy_applies():
            snap = await take_controller_policy(inp.node)
            trusted = {"policy": snap.policy, "expected_gpus": None}
            ignored = ignored_fields(inp, trusted)
            inp = self.inp = inp.model_copy(update=trusted)
            self._record("policy", *policy_taken(snap, ignored))
        if profiles and inp.policy.observe:
            # Observe mode never cordons: the node is validated and its baseline recorded, untainted.
            inp = self.inp = inp.model_copy(update={"policy": inp.policy.model_copy(update={"dry_run": True})})
        await self._step(c.KUBE_QUARANTINE, c.QuarantineRequest(
            node=inp.node, fault_class="unvalidated", reason="new node: validation pending",
            taint_key=c.UNVALIDATED_TAINT, dry_run=inp.policy.dry_run), f"taint {inp.node} unvalidated")
        denied = await self._step(c.LEDGER_CHECK_DENIED, c.CheckDeniedRequest(hardware_ids=inp.hardware_ids),
                                  f"check {inp.node}'s hardware against the denylist", c.CheckDeniedResult)
        if denied.denied:
            hw, why = sorted(denied.denied.items())[0]
            reason = f"hardware {hw} is denylisted ({why})"
            await self._step(c.KUBE_EVENT, c.EventRequest(node=inp.node, reason="GpuHardwareDenied", type="Warning",
                                                          message=reason, dry_run=inp.policy.dry_run),
                             f"warn: {inp.node} carries denylisted hardware {hw}")
            await self._step(c.CLOUD_REPLACE, c.ReplaceRequest(
                node=inp.node, idempotency_key=f"{workflow.info().workflow_id}/{workflow.info().run_id}/replace",
                mode=inp.policy.replacement, ownership_tag=inp.policy.ownership_tag, dry_run=inp.policy.dry_run),
                f"replace {inp.node}: {reason}", c.ReplaceResult)
            return self._result(Outcome.DENIED_ADMISSION, reason, 0)
        passed = await validate_twice(inp.node, inp.policy.validation, inp.expected_gpus, self._record,
                                      inp.policy.dry_run, tiers=("admission", "repair") if load else (None, None))
        if passed < 2:
            return self._result(Outcome.QUARANTINED, f"validation {passed + 1} of 2 failed: node stays tainted", passed)
        if profiles:
            await self._record_baseline(inp)
        await self._step(c.KUBE_RETURN_TO_SERVICE, c.ReturnToServiceRequest(
            node=inp.node, reason="admitted: validated twice", taint_keys=[c.UNVALIDATED_TAINT],
            dry_run=inp.policy.dry_run), f"admit {inp.node}: remove the unvalidated taint")
        return self._result(Outcome.HEALTHY, "validated twice; admitted", passed)

    async def _record_baseline(self, inp: AdmissionInput) -> None:
        """What the node has now, having passed twice, is its baseline: fewer or slower links later
        are findings even where no profile names a number. Best effort: admission does not hang on it."""
        summary = f"record {inp.node}'s baseline (what it has, validated)"
        try:
            inv = await call(c.NODE_INVENTORY, c.InventoryRequest(node=inp.node), c.InventoryResult,
                             summary=f"inventory of {inp.node}", timeout=timedelta(minutes=2), attempts=3,
                             task_queue=c.node_task_queue(inp.node), schedule_to_start=inp.policy.validation.agent_timeout)
            if inv.inventory is None or inv.findings:
                why = ", ".join(f.label() for f in inv.findings) or "a probe could not read it"
                return self._record("baseline", summary, False, f"not recorded: {why}")
            await call(c.PROFILE_RECORD_BASELINE, c.RecordBaselineRequest(
                node=inp.node, inventory=inv.inventory, validated=True, dry_run=inp.policy.dry_run and not inp.policy.observe),
                summary=summary, timeout=timedelta(seconds=30), attempts=5, max_interval=timedelta(seconds=10))
        except ActivityError as err:
            return self._record("baseline", summary, False, f"not recorded: {err.cause or err}")
        self._record("baseline", summary, True, inv.inventory.summary())

    async def _step(self, name: str, req: BaseModel, summary: str, result_type: type | None = None):
        """A step that fails after its retries fails the admission: the node keeps its unvalidated
        taint (fail closed) and the failed workflow, with its cause, is what a person sees."""
        result = await call(name, req, result_type, summary=summary, timeout=timedelta(minutes=2), attempts=10,
                            max_interval=timedelta(seconds=30))
        self._record(name, summary, True)
        return result

    def _record(self, step: str, summary: str, ok: bool, detail: str = "") -> None:
        self.actions.append(ActionRecord(at=workflow.now(), step=step, summary=summary, ok=ok, detail=detail))
        workflow.set_current_details("\n".join(f"- {'ok' if a.ok else 'FAILED'} {a.summary}" for a in self.actions[-8:]))

    def _result(self, outcome: Outcome, reason: str, validations: int) -> AdmissionResult:
        return AdmissionResult(node=self.inp.node, outcome=outcome, reason=reason, validations=validations,
                               actions=self.actions)
