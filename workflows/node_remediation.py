"""NodeRemediation, id `remediate/<node>`: one unhealthy spell of one node, walked up the ladder."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from pydantic import BaseModel, ValidationError
from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, FailureError

from workflows import metrics

with workflow.unsafe.imports_passed_through():
    from activities import contracts as c
    from activities.errors import NON_RETRYABLE
    from policies.classify import Triage, classify
    from policies.findings import HealthReport
    from policies.model import Rung
    from workflows.controller_policy import controller_policy_applies, ignored_fields, take_controller_policy
    from workflows.guard_types import (
        GUARD_SIGNAL_FAULT,
        GUARD_SIGNAL_RELEASE,
        GUARD_SIGNAL_REQUEST,
        HOLDER_SIGNAL_GRANTED,
        HOLDER_SIGNAL_QUARANTINE,
        FaultNotice,
        LeaseGrant,
        LeaseRelease,
        QuarantineAnswer,
        guard_workflow_id,
    )
    from workflows.remediation_types import (  # noqa: F401 - re-exported: callers import them from here
        MAX_ACTIONS_KEPT,
        MAX_BOOTS_KEPT,
        MAX_REJECTED_KEPT,
        MAX_RUN_IDS_KEPT,
        MAX_SEQ_SENDERS_KEPT,
        PATCH_BOUNDED_STATE,
        PATCH_DO_NO_HARM,
        PATCH_GUARD_ADMISSION,
        PATCH_LOCAL_CLUSTER_CALLS,
        SA_ATTRIBUTION,
        SA_FAULT,
        SA_NODE,
        SA_OUTCOME,
        SA_STAGE,
        SA_UUIDS,
        SEARCH_ATTRIBUTES,
        ActionRecord,
        Outcome,
        RejectedReport,
        RemediationInput,
        RemediationResult,
        RemediationState,
        RemediationStatus,
        Stage,
        remediation_workflow_id,
    )
    from workflows.report_intake import (
        fault_cleared,
        new_event_ids,
        recurrence_findings,
        remember_events,
        report_bounds_problem,
    )
    from workflows.validation import AgentMissing, agent_gone, validate_once, validate_twice

@workflow.defn(name="NodeRemediation")
class NodeRemediation:
    @workflow.init
    def __init__(self, inp: RemediationInput) -> None:
        self.inp = inp
        self.policy = inp.policy
        self.node = inp.node
        # Only a run this workflow continued carries state: a first run's input comes from whoever
        # sent the first report, and is never trusted with the episode's state.
        self.s = (inp.state if workflow.info().continued_run_id else None) or RemediationState()

    # --- handlers: agents signal, operators update, everyone queries --------------------------
    @workflow.signal
    def report(self, raw: Any) -> None:
        """A health report. Anything wrong with it is recorded and dropped: never a failed task."""
        if self._bounded() and (problem := report_bounds_problem(raw)) is not None:
            return self._reject(problem, raw)
        try:
            r = HealthReport.model_validate(raw)
        except ValidationError as err:
            first = err.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "(report)"
            return self._reject(f"malformed report: {where}: {first['msg']}", raw)
        except Exception as err:  # noqa: BLE001 - any bad input is a rejection, not a task failure
            return self._reject(f"malformed report: {type(err).__name__}", raw)
        if r.node != self.node:
            return self._reject(f"report for node {r.node!r} sent to {self.node!r}", raw)
        if r.boot_id in self.s.retired_boots:
            return self._reject(f"stale report from earlier boot {r.boot_id}", raw)
        # Sequences are per sender and boot: the agent, a condition watcher and an operator each count their own.
        last = self.s.seq_by_boot.get(_seq_key(r))
        if last is not None and r.seq <= last:
            if self.s.latest and r.seq == last and r.fingerprint() == self.s.latest.fingerprint():
                self.s.duplicates += 1
                return None
            return self._reject(f"stale sequence {r.seq} (already have {last} from {r.source} for boot {r.boot_id})", raw)
        self._accept(r)

    @workflow.signal(name=HOLDER_SIGNAL_GRANTED)
    def lease_granted(self, grant: LeaseGrant) -> None:
        self.s.lease_held = True

    @workflow.signal(name=HOLDER_SIGNAL_QUARANTINE)
    def quarantine_answer(self, answer: QuarantineAnswer) -> None:
        if self.s.admission != "admitted":
            self.s.admission = "admitted" if answer.admitted else "deferred"
            self.s.admission_reason = answer.reason

    # Updates take who asked as their last argument (the CLI sends its client identity): an update
    # handler cannot see the caller, and the record in the history and in `status` names them.
    @workflow.update
    def pause(self, reason: str = "", by: str = "") -> RemediationStatus:
        self.s.paused, self.s.pause_reason = True, reason or "paused by operator"
        self._asked("pause", by, reason)
        return self.status()

    @pause.validator
    def _validate_pause(self, reason: str = "", by: str = "") -> None:
        self._require_active("pause")
        if self.s.paused:
            raise ValueError("already paused")

    @workflow.update
    def resume(self, by: str = "") -> RemediationStatus:
        self.s.paused, self.s.pause_reason = False, ""
        self._asked("resume", by)
        return self.status()

    @resume.validator
    def _validate_resume(self, by: str = "") -> None:
        if not self.s.paused:
            raise ValueError("not paused")

    @workflow.update
    def approve(self, by: str = "") -> RemediationStatus:
        self.s.approved.append(self.s.awaiting_approval)
        self._asked("approve", by, self.s.awaiting_approval.value)
        return self.status()

    @approve.validator
    def _validate_approve(self, by: str = "") -> None:
        if self.s.awaiting_approval is None:
            raise ValueError("nothing awaits approval")

    @workflow.update
    def skip_to(self, rung: str, by: str = "") -> RemediationStatus:
        self.s.skip_to = Rung(rung)
        self._asked("skip_to", by, rung)
        return self.status()

    @skip_to.validator
    def _validate_skip_to(self, rung: str, by: str = "") -> None:
        self._require_active("skip")
        if rung not in {r.value for r in Rung}:
            raise ValueError(f"unknown rung {rung!r}: one of {', '.join(r.value for r in Rung)}")

    @workflow.update
    def cancel(self, reason: str = "", by: str = "") -> RemediationStatus:
        self.s.cancel_reason = reason or "cancelled by operator"
        self._asked("cancel", by, reason)
        return self.status()

    @cancel.validator
    def _validate_cancel(self, reason: str = "", by: str = "") -> None:
        self._require_active("cancel")

    @workflow.query
    def status(self) -> RemediationStatus:
        s = self.s
        return RemediationStatus(
            node=self.node, stage=s.stage, outcome=s.outcome, outcome_reason=s.outcome_reason, triage=s.triage,
            next_rung=s.next_rung, fixed_by=s.fixed_by, rungs_tried=s.rungs_tried, attempts=s.attempts,
            actions=s.actions, lease_held=s.lease_held, quarantined=s.quarantined, paused=s.paused,
            pause_reason=s.pause_reason, awaiting_approval=s.awaiting_approval, cancel_reason=s.cancel_reason,
            rejected=s.rejected, rejected_total=s.rejected_total, duplicates=s.duplicates,
            validations=s.validations, boot_id=s.boot_id, run_ids=s.run_ids, agent_missing=s.agent_missing,
            implicated=s.implicated, policy_name=s.policy_name, policy_sha256=s.policy_sha256,
            cluster=self.inp.cluster, lease_requested=s.lease_requested, admission=s.admission,
            waiting=self._waiting_for(),
        )

    def _waiting_for(self) -> str:
        """What the episode waits on now, in words (`gpuheal status NODE`)."""
        s = self.s
        if s.stage is Stage.DONE:
            return ""
        if s.paused:
            return f"resume: paused ({s.pause_reason})"
        if s.admission == "deferred":
            return f"room to quarantine: {s.admission_reason}"
        if s.awaiting_approval is not None:
            return f"approval to {s.awaiting_approval.value} (gpuheal approve {self.node})"
        if s.lease_requested and not s.lease_held:
            return "a disruption lease from the fleet guard"
        if s.stage is Stage.PROBATION:
            return f"the end of probation ({self.policy.probation if self.policy else ''})"
        return ""

    # --- the runbook ---------------------------------------------------------------------------
    @workflow.run
    async def run(self, inp: RemediationInput) -> RemediationResult:
        self._begin_run()
        await self._take_controller_policy()
        await workflow.wait_condition(lambda: self.s.latest is not None)
        steps = {
            Stage.TRIAGE: self._triage,
            Stage.LADDER: self._climb_one_rung,
            Stage.RETURN: self._return_to_service,
            Stage.PROBATION: self._probation,
        }
        while self.s.stage is not Stage.DONE:
            await self._continue_as_new_if_due()
            await self._hold_while_paused()
            if self.s.cancel_reason is not None:
                self._finish(Outcome.QUARANTINED if self.s.quarantined else Outcome.HEALTHY,
                             f"cancelled: {self.s.cancel_reason}")
                break
            await steps[self.s.stage]()
        await self._close_episode()
        return self._result()

    async def _take_controller_policy(self) -> None:
        """The controller's policy, once per episode (a continued run carries it): the sender's
        policy, GPU count and guard queue in the start input are ignored, and the history says so."""
        if not controller_policy_applies():
            return
        # Every patch is decided before the first local activity of a run: on replay, a patch
        # marker after a local activity's marker in one workflow task is a nondeterminism error.
        self._bounded(), self._no_harm(), self._local_cluster_calls(), self._guard_admission()
        if workflow.info().continued_run_id and self.s.policy_sha256:
            return
        snap = await take_controller_policy(self.node)
        trusted = {"policy": snap.policy, "state": None, "expected_gpus": None,
                   "guard_task_queue": workflow.info().task_queue}
        ignored = ignored_fields(self.inp, trusted) if not workflow.info().continued_run_id else []
        self.inp = self.inp.model_copy(update=trusted)
        self.policy = snap.policy
        self.s.policy_name, self.s.policy_sha256 = snap.name, snap.sha256
        self._record("policy", f"policy {snap.name} ({snap.sha256[:12]}) from the controller", True,
                     f"ignored what the start input set: {', '.join(ignored)}" if ignored else "")

    async def _triage(self) -> None:
        report = self.s.latest
        if self._no_harm() and not await self._node_is_ours():
            return
        t = classify(report.findings, self.inp.generation, self.policy)
        self.s.triage = t
        self.s.hardware_ids = report.hardware_ids()
        self._implicate(report, t)
        found = [SA_FAULT.value_set(t.fault_class or "none"), SA_UUIDS.value_set([g.uuid for g in report.gpus]),
                 *([SA_ATTRIBUTION.value_set(t.attribution)] if t.attribution else [])]
        if not t.actionable:
            self._record("triage", f"triage {self.node}", True, t.reason)
            return self._finish(Outcome.HEALTHY, t.reason, *found)
        self._upsert(*found)
        self._record("triage", f"triage {self.node}", True,
                     f"{t.fault_class} ({t.attribution}, {t.severity}): start at {t.start_rung.value}; {t.reason}")
        self.s.next_rung = t.start_rung
        if t.attribution == "platform":
            # Cordon first: it is safe, needs no budget, and every second counts for the jobs.
            await self._quarantine()
            if self._quarantine_withheld() or not self._cordon_holds():
                return
            if await self._is_repeat_offender():
                self.s.next_rung = Rung.REPLACE
        await self._attribute_pods(t)
        self._set_stage(Stage.LADDER)

    async def _climb_one_rung(self) -> None:
        rung = self.s.skip_to or self.s.next_rung
        self.s.skip_to = None
        if rung.disruptive:
            await self._quarantine()
            if self._quarantine_withheld() or not self._cordon_holds():
                return
            approved = await self._approved(rung)
            if self._no_harm() and self._steered():
                return
            if not approved:
                return self._finish(Outcome.AWAITING_APPROVAL, f"{rung.value} was not approved in time")
            await self._acquire_lease()
            if self._steered():
                return
            await self._drain()
            if self.s.stage is Stage.DONE:
                return
        await self._hold_while_paused()
        if self._steered():
            return
        if rung.disruptive and self._no_harm() and not self.policy.dry_run and not self.s.lease_held:
            await self._acquire_lease()  # a long pause gave it back
            if self._steered():
                return
        self.s.rungs_tried.append(rung)
        self.s.attempts[rung.value] = self.s.attempts.get(rung.value, 0) + 1
        acted = await self._act(rung)
        if self.policy.dry_run:
            return self._finish(Outcome.DRY_RUN, f"dry run: would {rung.value} ({self._fault_label()}); nothing changed")
        if rung is Rung.REPLACE:
            return self._finish(Outcome.REPLACED if acted else Outcome.QUARANTINED,
                                "instance replaced; hardware ids denylisted" if acted
                                else "replacement failed: the node stays quarantined for a person")
        if self.s.stage is Stage.DONE:
            return
        if acted and await self._validated():
            self.s.fixed_by = rung
            return self._set_stage(Stage.RETURN if self.s.quarantined else Stage.PROBATION)
        self.s.next_rung = rung.above()
        if self.s.agent_missing and rung is not Rung.REBOOT:
            # Without its agent nothing node-local can run: reboot through the cloud API and wait for it.
            self.s.next_rung = Rung.REBOOT

    async def _return_to_service(self) -> None:
        done = await self._kube(c.KUBE_RETURN_TO_SERVICE,
                                c.ReturnToServiceRequest(node=self.node, reason=f"fixed by {self.s.fixed_by.value}"),
                                c.ReturnToServiceResult,
                                f"uncordon {self.node}: validated twice after {self.s.fixed_by.value}")
        if done is None and self._no_harm():
            # `returned` means the API server shows the node schedulable: it does not, so a person looks.
            await self._release_lease("quarantined")
            return self._finish(Outcome.QUARANTINED, f"validated after {self.s.fixed_by.value}, but the uncordon "
                                f"failed ({self.s.actions[-1].detail}): the node stays cordoned for a person")
        self.s.quarantined = self.s.drained = False
        self.s.admission = ""  # back in service: a recurrence asks the guard for room again
        await self._release_lease("validated")
        await self._tell_guard(healthy=True)
        self._set_stage(Stage.PROBATION)

    async def _probation(self) -> None:
        self.s.returned_at = workflow.now()
        try:
            await workflow.wait_condition(
                lambda: self.s.recurrence is not None or self.s.cancel_reason is not None or self.s.skip_to is not None,
                timeout=self.policy.probation, timeout_summary=f"probation of {self.node}",
            )
        except TimeoutError:
            return self._finish(Outcome.RETURNED, f"fixed by {self.s.fixed_by.value}; probation passed")
        if self.s.skip_to is not None:
            return self._set_stage(Stage.LADDER)
        if self.s.recurrence is None:
            return
        t = classify(self.s.recurrence.findings, self.inp.generation, self.policy)
        above = self.s.fixed_by.above() or Rung.REPLACE
        self.s.triage = t
        self._implicate(self.s.recurrence, t)
        self.s.next_rung = max(above, t.start_rung, key=list(Rung).index)
        self._record("probation", f"recurrence on {self.node} during probation", False,
                     f"{t.reason}: escalate to {self.s.next_rung.value}")
        self.s.recurrence = None
        self._set_stage(Stage.LADDER)

    # --- steps ---------------------------------------------------------------------------------
    async def _quarantine(self) -> None:
        if self.s.quarantined:
            return
        if self._guard_admission() and not self.policy.dry_run and not await self._admitted_to_quarantine():
            return
        t = self.s.triage
        result = await self._kube(
            c.KUBE_QUARANTINE,
            c.QuarantineRequest(node=self.node, fault_class=t.fault_class or "unknown", reason=t.reason,
                                dry_run=self.policy.dry_run),
            c.QuarantineResult, f"cordon and taint {self.node} ({self._fault_label()})",
        )
        if result is None and self._no_harm():
            return  # not verifiably cordoned: `_cordon_holds` ends the episode before anything disruptive
        self.s.quarantined = True
        detected = self.s.first_report.detected_at if self.s.first_report else None
        if result is not None and detected is not None and self.s.detect_to_cordon_ms is None:
            self.s.detect_to_cordon_ms = max(0, int((result.cordoned_at - detected).total_seconds() * 1000))
            metrics.node_cordoned(self.inp.cluster, t.fault_class or "unknown", self.s.detect_to_cordon_ms)
        if not (self._guard_admission() and self.s.admission == "admitted"):
            await self._tell_guard(healthy=False)

    async def _admitted_to_quarantine(self) -> bool:
        """The guard admits a cordon while at most max_unhealthy nodes are quarantined; past that
        the fault waits uncordoned, recorded with the reason, until there is room, the fault clears
        or an operator cancels. A guard that does not answer in time does not stop the cordon."""
        if self.s.admission == "admitted":
            return True
        t, timeout = self.s.triage, self.policy.guard.admission_timeout
        if not self.s.admission:
            await self._signal_guard(GUARD_SIGNAL_FAULT, FaultNotice(
                node=self.node, holder=workflow.info().workflow_id, fault_class=t.fault_class if t else None,
                admission=True), started=self.s.guard_notified)
            self.s.admission, self.s.guard_notified = "asked", True
        done = lambda: self.s.admission == "admitted" or self._fault_cleared() or self.s.cancel_reason is not None  # noqa: E731
        try:
            await workflow.wait_condition(lambda: done() or self.s.admission == "deferred", timeout=timeout,
                                          timeout_summary=f"the fleet guard's answer for {self.node}")
        except TimeoutError:
            self._record("quarantine", f"no answer from the fleet guard for {self.node}", False,
                         f"none within {timeout}: cordoning anyway (a bad node is not left in service)")
            self.s.admission = "admitted"
            return True
        if self.s.admission == "deferred" and not done():
            self._record("quarantine", f"quarantine of {self.node} deferred by the fleet guard", False,
                         self.s.admission_reason)
            self._set_details(f"room to quarantine: {self.s.admission_reason}")
            while not done():
                # Asked again now and then: a guard started afresh knows no deferred faults.
                try:
                    await workflow.wait_condition(done, timeout=self.policy.guard.holder_check_interval,
                                                  timeout_summary=f"{self.node}'s quarantine request, re-sent")
                except TimeoutError:
                    await self._signal_guard(GUARD_SIGNAL_FAULT, FaultNotice(
                        node=self.node, holder=workflow.info().workflow_id,
                        fault_class=t.fault_class if t else None, admission=True), started=True)
            if self.s.admission == "admitted":
                self._record("quarantine", f"quarantine of {self.node} admitted by the fleet guard", True)
        if self.s.admission != "admitted" and self._fault_cleared():
            self._finish(Outcome.HEALTHY, "the fault cleared while its quarantine was deferred; nothing done")
        return self.s.admission == "admitted"

    def _quarantine_withheld(self) -> bool:
        """The guard held the cordon back and the episode ended (fault cleared) or was cancelled."""
        return self.s.stage is Stage.DONE or (self.s.cancel_reason is not None and not self.s.quarantined)

    def _fault_cleared(self) -> bool:
        t = self.s.triage
        return fault_cleared([v.finding for v in t.verdicts if v.rung is not None] if t else [], self.s.latest)

    async def _approved(self, rung: Rung) -> bool:
        rp = self.policy.ladder.for_rung(rung)
        if not rp.requires_approval or rung in self.s.approved:
            return True
        self.s.awaiting_approval = rung
        self._set_details()
        steerable = self._no_harm()
        try:
            await workflow.wait_condition(lambda: rung in self.s.approved or (steerable and self._steered()),
                                          timeout=rp.approval_timeout,
                                          timeout_summary=f"wait for approval to {rung.value} {self.node}")
        except TimeoutError:
            return False
        finally:
            self.s.awaiting_approval = None
        if rung not in self.s.approved:
            return False  # steered away (cancel or skip): the caller re-plans
        self._record("approval", f"{rung.value} {self.node} approved", True)
        return True

    async def _acquire_lease(self) -> None:
        if self.s.lease_held:
            return
        if self.policy.dry_run:
            # A dry run disrupts nothing, so it must not take budget from real remediations.
            return self._record("lease", f"would take a disruption lease for {self.node}", True, "dry run")
        if not self.s.lease_requested:
            await self._signal_guard(GUARD_SIGNAL_REQUEST, c.LeaseRequest(
                cluster=self.inp.cluster, holder=workflow.info().workflow_id, node=self.node),
                started=self.s.guard_notified)
            self.s.lease_requested = True
        self._set_details("waiting for a disruption lease from the fleet guard")
        while self._guard_admission():
            # The request is sent again now and then: a guard started afresh learns its waiters back.
            try:
                await workflow.wait_condition(lambda: self.s.lease_held or self._steered(),
                                              timeout=self.policy.guard.holder_check_interval,
                                              timeout_summary=f"{self.node}'s lease request, re-sent")
                break
            except TimeoutError:
                await self._signal_guard(GUARD_SIGNAL_REQUEST, c.LeaseRequest(
                    cluster=self.inp.cluster, holder=workflow.info().workflow_id, node=self.node), started=True)
        await workflow.wait_condition(
            lambda: self.s.lease_held or self._steered())
        if self.s.lease_held:
            self._record("lease", f"disruption lease for {self.node}", True)

    async def _drain(self) -> None:
        if self.s.drained:
            return
        d = self.policy.drain
        result = await self._kube(
            c.KUBE_DRAIN,
            c.DrainRequest(node=self.node, episode=self._episode(), checkpoint_grace_s=d.checkpoint_grace.total_seconds(),
                           deadline_s=d.deadline.total_seconds(), timeout_action=d.timeout_action,
                           allow_force=d.allow_force, pod_grace_seconds=d.pod_grace_seconds, dry_run=self.policy.dry_run),
            c.DrainResult, f"drain {self.node} through the Eviction API",
            start_to_close=d.checkpoint_grace + d.deadline + timedelta(minutes=5), heartbeat=d.heartbeat_timeout,
        )
        self.s.drained = result is not None
        if not self._no_harm():
            return
        if result is None:
            # Pods may still be on the node: no reboot or reset under them.
            return self._finish(Outcome.QUARANTINED, f"drain failed ({self.s.actions[-1].detail}): nothing "
                                "disruptive done; the node stays quarantined for a person")
        left = [*result.remaining, *result.lingering]
        if left:
            self.s.drain_left = left
            self._record("drain", f"drain of {self.node} incomplete", False,
                         f"{len(left)} pods still there ({', '.join(left[:5])}); "
                         f"timeout_action={d.timeout_action}: the rung goes ahead and stops them")

    async def _act(self, rung: Rung) -> bool:
        """The rung's action and its wait; False when it failed or the node did not come back."""
        rp = self.policy.ladder.for_rung(rung)
        summary = f"{rung.value} {self.node} ({self._fault_label()})"
        key = f"{workflow.info().workflow_id}/{self.s.run_ids[0]}/{rung.value}/{self.s.attempts[rung.value]}"
        dry = self.policy.dry_run
        try:
            if rung is Rung.KILL:
                await self._node_activity(c.NODE_KILL, c.KillRequest(node=self.node, gpus=self._gpus(), dry_run=dry),
                                          c.KillResult, summary, rp)
            elif rung is Rung.RESET:
                await self._node_activity(c.NODE_KILL, c.KillRequest(node=self.node, gpus=self._gpus(), dry_run=dry),
                                          c.KillResult, f"stop GPU processes on {self.node} before reset", rp)
                await self._node_activity(c.NODE_RESET, c.ResetRequest(node=self.node, gpus=self._gpus(), dry_run=dry),
                                          c.ResetResult, summary, rp)
            elif rung is Rung.REBOOT:
                return await self._reboot(summary, key, rp)
            elif rung is Rung.REPLACE:
                await self._denylist()
                await self._cloud(c.CLOUD_REPLACE, c.ReplaceRequest(
                    node=self.node, idempotency_key=key, mode=self.policy.replacement,
                    ownership_tag=self.policy.ownership_tag, dry_run=dry), c.ReplaceResult, summary, rp)
                self._record(rung.value, summary, True, self._take_drain_note())
                return True
        except ActivityError as err:
            if self._no_harm() and agent_gone(err):
                self.s.agent_missing = True
                self._record(rung.value, summary, False, f"agent_missing: no agent polled "
                             f"{c.node_task_queue(self.node)} within {self.policy.validation.agent_timeout}")
                return False
            self._record(rung.value, summary, False, _cause(err))
            return False
        self._record(rung.value, summary, True, self._take_drain_note())
        await workflow.sleep(max(rp.return_timeout, timedelta(milliseconds=1)),
                             summary=f"let {self.node} settle after {rung.value}")
        return True

    async def _reboot(self, summary: str, key: str, rp) -> bool:
        """Reboot through the cloud API; back when the agent reports from a new boot. If it never
        does, the kubelet's boot id tells a machine that rebooted (its agent is what is missing)
        from one that did not come back."""
        before = self.s.boot_id
        no_harm, dry = self._no_harm(), self.policy.dry_run
        sent = await self._cloud(c.CLOUD_REBOOT, c.RebootRequest(node=self.node, idempotency_key=key, dry_run=dry,
                                                                 ownership_tag=self.policy.ownership_tag),
                                 c.RebootResult, summary, rp)
        kubelet_before = sent.from_boot
        self._record(Rung.REBOOT.value, summary, True,
                     "; ".join(x for x in ("reboot sent; waiting for a report from a new boot", self._take_drain_note()) if x))
        try:
            await workflow.wait_condition(lambda: self.s.boot_id != before or (no_harm and self._steered()),
                                          timeout=rp.return_timeout,
                                          timeout_summary=f"wait for {self.node} to come back from reboot")
        except TimeoutError:
            self._record(Rung.REBOOT.value, f"{self.node} back from reboot", False,
                         f"no report from a new boot within {rp.return_timeout}")
            if no_harm and not dry:
                after = await self._kubelet_boot_id()
                if self.s.agent_missing or (after and after != kubelet_before):
                    came_back = (f"the machine rebooted (kubelet boot id {kubelet_before} -> {after})"
                                 if after and after != kubelet_before else "the machine shows no new boot either")
                    self._finish(Outcome.QUARANTINED, f"agent_missing: {came_back} but no agent reported from "
                                 f"{self.node}; no evidence about the hardware, so it stays quarantined for a person")
            return False
        if self.s.boot_id == before:
            return False  # steered away while waiting
        self.s.agent_missing = False
        self._record(Rung.REBOOT.value, f"{self.node} back from reboot", True, f"boot id {self.s.boot_id}")
        return True

    async def _kubelet_boot_id(self) -> str | None:
        try:
            return await workflow.execute_activity(
                c.CLOUD_BOOT_ID, c.BootIdRequest(node=self.node), result_type=str,
                start_to_close_timeout=timedelta(minutes=1), summary=f"read {self.node}'s boot id without its agent",
                retry_policy=RetryPolicy(maximum_attempts=3, non_retryable_error_types=NON_RETRYABLE))
        except ActivityError as err:
            self._record("boot_id", f"read {self.node}'s boot id without its agent", False, _cause(err))
            return None

    async def _denylist(self) -> None:
        """Only hardware a probe on the node implicated goes on the denylist, never every id a report listed."""
        ids = self.s.implicated if self._no_harm() else self.s.hardware_ids
        if not ids and self._no_harm():
            return self._record("denylist", f"denylist hardware of {self.node}", True,
                                "no probe implicated any hardware: nothing denylisted")
        await self._ledger(c.LEDGER_DENYLIST, c.DenylistRequest(
            hardware_ids=ids, node=self.node, reason=f"replaced: {self._fault_label()}"),
            c.DenylistResult, f"denylist hardware of {self.node}")

    async def _validated(self) -> bool:
        strict = self._no_harm()
        try:
            if not self.s.quarantined:
                # Kill-only (application) episodes never took the node out: one validation suffices.
                ok = await validate_once(self.node, self.policy.validation, self.inp.expected_gpus, "after kill",
                                         self._record, self.policy.dry_run, strict)
                self.s.validations += int(ok)
                return ok
            passed = await validate_twice(self.node, self.policy.validation, self.inp.expected_gpus, self._record,
                                          self.policy.dry_run, strict)
        except AgentMissing:
            self.s.agent_missing = True
            return False
        self.s.validations += passed
        return passed == 2

    async def _is_repeat_offender(self) -> bool:
        ro = self.policy.repeat_offender
        if not self.s.hardware_ids:
            return False
        count = await self._ledger(c.LEDGER_COUNT_RECENT, c.CountRecentRequest(
            hardware_ids=self.s.hardware_ids, window_s=ro.window.total_seconds(), exclude_episode=self._episode()),
            int, f"count recent remediations of {self.node}'s hardware")
        if count is not None and count + 1 >= ro.threshold:
            self._record("triage", f"repeat offender {self.node}", True,
                         f"{count} earlier remediations within {ro.window}: straight to replace")
            return True
        return False

    async def _attribute_pods(self, t: Triage) -> None:
        pod_gpus = await self._pod_gpus() if t.gpus and self._no_harm() else None
        await self._kube(c.KUBE_ATTRIBUTE_PODS, c.AttributePodsRequest(
            node=self.node, attribution=t.attribution, fault=self._fault_label(), gpus=t.gpus, pod_gpus=pod_gpus,
            episode=self._episode(), dry_run=self.policy.dry_run),
            c.AttributePodsResult, f"mark pods on {self.node}: failure attribution {t.attribution}")

    async def _pod_gpus(self) -> dict[str, list[int]] | None:
        """Which pod runs on which GPU, from the node (None when the agent cannot say quickly)."""
        try:
            result = await workflow.execute_activity(
                c.NODE_GPU_PODS, c.GpuPodsRequest(node=self.node), result_type=c.GpuPodsResult,
                task_queue=c.node_task_queue(self.node),
                schedule_to_start_timeout=min(timedelta(seconds=15), self.policy.validation.agent_timeout),
                start_to_close_timeout=timedelta(seconds=30), summary=f"which pods use which GPUs on {self.node}",
                retry_policy=RetryPolicy(maximum_attempts=2))
        except ActivityError as err:
            self._record("attribution", f"which pods use which GPUs on {self.node}", False,
                         f"{_cause(err)}: every pod on the node is marked")
            return None
        return result.pod_gpus

    async def _node_is_ours(self) -> bool:
        """A report for a node that does not exist, or is not a GPU node of ours, ends here: no lease,
        no cordon, no ledger, no denylist. When the API cannot say, the cordon's own checks decide."""
        found = await self._kube(c.KUBE_CHECK_NODE, c.NodeCheckRequest(node=self.node), c.NodeCheckResult,
                                 f"check {self.node} is a GPU node of this cluster")
        if found is None or (found.exists and found.ours):
            return True
        self._finish(Outcome.REJECTED, f"rejected: {found.reason}")
        return False

    def _cordon_holds(self) -> bool:
        """No disruptive step on a node that is not verifiably cordoned: evicted pods would land back on it."""
        if self.s.quarantined or not self._no_harm():
            return True
        self._finish(Outcome.FAILED, f"cordon of {self.node} did not take effect ({self.s.actions[-1].detail}): "
                     "nothing disruptive done; a person must cordon or fix access")
        return False

    def _implicate(self, report: HealthReport, t: Triage) -> None:
        """Hardware a probe on the node itself named (the agent's report), for the denylist."""
        if report.source != "agent":
            return
        acted = [v.finding for v in t.verdicts if v.rung is not None]
        self.s.implicated = sorted({*self.s.implicated, *report.implicated_ids(acted)})

    async def _close_episode(self) -> None:
        if self._guard_admission():
            # Every ending tells the guard (lease, canary, unhealthy count) once it was involved.
            s = self.s
            if s.guard_notified or s.lease_held or s.lease_requested or s.admission:
                await self._signal_guard(GUARD_SIGNAL_RELEASE, LeaseRelease(
                    holder=workflow.info().workflow_id, node=self.node, outcome=s.outcome.value))
                s.lease_held = s.lease_requested = False
        else:
            await self._release_lease()
        if self.s.outcome is Outcome.REPLACED and not self._guard_admission():
            # The node leaves the fleet: it no longer counts as unhealthy. Other endings keep it cordoned.
            await self._tell_guard(healthy=True)
        if self.s.triage is not None and self.s.triage.actionable and self.s.outcome is not Outcome.REJECTED:
            await self._ledger(c.LEDGER_RECORD, c.RemediationRecord(
                node=self.node, episode=self._episode(), hardware_ids=self.s.hardware_ids,
                fault_class=self.s.triage.fault_class, attribution=self.s.triage.attribution,
                rungs=[r.value for r in self.s.rungs_tried], outcome=self.s.outcome.value,
                started_at=self.s.started_at, ended_at=workflow.now()), None,
                f"record {self.node}'s episode in the ledger")

    # --- guard ---------------------------------------------------------------------------------
    async def _signal_guard(self, signal: str, arg: BaseModel, started: bool = False) -> None:
        """Signal-with-start through an activity the first time, so the guard exists when needed;
        a plain external signal (two events, no activity) once this episode knows it runs."""
        local = self._local_cluster_calls()
        if started and not local:
            try:
                await workflow.get_external_workflow_handle(guard_workflow_id(self.inp.cluster)).signal(signal, arg)
                return
            except FailureError:
                pass  # the guard was terminated or reset: start it again below
        await self._cluster_call(
            c.GUARD_SIGNAL,
            c.GuardSignalRequest(cluster=self.inp.cluster, guard=self.policy.guard, task_queue=self.inp.guard_task_queue,
                                 signal=signal, payload=arg.model_dump(mode="json")),
            None, f"{signal} to fleet guard for {self.node}", timedelta(seconds=30),
            RetryPolicy(maximum_interval=timedelta(seconds=10)))

    async def _tell_guard(self, healthy: bool) -> None:
        if (healthy and not self.s.guard_notified) or self.policy.dry_run:
            return
        await self._signal_guard(GUARD_SIGNAL_FAULT, FaultNotice(
            node=self.node, holder=workflow.info().workflow_id,
            fault_class=self.s.triage.fault_class if self.s.triage else None, healthy=healthy),
            started=self.s.guard_notified)
        self.s.guard_notified = not healthy

    async def _release_lease(self, outcome: str | None = None) -> None:
        if not (self.s.lease_held or self.s.lease_requested):
            return
        release = LeaseRelease(holder=workflow.info().workflow_id, node=self.node,
                               outcome=outcome if self._guard_admission() else None)
        if self._local_cluster_calls():
            await self._signal_guard(GUARD_SIGNAL_RELEASE, release)
        else:
            await workflow.get_external_workflow_handle(guard_workflow_id(self.inp.cluster)).signal(
                GUARD_SIGNAL_RELEASE, release)
        self.s.lease_held = self.s.lease_requested = False

    # --- activity plumbing ---------------------------------------------------------------------
    async def _kube(self, name: str, req: BaseModel, result_type: type, summary: str,
                    start_to_close: timedelta = timedelta(minutes=1), heartbeat: timedelta | None = None):
        """Cluster activities retry transient API errors; a non-retryable one leaves the node as it is."""
        retry = RetryPolicy(maximum_attempts=10, maximum_interval=timedelta(seconds=30),
                            non_retryable_error_types=NON_RETRYABLE)
        try:
            result = await self._cluster_call(name, req, result_type, summary, start_to_close, retry, heartbeat)
        except (ActivityError, ApplicationError) as err:  # a local activity's failure comes unwrapped
            self._record(name, summary, False, _cause(err))
            return None
        self._record(name, summary, True)
        return result

    async def _ledger(self, name: str, req: BaseModel, result_type: type, summary: str):
        return await self._cluster_call(name, req, result_type, summary, timedelta(seconds=30),
                                        RetryPolicy(maximum_interval=timedelta(seconds=30)))

    async def _cluster_call(self, name: str, arg: BaseModel, result_type: type | None, summary: str,
                            start_to_close: timedelta, retry: RetryPolicy, heartbeat: timedelta | None = None):
        """A controller-side activity: local where it is short (no heartbeat), else a regular one."""
        if heartbeat is None and self._local_cluster_calls():
            # A local activity leaves a marker, not a scheduled event: a summary would cost a payload
            # encoding per call and show nowhere. The step record (`_record`) carries it instead.
            return await workflow.execute_local_activity(name, arg, result_type=result_type,
                                                         start_to_close_timeout=start_to_close, retry_policy=retry)
        return await workflow.execute_activity(name, arg, result_type=result_type, start_to_close_timeout=start_to_close,
                                               heartbeat_timeout=heartbeat, summary=summary, retry_policy=retry)

    def _take_drain_note(self) -> str:
        """What the rung's record says of pods the drain left (timed out and escalated): the rung
        itself stopped them. Said once, by the rung that went ahead."""
        left, self.s.drain_left = self.s.drain_left, []
        return f"went ahead over {len(left)} pods the drain left ({', '.join(left[:3])})" if left else ""

    def _bounded(self) -> bool:
        """Bounded reports and state (see PATCH_BOUNDED_STATE)."""
        return workflow.patched(PATCH_BOUNDED_STATE)

    def _guard_admission(self) -> bool:
        """Quarantine admitted by the guard, endings told to it, lease requests re-sent (PATCH_GUARD_ADMISSION)."""
        return workflow.patched(PATCH_GUARD_ADMISSION)

    def _no_harm(self) -> bool:
        """The do-no-harm rules (see PATCH_DO_NO_HARM); histories from before replay without them."""
        return workflow.patched(PATCH_DO_NO_HARM)

    def _local_cluster_calls(self) -> bool:
        """Short cluster-side calls (cordon, pod marks, events, ledger, guard signals) run as local
        activities in the controller: one marker event each instead of three events and a workflow
        task, and no task-queue round trip before the cordon. Histories from before keep replaying."""
        return workflow.patched(PATCH_LOCAL_CLUSTER_CALLS)

    async def _cloud(self, name: str, req: BaseModel, result_type: type, summary: str, rp):
        return await workflow.execute_activity(
            name, req, result_type=result_type, start_to_close_timeout=rp.action_timeout, summary=summary,
            retry_policy=RetryPolicy(maximum_attempts=rp.retries, non_retryable_error_types=NON_RETRYABLE),
        )

    async def _node_activity(self, name: str, req: BaseModel, result_type: type, summary: str, rp):
        """Node-local work: a dead agent is caught by schedule_to_start, and the ladder climbs on."""
        return await workflow.execute_activity(
            name, req, result_type=result_type, task_queue=c.node_task_queue(self.node),
            schedule_to_start_timeout=self.policy.validation.agent_timeout,
            start_to_close_timeout=rp.action_timeout, summary=summary,
            retry_policy=RetryPolicy(maximum_attempts=rp.retries, non_retryable_error_types=NON_RETRYABLE),
        )

    # --- state helpers -------------------------------------------------------------------------
    def _begin_run(self) -> None:
        info = workflow.info()
        if info.run_id not in self.s.run_ids:
            self.s.run_ids.append(info.run_id)
            if self._bounded() and len(self.s.run_ids) > MAX_RUN_IDS_KEPT:
                # The first run id names the episode (idempotency keys, the ledger): it stays.
                self.s.run_ids = [self.s.run_ids[0], *self.s.run_ids[-(MAX_RUN_IDS_KEPT - 1):]]
        if self.s.started_at is None:
            self.s.started_at = workflow.now()
            if workflow.info().typed_search_attributes.get(SA_NODE) is None:
                self._upsert(SA_NODE.value_set(self.node), SA_STAGE.value_set(self.s.stage.value))

    def _accept(self, r: HealthReport) -> None:
        if self.s.boot_id is not None and r.boot_id != self.s.boot_id:
            self.s.retired_boots = [*self.s.retired_boots, self.s.boot_id][-MAX_BOOTS_KEPT:]
            self.s.seq_by_boot = {k: v for k, v in self.s.seq_by_boot.items() if not k.endswith(f":{self.s.boot_id}")}
        self.s.boot_id = r.boot_id
        self.s.seq_by_boot[_seq_key(r)] = r.seq
        if self._bounded() and len(self.s.seq_by_boot) > MAX_SEQ_SENDERS_KEPT:
            # Dicts keep insertion order: the senders heard from longest ago go first.
            self.s.seq_by_boot = dict(list(self.s.seq_by_boot.items())[-MAX_SEQ_SENDERS_KEPT:])
        self.s.latest = r
        if self.s.first_report is None:
            self.s.first_report = r
        seen = self.s.seen_events
        if self._no_harm():
            self.s.seen_events = remember_events(seen, new_event_ids(r, seen))
        if self.s.stage in (Stage.RETURN, Stage.PROBATION) and not r.healthy and self.s.recurrence is None:
            news = recurrence_findings(r, seen) if self._no_harm() else r.findings
            if news and classify(news, self.inp.generation, self.policy).actionable:
                self.s.recurrence = r.model_copy(update={"findings": news}) if self._no_harm() else r

    def _reject(self, reason: str, raw: Any) -> None:
        self.s.rejected_total += 1
        excerpt = repr(raw)[:200]
        self.s.rejected = [*self.s.rejected, RejectedReport(at=workflow.now(), reason=reason, excerpt=excerpt)][
            -MAX_REJECTED_KEPT:]
        workflow.logger.warning("rejected report for %s: %s", self.node, reason)

    def _asked(self, update: str, by: str, detail: str = "") -> None:
        if by:  # older callers (and histories) send no identity: nothing is recorded for them
            self._record("operator", f"{update} by {by[:200]}", True, detail)

    def _require_active(self, what: str) -> None:
        if self.s.stage is Stage.DONE:
            raise ValueError(f"cannot {what}: the episode has ended ({self.s.outcome})")

    def _record(self, step: str, summary: str, ok: bool, detail: str = "") -> None:
        if self._bounded():
            summary, detail = summary[:300], detail[:1000]
        self.s.actions.append(ActionRecord(at=workflow.now(), step=step, summary=summary, ok=ok, detail=detail))
        if self._bounded() and len(self.s.actions) > MAX_ACTIONS_KEPT:
            self.s.actions = self.s.actions[-MAX_ACTIONS_KEPT:]  # the whole list is in the history
        self._set_details()

    def _set_stage(self, stage: Stage, *also) -> None:
        self.s.stage = stage
        self._upsert(SA_STAGE.value_set(stage.value), *also)
        self._set_details()

    def _finish(self, outcome: Outcome, reason: str, *also) -> None:
        self.s.outcome, self.s.outcome_reason = outcome, reason
        last = self.s.rungs_tried[-1].value if self.s.rungs_tried else "none"
        metrics.remediation_finished(self.inp.cluster, outcome.value, last,
                                     (self.s.triage.fault_class if self.s.triage else None) or "none")
        self._set_stage(Stage.DONE, SA_OUTCOME.value_set(outcome.value), *also)

    def _upsert(self, *updates) -> None:
        workflow.upsert_search_attributes(list(updates))

    def _steered(self) -> bool:
        """An operator redirected the episode (skip or cancel) while it waited: re-plan first."""
        return self.s.skip_to is not None or self.s.cancel_reason is not None

    async def _hold_while_paused(self) -> None:
        """Held until resume or cancel (a skip given meanwhile applies on resume). A long pause gives
        the disruption lease back, so one parked node does not hold the fleet's budget."""
        if not self.s.paused:
            return
        self._set_details()
        released = lambda: not self.s.paused or self.s.cancel_reason is not None  # noqa: E731
        if self.s.lease_held and self._no_harm():
            limit = self.policy.pause_releases_lease_after
            try:
                await workflow.wait_condition(released, timeout=limit, timeout_summary=f"pause of {self.node}")
                return
            except TimeoutError:
                await self._release_lease()
                self._record("lease", f"gave back {self.node}'s disruption lease", True,
                             f"paused longer than {limit}; taken again on resume")
        await workflow.wait_condition(released)

    async def _continue_as_new_if_due(self) -> None:
        info = workflow.info()
        limit = self.inp.history_limit
        if info.is_continue_as_new_suggested() or (limit and info.get_current_history_length() > limit):
            await workflow.wait_condition(workflow.all_handlers_finished)
            workflow.continue_as_new(self.inp.model_copy(update={"state": self.s, "policy": self.policy}))

    def _episode(self) -> str:
        return f"{workflow.info().workflow_id}/{self.s.run_ids[0]}"

    def _gpus(self) -> list[int]:
        return self.s.triage.gpus if self.s.triage else []

    def _fault_label(self) -> str:
        t = self.s.triage
        if t is None or not t.verdicts:
            return "no fault"
        acted = [v.finding.label() for v in t.verdicts if v.rung is not None][:3]
        return ", ".join(acted) or t.fault_class or "fault"

    def _set_details(self, waiting: str = "") -> None:
        s = self.s
        lines = [f"## {self.node}: {s.stage.value}" + (f" ({s.outcome.value})" if s.outcome else "")]
        if s.triage and s.triage.fault_class:
            lines.append(f"**Fault**: {s.triage.fault_class}, {s.triage.attribution}: {s.triage.reason}")
        if s.stage is Stage.LADDER and s.next_rung:
            lines.append(f"**Next rung**: {s.next_rung.value}; tried: {', '.join(r.value for r in s.rungs_tried) or '-'}")
        if s.policy_sha256:
            lines.append(f"**Policy**: {s.policy_name} ({s.policy_sha256[:12]})")
        if s.paused:
            lines.append(f"**Paused**: {s.pause_reason}")
        if s.awaiting_approval:
            lines.append(f"**Awaiting approval** to {s.awaiting_approval.value} (update `approve`)")
        if waiting:
            lines.append(f"**Waiting**: {waiting}")
        lines += [f"- {a.at:%H:%M:%S} {'ok' if a.ok else 'FAILED'} {a.summary}" + (f": {a.detail}" if a.detail else "")
                  for a in s.actions[-8:]]
        workflow.set_current_details("\n".join(lines))

    def _result(self) -> RemediationResult:
        t = self.s.triage
        return RemediationResult(
            node=self.node, outcome=self.s.outcome, reason=self.s.outcome_reason,
            fault_class=t.fault_class if t else None, attribution=t.attribution if t else None,
            rungs=self.s.rungs_tried, validations=self.s.validations,
            detect_to_cordon_ms=self.s.detect_to_cordon_ms, run_ids=self.s.run_ids,
        )


def _seq_key(r: HealthReport) -> str:
    return f"{r.source}:{r.boot_id}"


def _cause(err: ActivityError | ApplicationError) -> str:
    if isinstance(err, ApplicationError):
        return f"{type(err).__name__}: {err}"
    cause = err.cause
    while cause is not None and cause.cause is not None and not isinstance(cause, ApplicationError):
        cause = cause.cause
    return f"{type(cause).__name__}: {cause}" if cause is not None else str(err)
