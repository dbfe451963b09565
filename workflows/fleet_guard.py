"""FleetGuard, id `fleet-guard/<cluster>`: the disruption budget and storm breaker for one cluster.

Never wedged: past max_unhealthy or with the breaker open, leases trickle one at a time (canaries)
and step back up as canaries come back validated; quarantine itself is admitted only while it
leaves at most max_unhealthy nodes cordoned; what it believes (holders, waiters, unhealthy nodes)
is reconciled with the running episodes and the nodes' taints on every holder check."""

from __future__ import annotations

import asyncio
from datetime import datetime

from temporalio import workflow
from temporalio.exceptions import FailureError

from workflows import metrics

with workflow.unsafe.imports_passed_through():
    import api as c
    from api.guard import (
        MAX_RELEASED_KEPT,
        FaultNotice,
        GateRelease,
        GuardInput,
        GuardState,
        GuardStatus,
        Lease,
        LeaseGrant,
        LeaseRelease,
        LeaseRequest,
        QuarantineAnswer,
        RoomGrant,
        RoomRequest,
    )
    from policies.guard_policy import GuardPolicy
    from workflows import guard_room
    from workflows.guard_books import GuardBooks
    from workflows.guard_constants import (
        CANARY_FAILED,
        CANARY_PROVEN,
        LEFT_QUARANTINE,
    )
    from workflows.guard_status import guard_details, guard_status


