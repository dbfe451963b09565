"""The fleet guard's gates: how many disruption leases may be held now (the budget, the storm
breaker, max_unhealthy, the canary trickle, an operator's lift) and the Warning events they raise."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    import api as c
    from api.guard import GuardInput, GuardState
    from policies.guard_policy import GuardPolicy, resolve_limit
    from workflows.calls import call_or_none


@dataclass(frozen=True)
class Gate:
    """One reason the guard holds new leases back: `holds` answers why, or None when it lets them go.
    A new gate is one more entry in GATES."""

    name: str
    holds: Callable[[GuardGates], str | None]


def _storm(g: GuardGates) -> str | None:
    return g.s.breaker_reason if g.s.breaker_open else None


def _over_max_unhealthy(g: GuardGates) -> str | None:
    limit = g._max_unhealthy()
    if limit is not None and len(g.s.unhealthy) > limit:
        return f"{len(g.s.unhealthy)} nodes unhealthy, above max_unhealthy {g.policy.max_unhealthy}"
    return None


# In order: the first that holds is the reason given. A held gate makes new leases trickle as
# canaries (or stops them, with the canary trickle turned off).
GATES = (Gate("storm breaker", _storm), Gate("max_unhealthy", _over_max_unhealthy))


class GuardGates:
    """The base of FleetGuard's parts (guard_books.py, fleet_guard.py)."""

    inp: GuardInput
    policy: GuardPolicy
    s: GuardState
    _wake: bool
    _rechecks: list[tuple[datetime, asyncio.Task]]

    def _limit(self) -> int:
        return resolve_limit(self.policy.max_disruptive, self.s.fleet_size)

    def _max_unhealthy(self) -> int | None:
        # Until the fleet has been counted, a percentage means nothing: only the lease budget holds.
        return resolve_limit(self.policy.max_unhealthy, self.s.fleet_size) if self.s.fleet_size else None

    def _gate(self) -> str | None:
        """Why new leases trickle (or stop, with no canary trickle): the first gate that holds."""
        return next((why for gate in GATES if (why := gate.holds(self)) is not None), None)

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
        if self._gate() and not self.policy.canary:
            return 0
        return min(limit, self.s.canary_budget) if self.s.canary_budget else limit


    # --- canaries -------------------------------------------------------------------------------
    def _update_canary(self) -> None:
        if not self.policy.canary:
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

    def _idle(self) -> bool:
        s = self.s
        return not (s.holders or s.waiters or s.unhealthy or s.deferred or s.breaker_open or s.fault_times
                    or s.canary_budget or s.forced is not None or self._learning())

    def _next_deadline(self) -> timedelta:
        p, now = self.policy, workflow.now()
        # Idle, nothing is due on a clock: a message wakes the guard, and it counts the fleet then.
        waits = [max(p.idle_recheck, p.holder_check_interval) if self._idle() else p.holder_check_interval]
        if self.s.breaker_open and self.s.calm_since is not None:
            waits.append(p.storm_cooldown - (now - self.s.calm_since))
        if self.s.fault_times:
            waits.append(p.storm_window - (now - self.s.fault_times[0]))
        if self.s.forced is not None and self.s.forced.until is not None and now < self.s.forced.until:
            waits.append(self.s.forced.until - now)
        return max(min(waits), timedelta(seconds=1))


    def _arm_recheck(self) -> None:
        """A timer for the next deadline, unless one already fires by then. None is ever cancelled:
        one due later than needed stays and wakes the loop once more, for nothing to do."""
        wait = self._next_deadline()
        due = workflow.now() + wait
        self._rechecks = [(at, t) for at, t in self._rechecks if not t.done()]
        if any(at <= due for at, _ in self._rechecks):
            return
        self._rechecks.append((due, asyncio.create_task(self._recheck_after(wait))))

    async def _recheck_after(self, wait: timedelta) -> None:
        await workflow.sleep(wait, summary="re-check breaker and lease holders")
        self._wake = True

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

    async def _announce(self) -> None:
        """Warning events people see in `kubectl get events`: once per breaker trip and per failed canary."""
        for attr, reason, prefix in (("pending_storm_event", "GpuRemediationStorm", "disruptive remediation paused"),
                                     ("pending_alarm_event", "GpuRemediationCanaryFailed", "canary failed")):
            message = getattr(self.s, attr)
            if message is None:
                continue
            setattr(self.s, attr, None)
            node = next(iter(sorted(self.s.unhealthy)), self.inp.cluster)
            await call_or_none(lambda why, reason=reason: workflow.logger.warning(
                                   "could not emit the %s event: %s", reason, why),
                               c.KUBE_EVENT, c.EventRequest(node=node, reason=reason, type="Warning",
                                                            message=f"{prefix} in {self.inp.cluster}: {message}"),
                               summary=f"warn: {prefix}", timeout=timedelta(seconds=30), attempts=3)
