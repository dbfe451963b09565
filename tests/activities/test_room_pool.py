"""The controller's room pool (activities/room_pool.py) stops when the controller does, even with an
ask to the guard in flight."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from temporalio.client import WorkflowUpdateRPCTimeoutOrCancelledError

from activities.room_pool import RoomPool
from api.guard import FaultNotice, RoomGrant


class GuardNeverAnswers:
    """A client whose reserve-room update never completes, cancelled as temporalio's client cancels
    one: the CancelledError comes back as WorkflowUpdateRPCTimeoutOrCancelledError
    (temporalio/client/_impl.py, the start-update call)."""

    def __init__(self):
        self.asked = asyncio.Event()

    def get_workflow_handle(self, workflow_id: str):
        return self

    async def execute_update(self, *args, **kwargs):
        self.asked.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError as err:
            raise WorkflowUpdateRPCTimeoutOrCancelledError() from err


async def test_close_ends_the_pool_while_an_ask_is_in_flight():
    """The client turns close()'s cancel into an ordinary error: a pool that took it for a failed
    ask renewed forever, and a controller (or a test's workers) never finished stopping."""
    client = GuardNeverAnswers()
    pool = RoomPool(client, identity="ctl", retry_s=0.01)
    room = pool.start("c1")
    await asyncio.wait_for(client.asked.wait(), 5)
    closing = asyncio.ensure_future(pool.close())
    done, _ = await asyncio.wait({closing}, timeout=20)  # asyncio.wait: never waits on a task that ignores its cancel
    assert closing in done, "close() did not return"
    assert room.task.done(), "the pool's renewing task still runs after close()"
    assert await pool.take("c1", now=None) == "", "a closed pool hands nothing out"


class GuardAnswers:
    """A guard that takes every ask after `delay_s`, reserving what is wanted, or fails each ask."""

    def __init__(self, delay_s: float = 0.02, fail: bool = False, echoes: bool = True):
        self.delay_s, self.fail, self.echoes = delay_s, fail, echoes
        self.asks: list = []

    def get_workflow_handle(self, workflow_id: str):
        return self

    async def execute_update(self, name, req, result_type=None, rpc_timeout=None):
        self.asks.append(req)
        await asyncio.sleep(self.delay_s)
        if self.fail:
            raise RuntimeError("guard unreachable")
        new = [f"t{len(self.asks)}-{i}" for i in range(req.want)]
        took = [n.room_token for n in req.told] if self.echoes else []  # a guard on an older build knows no `told`
        return RoomGrant(new=new, held=[*req.keep, *new], expires=datetime.now(UTC) + timedelta(minutes=10), ttl_s=600,
                         took=took)


def notice(i: int) -> FaultNotice:
    return FaultNotice(node=f"n{i}", holder=f"remediate/c1/n{i}", room_token=f"tok{i}", sent_at=datetime.now(UTC))


async def test_slot_notices_reach_the_guard_many_to_an_ask():
    """A storm's slot notices go in the pool's asks, not a signal each: the guard sees every notice
    once, in far fewer messages than notices, and each episode hears it was taken."""
    guard = GuardAnswers()
    pool = RoomPool(guard, identity="ctl", retry_s=0.01)
    try:
        taken = await asyncio.gather(*(pool.tell("c1", notice(i)) for i in range(200)))
        assert all(taken)
        told = [n.node for ask in guard.asks for n in ask.told]
        assert sorted(told) == sorted(f"n{i}" for i in range(200)), "each notice reaches the guard exactly once"
        assert len([a for a in guard.asks if a.told]) <= 20, f"{len(guard.asks)} asks for 200 notices"
    finally:
        await pool.close()


async def test_a_notice_the_guard_could_not_take_is_the_episodes_to_signal():
    """An ask that fails says nothing of whether the guard took its notices, and a guard on a build
    that knows no `told` answers without them: either way tell answers False and the episode's
    activity signals the guard itself (guard.signal_guard)."""
    for guard in (GuardAnswers(fail=True), GuardAnswers(echoes=False)):
        pool = RoomPool(guard, identity="ctl", retry_s=0.01)
        try:
            assert await pool.tell("c1", notice(1), wait_s=5) is False
            assert guard.asks, "it was asked"
        finally:
            await pool.close()


async def test_an_empty_pool_waits_for_its_ask_in_flight_not_for_a_guard_without_room():
    guard = GuardAnswers(delay_s=0.3)
    pool = RoomPool(guard, identity="ctl", retry_s=0.01)
    try:
        room = pool.start("c1")
        for _ in range(100):
            if room.tokens:
                break
            await asyncio.sleep(0.05)
        room.tokens.clear()  # all handed out: the next take wakes an ask and waits for its answer
        room.starved = False
        assert await pool.take("c1", datetime.now(UTC), wait_s=5), "a take while the pool tops up gets a slot"
        room.tokens.clear()
        room.starved = True  # the guard's last answer had no room: a take does not wait
        t0 = asyncio.get_running_loop().time()
        assert await pool.take("c1", datetime.now(UTC), wait_s=5) == ""
        assert asyncio.get_running_loop().time() - t0 < 0.2
    finally:
        await pool.close()


async def test_a_slot_taken_with_its_notice_is_handed_out_only_once_the_guard_took_the_notice():
    """guard.take_room with the episode's notice: the token comes back only when the guard echoed
    the notice under that token; a guard that did not (failed, or on an older build) gives no
    slot, so the episode asks the guard rather than cordon in room the guard may not count."""
    from temporalio.testing import ActivityEnvironment

    from activities.guard import GuardActivities
    from api.guard import TakeRoomRequest

    for guard, handed in ((GuardAnswers(), True), (GuardAnswers(echoes=False), False)):
        pool = RoomPool(guard, identity="ctl", retry_s=0.01)
        try:
            pool.start("c1")
            for _ in range(100):
                if pool.held("c1"):
                    break
                await asyncio.sleep(0.05)
            req = TakeRoomRequest(cluster="c1", now=datetime.now(UTC),
                                  notice=FaultNotice(node="n1", holder="remediate/c1/n1", sent_at=datetime.now(UTC)))
            token = await ActivityEnvironment().run(GuardActivities(guard, pool).take_room, req)
            told = [n for ask in guard.asks for n in ask.told]
            assert [n.node for n in told] == ["n1"] and told[0].room_token, told
            assert (token == told[0].room_token) if handed else token == "", (token, told)
        finally:
            await pool.close()
