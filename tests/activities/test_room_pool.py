"""The controller's room pool (activities/room_pool.py) stops when the controller does, even with an
ask to the guard in flight."""

from __future__ import annotations

import asyncio

from temporalio.client import WorkflowUpdateRPCTimeoutOrCancelledError

from activities.room_pool import RoomPool


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
    assert pool.take("c1", now=None) == "", "a closed pool hands nothing out"
