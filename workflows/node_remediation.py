"""NodeRemediation, id `remediate/<cluster>/<node>`: one unhealthy spell of one node, walked up the ladder."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RawValue

with workflow.unsafe.imports_passed_through():
    import api as c
    from api.episode import (
        SA_ATTRIBUTION,
        SA_FAULT,
        SA_UUIDS,
        Outcome,
        RemediationInput,
        RemediationResult,
        RemediationState,
        RemediationStatus,
        Stage,
    )
    from api.guard import LeaseGrant, QuarantineAnswer
    from api.names import HOLDER_SIGNAL_GRANTED, HOLDER_SIGNAL_QUARANTINE
    from policies.classify import classify
    from policies.terms import Rung
    from workflows.controller_policy import (
        controller_policy_applies,
        ignored_fields,
        policy_taken,
        take_controller_policy,
    )
    from workflows.episode import node_of
    from workflows.episode_constants import (
        PATCH_APPROVE_RUNG,
        PATCH_CLOSE_BARRIER,
        PATCH_FIRST_REPORT_DEADLINE,
        PATCH_KILL_IMPLICATED,
        PATCH_LEASE_BACKOFF,
        PATCH_NODE_PROFILES,
        PATCH_REPEAT_PER_BOARD,
        PATCH_REPLACE_ON_AGENT_RECURRENCE,
    )
    from workflows.outcome import PATCH_OUTCOME_LEDGER, outcome_fields
    from workflows.remediation_steps import RemediationSteps
    from workflows.report_intake import describe, record_rejection, take_report
    from workflows.rungs import RungActions
    from workflows.suspect import PATCH_SUSPECT_LOAD_TEST, SuspectCheck
    from workflows.validation import PATCH_LOAD_VALIDATION


@workflow.defn(name=c.EPISODE_WORKFLOW)
class NodeRemediation(RungActions, RemediationSteps, SuspectCheck):
    """The runbook: triage, the ladder one rung at a time, return to service, probation. Its parts
    are lease.py (the guard), remediation_steps.py (cordon, drain, approval), rungs.py (the
    actions and validation), episode.py (state and records), report_intake.py (reports)."""

    @workflow.init
    def __init__(self, inp: RemediationInput) -> None:
        self.inp = inp
        self.policy = inp.policy
        # The node is the one the workflow id names (`remediate/<cluster>/<node>`), never what the start input says.
        self.node = node_of(workflow.info().workflow_id, inp.node) if self._identity() else inp.node
        # Only a run this workflow continued carries state: a first run's input comes from whoever
        # sent the first report, and is never trusted with the episode's state.
        self.s = (inp.state if workflow.info().continued_run_id else None) or RemediationState()
        self._decide_issue22()
        self._profiles = False  # PATCH_NODE_PROFILES, decided with the other patches
        self._lease_backoff = False  # PATCH_LEASE_BACKOFF, likewise
        self._action_failed = ""  # why the rung just acted could not be done (rungs.py), read once

    # --- handlers: agents signal, operators update, everyone queries --------------------------
    @workflow.signal
    def report(self, payload: RawValue) -> None:
        """A health report. Anything wrong with it, an undecodable payload too, is recorded and
        dropped: never a failed task (taken raw: the SDK would drop what it cannot decode with a log line)."""
        try:
            raw = workflow.payload_converter().from_payload(payload.payload)
        except Exception as err:  # noqa: BLE001 - any bad payload is a rejection, not a task failure
            if not self._trusted_intake():
                workflow.logger.warning("dropped an undecodable report for %s: %s", self.node, err)
                return
            raw, why = payload.payload.data[:200], f"undecodable report: {type(err).__name__}: {str(err)[:200]}"
        else:
            why = take_report(self.s, raw, node=self.node, generation=self.inp.generation, policy=self.policy,
                              bounded=self._bounded, no_harm=self._no_harm, trusted=self._trusted_intake,
                              now_us=int(workflow.now().timestamp() * 10**6))
        if self.s.held:
            self._hold_news = True  # the held episode looks at the node again
        if self.s.stage is Stage.DONE and self._late_reports():
            # The episode has decided and is closing: this report is not acted on. Said where a person
            # looks; the sender's next report (the agent re-sends while unhealthy) starts a new episode.
            self.s.late_reports += 1
            self._record("report", f"report for {self.node} after the episode ended ({self.s.outcome.value})", False,
                         f"{describe(raw)}; not acted on ({why or 'accepted'}): the next report starts a new episode")
        if why is not None:
            record_rejection(self.s, why, raw, workflow.now())
            workflow.logger.warning("rejected report for %s: %s", self.node, why)
        elif self.s.latest is not None and self.s.latest.source == "agent":
            self.s.agent_boot_id = self.s.latest.boot_id  # only the agent's own boot ends a reboot's wait

    @workflow.signal(name=HOLDER_SIGNAL_GRANTED)
    def lease_granted(self, grant: LeaseGrant) -> None:
        self._take_grant(grant)

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
    def approve(self, rung: str = "", by: str = "") -> RemediationStatus:
        if not self._fixed(PATCH_APPROVE_RUNG):
            by = by or rung  # callers before approve-names-rung sent only who asked
        self.s.approved.append(self.s.awaiting_approval)
        self._asked("approve", by, self.s.awaiting_approval.value)
        return self.status()

    @approve.validator
    def _validate_approve(self, rung: str = "", by: str = "") -> None:
        if self.s.awaiting_approval is None:
            raise ValueError("nothing awaits approval")
        waiting = self.s.awaiting_approval.value
        if self._fixed(PATCH_APPROVE_RUNG) and rung != waiting:
            # The operator approves what they saw: a rung the episode moved past or to since is not approved.
            said = f"you approved {rung!r}" if rung else "no rung named"
            raise ValueError(f"{said}, but {self.node} awaits approval to {waiting}: nothing approved "
                             f"(gpuheal approve {self.node} {waiting})")

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

    @workflow.update
    def lift(self, reason: str = "", by: str = "") -> RemediationStatus:
        """An operator lifts the hold on a node an earlier episode left quarantined: it is uncordoned."""
        self.s.lifted_by, self.s.lift_reason = by[:200], reason[:300]
        self._asked("lift", by, reason)
        return self.status()

    @lift.validator
    def _validate_lift(self, reason: str = "", by: str = "") -> None:
        if not self.s.held or self.s.stage is Stage.DONE:
            raise ValueError("not held: nothing to lift")
        if not by:
            raise ValueError("say who lifts the hold")

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
            waiting=self._waiting_for(), held=s.held,
        )

    def _waiting_for(self) -> str:
        """What the episode waits on now, in words (`gpuheal status NODE`)."""
        s = self.s
        if s.stage is Stage.DONE:
            return ""
        if s.held:
            return f"a person: {s.held}" + ("" if "gpuheal lift" in s.held else f" (gpuheal lift {self.node})")
        if s.paused:
            return f"resume: paused ({s.pause_reason})"
        if s.admission == "deferred":
            return f"room to quarantine: {s.admission_reason}"
        if s.awaiting_approval is not None:
            return f"approval to {s.awaiting_approval.value} (gpuheal approve {self.node} {s.awaiting_approval.value})"
        if s.lease_requested and not s.lease_held:
            return "a disruption lease from the fleet guard"
        if s.latest is None and s.stage is Stage.TRIAGE:
            return f"a valid report from {self.node} ({s.rejected_total} rejected so far)"
        if s.stage is Stage.PROBATION:
            return f"the end of probation ({self.policy.probation if self.policy else ''})"
        return ""

    # --- the runbook ---------------------------------------------------------------------------
    @workflow.run
    async def run(self, inp: RemediationInput) -> RemediationResult:
        self._begin_run()
        await self._take_controller_policy()
        if self._fixed(PATCH_FIRST_REPORT_DEADLINE):
            await self._first_valid_report()
        else:
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

    async def _first_valid_report(self) -> None:
        """A start whose report was rejected (malformed, spoofed, stale) waits for a valid one as long
        as an agent is given to answer, then ends `rejected` with why: it never waits unseen."""
        if self.s.latest is not None:
            return
        timeout = self.policy.validation.agent_timeout if self.policy else timedelta(minutes=2)
        try:
            await workflow.wait_condition(lambda: self.s.latest is not None or self.s.cancel_reason is not None,
                                          timeout=timeout, timeout_summary=f"wait for a valid report from {self.node}")
        except TimeoutError:
            last = f"; the latest: {self.s.rejected[-1].reason}" if self.s.rejected else ""
            self._finish(Outcome.REJECTED, f"rejected: no valid report for {self.node} within {timeout} of the "
                                           f"start ({self.s.rejected_total} rejected{last}); nothing done")

    def _id_refused(self) -> str | None:
        """Why the id is no episode of this controller's (None: it is). `remediate/<cluster>/<node>`
        must name the controller's cluster: a sender naming another would start a second episode for
        the node beside its real one. An id from before ids carried the cluster names none, so no
        recorded history reaches the refusal (no patch needed); nor does an id of another shape
        (every recorded id is `remediate/<node>`), which is refused."""
        wid = workflow.info().workflow_id
        if not self._identity():
            return None
        if c.node_in_workflow_id(wid, "remediate") is None:
            return f"the episode id {wid[:200]!r} is not remediate/<cluster>/<node>"
        named = c.cluster_in_workflow_id(wid, "remediate")
        if named is None or named == self.inp.cluster:
            return None
        return (f"the episode id names cluster {named}, the controller serves {self.inp.cluster}: a report "
                f"for {self.node} goes to remediate/{self.inp.cluster}/{self.node}")

    async def _take_controller_policy(self) -> None:
        """The controller's policy, once per episode (a continued run carries it): the sender's
        policy, GPU count and guard queue in the start input are ignored, and the history says so."""
        if not controller_policy_applies():
            return
        # Every patch is decided before the first local activity of a run: on replay, a patch
        # marker after a local activity's marker in one workflow task is a nondeterminism error.
        self._bounded(), self._no_harm(), self._local_cluster_calls(), self._guard_admission()
        self._profiles = workflow.patched(PATCH_NODE_PROFILES)
        self._lease_backoff = workflow.patched(PATCH_LEASE_BACKOFF)
        workflow.patched(PATCH_LOAD_VALIDATION), workflow.patched(PATCH_SUSPECT_LOAD_TEST)  # read where used
        self._trusted_intake(), self._identity(), self._holds(), self._sticky(), self._late_reports()
        if workflow.info().continued_run_id and self.s.policy_sha256:
            return
        snap = await take_controller_policy(self.node)
        trusted = {"policy": snap.policy, "state": None, "expected_gpus": None,
                   "guard_task_queue": workflow.info().task_queue}
        if self._identity():
            # The controller's cluster (so its guard and budget) and history limit, not the sender's.
            trusted |= {"node": self.node, "history_limit": snap.policy.history_limit,
                        "cluster": snap.cluster or self.inp.cluster}
        ignored = ignored_fields(self.inp, trusted) if not workflow.info().continued_run_id else []
        self.inp = self.inp.model_copy(update=trusted)
        self.policy = snap.policy
        self.s.policy_name, self.s.policy_sha256 = snap.name, snap.sha256
        self.s.profile = snap.profile or ""  # the outcome ledger's --by profile
        self._record("policy", *policy_taken(snap, ignored))

    async def _triage(self) -> None:
        report = self.s.latest
        if (why := self._id_refused()) is not None:
            return self._finish(Outcome.REJECTED, f"rejected: {why}")
        if self._no_harm() and not await self._node_is_ours():
            return
        if self._holds() and await self._held_for_a_person():
            return
        if self._sticky() and await self._conditions_already_handled(report):
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
        if self._profiles and self.policy.observe:
            return self._finish(Outcome.OBSERVED, f"observe mode ({self.policy.name}): would start at "
                                                  f"{t.start_rung.value} ({t.fault_class}); nothing done")
        self.s.next_rung = t.start_rung
        if self.s.stale_report:  # hold-when-unchecked, released by its timer on the old report
            return await self._leave_for_a_person(f"{self.s.stale_report}: cordoned and tainted for a person, "
                                                  "nothing disruptive done on old news")
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
        if rung is Rung.KILL and not self._gpus() and self._fixed(PATCH_KILL_IMPLICATED):
            # "Every GPU" would kill other tenants' jobs for one that cannot be located.
            return await self._leave_for_a_person(
                f"kill: {self._fault_label()} names no GPU of {self.node} (its bus id maps to none): nothing "
                "killed, other tenants' jobs untouched; cordoned for a person")
        if rung.disruptive:
            await self._quarantine()
            if self._quarantine_withheld() or not self._cordon_holds():
                return
            approved = await self._approved(rung)
            if self._no_harm() and self._steered():
                return
            if not approved:
                return self._finish(Outcome.AWAITING_APPROVAL, f"{rung.value} was not approved in time")
            if not await self._lease_unpaused():
                return
            await self._drain()
            if self.s.stage is Stage.DONE:
                return
        await self._hold_while_paused()
        if self._steered():
            return
        if rung.disruptive and self._no_harm() and not self.policy.dry_run and not self.s.lease_held:
            if not await self._lease_unpaused():  # a long pause gave it back
                return
        if rung.disruptive and self._suspect_pending():
            if await self._suspect_cleared() or self.s.stage is Stage.DONE:
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
        if why := self._failed_action_stops(rung):
            return await self._leave_for_a_person(why)
        if self.s.agent_missing and (why := self._agent_missing_stops(rung)):
            return await self._leave_for_a_person(why)
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
        self.s.next_rung = max(above, t.start_rung, key=lambda r: r.rank)
        self._record("probation", f"recurrence on {self.node} during probation", False,
                     f"{t.reason}: escalate to {self.s.next_rung.value}")
        sender, self.s.recurrence = self.s.recurrence.source, None
        if (self.s.next_rung is Rung.REPLACE and sender != "agent"
                and self._fixed(PATCH_REPLACE_ON_AGENT_RECURRENCE)):
            # Anyone able to signal can send a report; only the node's own probes are evidence enough
            # to replace it and denylist its hardware.
            return await self._leave_for_a_person(
                f"recurrence on {self.node} reported by {sender[:64]}, not its own agent: a replace needs the "
                "node's own probes; cordoned for a person")
        self._set_stage(Stage.LADDER)

    async def _commit_side_effects(self) -> None:
        """A durable timer before the run ends or continues as new: the local activities run so far
        are recorded in a task that does not end the run, so a signal arriving meanwhile (a guard's
        answer to one of them) cannot fail the ending task and have them run again."""
        if self._fixed(PATCH_CLOSE_BARRIER) and self._local_cluster_calls():
            await workflow.sleep(timedelta(seconds=1), summary=f"record {self.node}'s last steps")

    async def _close_episode(self) -> None:
        await self._tell_guard_the_ending()
        if self.s.triage is not None and self.s.triage.actionable and self.s.outcome is not Outcome.REJECTED:
            await self._ledger(c.LEDGER_RECORD, c.RemediationRecord(
                node=self.node, episode=self._episode(), hardware_ids=self.s.hardware_ids,
                fault_class=self.s.triage.fault_class, attribution=self.s.triage.attribution,
                rungs=[r.value for r in self.s.rungs_tried], outcome=self.s.outcome.value,
                started_at=self.s.started_at, ended_at=workflow.now(),
                boards=self.s.implicated if self._fixed(PATCH_REPEAT_PER_BOARD) else [],
                **(outcome_fields(self.s, self.inp.generation.value, workflow.now())
                   if workflow.patched(PATCH_OUTCOME_LEDGER) else {})), None,
                f"record {self.node}'s episode in the ledger")
        await self._commit_side_effects()

    async def _continue_as_new_if_due(self) -> None:
        info = workflow.info()
        limit = self.inp.history_limit
        if info.is_continue_as_new_suggested() or (limit and info.get_current_history_length() > limit):
            await self._commit_side_effects()
            await workflow.wait_condition(workflow.all_handlers_finished)
            workflow.continue_as_new(self.inp.model_copy(update={"state": self.s, "policy": self.policy}))

    def _asked(self, update: str, by: str, detail: str = "") -> None:
        if by:  # older callers (and histories) send no identity: nothing is recorded for them
            self._record("operator", f"{update} by {by[:200]}", True, detail)

    def _require_active(self, what: str) -> None:
        if self.s.stage is Stage.DONE:
            raise ValueError(f"cannot {what}: the episode has ended ({self.s.outcome})")
