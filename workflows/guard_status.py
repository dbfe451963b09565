"""What the fleet guard shows: the `status` query (`gpuheal guard`) and the details line the
Temporal UI shows, as functions of the guard. No workflow calls here."""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from api.guard import GuardStatus, Waiting
    from workflows import guard_room


def guard_status(g) -> GuardStatus:  # g: the FleetGuard (imported by it, so not imported here)
    s, now = g.s, workflow.now()
    return GuardStatus(
        cluster=g.inp.cluster, limit=g._limit(), holders=s.holders,
        waiters=[w.holder for w in s.waiters], unhealthy=sorted(s.unhealthy),
        breaker_open=s.breaker_open, breaker_reason=s.breaker_reason, paused=s.paused,
        pause_reason=s.pause_reason, recent_faults=len(s.fault_times),
        max_seen_holders=s.max_seen_holders, fleet_size=s.fleet_size, trips=s.trips,
        budget=g._budget(), max_unhealthy=g._max_unhealthy() or 0, gate=g._gate(),
        canary_budget=s.canary_budget, canary_history=s.canary_history, alarm=s.alarm,
        waiting=[Waiting(holder=w.holder, node=w.node, since=s.waiting_since.get(w.holder, now),
                         reason=g._waiter_reason()) for w in s.waiters],
        deferred=s.deferred, forced=s.forced, policy=g.policy, policy_changes=s.policy_changes,
        breaker_opened_at=s.breaker_opened_at, grants=s.grants,
        room_reserved=guard_room.by_controller(s),
    )


def guard_details(g) -> str:
    s = g.s
    lines = [f"**Fleet guard {g.inp.cluster}**: {len(s.holders)}/{g._budget()} disruptive leases held "
             f"(max {g._limit()}), {len(s.waiters)} waiting, {len(s.unhealthy)} unhealthy, "
             f"{len(s.deferred)} deferred" + (f", {len(s.room)} slots reserved ahead" if s.room else "")]
    if (why := g._gate()) is not None:
        lines.append(f"Gate: {why}")
    if s.canary_budget:
        lines.append(f"Canary trickle: {s.canary_budget} at a time" + (f"; **alarm**: {s.alarm}" if s.alarm else ""))
    if s.paused:
        lines.append(f"Paused: {s.pause_reason}")
    lines += [f"- {h.node}: since {h.since:%H:%M:%S}" + (" (canary)" if h.canary else "") for h in s.holders]
    return "\n".join(lines)
