"""Quarantine room reserved ahead for controllers (issue 25's fast path). A slot counts against
max_unhealthy from the moment the guard reserves it, so an episode that takes one from its
controller cordons with no round trip to the guard, and the books stay exact: the slot becomes the
node when the episode's notice arrives, or lapses room_ttl after its controller last renewed it.
Pure bookkeeping over GuardState.room; FleetGuard decides when room may be reserved."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from api.guard import GuardState, RoomGrant, RoomRequest, RoomToken
    from policies.guard_policy import GuardPolicy

MAX_ROOM_WANTED = 1000  # one request's ask; the guard's cap per controller is policy.room_ahead


def lapse(s: GuardState, now: datetime) -> None:
    """Slots whose controller stopped renewing them (it died, or lost the guard) are room again."""
    for token in [t for t, r in s.room.items() if r.expires < now]:
        del s.room[token]


def reserve(s: GuardState, req: RoomRequest, policy: GuardPolicy, now: datetime, free: int | None,
            new_token: Callable[[], str], reclaim: bool = False, half: bool = False) -> RoomGrant:
    """Gives back what the controller returned, renews the unused slots it keeps, and reserves up to
    `want` more within `free` (None: no max_unhealthy applies) and the policy's cap per controller,
    which counts its slots handed out and not yet told as well. `reclaim`: the room is wanted
    elsewhere (faults wait for it, a lowered limit, room_ahead 0): the unused slots it keeps are
    taken back and none reserved. The pool hands none out while it asks, so a kept slot is unused.
    `half`: a controller holds at most half the room not held by others, so a cordon through
    another controller (or one that asks the guard) is not deferred while room sits in a pool."""
    own = lambda t: (r := s.room.get(t)) is not None and r.controller == req.controller  # noqa: E731
    for token in [*req.returned, *(req.keep if reclaim else [])]:
        if own(token):
            del s.room[token]
    lapse(s, now)
    expires = now + policy.room_ttl
    held = [] if reclaim else [t for t in dict.fromkeys(req.keep) if own(t)][:max(0, policy.room_ahead)]
    for token in [t for t in dict.fromkeys(req.keep) if own(t) and t not in held]:
        del s.room[token]  # past a lowered room_ahead: given back
    for token in held:
        s.room[token] = RoomToken(controller=req.controller, expires=expires)
    outstanding = sum(1 for r in s.room.values() if r.controller == req.controller)
    n = 0 if reclaim else min(req.want, policy.room_ahead - outstanding, MAX_ROOM_WANTED)
    if free is not None:
        n = min(n, (free + outstanding) // 2 - outstanding if half else free)
    new = [new_token() for _ in range(max(0, n))]
    for token in new:
        s.room[token] = RoomToken(controller=req.controller, expires=expires)
    return RoomGrant(new=new, held=[*held, *new], expires=expires, ttl_s=policy.room_ttl.total_seconds())


def by_controller(s: GuardState) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in s.room.values():
        out[r.controller] = out.get(r.controller, 0) + 1
    return out
