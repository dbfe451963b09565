"""One what-if run: for each policy, a fresh time-skipping server, the real NodeRemediation,
FleetGuard and NodeAdmission on it, the stand-in fleet, and the clock driving the faults.

Each policy runs in its own process (a core each, up to the machine's count); all of them meet the
same faults, drawn from the model with one seed.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing as mp
import os
import queue
import signal
import sys
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path

from pydantic import BaseModel, Field
from temporalio.api.testservice.v1 import SleepRequest
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.runtime import LoggingConfig, Runtime, TelemetryConfig, TelemetryFilter
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

import api as c
from activities.outcomes import figures
from api.names import remediation_workflow_id
from policies.loader import load_policy
from policies.model import Policy
from sim.whatif.clock import ClockEvent, ClockInput, WhatIfClock, clock_workflow_id
from sim.whatif.faultmodel import FaultDraw, FaultModel, draw_faults
from sim.whatif.fleet import WHATIF_CLUSTER, WhatIfFleet
from sim.whatif.jobs import JobOutcome, simulate_jobs
from sim.whatif.outages import fleet_outages
from sim.whatif.workload import WorkloadModel
from workers.embedded_temporal import binary, register_search_attributes
from workflows.fleet_guard import FleetGuard
from workflows.node_admission import NodeAdmission
from workflows.node_remediation import NodeRemediation

BUILTIN_POLICIES = Path(__file__).resolve().parent / "policies"
TASK_QUEUE = "whatif"
STALL_S = 150.0  # wall seconds one virtual day may take before the run is called stuck
CLOCK_RESTARTS = 2  # a stuck run starts again, same seed, on a fresh server, at most this often


class ClockStalled(RuntimeError):
    """The time-skipping server stopped moving (sim/whatif/clock.off_grid): its own fault, not the policy's."""


class WhatIfError(RuntimeError):
    pass


def _stop(child: mp.Process) -> None:
    """A child still running, and its test server, killed (its process group)."""
    if child.is_alive() and child.pid:
        try:
            os.killpg(child.pid, signal.SIGKILL)
        except ProcessLookupError:  # not yet its own group
            child.kill()
        child.join(timeout=5)


def resolve_policy(arg: str) -> tuple[str, Policy]:
    """A policy file, "default", or a shipped comparison policy (replace-only, reboot-then-replace)."""
    if arg == "default":
        return "default", load_policy("default")
    shipped = BUILTIN_POLICIES / f"{arg}.yaml"
    if not Path(arg).exists() and shipped.exists():
        return arg, load_policy(shipped)
    return Path(arg).stem, load_policy(arg)


class PolicyOutcome(BaseModel):
    policy: str
    nodes: int
    days: float
    availability: float = Field(description="Node-hours in service / node-hours.")
    node_hours: float
    node_hours_lost: float
    lost_by_cause: dict[str, float]
    faults: int
    faults_dropped: int = Field(description="Faults that struck a slot whose node was being replaced.")
    episodes: dict[str, int] = Field(description="Episodes by outcome; `running` at the end of the run.")
    kills: int
    resets: int
    reboots: int
    replacements: int
    denylisted_nodes: int
    jobs_interrupted: int
    p95_return_h: float | None = Field(description="95th percentile, fault to back in service, hours.")
    availability_by_hour: list[float] = Field(default_factory=list)
    events_per_episode: float | None = None
    wall_s: float = 0.0
    clock_restarts: int = Field(default=0, description="Runs started again after the test server's clock stopped.")
    mttr_h: float | None = Field(default=None, description="Mean time from a fault to its slot back in service, hours.")
    failed_again_7d: int = Field(default=0, description="Repaired nodes with another platform episode within 7 days.")
    failed_again_30d: int = 0
    node_hours_lost_by_phase: dict[str, float] = Field(default_factory=dict)
    jobs: list[JobOutcome] = Field(default_factory=list, description="Each workload's jobs on this run's outages.")


