"""The lease between an episode and its cluster's FleetGuard: the messages both sides send, and
the episode's side of it (ask before cordoning, take a disruption lease, give it back, tell every
ending). The guard's side is workflows/fleet_guard.py."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

from pydantic import BaseModel
from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    import api as c
    from api.episode import GuardAnswer, Outcome
    from api.guard import (
        FaultNotice,
        GuardLiveness,
        GuardLivenessRequest,
        LeaseGrant,
        LeaseRelease,
        LeaseRequest,
        TakeRoomRequest,
    )
    from api.names import GUARD_SIGNAL_FAULT, GUARD_SIGNAL_RELEASE, GUARD_SIGNAL_REQUEST
    from policies.durations import format_duration
    from workflows.calls import call_or_none
    from workflows.episode import Episode
    from workflows.episode_constants import PATCH_SLOT_TOLD_WHEN_TAKEN
    from workflows.report_intake import fault_cleared

RESEND_BACKOFF_CAP = 8  # a waiting episode re-sends its request at most every 8 x holder_check_interval
# A guard that runs but has not answered within this many admission_timeouts (10 min by default) is
# taken as stuck all the same: a bad node is not left in service on a guard's word that never comes.
SLOW_GUARD_PATIENCE = 20


class GuardClient(Episode):
    """The episode's side of the lease."""

    async def _signal_guard(self, signal: str, arg: BaseModel) -> None:
        """Signal-with-start through a local activity, so the guard exists whenever it is needed
        (one marker event; a guard terminated or reset since is started again)."""
        await self._ledger(
            c.GUARD_SIGNAL,
            c.GuardSignalRequest(cluster=self.inp.cluster, guard=self.policy.guard, task_queue=self.inp.guard_task_queue,
                                 signal=signal, payload=arg.model_dump(mode="json")),
            None, f"{signal} to fleet guard for {self.node}", max_interval=timedelta(seconds=10))

    def _fault_notice(self, **kind: bool | str) -> FaultNotice:
        t = self.s.triage
        return FaultNotice(node=self.node, holder=workflow.info().workflow_id,
                           fault_class=t.fault_class if t else None, sent_at=workflow.now(), **kind)

    def _lease_request(self) -> LeaseRequest:
        return LeaseRequest(cluster=self.inp.cluster, holder=workflow.info().workflow_id, node=self.node,
                            request_id=self.s.lease_request_id)

    def _take_grant(self, grant: LeaseGrant) -> None:
        """A grant is the lease only for the request outstanding: one that arrives after the lease was
        given back (a re-grant of a re-sent request, a duplicate) would have a drain run with no
        holder at the guard, and one with no id proves nothing (the guard echoes the id)."""
        if not (self.s.lease_requested and grant.request_id == self.s.lease_request_id):
            # Counted and logged, not a step of the record: a re-grant arriving after the lease went
            # back is routine, and the record's steps time the episode's phases.
            self.s.stray_grants += 1
            workflow.logger.info("%s: ignored a lease grant of request %s (outstanding: %s)", self.node,
                                 grant.request_id or "(none)", self.s.lease_request_id if self.s.lease_requested else "none")
            return
        self.s.lease_held = True

    async def _tell_guard(self, healthy: bool) -> None:
        if (healthy and not self.s.guard_notified) or self.policy.dry_run:
            return
        await self._signal_guard(GUARD_SIGNAL_FAULT, self._fault_notice(healthy=healthy))
        self.s.guard_notified = not healthy

    async def _admitted_to_quarantine(self) -> bool:
        """The guard admits a cordon while at most max_unhealthy nodes are quarantined; past that
        the fault waits uncordoned, recorded with the reason, until there is room, the fault clears
        or an operator cancels. A guard that does not answer in time does not stop the cordon."""
        if self.s.admission == GuardAnswer.ADMITTED:
            return True
        # Asked only where the policy reserves room: no local activity for nothing on every cordon.
        if not self.s.admission and self.policy.guard.room_ahead and await self._took_room_ahead():
            return True
        timeout = self.policy.guard.admission_timeout
        if not self.s.admission:
            await self._signal_guard(GUARD_SIGNAL_FAULT, self._fault_notice(admission=True))
            self.s.admission, self.s.guard_notified = GuardAnswer.ASKED, True
        done = lambda: self.s.admission == GuardAnswer.ADMITTED or self._fault_cleared() or self.s.cancel_reason is not None  # noqa: E731
        answered = lambda: done() or self.s.admission == GuardAnswer.DEFERRED  # noqa: E731
        stuck = ""
        try:
            await workflow.wait_condition(answered, timeout=timeout,
                                          timeout_summary=f"the fleet guard's answer for {self.node}")
        except TimeoutError:
            stuck = await self._guard_stuck(answered)
        if stuck:
            # Told before the cordon, as a fault the guard counts at once: a slow guard's books
            # must hold this node, or it admits others into room this one already took.
            await self._signal_guard(GUARD_SIGNAL_FAULT, self._fault_notice())
            self._record("quarantine", f"no answer from the fleet guard for {self.node}", False,
                         f"none within {timeout}: cordoning anyway (a bad node is not left in service); "
                         f"the guard counts it quarantined; {stuck}")
            self.s.admission = GuardAnswer.ADMITTED
            return True
        if self.s.admission == GuardAnswer.DEFERRED and not done():
            self._record("quarantine", f"quarantine of {self.node} deferred by the fleet guard", False,
                         self.s.admission_reason)
            self._set_details(f"room to quarantine: {self.s.admission_reason}")
            while not done():
                # Asked again now and then: a guard started afresh knows no deferred faults.
                try:
                    await workflow.wait_condition(done, timeout=self.policy.guard.holder_check_interval,
                                                  timeout_summary=f"{self.node}'s quarantine request, re-sent")
                except TimeoutError:
                    await self._signal_guard(GUARD_SIGNAL_FAULT, self._fault_notice(admission=True))
            if self.s.admission == GuardAnswer.ADMITTED:
                self._record("quarantine", f"quarantine of {self.node} admitted by the fleet guard", True)
        if self.s.admission != GuardAnswer.ADMITTED and self._fault_cleared():
            self._finish(Outcome.HEALTHY, "the fault cleared while its quarantine was deferred; nothing done")
        return self.s.admission == GuardAnswer.ADMITTED

    async def _guard_stuck(self, answered: Callable[[], bool]) -> str:
        """After admission_timeout with no answer: the reason the guard is stuck (the caller cordons
        anyway), or "" once it answered. A guard that runs and whose worker takes its tasks is
        slow, not stuck: waited for, re-asked as the wait doubles, so a storm's late answers do not
        cordon past max_unhealthy (guard storm, 2,000 of 10,000: 1,631 quarantined against 1,000)."""
        timeout, noted, doubt = self.policy.guard.admission_timeout, False, ""
        wait, asked = timeout, workflow.now() - timeout
        while True:
            live = await call_or_none(lambda why: None, c.GUARD_LIVENESS,
                                      GuardLivenessRequest(cluster=self.inp.cluster,
                                                           stale_after=max(180.0, 2 * timeout.total_seconds())),
                                      GuardLiveness, summary="is the fleet guard stuck or slow",
                                      timeout=timedelta(seconds=30), attempts=2)
            if answered():
                return ""
            # Stuck only when seen twice in a row, a wait and a re-send apart: in a storm, one task
            # past the deadlock timeout or a rate-limited describe must not cordon thousands at once.
            now_doubt = (live.why if live.stuck else "") if live else "the guard's liveness could not be read"
            if now_doubt and doubt:
                return now_doubt
            doubt = now_doubt
            if workflow.now() - asked >= timeout * SLOW_GUARD_PATIENCE:
                return f"the fleet guard runs but has not answered in {format_duration(workflow.now() - asked)}"
            if not noted:
                noted = True
                self._record("quarantine", f"the fleet guard is slow to answer for {self.node}", False,
                             f"{doubt or live.why}: waiting for its answer, uncordoned, up to "
                             f"{format_duration(timeout * SLOW_GUARD_PATIENCE)} (max_unhealthy holds)")
                self._set_details("the fleet guard's answer (it is slow)")
            try:
                await workflow.wait_condition(answered, timeout=wait,
                                              timeout_summary=f"the slow fleet guard's answer for {self.node}")
                return ""
            except TimeoutError:
                # Re-asked: a guard started afresh since knows no pending admission.
                await self._signal_guard(GUARD_SIGNAL_FAULT, self._fault_notice(admission=True))
                wait = min(wait * 2, timeout * RESEND_BACKOFF_CAP)

    async def _took_room_ahead(self) -> bool:
        """A slot the guard reserved for this controller ahead of demand: counted there already, so
        the cordon needs no round trip. None left (or no pool): the guard is asked."""
        # The slot's notice goes with the take: the guard has it before the cordon, and the episode
        # spends no second local activity telling it (issue 25's storm).
        told = workflow.patched(PATCH_SLOT_TOLD_WHEN_TAKEN)
        token = await call_or_none(lambda why: None, c.GUARD_TAKE_ROOM,
                                   TakeRoomRequest(cluster=self.inp.cluster, now=workflow.now(),
                                                   notice=self._fault_notice() if told else None), str,
                                   summary=f"room to quarantine {self.node}, reserved ahead", local=True,
                                   timeout=timedelta(seconds=15 if told else 5), attempts=1)
        if token:
            self.s.admission, self.s.room_token = GuardAnswer.ADMITTED, token
            self.s.guard_notified = self.s.guard_notified or told
        return bool(token)

    async def _tell_guard_the_slot(self) -> None:
        """The slot becomes the node at the guard (told whether the cordon took or not: either way
        the node counts until its episode ends or the reconcile finds no taint)."""
        if self.s.room_token and not self.s.guard_notified:
            await self._signal_guard(GUARD_SIGNAL_FAULT, self._fault_notice(room_token=self.s.room_token))
            self.s.guard_notified = True

    def _fault_cleared(self) -> bool:
        t = self.s.triage
        return fault_cleared([v.finding for v in t.verdicts if v.rung is not None] if t else [], self.s.latest)

    async def _acquire_lease(self) -> None:
        if self.s.lease_held:
            return
        if self.policy.dry_run:
            # A dry run disrupts nothing, so it must not take budget from real remediations.
            return self._record("lease", f"would take a disruption lease for {self.node}", True, "dry run")
        if not self.s.lease_requested:
            self.s.lease_requests += 1
            # Not derivable from what `status` shows (the run ids): a grant must echo what the guard
            # was sent (workflow.uuid4 is replay-safe).
            self.s.lease_request_id = f"{self._episode()}/{self.s.lease_requests}/{workflow.uuid4().hex[:12]}"
            self.s.lease_requested = True  # before the signal: its grant may arrive while it is sent
            await self._signal_guard(GUARD_SIGNAL_REQUEST, self._lease_request())
            self.s.lease_requested = True
        self._set_details("waiting for a disruption lease from the fleet guard")
        asked = workflow.now()
        every = self.policy.guard.holder_check_interval
        while True:
            # The request is sent again now and then: a guard started afresh learns its waiters back.
            # Each wait doubles, up to RESEND_BACKOFF_CAP times the first, so a long pause adds a
            # few events an hour to each waiter's history instead of one re-send per interval.
            try:
                await workflow.wait_condition(lambda: self.s.lease_held or self._steered() or self._paused_wait(),
                                              timeout=every,
                                              timeout_summary=f"{self.node}'s lease request, re-sent")
                break
            except TimeoutError:
                await self._signal_guard(GUARD_SIGNAL_REQUEST, self._lease_request())
                every = min(every * 2, self.policy.guard.holder_check_interval * RESEND_BACKOFF_CAP)
        if self.s.lease_held:
            waited = workflow.now() - asked
            # How long the fleet held it back is part of the runbook (a pause, the budget, a storm).
            self._record("lease", f"disruption lease for {self.node}", True,
                         f"after waiting {format_duration(waited)}" if waited >= timedelta(seconds=1) else "")

    def _paused_wait(self) -> bool:
        """A pause wakes the lease wait: the grant is not taken while paused."""
        return self.s.paused

    async def _lease_unpaused(self) -> bool:
        """The disruption lease, taken and kept only while the episode is not paused: a pause given
        while it waited for approval or for the lease holds the drain until resume (the lease or its
        request goes back meanwhile). False: steered away (cancel or skip)."""
        while True:
            await self._hold_while_paused()
            if self._steered():
                return False
            await self._acquire_lease()
            if self._steered():
                return False
            if not self.s.paused:
                return True
            held = self.s.lease_held
            await self._release_lease()
            self._record("lease", f"gave back {self.node}'s disruption lease" if held
                         else f"withdrew {self.node}'s lease request", True,
                         f"paused ({self.s.pause_reason}) before the drain; taken again on resume")

    async def _release_lease(self, outcome: str | None = None) -> None:
        if not (self.s.lease_held or self.s.lease_requested):
            return
        # Cleared before the signal: while it is in flight the guard may grant the lease to another,
        # and the episode's status must never show a lease the guard no longer counts as its own.
        self.s.lease_held = self.s.lease_requested = False
        await self._signal_guard(GUARD_SIGNAL_RELEASE, LeaseRelease(
            holder=workflow.info().workflow_id, node=self.node, outcome=outcome, sent_at=workflow.now()))

    async def _tell_guard_the_ending(self) -> None:
        # Every ending tells the guard (lease, canary, unhealthy count) once it was involved.
        s = self.s
        if s.guard_notified or s.lease_held or s.lease_requested or s.admission:
            s.lease_held = s.lease_requested = False  # before the signal, as in _release_lease
            await self._signal_guard(GUARD_SIGNAL_RELEASE, LeaseRelease(
                holder=workflow.info().workflow_id, node=self.node, outcome=s.outcome.value, sent_at=workflow.now()))

    async def _hold_while_paused(self) -> None:
        """Held until resume or cancel (a skip given meanwhile applies on resume). A long pause gives
        the disruption lease back, so one parked node does not hold the fleet's budget."""
        if not self.s.paused:
            return
        self._set_details()
        released = lambda: not self.s.paused or self.s.cancel_reason is not None  # noqa: E731
        if self.s.lease_held:
            limit = self.policy.pause_releases_lease_after
            try:
                await workflow.wait_condition(released, timeout=limit, timeout_summary=f"pause of {self.node}")
                return
            except TimeoutError:
                await self._release_lease()
                self._record("lease", f"gave back {self.node}'s disruption lease", True,
                             f"paused longer than {limit}; taken again on resume")
        await workflow.wait_condition(released)
