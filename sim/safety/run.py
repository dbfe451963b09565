"""Running safety schedules: many at once on one time-skipping server (each its own cluster, task
queues and node names), then the invariants over each one's record."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
from dataclasses import dataclass, field

from temporalio.api.enums.v1 import EventType
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from sim.safety import mutants
from sim.safety.driver import DRIVER_QUEUE, DriverActivities, DriverInput, SafetyDriver
from sim.safety.invariants import Violation, violations
from sim.safety.schedule import driver_id, make_schedule
from sim.safety.world import SafetyWorld
from sim.whatif.engine import _quiet_runtime
from workers.embedded_temporal import binary, register_search_attributes

SCHEDULE_WALL_S = float(os.environ.get("SAFETY_WALL_S", "240"))  # a batch's backstop
# A history this long in one schedule is a hot loop. Guards pass 1,500 events in a busy schedule
# (the test server never suggests continue-as-new, the real one does), so the bar is well above.
WEDGE_EVENTS = 5000
DEBUG = bool(os.environ.get("SAFETY_DEBUG"))
STALL_S = float(os.environ.get("SAFETY_STALL_S", "15"))  # wall seconds the clock may stop skipping


@dataclass
class Outcome:
    seed: int
    violations: list[Violation] = field(default_factory=list)
    stalled: bool = False
    effects: int = 0
    stall: list[str] = field(default_factory=list)  # what each workflow still had pending, when stalled
    reruns: int = 0  # runs before this one that a server wedge or another schedule's stall cut short
    room_taken: int = 0  # cordons in quarantine room reserved ahead (schedules with room_ahead)
    world: SafetyWorld | None = None


async def run_batch(env: WorkflowEnvironment, seeds: list[int], keep_worlds: bool = False) -> list[Outcome]:
    worlds = {s: SafetyWorld(env.client, make_schedule(s)) for s in seeds}
    driver = Worker(env.client, task_queue=DRIVER_QUEUE, workflows=[SafetyDriver],
                    activities=[DriverActivities(worlds).step, DriverActivities(worlds).finish],
                    workflow_runner=UnsandboxedWorkflowRunner(), max_concurrent_activities=len(seeds) + 4)
    outcomes = []
    async with driver:
        handles = []
        for w in worlds.values():
            w.start_controller()
            for spec in w.sched.nodes:
                w.start_agent(spec.name)
        await asyncio.gather(*(w.room_before_faults() for w in worlds.values() if w.room is not None))
        for seed, w in worlds.items():
            steps = [{"at_s": s.at_s, "kind": s.kind, "node": s.node, "arg": s.arg} for s in w.sched.steps]
            handles.append(await env.client.start_workflow(
                SafetyDriver.run, DriverInput(seed=seed, end_s=w.sched.end_s, steps=steps), id=driver_id(seed),
                task_queue=DRIVER_QUEUE))
        await _wait(env, handles)
        for seed, w in worlds.items():
            stalled = not w.finished.is_set()
            stall = await _pending(env, w) if stalled else []
            await w.stop_all()
            outcomes.append(Outcome(seed, [] if stalled else violations(w), stalled, len(w.log),
                                    stall=stall, world=w if keep_worlds else None, room_taken=w.room_taken))
    return outcomes


async def _wait(env: WorkflowEnvironment, handles: list) -> None:
    """Each driver's end, one awaited at a time (each await lets the server skip time for all),
    until the server's clock stops skipping for STALL_S wall seconds: one workflow task left
    unanswered locks the clock (it then only keeps pace with the wall clock) for every schedule on
    the server."""
    end = time.monotonic() + SCHEDULE_WALL_S
    last, moved = await env.get_current_time(), time.monotonic()
    start, t0 = last, time.monotonic()
    for h in handles:
        task = asyncio.ensure_future(h.result())
        while not task.done() and time.monotonic() < end:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(task), 1.0)
            now = await env.get_current_time()
            if DEBUG:
                print(f"clock {(now - start).total_seconds():.0f}s at wall {time.monotonic() - t0:.0f}s", flush=True)
            wall = time.monotonic()
            if (now - last).total_seconds() > 2 * (wall - moved) + 1:
                last, moved = now, wall  # skipping: a locked clock only keeps pace with the wall clock
            elif wall - moved > STALL_S:
                break
        if not task.done():
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
            return


async def _pending(env: WorkflowEnvironment, w: SafetyWorld) -> list[str]:
    """What a stalled schedule's workflows wait on (the server's clock stops while any workflow
    task stays unanswered)."""
    from api.names import admission_workflow_id, guard_workflow_id, remediation_workflow_id

    names = [*w.nodes, w.sched.ghost]
    ids = [driver_id(w.sched.seed), guard_workflow_id(w.cluster), guard_workflow_id(f"other-{w.sched.seed}"),
           *(remediation_workflow_id(n, w.cluster) for n in names),
           *(remediation_workflow_id(f"not-{n}", w.cluster) for n in names),
           *(remediation_workflow_id(n, f"other-{w.sched.seed}") for n in names),
           *(admission_workflow_id(n, w.cluster) for n in names)]
    out, now = [], await env.get_current_time()
    for wid in ids:
        try:
            d = (await env.client.get_workflow_handle(wid).describe()).raw_description
        except Exception:  # noqa: BLE001 - never started
            continue
        hist = await env.client.get_workflow_handle(wid).fetch_history()
        last = hist.events[-1].event_type if hist.events else 0
        if _server_wedge(hist.events, now):
            out.append(f"SERVER_WEDGE {wid}: a workflow task started at event {len(hist.events)} was never timed "
                       f"out (temporalio/sdk-java#3088: the test server refused a CancelTimer for a timer that "
                       f"fired during the task)")
        elif last in (5, 6) or len(hist.events) > WEDGE_EVENTS:  # a task never answered, or a hot loop
            age = now - hist.events[-1].event_time.ToDatetime(tzinfo=now.tzinfo)
            out.append(f"WEDGED {wid}: last event {EventType.Name(last)} of {len(hist.events)}, "
                       f"{age.total_seconds():.0f}s before")
            if DEBUG:
                for ev in hist.events[-12:]:
                    print(f"  {wid} #{ev.event_id} {EventType.Name(ev.event_type)} {str(ev)[:600]!r}", flush=True)
        acts = [f"{a.activity_type.name} attempt {a.attempt} {a.last_failure.message[:80]}" for a in d.pending_activities]
        task = d.pending_workflow_task
        out.append(f"{wid}: status {d.workflow_execution_info.status} history {d.workflow_execution_info.history_length}"
                   f"{f' workflow task attempt {task.attempt} state {task.state}' if d.HasField('pending_workflow_task') else ''}"
                   f"{' activities ' + '; '.join(acts) if acts else ''}")
    return out


def _server_wedge(events, now) -> bool:
    """A workflow task STARTED and left past its own start-to-close timeout with no timeout event:
    the real server fails such a task and redelivers it, the time-skipping test server does not
    when it refused the task's CancelTimer for a timer that fired while the task ran
    (temporalio/sdk-java#3088, #2606). The workflow did nothing wrong; its schedule is run again."""
    if len(events) < 2 or events[-1].event_type != EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED:
        return False
    sched = events[-2].workflow_task_scheduled_event_attributes
    started = events[-1].event_time.ToDatetime(tzinfo=now.tzinfo)
    return (now - started).total_seconds() > sched.start_to_close_timeout.ToTimedelta().total_seconds()


async def run_schedules(seeds: list[int], batch: int = 30, mutant: str | None = None, on_batch=None,
                        keep_worlds: bool = False, until=None) -> list[Outcome]:
    """Every seed, `batch` at a time, on one time-skipping server (a fresh one per batch: a stalled
    schedule must not hold the clock for the next)."""
    out: list[Outcome] = []
    queue, tries, runs = list(seeds), dict.fromkeys(seeds, 0), dict.fromkeys(seeds, 0)
    alone: set[int] = set()
    with mutants.applied(mutant):
        while queue:
            if queue[0] in alone:  # met the server's wedge: alone, its tasks are quicker to answer
                now, queue = queue[:1], queue[1:]
            else:
                now = [seed for seed in queue if seed not in alone][:batch]
                queue = [seed for seed in queue if seed not in now]
            env = await WorkflowEnvironment.start_time_skipping(
                test_server_existing_path=binary("temporal-test-server"), data_converter=pydantic_data_converter,
                runtime=_quiet_runtime())
            try:
                await register_search_attributes(env.client)
                ran = await run_batch(env, now, keep_worlds)
            finally:
                await env.shutdown()
            done = []
            culprit = any(line.startswith(("WEDGED", "SERVER_WEDGE")) for o in ran for line in o.stall)
            for o in ran:
                server_wedged = [line for line in o.stall if line.startswith("SERVER_WEDGE")]
                for line in server_wedged:
                    print(f"seed {o.seed}: run again: {line}", file=sys.stderr, flush=True)
                tries[o.seed] += bool(server_wedged) or not culprit  # held up by another's wedge is no try of its own
                if server_wedged:
                    alone.add(o.seed)
                wedged = [line for line in o.stall if line.startswith("WEDGED")]
                if wedged:  # its own workflow locked the clock: a workflow that never settles
                    o.violations, o.stalled = [("liveness", line.removeprefix("WEDGED ")) for line in wedged], False
                if o.stalled and tries[o.seed] < 4:
                    queue.append(o.seed)  # the server's wedge, or held up by another schedule's: run again
                    runs[o.seed] += 1
                else:
                    o.reruns = runs[o.seed]
                    done.append(o)
            out += done
            if on_batch:
                on_batch(done)
            if until is not None and any(until(o) for o in done):
                break  # what the caller looked for is found
    return out
