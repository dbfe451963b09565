"""The what-if clock on the time-skipping server: every event delivered at its time, in order, and
no timer ever cancelled (a CancelTimer for a timer that fired as a signal landed wedges the
server's workflow task for good: sdk-java#3088)."""

from __future__ import annotations

import asyncio

from temporalio import activity
from temporalio.api.enums.v1 import EventType
from temporalio.worker import Worker

from sim.whatif.clock import DELIVER_ACTIVITY, ClockEvent, ClockInput, WhatIfClock


async def test_signalled_events_arrive_in_order_and_no_timer_is_cancelled(ts_env, uniq):
    delivered: list[tuple[float, int]] = []

    @activity.defn(name=DELIVER_ACTIVITY)
    async def deliver(events: list[ClockEvent]) -> None:
        now = (activity.info().current_attempt_scheduled_time - t0).total_seconds()
        delivered.extend((now, e.slot) for e in events)

    t0 = await ts_env.get_current_time()
    start = ClockInput(t0=t0, end_s=3600, events=[ClockEvent(at_s=600, kind="fault", slot=1),
                                                  ClockEvent(at_s=1800, kind="fault", slot=2)])
    async with Worker(ts_env.client, task_queue=uniq, workflows=[WhatIfClock], activities=[deliver]):
        handle = await ts_env.client.start_workflow(WhatIfClock.run, start, id=f"clock-{uniq}", task_queue=uniq)
        # Signalled only once the clock waits on its first timer: a signal in before that would
        # meet no timer to cancel, and the old clock would pass too.
        while EventType.EVENT_TYPE_TIMER_STARTED not in [e.event_type async for e in handle.fetch_history_events()]:
            await asyncio.sleep(0.05)
        # Earlier than the armed timer (a second timer, the first left to fire), and later.
        await handle.signal(WhatIfClock.schedule, ClockEvent(at_s=300, kind="boot", slot=3, node="a"))
        await handle.signal(WhatIfClock.schedule, ClockEvent(at_s=900, kind="ready", slot=4, node="b"))
        assert await handle.result() == 4
        history = await handle.fetch_history()

    assert [slot for _, slot in delivered] == [3, 1, 4, 2]
    for (at, _), planned in zip(delivered, [300, 600, 900, 1800], strict=True):
        assert planned + 1 <= at <= planned + 5  # off its grid point by 1-4 s (clock.off_grid), never early
    kinds = [e.event_type for e in history.events]
    assert EventType.EVENT_TYPE_TIMER_STARTED in kinds
    assert EventType.EVENT_TYPE_TIMER_CANCELED not in kinds
