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
from bisect import bisect_left, bisect_right
from datetime import timedelta
from pathlib import Path

from temporalio.api.testservice.v1 import SleepRequest
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.runtime import LoggingConfig, Runtime, TelemetryConfig, TelemetryFilter
from temporalio.service import RPCError, RPCStatusCode
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from api.guard import GuardStatus
from api.names import STATUS_QUERY, guard_workflow_id, remediation_workflow_id
from policies.loader import load_policy
from policies.model import Policy
from sim.whatif.clock import ClockEvent, ClockInput, WhatIfClock, clock_workflow_id
from sim.whatif.faultmodel import FaultDraw, FaultModel, draw_faults
from sim.whatif.fleet import WHATIF_CLUSTER, WhatIfFleet
from sim.whatif.summary import PolicyOutcome, summarize
from sim.whatif.workload import WorkloadModel
from workers.embedded_temporal import binary, register_search_attributes
from workflows.fleet_guard import FleetGuard
from workflows.node_admission import NodeAdmission
from workflows.node_remediation import NodeRemediation

BUILTIN_POLICIES = Path(__file__).resolve().parent / "policies"
TASK_QUEUE = "whatif"
STALL_S = 150.0  # wall seconds one virtual day may take before the run is called stuck...
STALL_PER_FAULT_S = 1.0  # ...and this much more per fault arriving that day (a mass failure's day is long)
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


def _quiet_runtime() -> Runtime:
    """The SDK's own warnings, one per node worker (the test server lacks a capability), would bury
    the run's output: errors only, unless WHATIF_SDK_LOG names a level (WARN showed the test
    server refusing a completion, see clock.off_grid)."""
    level = os.environ.get("WHATIF_SDK_LOG", "ERROR")
    return Runtime(telemetry=TelemetryConfig(logging=LoggingConfig(
        filter=TelemetryFilter(core_level=level, other_level=level))))


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
        # The controller's workflows without the sandbox: every activation in the sandbox costs its
        # import checks and code runs (10,000 nodes x 8 days: 64.6 s sandboxed, 54.4 s without, the
        # same figures). The sandbox guards determinism, which the replay tests, the safety
        # simulation and test_determinism.py check on the same classes. A cache that holds every
        # episode of a mass failure: evicted, each wakes by replaying.
        async with Worker(env.client, task_queue=TASK_QUEUE, activities=fleet.controller_activities(),
                          workflows=[NodeRemediation, FleetGuard, NodeAdmission, WhatIfClock],
                          workflow_runner=UnsandboxedWorkflowRunner(), max_cached_workflows=max(1000, nodes + 100)):
            handle = await env.client.start_workflow(WhatIfClock.run, clock_in, id=clock_workflow_id(TASK_QUEUE),
                                                     task_queue=TASK_QUEUE)
            # Skipped a day at a time: awaiting the result would skip too, but in steps of the
            # result's long poll, which is slow over weeks.
            end = t0 + timedelta(days=days)
            arrivals = sorted(f.at_s for f in faults)
            while (now := await env.get_current_time()) < end:
                if progress:
                    progress((now - t0).total_seconds() / (days * 86400.0))
                span = min(end - now, timedelta(days=1)) + timedelta(seconds=1)
                step = SleepRequest()
                step.duration.FromTimedelta(span)
                at = (now - t0).total_seconds()
                allowed = STALL_S + STALL_PER_FAULT_S * (bisect_right(arrivals, at + span.total_seconds())
                                                         - bisect_left(arrivals, at))
                # Returns once the server's clock has run the step: as long as the day's work takes.
                sleep = env.client.test_service.unlock_time_skipping_with_sleep(
                    step, timeout=timedelta(seconds=allowed + 60))  # the RPC's own deadline, a backstop
                try:
                    await asyncio.wait_for(sleep, allowed)
                except TimeoutError:
                    raise ClockStalled(
                        f"the test server's clock stopped at day {at / 86400:.2f} for {allowed:.0f} s: a "
                        "workflow no longer gets tasks (a timer and a signal at one instant; see "
                        "sim/whatif/clock.off_grid)") from None
            await handle.result()
            out = summarize(fleet, label, days, list(workloads), await _guard_status(env))
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


async def _guard_status(env: WorkflowEnvironment) -> GuardStatus | None:
    """The guard's books at the end of the run; None when no fault ever started it."""
    try:
        return await env.client.get_workflow_handle(guard_workflow_id(WHATIF_CLUSTER)).query(
            STATUS_QUERY, result_type=GuardStatus, rpc_timeout=timedelta(seconds=30))
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            return None
        raise


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
