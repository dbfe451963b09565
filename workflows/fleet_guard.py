"""FleetGuard, id `fleet-guard/<cluster>`: the disruption budget and storm breaker for one cluster.

Never wedged: past max_unhealthy or with the breaker open, leases trickle one at a time (canaries)
and step back up as canaries come back validated; quarantine itself is admitted only while it
leaves at most max_unhealthy nodes cordoned; what it believes (holders, waiters, unhealthy nodes)
is reconciled with the running episodes and the nodes' taints on every holder check."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, FailureError

from workflows import metrics

with workflow.unsafe.imports_passed_through():
    from activities import contracts as c
    from policies.model import GuardPolicy, resolve_limit
    from workflows.guard_types import (  # noqa: F401 - re-exported: callers import them from here
        CANARY_FAILED,
        CANARY_PROVEN,
        GUARD_SIGNAL_FAULT,
        GUARD_SIGNAL_RELEASE,
        GUARD_SIGNAL_REQUEST,
        HOLDER_SIGNAL_GRANTED,
        HOLDER_SIGNAL_QUARANTINE,
        LEFT_QUARANTINE,
        MAX_DEFERRED_KEPT,
        PATCH_GUARD_NEVER_WEDGED,
        FaultNotice,
        GateRelease,
        GuardInput,
        GuardState,
        GuardStatus,
        Lease,
        LeaseGrant,
        LeaseRelease,
        QuarantineAnswer,
        Waiting,
        guard_workflow_id,
    )


@workflow.defn(name="FleetGuard")
class FleetGuard:
    @workflow.init
    def __init__(self, inp: GuardInput) -> None:
        self.inp = inp
        self.policy = inp.policy
        self.s = inp.state or GuardState(fleet_size=inp.fleet_size)
        self._wake = True
        self._regrant: set[str] = set()
        self._answers: list[tuple[str, QuarantineAnswer]] = []
        self._relearning = None
        # Decided once per run, here: queries (read-only) read it too.
        self._never_wedged = workflow.patched(PATCH_GUARD_NEVER_WEDGED)

    # --- handlers ------------------------------------------------------------------------------
    @workflow.signal(name=GUARD_SIGNAL_REQUEST)
    def request(self, req: c.LeaseRequest) -> None:
        if any(h.holder == req.holder for h in self.s.holders):
            # A holder asking again (after continue-as-new, say) gets its grant again.
            self._regrant.add(req.holder)
        elif not any(w.holder == req.holder for w in self.s.waiters):
            self.s.waiters.append(req)
            if self._new():
                self.s.waiting_since[req.holder] = workflow.now()
        self._wake = True

    @workflow.signal(name=GUARD_SIGNAL_RELEASE)
    def release(self, rel: LeaseRelease) -> None:
        canary = any(h.holder == rel.holder and h.canary for h in self.s.holders)
        self._drop_holder(rel.holder)
        if rel.outcome is None or not self._new():
            return
        self.s.deferred = [d for d in self.s.deferred if d.holder != rel.holder]
        self.s.admissions = [a for a in self.s.admissions if a.holder != rel.holder]
        if canary and rel.outcome in CANARY_PROVEN:
            self._canary_proven(rel.node)
        elif canary and rel.outcome in CANARY_FAILED:
            self._canary_failed(rel.node, rel.outcome)
        if rel.outcome in LEFT_QUARANTINE and self.s.unhealthy.get(rel.node) in (rel.holder, ""):
            self.s.unhealthy.pop(rel.node, None)

    @workflow.signal(name=GUARD_SIGNAL_FAULT)
    def fault(self, notice: FaultNotice) -> None:
        if notice.healthy:
            self.s.unhealthy.pop(notice.node, None)
        elif notice.admission and self._new():
            if not any(a.holder == notice.holder for a in self.s.admissions):
                self.s.admissions.append(notice)
        else:
            if self.s.unhealthy.get(notice.node) != notice.holder:
                self.s.fault_times.append(workflow.now())
            self.s.unhealthy[notice.node] = notice.holder
        self._wake = True

    @workflow.update
    def pause(self, reason: str = "") -> GuardStatus:
        self.s.paused, self.s.pause_reason = True, reason or "paused by operator"
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

    @workflow.query
    def status(self) -> GuardStatus:
        s, now = self.s, workflow.now()
        return GuardStatus(
            cluster=self.inp.cluster, limit=self._limit(), holders=s.holders,
            waiters=[w.holder for w in s.waiters], unhealthy=sorted(s.unhealthy),
            breaker_open=s.breaker_open, breaker_reason=s.breaker_reason, paused=s.paused,
            pause_reason=s.pause_reason, recent_faults=len(s.fault_times),
            max_seen_holders=s.max_seen_holders, fleet_size=s.fleet_size, trips=s.trips,
            budget=self._budget(), max_unhealthy=self._max_unhealthy() or 0, gate=self._gate(),
            canary_budget=s.canary_budget, canary_history=s.canary_history, alarm=s.alarm,
            waiting=[Waiting(holder=w.holder, node=w.node, since=s.waiting_since.get(w.holder, now),
                             reason=self._waiter_reason()) for w in s.waiters],
            deferred=s.deferred, forced=s.forced, policy=self.policy, policy_changes=s.policy_changes,
        )

    # --- main loop -----------------------------------------------------------------------------
    @workflow.run
    async def run(self, inp: GuardInput) -> None:
        if self._new() and inp.state is None and not workflow.info().continued_run_id:
            # Beside the loop: cordons are answered meanwhile (the API's taints and every ending
            # correct the count), leases wait until the holders are known.
            self._relearning = asyncio.create_task(self._relearn())
        while True:
            self._wake = False
            if self.s.fleet_size:
                await self._admit()  # a cordon is answered first: every millisecond counts for the jobs
                await self._answer()
            # The order of the steps is the order of their commands: old histories replay it.
            await self._count_fleet_if_due()
            await self._admit()
            self._update_breaker()
            self._update_canary()
            await self._announce()
            await self._check_holders_if_due()
            await self._answer()
            await self._grant()
            metrics.guard_state(inp.cluster, len(self.s.holders), self._budget(), len(self.s.waiters),
                                self.s.breaker_open)
            if workflow.info().is_continue_as_new_suggested():
                await workflow.wait_condition(workflow.all_handlers_finished)
                workflow.continue_as_new(GuardInput(cluster=inp.cluster, policy=self.policy, state=self.s))
            try:
                await workflow.wait_condition(
                    lambda: self._wake or bool(self._regrant), timeout=self._next_deadline(),
                    timeout_summary="re-check breaker and lease holders",
                )
            except TimeoutError:
                pass

    def _new(self) -> bool:
        return self._never_wedged

    def _limit(self) -> int:
        return resolve_limit(self.policy.max_disruptive, self.s.fleet_size)

    def _max_unhealthy(self) -> int | None:
        # Until the fleet has been counted, a percentage means nothing: only the lease budget holds.
        return resolve_limit(self.policy.max_unhealthy, self.s.fleet_size) if self.s.fleet_size else None

    def _gate(self) -> str | None:
        """Why new leases stop (before never-wedged) or trickle (since): the breaker or max_unhealthy."""
        if self.s.breaker_open:
            return self.s.breaker_reason
        limit = self._max_unhealthy()
        if limit is not None and len(self.s.unhealthy) > limit:
            return f"{len(self.s.unhealthy)} nodes unhealthy, above max_unhealthy {self.policy.max_unhealthy}"
        return None

    def _forced(self) -> bool:
        f = self.s.forced
        return f is not None and (f.leases > 0 or (f.until is not None and workflow.now() < f.until))

    def _budget(self) -> int:
        """Leases that may be held now."""
        limit = self._limit()
        if self._forced():
            return limit
        if self.s.paused:
            return 0
        if not self._new():
            return 0 if self._gate() else limit
        if self._gate() and not self.policy.canary:
            return 0
        return min(limit, self.s.canary_budget) if self.s.canary_budget else limit

    def _learning(self) -> bool:
        return self._relearning is not None and not self._relearning.done()

    def _waiter_reason(self) -> str:
        if self.s.paused and not self._forced():
            return f"paused: {self.s.pause_reason}"
        if self._learning() and not self._forced():
            return "learning the lease holders back from running episodes" + (
                f": {self.s.relearn_error}" if self.s.relearn_error else "")
        if len(self.s.holders) >= self._budget():
            gate = self._gate()
            if self.s.canary_budget:
                why = f"canary trickle: {self.s.canary_budget} at a time" + (f" ({gate})" if gate else "")
                return why + (f"; alarm: {self.s.alarm}" if self.s.alarm else "")
            return gate or f"budget full: {len(self.s.holders)} of {self._limit()} leases held"
        return "in line"

    async def _grant(self) -> None:
        if self._learning() and not self._forced():
            return  # no lease before the guard knows who holds one
        for holder in sorted(self._regrant):
            await self._signal_grant(holder)
        self._regrant.clear()
        while self.s.waiters and len(self.s.holders) < self._budget():
            req = self.s.waiters.pop(0)
            self.s.waiting_since.pop(req.holder, None)
            canary = bool(self._new() and self.s.canary_budget) and not self._forced()
            self.s.holders.append(Lease(holder=req.holder, node=req.node, since=workflow.now(), canary=canary))
            self.s.grants += 1
            self.s.max_seen_holders = max(self.s.max_seen_holders, len(self.s.holders))
            if self.s.forced is not None and self.s.forced.leases > 0:
                self.s.forced = self.s.forced.model_copy(update={"leases": self.s.forced.leases - 1})
            await self._signal_grant(req.holder)
        workflow.set_current_details(self._details())

    async def _signal_grant(self, holder: str) -> None:
        try:
            await workflow.get_external_workflow_handle(holder).signal(
                HOLDER_SIGNAL_GRANTED, LeaseGrant(holder=holder, granted_at=workflow.now())
            )
        except FailureError:
            # The holder is gone (completed or terminated): its slot goes back to the budget.
            self._drop_holder(holder)

    def _drop_holder(self, holder: str) -> None:
        self.s.holders = [h for h in self.s.holders if h.holder != holder]
        self.s.waiters = [w for w in self.s.waiters if w.holder != holder]
        self.s.waiting_since.pop(holder, None)
        self._wake = True

    # --- quarantine admission -------------------------------------------------------------------
    async def _admit(self) -> None:
        """Deferred faults first (oldest first), then new ones: admitted while at most max_unhealthy
        nodes are quarantined, else deferred, each told once."""
        if not self._new():
            return
        now, new = workflow.now(), self.s.admissions
        self.s.admissions = []
        for n in new:
            if self.s.unhealthy.get(n.node) != n.holder and not any(d.holder == n.holder for d in self.s.deferred):
                self.s.fault_times.append(now)  # counts toward the storm, admitted or not
        still: list[Waiting] = []
        for w in [*self.s.deferred, *(Waiting(holder=n.holder, node=n.node, since=now) for n in new)]:
            if any(x.holder == w.holder for x in still):
                continue
            if self._room_for(w.node):
                self.s.unhealthy[w.node] = w.holder
                self._answers.append((w.holder, QuarantineAnswer(admitted=True)))
                continue
            if not w.reason:
                w = w.model_copy(update={"reason": f"quarantine deferred: {len(self.s.unhealthy)} nodes quarantined, "
                                                   f"max_unhealthy {self.policy.max_unhealthy}"})
                self._answers.append((w.holder, QuarantineAnswer(admitted=False, reason=w.reason)))
            still.append(w)
        self.s.deferred = still[:MAX_DEFERRED_KEPT]

    def _room_for(self, node: str) -> bool:
        limit = self._max_unhealthy()
        return (node in self.s.unhealthy or not self.policy.defer_quarantine or limit is None
                or len(self.s.unhealthy) < limit)

    async def _answer(self) -> None:
        answers, self._answers = self._answers, []
        for holder, answer in answers:
            try:
                await workflow.get_external_workflow_handle(holder).signal(HOLDER_SIGNAL_QUARANTINE, answer)
            except FailureError:
                self.s.unhealthy = {n: h for n, h in self.s.unhealthy.items() if h != holder}
                self.s.deferred = [d for d in self.s.deferred if d.holder != holder]

    # --- canaries -------------------------------------------------------------------------------
    def _update_canary(self) -> None:
        if not self._new() or not self.policy.canary:
            return
        gate = self._gate()
        if gate and not self.s.canary_budget:
            self.s.canary_budget = 1
            workflow.logger.warning("guard %s: canary trickle, one lease at a time: %s", self.inp.cluster, gate)
        elif not gate and self.s.canary_budget >= self._limit():
            self.s.canary_budget = 0  # recovered: the whole budget again

    def _canary_proven(self, node: str) -> None:
        self.s.canary_budget = min(self._limit(), max(1, self.s.canary_budget) * 2) if self.s.canary_budget else 0
        self.s.canary_history = [*self.s.canary_history, f"proven: {node}"][-32:]
        self.s.alarm = ""
        self._wake = True

    def _canary_failed(self, node: str, outcome: str) -> None:
        self.s.canary_budget = 1
        self.s.canary_history = [*self.s.canary_history, f"failed: {node} ({outcome})"][-32:]
        self.s.alarm = f"canary {node} ended {outcome}: leases stay one at a time"
        self.s.pending_alarm_event = self.s.alarm
        workflow.metric_meter().create_counter(
            "gpuheal_guard_canary_failures", "canary remediations that did not come back").add(1, {"cluster": self.inp.cluster})
        self._wake = True

    # --- breaker ---------------------------------------------------------------------------------
    def _update_breaker(self) -> None:
        p, now = self.policy, workflow.now()
        self.s.fault_times = [t for t in self.s.fault_times if now - t < p.storm_window]
        storm = len(self.s.fault_times) > p.storm_faults
        if storm:
            self.s.calm_since = None
            if not self.s.breaker_open:
                self.s.breaker_open, self.s.breaker_opened_at = True, now
                self.s.breaker_reason = (
                    f"storm: {len(self.s.fault_times)} new faults within {p.storm_window}, above {p.storm_faults}"
                )
                self.s.trips += 1
                self.s.pending_storm_event = self.s.breaker_reason
                workflow.metric_meter().create_counter(
                    "gpuheal_storm_breaker_trips", "times the storm breaker opened").add(1, {"cluster": self.inp.cluster})
                workflow.logger.warning("storm breaker open: %s", self.s.breaker_reason)
        elif self.s.breaker_open:
            self.s.calm_since = self.s.calm_since or now
            if now - self.s.calm_since >= p.storm_cooldown:
                self._close_breaker(f"fault rate below threshold for {p.storm_cooldown}")

    def _close_breaker(self, why: str) -> None:
        workflow.logger.info("storm breaker closed: %s", why)
        self.s.breaker_open, self.s.breaker_reason, self.s.calm_since = False, "", None

    def _next_deadline(self) -> timedelta:
        p, now = self.policy, workflow.now()
        waits = [p.holder_check_interval]
        if self.s.breaker_open and self.s.calm_since is not None:
            waits.append(p.storm_cooldown - (now - self.s.calm_since))
        if self.s.fault_times:
            waits.append(p.storm_window - (now - self.s.fault_times[0]))
        if self.s.forced is not None and self.s.forced.until is not None and now < self.s.forced.until:
            waits.append(self.s.forced.until - now)
        return max(min(waits), timedelta(seconds=1))

    # --- the cluster and the episodes, as they are ----------------------------------------------
    async def _count_fleet_if_due(self) -> None:
        """Percent limits need the fleet's size: counted from the cluster, not taken from a constant."""
        now, every = workflow.now(), self.policy.holder_check_interval
        if self.s.last_fleet_count and now - self.s.last_fleet_count < every:
            return
        self.s.last_fleet_count = now
        try:
            self.s.fleet_size = await workflow.execute_activity(
                c.KUBE_FLEET_SIZE, result_type=int, start_to_close_timeout=timedelta(seconds=30),
                retry_policy=RetryPolicy(maximum_attempts=3), summary=f"count GPU nodes in {self.inp.cluster}")
        except ActivityError:
            workflow.logger.warning("fleet size unknown: keeping %d", self.s.fleet_size)

    async def _announce(self) -> None:
        """Warning events people see in `kubectl get events`: once per breaker trip and per failed canary."""
        for attr, reason, prefix in (("pending_storm_event", "GpuRemediationStorm", "disruptive remediation paused"),
                                     ("pending_alarm_event", "GpuRemediationCanaryFailed", "canary failed")):
            message = getattr(self.s, attr)
            if message is None:
                continue
            setattr(self.s, attr, None)
            node = next(iter(sorted(self.s.unhealthy)), self.inp.cluster)
            try:
                await workflow.execute_activity(
                    c.KUBE_EVENT, c.EventRequest(node=node, reason=reason, type="Warning",
                                                 message=f"{prefix} in {self.inp.cluster}: {message}"),
                    start_to_close_timeout=timedelta(seconds=30), retry_policy=RetryPolicy(maximum_attempts=3),
                    summary=f"warn: {prefix}")
            except ActivityError:
                workflow.logger.warning("could not emit the %s event", reason)

    async def _check_holders_if_due(self) -> None:
        """Holders, waiters and quarantined nodes whose episode is gone must not count forever: a
        node stays unhealthy only while its episode runs or it still carries gpuheal's taint."""
        now, p = workflow.now(), self.policy
        new = self._new()
        if not self.s.holders and not (new and (self.s.unhealthy or self.s.waiters or self.s.deferred)):
            return
        if self.s.last_holder_check and now - self.s.last_holder_check < p.holder_check_interval:
            return
        self.s.last_holder_check = now
        ids = {h.holder for h in self.s.holders}
        if new:
            ids |= {w.holder for w in self.s.waiters} | {h for h in self.s.unhealthy.values() if h}
            ids |= {d.holder for d in self.s.deferred}
        live = await workflow.execute_activity(
            c.GUARD_LIVE_HOLDERS, c.LiveHoldersRequest(holders=sorted(ids)), result_type=c.LiveHoldersResult,
            start_to_close_timeout=timedelta(seconds=30), summary=f"check {len(ids)} lease holders still run",
        )
        # Only what was checked can be gone: holders learnt back, requests and faults that arrived
        # while the activity ran were not asked about.
        gone = ids - set(live.running)
        for h in [h.holder for h in self.s.holders if h.holder in gone]:
            self._drop_holder(h)
        if not new:
            return
        for w in [w.holder for w in self.s.waiters if w.holder in gone]:
            self._drop_holder(w)
        self.s.deferred = [d for d in self.s.deferred if d.holder not in gone]
        try:
            tainted = set(await workflow.execute_activity(
                c.KUBE_QUARANTINED_NODES, result_type=list[str], start_to_close_timeout=timedelta(seconds=30),
                retry_policy=RetryPolicy(maximum_attempts=3), summary=f"list quarantined nodes in {self.inp.cluster}"))
        except ActivityError:
            return  # the API cannot say: keep what is known rather than forget a quarantined node
        kept = {n: h for n, h in self.s.unhealthy.items() if (h and h not in gone) or n in tainted}
        self.s.unhealthy = kept | {n: "" for n in sorted(tainted) if n not in kept}
        self._wake = True

    async def _relearn(self) -> None:
        """A guard started afresh (terminated and started again) learns the episodes that hold a
        lease, wait for one, or keep a node quarantined, before it grants anything. Holders unknown
        means no lease at all (one could exceed the budget): it asks again every
        holder_check_interval, the reason shows in `gpuheal guard`, and `resume --force` still works."""
        while True:
            try:
                found = await workflow.execute_activity(
                    c.GUARD_RUNNING_EPISODES, c.RunningEpisodesRequest(cluster=self.inp.cluster),
                    result_type=c.RunningEpisodesResult, start_to_close_timeout=timedelta(minutes=2),
                    retry_policy=RetryPolicy(maximum_attempts=3), summary="learn running episodes back")
                break
            except ActivityError as err:
                self.s.relearn_error = str(err.cause or err)[:300]
                workflow.logger.warning("guard %s: running episodes unknown, no lease yet: %s",
                                        self.inp.cluster, self.s.relearn_error)
                self._wake = True
                await workflow.sleep(self.policy.holder_check_interval, summary="ask for running episodes again")
        self.s.relearn_error = ""
        now = workflow.now()
        for e in found.episodes:
            if e.lease_held and not any(h.holder == e.holder for h in self.s.holders):
                self.s.holders.append(Lease(holder=e.holder, node=e.node, since=now))
            elif e.lease_requested and not any(w.holder == e.holder for w in self.s.waiters):
                self.s.waiters.append(c.LeaseRequest(cluster=self.inp.cluster, holder=e.holder, node=e.node))
                self.s.waiting_since[e.holder] = now
            if e.quarantined:
                self.s.unhealthy.setdefault(e.node, e.holder)
        self.s.relearned = found.known
        self._wake = True

    def _details(self) -> str:
        s = self.s
        lines = [f"**Fleet guard {self.inp.cluster}**: {len(s.holders)}/{self._budget()} disruptive leases held "
                 f"(max {self._limit()}), {len(s.waiters)} waiting, {len(s.unhealthy)} unhealthy, "
                 f"{len(s.deferred)} deferred"]
        if (why := self._gate()) is not None:
            lines.append(f"Gate: {why}")
        if s.canary_budget:
            lines.append(f"Canary trickle: {s.canary_budget} at a time" + (f"; **alarm**: {s.alarm}" if s.alarm else ""))
        if s.paused:
            lines.append(f"Paused: {s.pause_reason}")
        lines += [f"- {h.node}: since {h.since:%H:%M:%S}" + (" (canary)" if h.canary else "") for h in s.holders]
        return "\n".join(lines)
