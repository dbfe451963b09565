"""WhatIfClock: the fleet's events in virtual time, on the time-skipping server beside the real workflows.

Faults are known at the start; reboots ending, new nodes becoming Ready and faults coming back
are scheduled while the run goes (a signal from the stand-in activities). The clock sleeps to each
event with a workflow timer, so the server skips the quiet time between them.
"""

from __future__ import annotations

import asyncio
import heapq
import zlib
from datetime import datetime, timedelta

from pydantic import BaseModel, Field
from temporalio import workflow

CLOCK_WORKFLOW = "WhatIfClock"
DELIVER_ACTIVITY = "whatif.deliver"


def clock_workflow_id(task_queue: str) -> str:
    return f"whatif-clock/{task_queue}"


class ClockEvent(BaseModel):
    at_s: float = Field(description="Seconds since the run's start.")
    kind: str = Field(description="fault, recur, boot or ready.")
    slot: int
    fault: int | None = None  # the FaultDraw id of a fault or recurrence
    node: str = ""  # the node a boot or ready event is for


def off_grid(at_s: float, key: str) -> float:
    """An event's time moved 1-4 s (to the millisecond, fixed by `key`) past its grid point.

    The policies' timers are whole multiples of the 10 s grid (faultmodel.GRID_S), so a guard or
    clock deadline derived from one event lands on another event's grid point. A signal and a timer at one instant trip the
    time-skipping test server (a completion that cancels a timer it has just fired answers "invalid
    history builder state for action", and that workflow never gets another task). Off the grid,
    the two meet only within the same millisecond. The fleet's clock still reads the grid point, for
    work that runs up to 6 s of wall time late."""
    return at_s + 1.0 + (zlib.crc32(key.encode()) % 3000) / 1000.0


class ClockInput(BaseModel):
    t0: datetime
    end_s: float
    events: list[ClockEvent] = Field(default_factory=list)
    delivered: int = 0


@workflow.defn(name=CLOCK_WORKFLOW)
class WhatIfClock:
    def __init__(self) -> None:
        self._heap: list[tuple[float, int, ClockEvent]] = []
        self._n = 0
        self._woken = False
        self._timers: list[tuple[float, asyncio.Task]] = []  # wake-up timers still to fire, by due time

    def _push(self, ev: ClockEvent) -> None:
        fires = off_grid(ev.at_s, f"{ev.kind}/{ev.slot}/{ev.fault}/{ev.node}/{ev.at_s}")
        heapq.heappush(self._heap, (fires, self._n, ev))
        self._n += 1

    @workflow.signal
    def schedule(self, ev: ClockEvent) -> None:
        self._push(ev)
        self._woken = True

    @workflow.run
    async def run(self, inp: ClockInput) -> int:
        for ev in inp.events:
            self._push(ev)
        delivered = inp.delivered
        while True:
            now_s = (workflow.now() - inp.t0).total_seconds()
            due = []
            while self._heap and self._heap[0][0] <= now_s:
                due.append(heapq.heappop(self._heap)[2])
            if due:
                await workflow.execute_activity(DELIVER_ACTIVITY, due, start_to_close_timeout=timedelta(minutes=5))
                delivered += len(due)
                continue
            if now_s >= inp.end_s:
                return delivered
            if workflow.info().is_continue_as_new_suggested():
                await workflow.wait_condition(workflow.all_handlers_finished)
                workflow.continue_as_new(inp.model_copy(update={
                    "events": [e for _, _, e in sorted(self._heap)], "delivered": delivered}))
            nxt = min(self._heap[0][0] if self._heap else inp.end_s, inp.end_s)
            self._woken = False
            self._arm(nxt, now_s)
            await workflow.wait_condition(lambda: self._woken)

    def _arm(self, at_s: float, now_s: float) -> None:
        """A timer for the next event, unless one already fires by then. None is ever cancelled: a
        signal landing as a timer fires made the time-skipping server refuse the completion that
        cancelled it, and the clock never got another task (sdk-java#3088; the guard's own fix is
        guard-steady-recheck). A timer due later than needed wakes the loop once more, for nothing."""
        self._timers = [(at, t) for at, t in self._timers if not t.done()]
        if any(at <= at_s for at, _ in self._timers):
            return
        self._timers.append((at_s, asyncio.create_task(self._wake_after(max(at_s - now_s, 0.001)))))

    async def _wake_after(self, seconds: float) -> None:
        await workflow.sleep(timedelta(seconds=seconds), summary="the next fleet event")
        self._woken = True
