"""NodeAdmission, id `admit/<cluster>/<node>`: a new node stays tainted until its hardware passes twice."""

from __future__ import annotations

from datetime import timedelta

from pydantic import BaseModel
from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    import api as c
    from api.admission import AdmissionInput, AdmissionResult
    from api.episode import ActionRecord, Outcome
    from api.guard import LeaseGrant, LeaseRelease, LeaseRequest
    from api.names import GUARD_SIGNAL_RELEASE, GUARD_SIGNAL_REQUEST, HOLDER_SIGNAL_GRANTED
    from policies.model import Policy
    from workflows.calls import call, cause
    from workflows.controller_policy import ignored_fields, policy_taken, take_controller_policy
    from workflows.validation import validate_twice


@workflow.defn(name=c.ADMISSION_WORKFLOW)
class NodeAdmission:
    @workflow.init
    def __init__(self, inp: AdmissionInput) -> None:
        self.inp = inp
        self.actions: list[ActionRecord] = []
        self.granted = False
        self.awaiting_approval = False
        self.approved_by: str | None = None

    @workflow.query
    def actions_so_far(self) -> list[ActionRecord]:
        return self.actions

    @workflow.signal(name=HOLDER_SIGNAL_GRANTED)
    def lease_granted(self, grant: LeaseGrant) -> None:
        self.granted = True

    @workflow.update
    def approve(self, by: str = "") -> list[ActionRecord]:
        """An operator approves replacing a node whose hardware is denylisted (recorded with who)."""
        self.approved_by = by[:200]
        self._record("operator", f"approve by {self.approved_by}", True, "replace")
        return self.actions

    @approve.validator
    def _validate_approve(self, by: str = "") -> None:
        if not self.awaiting_approval:
            raise ValueError("nothing awaits approval")
        if not by:
            raise ValueError("say who approves")

    @workflow.run
    async def run(self, inp: AdmissionInput) -> AdmissionResult:
        # Trust no starter: the policy is the controller's, the node the workflow id's, and its
        # hardware ids come from its own agent (issue 22: 3).
        snap = await take_controller_policy(inp.node)
        trusted = {"policy": snap.policy, "expected_gpus": None,
                   "node": c.node_in_workflow_id(workflow.info().workflow_id, "admit") or inp.node, "hardware_ids": []}
        ignored = ignored_fields(inp, trusted)
        inp = self.inp = inp.model_copy(update=trusted)
        self._record("policy", *policy_taken(snap, ignored))
        if inp.policy.observe:
            # Observe mode never cordons: the node is validated and its baseline recorded, untainted.
            inp = self.inp = inp.model_copy(update={"policy": inp.policy.model_copy(update={"dry_run": True})})
        served = snap.cluster or "default"
        named = c.cluster_in_workflow_id(workflow.info().workflow_id, "admit")
        if named is not None and named != served:
            # A second admission of the node beside its real one; legacy ids name no cluster.
            return self._result(Outcome.REJECTED, f"rejected: the admission id names cluster {named}, the "
                                f"controller serves {served}", 0)
        return await self._admit(inp, served)

    async def _admit(self, inp: AdmissionInput, cluster: str) -> AdmissionResult:
        """Admission that trusts no starter: a re-start of an admitted node does nothing, and a replace
        takes approval and a disruption lease like any other."""
        node, p = inp.node, inp.policy
        found = await self._step(c.KUBE_CHECK_NODE, c.NodeCheckRequest(node=node),
                                 f"check {node} is a GPU node of this cluster", c.NodeCheckResult)
        if not (found.exists and found.ours):
            return self._result(Outcome.REJECTED, f"rejected: {found.reason}", 0)
        waited = await self._wait_for_episode_end(node, cluster, p)
        if waited or found.quarantined:
            # Asked again after the episode waited for (it may have replaced the node or left it
            # quarantined for a person: safety soak, seed 669), or with no episode and the taint
            # there (an earlier one's hold, a person's to lift: an episode running at the first check
            # may have returned the node since).
            after = " after its remediation" if waited else ""
            found = await self._step(c.KUBE_CHECK_NODE, c.NodeCheckRequest(node=node), f"check {node} again" + (
                after or f": it carried {c.QUARANTINE_TAINT}"), c.NodeCheckResult)
            if not (found.exists and found.ours):
                return self._result(Outcome.REJECTED, f"rejected{after}: {found.reason}", 0)
            if found.quarantined:
                held = (f"its remediation left {node} quarantined ({found.quarantined}) for a person" if waited else
                        f"{node} carries {c.QUARANTINE_TAINT}={found.quarantined} from an earlier episode: held for a person")
                return self._result(Outcome.QUARANTINED, f"{held}{': ' if waited else ', '}nothing done", 0)
        summary = f"read {node}'s hardware ids from its own agent"
        try:
            hw = await call(c.NODE_HARDWARE_IDS, c.HardwareIdsRequest(node=node), c.HardwareIdsResult, summary=summary,
                            timeout=timedelta(minutes=1), attempts=3, task_queue=self._node_queue(node),
                            schedule_to_start=p.validation.agent_timeout)
        except ActivityError as err:
            self._record(c.NODE_HARDWARE_IDS, summary, False, cause(err))
            return self._result(Outcome.FAILED, f"no hardware ids from {node}'s own agent ({cause(err)}): nothing done", 0)
        self._record(c.NODE_HARDWARE_IDS, summary, True, f"{hw.gpus} GPUs, {len(hw.hardware_ids)} ids")
        before = await self._step(c.LEDGER_ADMITTED, c.AdmittedRequest(node=node),
                                  f"was {node} admitted before", c.AdmittedResult)
        if set(before.hardware_ids) & set(hw.hardware_ids):
            return self._result(Outcome.HEALTHY, f"{node} was admitted before with this hardware: nothing done", 0)
        await self._step(c.KUBE_QUARANTINE, c.QuarantineRequest(
            node=node, fault_class="unvalidated", reason="new node: validation pending",
            taint_key=c.UNVALIDATED_TAINT, dry_run=p.dry_run), f"taint {node} unvalidated")
        denied = await self._step(c.LEDGER_CHECK_DENIED, c.CheckDeniedRequest(hardware_ids=hw.hardware_ids),
                                  f"check {node}'s hardware against the denylist", c.CheckDeniedResult)
        if denied.denied:
            hw_id, why = sorted(denied.denied.items())[0]
            reason = f"hardware {hw_id} is denylisted ({why})"
            await self._step(c.KUBE_EVENT, c.EventRequest(node=node, reason="GpuHardwareDenied", type="Warning",
                                                          message=reason, dry_run=p.dry_run),
                             f"warn: {node} carries denylisted hardware {hw_id}")
            if not await self._replace_approved(node, p):
                return self._result(Outcome.DENIED_ADMISSION, f"{reason}: replace not approved in time; the node "
                                    "stays tainted for a person", 0)
            await self._lease(node, cluster, p)
            await self._step(c.CLOUD_REPLACE, c.ReplaceRequest(
                node=node, idempotency_key=f"{workflow.info().workflow_id}/{workflow.info().run_id}/replace",
                mode=p.replacement, ownership_tag=p.ownership_tag, dry_run=p.dry_run),
                f"replace {node}: {reason}", c.ReplaceResult)
            if not p.dry_run:
                await self._to_guard(cluster, p, GUARD_SIGNAL_RELEASE, LeaseRelease(
                    holder=workflow.info().workflow_id, node=node, outcome="replaced", sent_at=workflow.now()))
            return self._result(Outcome.DENIED_ADMISSION, reason, 0)
        passed = await validate_twice(node, p.validation, inp.expected_gpus, self._record, p.dry_run,
                                      tiers=("admission", "repair"), queue=self._node_queue(node))
        if passed < 2:
            return self._result(Outcome.QUARANTINED, f"validation {passed + 1} of 2 failed: node stays tainted", passed)
        await self._record_baseline(inp)
        await self._step(c.KUBE_RETURN_TO_SERVICE, c.ReturnToServiceRequest(
            node=node, reason="admitted: validated twice", taint_keys=[c.UNVALIDATED_TAINT],
            dry_run=p.dry_run), f"admit {node}: remove the unvalidated taint")
        if not p.dry_run:
            await self._step(c.LEDGER_ADMIT, c.AdmitRequest(node=node, hardware_ids=hw.hardware_ids),
                             f"record {node}'s admission in the ledger")
        return self._result(Outcome.HEALTHY, "validated twice; admitted", passed)

    async def _wait_for_episode_end(self, node: str, cluster: str, p: Policy) -> bool:
        """A remediation episode runs for the node (its first report raced the admission, or the node
        served before gpuheal came): the unvalidated taint and the validation wait until it ends, so
        the two never take the node out of service beside each other past the guard's count."""
        every, waited = p.guard.holder_check_interval, False
        while (episode := await self._episode_running(node, cluster)) is not None:
            if not waited:
                self._record("remediation", f"wait for {episode} to end before admitting {node}", True,
                             "a node under remediation is neither tainted nor validated beside it")
                waited = True
            await workflow.sleep(every, summary=f"wait for {node}'s remediation to end")
            every = min(every * 2, timedelta(hours=1))
        if waited:
            self._record("remediation", f"{node}'s remediation ended: admission goes on", True)
        return waited

    async def _episode_running(self, node: str, cluster: str) -> str | None:
        ids = [c.remediation_workflow_id(node, cluster), c.legacy_remediation_workflow_id(node)]
        found = await call(c.GUARD_RUNNING_HOLDERS, c.LiveHoldersRequest(holders=ids), c.LiveHoldersResult,
                           summary=f"is a remediation of {node} running", timeout=timedelta(minutes=2), attempts=10,
                           max_interval=timedelta(seconds=30))
        return found.running[0] if found.running else None

    async def _replace_approved(self, node: str, p: Policy) -> bool:
        rp = p.ladder.replace
        if not rp.requires_approval:
            return True
        self.awaiting_approval = True
        self._record("approval", f"waiting for approval to replace {node} (update `approve`)", True)
        try:
            await workflow.wait_condition(lambda: self.approved_by is not None, timeout=rp.approval_timeout,
                                          timeout_summary=f"wait for approval to replace {node}")
        except TimeoutError:
            return False
        finally:
            self.awaiting_approval = False
        return True

    async def _lease(self, node: str, cluster: str, p: Policy) -> None:
        """A disruption lease from the cluster's guard, asked again now and then (as episodes do)."""
        if p.dry_run:
            return self._record("lease", f"would take a disruption lease for {node}", True, "dry run")
        request = LeaseRequest(cluster=cluster, holder=workflow.info().workflow_id, node=node)
        while not self.granted:
            await self._to_guard(cluster, p, GUARD_SIGNAL_REQUEST, request)
            try:
                await workflow.wait_condition(lambda: self.granted, timeout=p.guard.holder_check_interval,
                                              timeout_summary=f"{node}'s lease request, re-sent")
            except TimeoutError:
                pass
        self._record("lease", f"disruption lease for {node}", True)

    async def _to_guard(self, cluster: str, p: Policy, signal: str, arg: BaseModel) -> None:
        await call(c.GUARD_SIGNAL, c.GuardSignalRequest(cluster=cluster, guard=p.guard, task_queue=workflow.info().task_queue,
                                                        signal=signal, payload=arg.model_dump(mode="json")),
                   summary=f"{signal} to fleet guard", timeout=timedelta(seconds=30), max_interval=timedelta(seconds=10))

    def _node_queue(self, node: str) -> str:
        return c.agent_queue_of(workflow.info().workflow_id, "admit", node)

    async def _record_baseline(self, inp: AdmissionInput) -> None:
        """What the node has now, having passed twice, is its baseline: fewer or slower links later
        are findings even where no profile names a number. Best effort: admission does not hang on it."""
        summary = f"record {inp.node}'s baseline (what it has, validated)"
        try:
            inv = await call(c.NODE_INVENTORY, c.InventoryRequest(node=inp.node), c.InventoryResult,
                             summary=f"inventory of {inp.node}", timeout=timedelta(minutes=2), attempts=3,
                             task_queue=self._node_queue(inp.node), schedule_to_start=inp.policy.validation.agent_timeout)
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