def _quiet_runtime() -> Runtime:
    """The SDK's own warnings, one per node worker (the test server lacks a capability), would bury
    the run's output: errors only, unless WHATIF_SDK_LOG names a level (WARN showed the test
    server refusing a completion, see clock.off_grid)."""
    level = os.environ.get("WHATIF_SDK_LOG", "ERROR")
    return Runtime(telemetry=TelemetryConfig(logging=LoggingConfig(
        filter=TelemetryFilter(core_level=level, other_level=level))))


def _p95(values: list[float]) -> float | None:
    if not values:
        return None
    v = sorted(values)
    return v[min(len(v) - 1, int(round(0.95 * (len(v) - 1))))]


def summarize(fleet: WhatIfFleet, label: str, days: float, workloads: list[WorkloadModel] = ()) -> PolicyOutcome:
    """Every figure from the slots' out-of-service intervals and the stand-ins' counts, rounded so
    that the sub-second jitter of a real-time run never shows."""
    end = days * 86400.0
    hours = int(end // 3600) or 1
    lost_h = [0.0] * hours
    by_cause: Counter = Counter()
    returns: list[float] = []
    for slot in fleet.slots:
        spans = list(slot.intervals) + ([(slot.down_since, end, slot.cause)] if slot.down_since is not None else [])
        for start, stop, cause in spans:
            stop_c = min(stop, end)
            if stop_c <= start:
                continue
            by_cause[cause] += stop_c - start
            if stop <= end:
                returns.append((stop - start) / 3600.0)
            h = int(start // 3600)
            while h < hours and h * 3600 < stop_c:
                lost_h[h] += min(stop_c, (h + 1) * 3600) - max(start, h * 3600)
                h += 1
    total_h = fleet.nodes_count * end / 3600.0
    lost = sum(by_cause.values()) / 3600.0
    episodes = Counter(r.outcome for r in fleet.records)
    if fleet.open_episodes:
        episodes["running"] = len(fleet.open_episodes)
    k = fleet.calls
    p95 = _p95(returns)
    books = figures(fleet.records)
    outages = fleet_outages(fleet, fleet.policy) if workloads else []
    jobs = [simulate_jobs(w, outages, fleet.nodes_count, days, fleet.model.durations.detect.total_seconds())
            for w in workloads]
    return PolicyOutcome(
        policy=label, nodes=fleet.nodes_count, days=days,
        availability=round(1 - lost / total_h, 6), node_hours=round(total_h, 1), node_hours_lost=round(lost, 1),
        lost_by_cause={c: round(s / 3600.0, 1) for c, s in sorted(by_cause.items())},
        faults=len(fleet.faults), faults_dropped=fleet.dropped, episodes=dict(sorted(episodes.items())),
        kills=k[c.NODE_KILL] - k[c.NODE_RESET],  # a reset stops the GPU processes first: not a kill rung
        resets=k[c.NODE_RESET], reboots=k[c.CLOUD_REBOOT], replacements=k[c.CLOUD_REPLACE],
        denylisted_nodes=len(fleet.denylisted_nodes), jobs_interrupted=fleet.jobs_interrupted,
        p95_return_h=None if p95 is None else round(p95, 2),
        availability_by_hour=[round(1 - s / (fleet.nodes_count * 3600.0), 5) for s in lost_h],
        mttr_h=round(sum(returns) / len(returns), 3) if returns else None, failed_again_7d=books["failed_again_7d"], failed_again_30d=books["failed_again_30d"],
        node_hours_lost_by_phase=books["node_hours_lost_by_phase"], jobs=jobs,
    )


async def simulate_policy(model: FaultModel, policy_arg: str, nodes: int, days: float, seed: int,
                          progress=None, count_events: bool = False, workloads: list[WorkloadModel] = (),
                          faults: list[FaultDraw] | None = None, on_result=None) -> PolicyOutcome:
    """One policy against the model's faults (or `faults`, a ledger's replayed) on a fresh time-skipping server.
    `on_result(outcome)` hears the figures before the workers and the server are stopped. A run whose
    server clock stops is run again from the start: one seed gives one set of figures, so a restart
    changes nothing but the wall time, and the outcome says how many it took."""
    started = time.monotonic()
    for restart in range(CLOCK_RESTARTS + 1):
        try:
            return await _simulate_once(model, policy_arg, nodes, days, seed, progress, count_events, workloads,
                                        faults, on_result, started, restart)
        except ClockStalled as err:
            if restart == CLOCK_RESTARTS:
                raise WhatIfError(f"{err}; started again {CLOCK_RESTARTS} times, stopped each time: "
                                  "run again with another --seed") from None
            print(f"whatif {policy_arg}: {err}; starting again on a fresh server (same seed, same figures)",
                  file=sys.stderr, flush=True)
    raise AssertionError("unreachable")


async def _simulate_once(model: FaultModel, policy_arg: str, nodes: int, days: float, seed: int, progress,
                         count_events: bool, workloads, faults, on_result, started: float,
                         restart: int) -> PolicyOutcome:
    label, policy = resolve_policy(policy_arg)
    env = await WorkflowEnvironment.start_time_skipping(
        test_server_existing_path=binary("temporal-test-server"), data_converter=pydantic_data_converter,
        runtime=_quiet_runtime())
    try:
        await register_search_attributes(env.client)
        t0 = await env.get_current_time()
        faults = draw_faults(model, nodes, days, seed) if faults is None else faults
        fleet = WhatIfFleet(env.client, TASK_QUEUE, policy, model, faults, nodes, t0, env.get_current_time, seed)
        detect = model.durations.detect.total_seconds()
        clock_in = ClockInput(t0=t0, end_s=days * 86400.0, events=[
            ClockEvent(at_s=f.at_s + detect, kind="fault", slot=f.slot, fault=f.id) for f in faults])
        async with Worker(env.client, task_queue=TASK_QUEUE, activities=fleet.controller_activities(),
                          workflows=[NodeRemediation, FleetGuard, NodeAdmission, WhatIfClock]):
            handle = await env.client.start_workflow(WhatIfClock.run, clock_in, id=clock_workflow_id(TASK_QUEUE),
                                                     task_queue=TASK_QUEUE)
            # Skipped a day at a time: awaiting the result would skip too, but in steps of the
            # result's long poll, which is slow over weeks.
            end = t0 + timedelta(days=days)
            while (now := await env.get_current_time()) < end:
                if progress:
                    progress((now - t0).total_seconds() / (days * 86400.0))
                step = SleepRequest()
                step.duration.FromTimedelta(min(end - now, timedelta(days=1)) + timedelta(seconds=1))
                # Returns once the server's clock has run the step: as long as the day's work takes.
                sleep = env.client.test_service.unlock_time_skipping_with_sleep(
                    step, timeout=timedelta(seconds=STALL_S + 60))  # the RPC's own deadline, a backstop
                try:
                    await asyncio.wait_for(sleep, STALL_S)
                except TimeoutError:
                    raise ClockStalled(
                        f"the test server's clock stopped at day {(now - t0).total_seconds() / 86400:.2f} for "
                        f"{STALL_S:.0f} s: a workflow no longer gets tasks (a timer and a signal at one "
                        "instant; see sim/whatif/clock.off_grid)") from None
            await handle.result()
            out = summarize(fleet, label, days, list(workloads))
            if count_events:
                out.events_per_episode = await _events_per_episode(env, fleet)
            out.wall_s = round(time.monotonic() - started, 1)
            out.clock_restarts = restart
            if on_result:
                on_result(out)
            await fleet.stop_workers()
    finally:
        await env.shutdown()
    return out


async def _events_per_episode(env: WorkflowEnvironment, fleet: WhatIfFleet) -> float | None:
    """History events of each node's last episode run (a continued run counts from its start)."""
    lengths = []
    for name in sorted(fleet.episode_names):
        desc = await env.client.get_workflow_handle(remediation_workflow_id(name, WHATIF_CLUSTER)).describe()
        lengths.append(desc.raw_description.workflow_execution_info.history_length)
    return round(sum(lengths) / len(lengths), 1) if lengths else None


def _child(model_json: str, policy_arg: str, nodes: int, days: float, seed: int, index: int, shared, results,
           count_events: bool, workloads_json: str = "[]", faults_json: str | None = None) -> None:
    def progress(frac: float) -> None:
        shared[index] = frac
    os.setpgrp()  # its own process group, with its test server: the parent can stop both (_stop)
    os.dup2(2, 1)  # the parent's stdout is for its table or JSON document
    sent = []

    def send(out: PolicyOutcome) -> None:
        # Sent before the teardown: a worker or server that hangs stopping costs the parent's 30 s
        # join, then _stop, never the run.
        results.put((index, out.model_dump_json(), None))
        sent.append(True)

    try:
        model = FaultModel.model_validate_json(model_json)
        workloads = [WorkloadModel.model_validate(w) for w in json.loads(workloads_json)]
        faults = [FaultDraw.model_validate(f) for f in json.loads(faults_json)] if faults_json else None
        asyncio.run(simulate_policy(model, policy_arg, nodes, days, seed, progress, count_events, workloads, faults,
                                    on_result=send))
    except BaseException as err:  # noqa: BLE001 - said by the parent, with the policy's name
        if not sent:
            results.put((index, None, f"{type(err).__name__}: {err}"))
    # Leave without interpreter finalization: the SDK's native threads can hang it (see workers.cli.entry).
    results.close()
    results.join_thread()
    sys.stdout.flush()
    os._exit(0)


def run_whatif(model: FaultModel, policies: list[str], nodes: int, days: float, seed: int,
               on_progress=None, count_events: bool = False, jobs: int | None = None,
               workloads: list[WorkloadModel] = (), faults: list[FaultDraw] | None = None) -> list[PolicyOutcome]:
    """Every policy, each in its own process, at most `jobs` (default 1) at once. Two at once has
    been seen to stop making progress on a loaded machine (a policy's process idle, its time-skipping
    server's clock stopped; cause not found), so more than one is asked for explicitly."""
    for arg in policies:
        resolve_policy(arg)  # a bad policy file is refused before anything starts
    ctx = mp.get_context("spawn")
    shared = ctx.Array("d", len(policies))
    results = ctx.Queue()
    jobs = max(1, min(jobs or 1, len(policies)))
    pending = list(enumerate(policies))
    running: dict[int, mp.Process] = {}
    done: dict[int, PolicyOutcome] = {}
    errors: list[str] = []
    model_json = model.model_dump_json()
    for w in workloads:
        if w.nodes_needed > nodes:
            raise WhatIfError(f"workload {w.name} needs {w.nodes_needed} nodes (its gangs and spare_nodes), "
                              f"the fleet has {nodes}")
    extra = (json.dumps([w.model_dump(mode="json") for w in workloads]),
             json.dumps([f.model_dump() for f in faults]) if faults is not None else None)
    try:
        while pending or running:
            while pending and len(running) < jobs:
                i, arg = pending.pop(0)
                p = ctx.Process(target=_child, daemon=True,
                                args=(model_json, arg, nodes, days, seed, i, shared, results, count_events, *extra))
                p.start()
                running[i] = p
            try:
                i, payload, err = results.get(timeout=0.5)
            except queue.Empty:  # a progress beat
                for i, p in list(running.items()):
                    if not p.is_alive() and p.exitcode != 0:  # a clean exit has put its result
                        running.pop(i)
                        errors.append(f"policy {policies[i]}: its process exited with {p.exitcode}")
            else:
                child = running.pop(i)
                child.join(timeout=30)
                _stop(child)
                if err:
                    errors.append(f"policy {policies[i]}: {err}")
                else:
                    done[i] = PolicyOutcome.model_validate_json(payload)
                    shared[i] = 1.0
            if on_progress:
                on_progress([shared[i] for i in range(len(policies))])
    finally:  # interrupted (Ctrl-C, a deadline): no child or test server is left behind
        for p in running.values():
            _stop(p)
    if errors:
        raise WhatIfError("; ".join(errors))
    return [done[i] for i in range(len(policies))]
