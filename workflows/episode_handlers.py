"""What others send a running episode: health reports (any wrong one recorded and dropped, never a
failed task), the fleet guard's answers, and an operator's updates (`gpuheal pause|resume|approve|
skip|cancel|lift`: each validator refuses before anything is written to the history; the update
records who asked and answers with the episode's status)."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RawValue

with workflow.unsafe.imports_passed_through():
    from api.episode import GuardAnswer, Outcome, RemediationStatus, Stage
    from api.guard import LeaseGrant, QuarantineAnswer
    from api.names import HOLDER_SIGNAL_GRANTED, HOLDER_SIGNAL_QUARANTINE
    from policies.terms import Rung
    from workflows.episode_status import episode_status
    from workflows.lease import GuardClient
    from workflows.report_intake import describe, record_rejection, take_report


class EpisodeHandlers(GuardClient):
    """NodeRemediation's handlers: signals, updates, the `status` query."""

    @workflow.query
    def status(self) -> RemediationStatus:
        return self._answer()

    @workflow.signal
    def report(self, payload: RawValue) -> None:
        """A health report. Anything wrong with it, an undecodable payload too, is recorded and
        dropped: never a failed task (taken raw: the SDK would drop what it cannot decode with a log line)."""
        try:
            raw = workflow.payload_converter().from_payload(payload.payload)
        except Exception as err:  # noqa: BLE001 - any bad payload is a rejection, not a task failure
            raw, why = payload.payload.data[:200], f"undecodable report: {type(err).__name__}: {str(err)[:200]}"
        else:
            why = take_report(self.s, raw, node=self.node, generation=self.inp.generation, policy=self.policy,
                              now_us=int(workflow.now().timestamp() * 10**6))
        if self.s.held:
            self._hold_news = True  # the held episode looks at the node again
        if self.s.stage is Stage.DONE:
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
        if self.s.admission != GuardAnswer.ADMITTED:
            self.s.admission = GuardAnswer.ADMITTED if answer.admitted else GuardAnswer.DEFERRED
            self.s.admission_reason = answer.reason

    # Updates take who asked as their last argument (the CLI sends its client identity): an update
    # handler cannot see the caller, and the record in the history and in `status` names them.
    @workflow.update
    def pause(self, reason: str = "", by: str = "") -> RemediationStatus:
        self.s.paused, self.s.pause_reason = True, reason or "paused by operator"
        self._asked("pause", by, reason)
        return self._answer()

    @pause.validator
    def _validate_pause(self, reason: str = "", by: str = "") -> None:
        self._require_active("pause")
        if self.s.paused:
            raise ValueError("already paused")

    @workflow.update
    def resume(self, by: str = "") -> RemediationStatus:
        self.s.paused, self.s.pause_reason = False, ""
        self._asked("resume", by)
        return self._answer()

    @resume.validator
    def _validate_resume(self, by: str = "") -> None:
        if not self.s.paused:
            raise ValueError("not paused")

    @workflow.update
    def approve(self, rung: str = "", by: str = "") -> RemediationStatus:
        self.s.approved.append(self.s.awaiting_approval)
        self._asked("approve", by, self.s.awaiting_approval.value)
        return self._answer()

    @approve.validator
    def _validate_approve(self, rung: str = "", by: str = "") -> None:
        if self.s.awaiting_approval is None:
            raise ValueError("nothing awaits approval")
        waiting = self.s.awaiting_approval.value
        if rung != waiting:
            # The operator approves what they saw: a rung the episode moved past or to since is not approved.
            said = f"you approved {rung!r}" if rung else "no rung named"
            raise ValueError(f"{said}, but {self.node} awaits approval to {waiting}: nothing approved "
                             f"(gpuheal approve {self.node} {waiting})")

    @workflow.update
    def skip_to(self, rung: str, by: str = "") -> RemediationStatus:
        self.s.skip_to = Rung(rung)
        self._asked("skip_to", by, rung)
        return self._answer()

    @skip_to.validator
    def _validate_skip_to(self, rung: str, by: str = "") -> None:
        self._require_active("skip")
        if rung not in {r.value for r in Rung}:
            raise ValueError(f"unknown rung {rung!r}: one of {', '.join(r.value for r in Rung)}")

    @workflow.update
    def cancel(self, reason: str = "", by: str = "") -> RemediationStatus:
        self.s.cancel_reason = reason or "cancelled by operator"
        self._asked("cancel", by, reason)
        return self._answer()

    @cancel.validator
    def _validate_cancel(self, reason: str = "", by: str = "") -> None:
        self._require_active("cancel")

    @workflow.update
    def lift(self, reason: str = "", by: str = "") -> RemediationStatus:
        """An operator lifts the hold on a node an earlier episode left quarantined: it is uncordoned."""
        self.s.lifted_by, self.s.lift_reason = by[:200], reason[:300]
        self._asked("lift", by, reason)
        return self._answer()

    @lift.validator
    def _validate_lift(self, reason: str = "", by: str = "") -> None:
        if not self.s.held or self.s.stage is Stage.DONE:
            raise ValueError("not held: nothing to lift")
        if not by:
            raise ValueError("say who lifts the hold")

    def _asked(self, update: str, by: str, detail: str = "") -> None:
        if by:  # older callers (and histories) send no identity: nothing is recorded for them
            self._record("operator", f"{update} by {by[:200]}", True, detail)

    def _require_active(self, what: str) -> None:
        if self.s.stage is Stage.DONE:
            raise ValueError(f"cannot {what}: the episode has ended ({self.s.outcome})")

    def _answer(self) -> RemediationStatus:
        """What every update answers: the episode's status after it."""
        return episode_status(self.s, node=self.node, cluster=self.inp.cluster, policy=self.policy)

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
