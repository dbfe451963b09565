"""NodeRemediation, id `remediate/<cluster>/<node>`: one unhealthy spell of one node, walked up the ladder."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    import api as c
    from api.episode import (
        SA_ATTRIBUTION,
        SA_FAULT,
        SA_UUIDS,
        GuardAnswer,
        Outcome,
        RemediationInput,
        RemediationResult,
        RemediationState,
        Stage,
    )
    from policies.classify import classify
    from policies.terms import Rung
    from workflows.controller_policy import ignored_fields, policy_taken, take_controller_policy
    from workflows.episode import node_of
    from workflows.episode_constants import PATCH_POLICY_WITH_CHECK
    from workflows.episode_handlers import EpisodeHandlers
    from workflows.episode_status import id_refused
    from workflows.outcome import outcome_fields
    from workflows.remediation_steps import RemediationSteps
    from workflows.rungs import RungActions
    from workflows.suspect import SuspectCheck


@workflow.defn(name=c.EPISODE_WORKFLOW)
class NodeRemediation(EpisodeHandlers, RungActions, RemediationSteps, SuspectCheck):
    """The runbook: triage, the ladder one rung at a time, return to service, probation. Its parts
    are episode_handlers.py (reports, the guard's answers, an operator's updates, `status`),
    lease.py (the guard), remediation_steps.py (cordon, drain, approval), rungs.py (the actions and
    validation), episode.py (state and records), report_intake.py (what a report does)."""

    @workflow.init
    def __init__(self, inp: RemediationInput) -> None:
        self.inp = inp
        self.policy = inp.policy
        # The node is the one the workflow id names (`remediate/<cluster>/<node>`), never what the start input says.
        self.node = node_of(workflow.info().workflow_id, inp.node)
        # Only a run this workflow continued carries state: a first run's input comes from whoever
        # sent the first report, and is never trusted with the episode's state.
        self.s = (inp.state if workflow.info().continued_run_id else None) or RemediationState()
        self._action_failed = ""  # why the rung just acted could not be done (rungs.py), read once

    # --- the runbook ---------------------------------------------------------------------------
    @workflow.run
    async def run(self, inp: RemediationInput) -> RemediationResult:
        self._begin_run()
        await self._take_controller_policy()
        await self._first_valid_report()
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
        if workflow.info().continued_run_id and self.s.policy_sha256:
            return
        # With the report at hand (it comes with the start), the node is checked in the same call:
        # one local activity fewer before a cordon (issue 25's storm). Used once, for that report.
        report = self.s.latest
        check = report is not None and workflow.patched(PATCH_POLICY_WITH_CHECK)
        snap = await take_controller_policy(self.node, check, report.boot_id if check else None)
        if check and snap.node_check is not None:
            self._checked = (report.boot_id, snap.node_check, workflow.now())
        # The controller's cluster (so its guard and budget) and history limit, not the sender's.
        trusted = {"policy": snap.policy, "state": None, "expected_gpus": None,
                   "guard_task_queue": workflow.info().task_queue, "node": self.node,
                   "history_limit": snap.policy.history_limit, "cluster": snap.cluster or self.inp.cluster}
        ignored = ignored_fields(self.inp, trusted) if not workflow.info().continued_run_id else []
        self.inp = self.inp.model_copy(update=trusted)
        self.policy = snap.policy
        self.s.policy_name, self.s.policy_sha256 = snap.name, snap.sha256
        self.s.profile = snap.profile or ""  # the outcome ledger's --by profile
        self._record("policy", *policy_taken(snap, ignored))

    async def _triage(self) -> None:
        report = self.s.latest
        if (why := id_refused(workflow.info().workflow_id, self.inp.cluster, self.node)):
            return self._finish(Outcome.REJECTED, f"rejected: {why}")
        if not await self._node_is_ours():
            return
        if await self._held_for_a_person():
            return
        if await self._conditions_already_handled(report):
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
        if self.policy.observe:
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
        if rung is Rung.KILL and not self._gpus():
            # "Every GPU" would kill other tenants' jobs for one that cannot be located.
            return await self._leave_for_a_person(
                f"kill: {self._fault_label()} names no GPU of {self.node} (its bus id maps to none): nothing "
                "killed, other tenants' jobs untouched; cordoned for a person")
        if rung.disruptive:
            await self._quarantine()
            if self._quarantine_withheld() or not self._cordon_holds():
                return
            approved = await self._approved(rung)
            if self._steered():
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
        if rung.disruptive and not self.policy.dry_run and not self.s.lease_held:
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
        if done is None:
            # `returned` means the API server shows the node schedulable: it does not, so a person looks.
            await self._release_lease("quarantined")
            return self._finish(Outcome.QUARANTINED, f"validated after {self.s.fixed_by.value}, but the uncordon "
                                f"failed ({self.s.actions[-1].detail}): the node stays cordoned for a person")
        self.s.quarantined = self.s.drained = False
        self.s.admission = GuardAnswer.NOT_ASKED  # back in service: a recurrence asks the guard for room again
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
        if self.s.next_rung is Rung.REPLACE and sender != "agent":
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
        await workflow.sleep(timedelta(seconds=1), summary=f"record {self.node}'s last steps")

    async def _close_episode(self) -> None:
        await self._tell_guard_the_ending()
        if self.s.triage is not None and self.s.triage.actionable and self.s.outcome is not Outcome.REJECTED:
            await self._ledger(c.LEDGER_RECORD, c.RemediationRecord(
                node=self.node, episode=self._episode(), hardware_ids=self.s.hardware_ids,
                fault_class=self.s.triage.fault_class, attribution=self.s.triage.attribution,
                rungs=[r.value for r in self.s.rungs_tried], outcome=self.s.outcome.value,
                started_at=self.s.started_at, ended_at=workflow.now(),
                boards=self.s.implicated, **outcome_fields(self.s, self.inp.generation.value, workflow.now())),
                None,
                f"record {self.node}'s episode in the ledger")
        await self._commit_side_effects()

    async def _continue_as_new_if_due(self) -> None:
        info = workflow.info()
        limit = self.inp.history_limit
        if info.is_continue_as_new_suggested() or (limit and info.get_current_history_length() > limit):
            await self._commit_side_effects()
            await workflow.wait_condition(workflow.all_handlers_finished)
            workflow.continue_as_new(self.inp.model_copy(update={"state": self.s, "policy": self.policy}))
