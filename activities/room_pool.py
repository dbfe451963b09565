"""A controller's quarantine room, reserved ahead by its cluster's fleet guard (workflows/guard_room.py).

`take` hands an episode one reserved slot at once, with no round trip: the guard counted it against
max_unhealthy when it reserved it. A task beside keeps the pool topped up and renewed, one update
to the guard at a time, and gives what is left back when the controller stops. A slot is handed
out only while half its ttl is left on the guard's clock (the episode's clock, on the same server),
so the episode's notice reaches the guard before the slot could lapse, and only within FRESH_S of
the pool's last answer from the guard (a guard started afresh knows no slots: its answer says so).
None is handed out while the pool asks, so every slot it asks to keep is unused: the guard may take
those back when the room is wanted elsewhere. An episode that finds the pool empty while it asks
waits up to TAKE_WAIT_S for the answer: in a storm, a thousand episodes asking the guard one by one
(a signal each way, each a workflow task of the guard's) is what made the guard the bottleneck.
For the same reason the episodes' slot notices (the slot became this node) go to the guard in the
pool's next ask, many in one update, rather than as a signal each; `tell` returns once the guard has
taken the notice, and False when it could not (the episode then signals it itself)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import uuid
from datetime import datetime, timedelta

from temporalio.client import Client

import api as c
from api.guard import FaultNotice, RoomGrant, RoomRequest

log = logging.getLogger("gpuheal.room")

MAX_TOLD = 1000  # notices in one ask (the guard's bound, guard_room.MAX_ROOM_WANTED)
ASK_FOR = 64  # slots a pool asks for; the guard reserves at most its policy's room_ahead per controller
NO_ROOM_RETRY_S = 2.0  # the guard had no room to reserve (or could not be reached): asked again after this, doubling
RENEW_FLOOR_S = 1.0
RENEW_EVERY_S = 30.0  # at most; a quarter of the ttl when that is shorter
FRESH_S = 60.0  # a slot is handed out only this soon after the guard last answered
TELL_WAIT_S = 10.0  # a notice not taken by the guard in this long is signalled by its episode instead
YIELD_S = 0.005
TAKE_WAIT_S = 2.0  # an episode waits this long for the pool's ask (not for a guard with no room to give)
CLOSE_WAIT_S = 15.0  # close() waits this long for the renewing task to end (an ask is bounded at 10 s)


class RoomPool:
    """One per controller process, over the clusters its episodes ask for."""

    def __init__(self, client: Client, identity: str = "", ask_for: int = ASK_FOR, retry_s: float = NO_ROOM_RETRY_S):
        self.client = client
        self.identity = identity or f"{socket.gethostname()}/{os.getpid()}/{uuid.uuid4().hex[:8]}"
        self.ask_for, self.retry_s = ask_for, retry_s
        self.handed_out = 0
        self.closed = False
        self._rooms: dict[str, _ClusterRoom] = {}

    def start(self, cluster: str) -> _ClusterRoom:
        """Keeps room for `cluster` from now on (a controller starts its own cluster's at once)."""
        if self.closed:
            return _ClusterRoom(self, cluster)  # empty, never started: a closed pool hands nothing out
        if (room := self._rooms.get(cluster)) is None:
            room = self._rooms[cluster] = _ClusterRoom(self, cluster)
            room.task = asyncio.get_running_loop().create_task(room.keep(), name=f"room pool {cluster}")
        return room

    async def take(self, cluster: str, now: datetime, wait_s: float = TAKE_WAIT_S) -> str:
        """A reserved slot's token, or "" (none here: the episode asks the guard instead). While the
        pool is topping up, waits up to `wait_s` for the guard's answer; never while the guard had
        no room at its last answer (or none was had), nor once the pool is closed."""
        room = self.start(cluster)
        t0 = time.monotonic()
        while True:
            waited = time.monotonic() - t0
            token = room.take(now + timedelta(seconds=waited) if now is not None else now)
            if token or self.closed or room.starved or waited >= wait_s:
                return token
            answered = room.answered
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(answered.wait(), timeout=wait_s - waited)

    async def tell(self, cluster: str, notice: FaultNotice, wait_s: float = TELL_WAIT_S) -> bool:
        """Brings an episode's slot notice to the guard in the pool's next ask: True once the guard took it."""
        if self.closed:
            return False
        room = self.start(cluster)
        if room.ttl:
            wait_s = min(wait_s, room.ttl.total_seconds() / 4)  # the slot had at least half its ttl left
        told = asyncio.get_running_loop().create_future()
        room.telling.append((notice, told))
        room.wake.set()
        room.told_wake.set()
        try:
            return await asyncio.wait_for(asyncio.shield(told), timeout=wait_s)
        except (TimeoutError, asyncio.CancelledError) as err:
            # Still queued: taken out so that it is not sent after the episode signalled it itself
            # (harmless, the guard dedupes by holder, but one message less), nor applied after a
            # cancelled take gave no slot. In an ask in flight: let it go.
            room.telling = [(n, f) for n, f in room.telling if f is not told]
            if isinstance(err, asyncio.CancelledError):
                raise
            return False

    def held(self, cluster: str) -> int:
        room = self._rooms.get(cluster)
        return len(room.tokens) if room else 0

    async def close(self) -> None:
        """Stops renewing and gives every unused slot back (what is not given back lapses at the guard)."""
        self.closed = True
        rooms, self._rooms = list(self._rooms.values()), {}
        for room in rooms:
            if room.task is not None:
                room.task.cancel()
                room.wake.set()
                # Bounded, and not by wait_for (it waits on a task that ignores its cancel): an ask in
                # flight turns the cancel into WorkflowUpdateRPCTimeoutOrCancelledError, and `keep`
                # then ends on `closed` at its next turn.
                await asyncio.wait({room.task}, timeout=CLOSE_WAIT_S)
            if room.tokens or room.telling:
                telling, room.telling = room.telling, []
                took: set[str] = set()
                with contextlib.suppress(Exception):
                    grant = await room.ask(RoomRequest(controller=self.identity, returned=room.tokens,
                                                       told=[n for n, _ in telling]), timeout_s=5)
                    took = set(grant.took)
                _settle(telling, took)


def _settle(telling: list[tuple[FaultNotice, asyncio.Future]], took: set[str]) -> None:
    """Each notice was taken only if the guard echoed its token (a failed ask echoes none)."""
    for notice, told in telling:
        if not told.done():
            told.set_result(notice.room_token in took)


class _ClusterRoom:
    def __init__(self, pool: RoomPool, cluster: str):
        self.pool, self.cluster = pool, cluster
        self.tokens: list[str] = []
        self.expires: datetime | None = None
        self.ttl = timedelta(0)
        self.low_water = 1
        self.wake = asyncio.Event()
        self.task: asyncio.Task | None = None
        self.asking = False
        self.answered_at = 0.0  # monotonic
        self.starved = True  # the last ask got nothing it wanted (no room, no guard yet): takers do not wait
        self.answered = asyncio.Event()  # set, and replaced, at the end of each ask
        self.telling: list[tuple[FaultNotice, asyncio.Future]] = []  # slot notices for the next ask
        self.told_wake = asyncio.Event()  # a notice came: ends a backing-off pause

    def _ask_ended(self, starved: bool) -> None:
        self.starved = starved
        self.answered.set()
        self.answered = asyncio.Event()

    def take(self, now: datetime) -> str:
        fresh = (self.expires is not None and self.expires - now >= self.ttl / 2
                 and time.monotonic() - self.answered_at <= FRESH_S)
        if self.asking or not (fresh and self.tokens):
            self.wake.set()
            return ""
        token = self.tokens.pop()
        self.pool.handed_out += 1
        if len(self.tokens) < self.low_water:
            self.wake.set()
        return token

    async def ask(self, req: RoomRequest, timeout_s: float = 10) -> RoomGrant:
        handle = self.pool.client.get_workflow_handle(c.guard_workflow_id(self.cluster))
        return await handle.execute_update(c.GUARD_UPDATE_RESERVE_ROOM, req, result_type=RoomGrant,
                                           rpc_timeout=timedelta(seconds=timeout_s))

    async def keep(self) -> None:
        """Top up when low, renew every quarter ttl; one ask at a time, and a pause when the guard
        had nothing to give (no room under max_unhealthy, or not running yet)."""
        misses = 0
        while not self.pool.closed:
            want = max(0, self.pool.ask_for - len(self.tokens))
            pause = 0.0
            telling, self.telling = self.telling[:MAX_TOLD], self.telling[MAX_TOLD:]
            try:
                self.asking = True
                try:
                    grant = await self.ask(RoomRequest(controller=self.pool.identity, want=want, keep=list(self.tokens),
                                                       told=[n for n, _ in telling]))
                finally:
                    self.asking = False
                _settle(telling, set(grant.took))
                self.answered_at = time.monotonic()
                held = set(grant.held)
                self.tokens = [t for t in self.tokens if t in held] + list(grant.new)
                self.expires, self.ttl = grant.expires, timedelta(seconds=grant.ttl_s)
                self.low_water = max(1, len(grant.held) // 2)
                if want and not grant.new and not self.tokens:
                    pause = self.pool.retry_s
                self._ask_ended(starved=bool(pause))
            except asyncio.CancelledError:
                _settle(telling, set())
                self._ask_ended(starved=True)
                raise
            except Exception as err:  # noqa: BLE001 - no guard yet, a timeout: episodes ask the guard meanwhile
                # Whether the guard took the notices is unknown: their episodes signal them (it dedupes).
                _settle(telling, set())
                self._ask_ended(starved=True)
                if self.pool.closed:
                    return  # the client turned close()'s cancel into an error: the pool is done
                log.debug("room pool %s: %s", self.cluster, err)
                pause = self.pool.retry_s
            if pause and self.telling:
                continue  # notices came during the ask: brought now (each gets one ask), not after a pause
            if pause:
                # Backing off, to 32 times the first pause: no room now often means none for a while.
                # Notices to bring end the pause: they wait on it (a wake by a taker does not).
                self.told_wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.told_wake.wait(), timeout=pause * 2 ** min(misses, 5))
                misses += 1
                continue
            misses = 0
            if self.telling:
                # More came while it asked: the next ask brings them, after the takers woken by this
                # answer had their turn (none is handed out while the pool asks).
                await asyncio.sleep(YIELD_S)
                continue
            self.wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(),
                                       timeout=max(RENEW_FLOOR_S, min(RENEW_EVERY_S, self.ttl.total_seconds() / 4)))