@workflow.defn(name=c.GUARD_WORKFLOW)
class FleetGuard(GuardBooks):
    @workflow.init
    def __init__(self, inp: GuardInput) -> None:
        self.inp = inp
        self.policy = inp.policy
        self.s = inp.state or GuardState(fleet_size=inp.fleet_size)
        self._wake = True
        self._regrant: set[str] = set()
        self._regrant_ids: dict[str, str] = {}  # holder -> the request id its re-grant echoes
        self._answers: list[tuple[str, QuarantineAnswer]] = []
        self._relearning = None
        self._rechecks: list[tuple[datetime, asyncio.Task]] = []  # re-check timers still to fire, by due time
        self._holder_check = None
        self._upgrade = False

    # --- handlers ------------------------------------------------------------------------------
    @workflow.signal(name=c.GUARD_SIGNAL_REQUEST)
    def request(self, req: LeaseRequest) -> None:
        if self._stale(req):
            workflow.logger.warning("guard %s: stale lease request %s from %s ignored: that lease was given back",
                                    self.inp.cluster, req.request_id[:100], req.holder[:200])
            return
        if any(h.holder == req.holder for h in self.s.holders):
            # A holder asking again (after continue-as-new, say) gets its grant again.
            self._regrant.add(req.holder)
            self._regrant_ids[req.holder] = req.request_id
            if req.request_id:
                self.s.holders = [h.model_copy(update={"request_id": req.request_id}) if h.holder == req.holder else h
                                  for h in self.s.holders]
        elif not any(w.holder == req.holder for w in self.s.waiters):
            self.s.waiters.append(req)
            self.s.waiting_since[req.holder] = workflow.now()
        self._wake = True

    @workflow.signal(name=c.GUARD_SIGNAL_RELEASE)
    def release(self, rel: LeaseRelease) -> None:
        self._news(rel.node, rel.holder, rel.sent_at)
        canary = any(h.holder == rel.holder and h.canary for h in self.s.holders)
        # Remembered so a duplicate or late request for this lease is stale (`_stale`): granted, it
        # kept a phantom holder in the budget (safety simulation, seed 385).
        given_back = [h.request_id for h in self.s.holders if h.holder == rel.holder]
        given_back += [w.request_id for w in self.s.waiters if w.holder == rel.holder]
        if given_back and given_back[0]:
            self.s.released.pop(rel.holder, None)  # re-inserted: the newest last, the oldest dropped first
            self.s.released[rel.holder] = given_back[0]
            for old in list(self.s.released)[:max(0, len(self.s.released) - MAX_RELEASED_KEPT)]:
                del self.s.released[old]
        self._drop_holder(rel.holder)
        if rel.outcome is None:
            return
        self.s.deferred = [d for d in self.s.deferred if d.holder != rel.holder]
        self.s.admissions = [a for a in self.s.admissions if a.holder != rel.holder]
        if canary and rel.outcome in CANARY_PROVEN:
            self._canary_proven(rel.node)
        elif canary and rel.outcome in CANARY_FAILED:
            self._canary_failed(rel.node, rel.outcome)
        if rel.outcome in LEFT_QUARANTINE and self.s.unhealthy.get(rel.node) in (rel.holder, ""):
            self.s.unhealthy.pop(rel.node, None)

    @workflow.signal(name=c.GUARD_SIGNAL_FAULT)
    def fault(self, notice: FaultNotice) -> None:
        self._take_notice(notice)

    def _take_notice(self, notice: FaultNotice) -> bool:
        """False: not taken (stale, or told before its cordon in a slot this guard does not hold)."""
        if notice.before_cordon and notice.room_token and notice.room_token not in self.s.room:
            # Not cordoned yet: a lapsed or unknown slot (a guard started afresh) gives no room; the
            # episode, not echoed, asks for room like any other.
            workflow.logger.warning("guard %s: %s told in an unknown or lapsed slot before its cordon: not taken",
                                    self.inp.cluster, notice.node[:200])
            return False
        if not self._news(notice.node, notice.holder, notice.sent_at):
            workflow.logger.warning("guard %s: stale fault notice for %s from %s ignored: newer news from that sender came first",
                                    self.inp.cluster, notice.node[:200], notice.holder[:200])
            return False
        if notice.room_token:
            # Cordoned in a slot reserved ahead: the slot becomes the node. One the guard does not
            # hold (lapsed, or a guard started afresh) is counted all the same: the node is cordoned.
            if self.s.room.pop(notice.room_token, None) is None:
                workflow.logger.warning("guard %s: %s cordoned in an unknown or lapsed slot: counted",
                                        self.inp.cluster, notice.node[:200])
            if self.s.unhealthy.get(notice.node) != notice.holder:
                self.s.fault_times.append(workflow.now())
            self.s.unhealthy[notice.node] = notice.holder
        elif notice.healthy:
            self.s.unhealthy.pop(notice.node, None)
        elif notice.admission:
            self._queue_admission(notice)
        else:
            if self.s.unhealthy.get(notice.node) != notice.holder:
                self.s.fault_times.append(workflow.now())
            self.s.unhealthy[notice.node] = notice.holder
        self._wake = True
        return True

    @workflow.update
    def pause(self, reason: str = "", by: str = "") -> GuardStatus:
        """`by`: who paused (the CLI sends its identity); kept with the reason, which every waiter's
        status and `gpuheal guard` show."""
        reason = reason or "paused by operator"
        self.s.paused, self.s.pause_reason = True, f"{reason} (by {by})" if by else reason
        return self.status()

    @workflow.update
    def resume(self) -> GuardStatus:
        # An operator resume also closes a tripped breaker: people must be able to end a storm.
        self.s.paused, self.s.pause_reason = False, ""
        if self.s.breaker_open:
            self._close_breaker("closed by operator")
        self._wake = True
        return self.status()

    @workflow.update
    def release_gate(self, lift: GateRelease) -> GuardStatus:
        """An operator lifts every gate (pause, breaker, max_unhealthy, canary trickle) for `leases`
        grants or until `until`; max_disruptive still holds. Recorded in the history as the update."""
        self.s.forced = lift
        self._wake = True
        return self.status()

    @release_gate.validator
    def _validate_release_gate(self, lift: GateRelease) -> None:
        if not lift.leases and lift.until is None:
            raise ValueError("say for how many leases or until when")

    @workflow.update(name=c.GUARD_UPDATE_RESERVE_ROOM)
    def reserve_room(self, req: RoomRequest) -> RoomGrant:
        """A controller's room pool reserves, renews and gives back quarantine slots (guard_room.py),
        and brings its episodes' slot notices in one message rather than a signal each."""
        took = [n.room_token for n in req.told if self._take_notice(n) or not n.before_cordon]
        grant = self._reserve_room(req)
        grant.took = took
        return grant

    @reserve_room.validator
    def _validate_reserve_room(self, req: RoomRequest) -> None:
        if not 0 < len(req.controller) <= 300 or req.want > guard_room.MAX_ROOM_WANTED:
            raise ValueError(f"a controller id of 1-300 characters, at most {guard_room.MAX_ROOM_WANTED} slots wanted")
        if len(req.told) > guard_room.MAX_ROOM_WANTED or any(not n.room_token or n.admission or n.healthy for n in req.told):
            raise ValueError(f"at most {guard_room.MAX_ROOM_WANTED} notices told, each of a cordon in a reserved slot")

    @workflow.update
    def set_policy(self, policy: GuardPolicy, by: str = "") -> GuardStatus:
        """The controller's policy is the guard's: a controller started with a new one sends it here."""
        if policy != self.policy:
            changed = sorted(k for k in type(policy).model_fields if getattr(policy, k) != getattr(self.policy, k))
            self.policy = policy
            self.s.policy_changes = [*self.s.policy_changes,
                                     f"{workflow.now():%Y-%m-%dT%H:%M:%SZ} by {by[:100] or '?'}: {', '.join(changed)}"][-10:]
            self._wake = True
        return self.status()

    @workflow.update
    def upgrade(self, by: str = "") -> GuardStatus:
        """Sent at every controller start: the run continues as new at its next pass, so a long-lived
        guard runs the code deployed since rather than replaying a long history on it."""
        workflow.logger.info("guard %s: continuing as new (asked by %s)", self.inp.cluster, by[:100] or "?")
        self._upgrade, self._wake = True, True
        return self.status()

    @workflow.query
    def status(self) -> GuardStatus:
        return guard_status(self)
    # --- main loop -----------------------------------------------------------------------------
    @workflow.run
    async def run(self, inp: GuardInput) -> None:
        if inp.state is None and not workflow.info().continued_run_id:
            # Beside the loop: cordons are answered meanwhile (the API's taints and every ending
            # correct the count), leases wait until the holders are known.
            self._relearning = asyncio.create_task(self._relearn())
        while True:
            self._wake = False
            if self.s.fleet_size:
                await self._admit()  # a cordon is answered first: every millisecond counts for the jobs
                await self._answer()
            # The order of the steps is the order of their commands: replay depends on it.
            await self._count_fleet_if_due()
            await self._admit()
            self._update_breaker()
            self._update_canary()
            await self._announce()
            self._check_holders_if_due()
            await self._answer()
            await self._grant()
            metrics.guard_state(inp.cluster, len(self.s.holders), self._budget(), len(self.s.waiters),
                                self.s.breaker_open, **metrics.fleet_figures(self.s, workflow.now()))
            # Not while the holder check runs beside the loop: its activity and result would be
            # abandoned. An upgrade also waits for the relearning: the next run would not learn again.
            checking = self._holder_check is not None and not self._holder_check.done()
            upgrade = self._upgrade and not self._learning()
            if (upgrade or workflow.info().is_continue_as_new_suggested()) and not checking:
                await workflow.wait_condition(workflow.all_handlers_finished)
                workflow.continue_as_new(GuardInput(cluster=inp.cluster, policy=self.policy, state=self.s))
            # A message is a wake, not a new deadline: the re-check timer is left to fire.
            self._arm_recheck()
            await workflow.wait_condition(lambda: self._wake or (bool(self._regrant) and self._may_grant()))

    def _may_grant(self) -> bool:
        """No lease before the guard knows who holds one: a re-grant held back waits for the learning
        to end (waking the loop at once, again and again, it spun inside one workflow task: a wedge)."""
        return not self._learning() or self._forced()

    async def _grant(self) -> None:
        if self._learning() and not self._forced():
            return  # no lease before the guard knows who holds one
        grants = [(holder, self._regrant_ids.pop(holder, "")) for holder in sorted(self._regrant)]
        self._regrant.clear()
        while self.s.waiters and len(self.s.holders) < self._budget():
            req = self.s.waiters.pop(0)
            self.s.waiting_since.pop(req.holder, None)
            canary = bool(self.s.canary_budget) and not self._forced()
            self.s.holders.append(Lease(holder=req.holder, node=req.node, since=workflow.now(), canary=canary,
                                        request_id=req.request_id))
            self.s.grants += 1
            self.s.max_seen_holders = max(self.s.max_seen_holders, len(self.s.holders))
            if self.s.forced is not None and self.s.forced.leases > 0:
                self.s.forced = self.s.forced.model_copy(update={"leases": self.s.forced.leases - 1})
            grants.append((req.holder, req.request_id))
        # Together, not one awaited signal (one workflow task) each: a storm's hundreds of grants
        # held every quarantine answer back past the episodes' admission_timeout.
        await asyncio.gather(*(self._signal_grant(h, r) for h, r in grants))
        workflow.set_current_details(guard_details(self))

    async def _signal_grant(self, holder: str, request_id: str = "") -> None:
        try:
            await workflow.get_external_workflow_handle(holder).signal(
                c.HOLDER_SIGNAL_GRANTED, LeaseGrant(holder=holder, granted_at=workflow.now(), request_id=request_id)
            )
        except FailureError:
            # The holder is gone (completed or terminated): its slot goes back to the budget.
            self._drop_holder(holder)
