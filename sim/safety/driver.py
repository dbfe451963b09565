"""SafetyDriver, id `safety-driver/<seed>`: a schedule's steps in virtual time, on the time-skipping
server beside the real workflows. It sleeps to each step with a workflow timer (so the server
skips the quiet time between them), runs the step as an activity, and at the end asks the world
for its final observation. The world adds steps while it runs (a terminated host's last report)."""

from __future__ import annotations

import heapq
from datetime import timedelta

from pydantic import BaseModel, Field
from temporalio import activity, workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError

DRIVER_QUEUE = "safety-driver"
STEP_ACTIVITY = "safety.step"
FINISH_ACTIVITY = "safety.finish"


class DriverInput(BaseModel):
    seed: int
    end_s: float
    steps: list[dict] = Field(default_factory=list)  # Step fields: at_s, kind, node, arg


@workflow.defn(name="SafetyDriver")
class SafetyDriver:
    @workflow.init
    def __init__(self, inp: DriverInput) -> None:
        self.t0 = workflow.now()
        self.heap: list[tuple[float, int, dict]] = []
        self.woken = False
        for s in inp.steps:
            self._push(s)

    def _push(self, step: dict) -> None:
        heapq.heappush(self.heap, (step["at_s"], len(self.heap) + 1000 * workflow.info().attempt, step))

    def _now(self) -> float:
        return (workflow.now() - self.t0).total_seconds()

    @workflow.signal(name="later")
    def later(self, ev: dict) -> None:
        self._push({"at_s": self._now() + ev["delay_s"] + 0.013, "kind": ev["kind"], "node": ev["node"], "arg": ""})
        self.woken = True

    @workflow.run
    async def run(self, inp: DriverInput) -> int:
        done = 0
        once = RetryPolicy(maximum_attempts=1)
        while True:
            now = self._now()
            if self.heap and self.heap[0][0] <= now:
                step = heapq.heappop(self.heap)[2]
                try:
                    await workflow.execute_activity(STEP_ACTIVITY, args=[inp.seed, step], retry_policy=once,
                                                    start_to_close_timeout=timedelta(minutes=2))
                except ActivityError:
                    pass  # the world recorded what went wrong; the schedule goes on
                done += 1
                continue
            if now >= inp.end_s:
                break
            nxt = min(self.heap[0][0] if self.heap else inp.end_s, inp.end_s)
            self.woken = False
            try:
                await workflow.wait_condition(lambda: self.woken, timeout=timedelta(seconds=max(nxt - now, 0.001)))
            except TimeoutError:
                pass
        await workflow.execute_activity(FINISH_ACTIVITY, inp.seed, retry_policy=once,
                                        start_to_close_timeout=timedelta(minutes=2))
        return done


class DriverActivities:
    """The driver's activities, dispatched to each schedule's world by seed."""

    def __init__(self, worlds: dict):
        self.worlds = worlds

    @activity.defn(name=STEP_ACTIVITY)
    async def step(self, seed: int, step: dict) -> None:
        from sim.safety.schedule import Step
        from sim.safety.steps import do_step

        await do_step(self.worlds[seed], Step(**step))

    @activity.defn(name=FINISH_ACTIVITY)
    async def finish(self, seed: int) -> None:
        w = self.worlds[seed]
        await w.observe("final")
        w.finished.set()
