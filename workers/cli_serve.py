"""Commands that run gpuheal's processes: controller, agent, simulate, whatif, outcomes, demo."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from pathlib import Path

from policies.loader import PolicyError, load_policy
from workers.cli_common import address, fail, print_json, serve, temporal_options


def cmd_controller(args) -> int:
    """Workflows and cluster-side activities; run as many replicas as the load needs."""
    from workers.condition_watcher import ConditionRule
    from workers.controller import ControllerConfig, run_controller

    rules = []
    for spec in args.watch_condition:  # TYPE[=STATUS][:SECONDS]
        head, _, hold = spec.partition(":")
        ctype, _, status = head.partition("=")
        rules.append(ConditionRule(type=ctype, status=status or "True", for_s=float(hold or 0)))
    try:
        policy = load_policy(args.policy)
    except PolicyError as err:
        print(f"gpuheal controller: {err}", file=sys.stderr)
        return 2
    cfg = ControllerConfig(task_queue=args.task_queue, kubeconfig=args.kubeconfig, ledger=args.ledger,
                           gpu_node_selector=args.gpu_node_selector or None, watch_conditions=rules,
                           policy=policy, policy_source=args.policy, cluster=args.cluster,
                           provider=args.provider, provider_kubeconfig=args.machines_kubeconfig)

    async def body(client, stop) -> None:
        print(f"gpuheal controller: serving {args.task_queue} on {address(args)}", file=sys.stderr, flush=True)
        await run_controller(client, cfg, stop)

    return serve(args, body)


def cmd_agent(args) -> int:
    """The node agent: probes this host and serves node-local activities on node/<cluster>/<node>."""
    from workers.agent import AgentConfig, run_agent
    from workers.cli_profiles import local_profile

    try:
        policy = load_policy(args.policy)
    except PolicyError as err:
        print(f"gpuheal agent: {err}", file=sys.stderr)
        return 2
    probe = local_profile(args, "gpuheal agent")
    if isinstance(probe, int):
        return probe
    # In a cluster the controller tells the agent its node's profile and baseline; --profile says it here.
    config = AgentConfig(node=args.node, policy=policy, cluster=args.cluster, task_queue=args.task_queue,
                         generation=probe.generation, poll_interval_s=args.poll_interval,
                         kmsg_state=Path(args.kmsg_state) if args.kmsg_state else None,
                         probe=probe, lookup_expectations=not args.profile)

    async def body(client, stop) -> None:
        await run_agent(client, config, stop)

    return serve(args, body)


def cmd_simulate(args) -> int:
    from sim.runner import outcome_table, run_scenario
    from sim.scenario import ScenarioError, load_scenario

    try:
        scenario, policy = load_scenario(args.scenario)
    except ScenarioError as err:
        for problem in err.problems:
            print(f"{err.source}: {problem}", file=sys.stderr)
        return 2
    # The embedded servers write banners to stdout: keep stdout for the one JSON document.
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        doc = asyncio.run(run_scenario(scenario, policy, temporal_options(args, "gpuheal-simulate")))
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)
    if args.json:
        print_json(doc)
    else:
        print(outcome_table(doc))
    return 1 if doc.get("deadline_passed") else 0


def cmd_whatif(args) -> int:
    from policies.loader import PolicyError
    from sim.whatif.engine import WhatIfError, run_whatif
    from sim.whatif.faultmodel import FaultModelError, load_fault_model, mass_failure
    from sim.whatif.ledger_replay import LedgerReplayError, load_ledger_faults
    from sim.whatif.report import ProgressBar, outcome_table, plot
    from sim.whatif.workload import WorkloadError, load_workload

    policies = args.policies or ["default", "replace-only"]
    if args.nodes < 1 or not 0 < args.days <= 366:
        print("gpuheal whatif: --nodes must be at least 1 and --days between 0 and 366", file=sys.stderr)
        return 2
    if not args.faults and not args.from_ledger:
        print("gpuheal whatif: name a fault model (large-cluster) or --from-ledger FILE", file=sys.stderr)
        return 2
    try:
        model = load_fault_model(args.faults) if args.faults else None
        faults = None
        if args.mass_failure:
            count, _, name = args.mass_failure.partition(":")
            if not count.isdigit() or not 0 < int(count) <= args.nodes or not name or args.from_ledger or model is None:
                print(f"gpuheal whatif: --mass-failure takes N:CLASS (200:gsp), N from 1 to --nodes ({args.nodes}), "
                      "with a fault model and without --from-ledger", file=sys.stderr)
                return 2
            faults = mass_failure(model, args.nodes, int(count), name, seed=args.seed)
        if args.from_ledger:
            model, faults, args.nodes, args.days, notes = load_ledger_faults(
                args.from_ledger, model.durations if model else None)
            for note in notes:
                print(f"gpuheal whatif: {note}", file=sys.stderr)
        workloads = [load_workload(w) for w in args.workloads or []]
        bars = ProgressBar(policies)
        try:
            outcomes = run_whatif(model, policies, args.nodes, args.days, args.seed,
                                  on_progress=bars, jobs=args.jobs, workloads=workloads, faults=faults)
        finally:
            bars.close()
    except (FaultModelError, PolicyError, WorkloadError) as err:
        for problem in err.problems:
            print(f"{err.source}: {problem}", file=sys.stderr)
        return 2
    except LedgerReplayError as err:
        print(f"gpuheal whatif: {err}", file=sys.stderr)
        return 2
    except WhatIfError as err:
        return fail(f"gpuheal whatif: {err}")
    if args.plot:
        plot(outcomes, args.plot)
    if args.json:
        print_json({"model": model.name, "nodes": args.nodes, "days": args.days, "seed": args.seed,
                     "workloads": args.workloads or [], "from_ledger": args.from_ledger,
                     "mass_failure": args.mass_failure,
                     "policies": [o.model_dump(mode="json") for o in outcomes]})
    else:
        print(f"{model.name}: {args.nodes} nodes, {args.days:g} days, seed {args.seed}")
        print(outcome_table(outcomes))
        if args.plot:
            print(f"plot: {args.plot}")
    return 0


def cmd_outcomes(args) -> int:
    from workers import outcomes

    try:
        doc = outcomes.report(args.ledger, args.since, args.by)
    except outcomes.OutcomesError as err:
        print(f"gpuheal outcomes: {err}", file=sys.stderr)
        return 2
    if args.json:
        print_json(doc)
    else:
        print(outcomes.table(doc))
    return 0


DEMO_PORTS = {"Temporal frontend": 7233, "Temporal UI": 8233}


def _port_free(port: int) -> bool:
    import socket

    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


def cmd_demo(args) -> int:
    """The whole system on this machine: dev server (SQLite under .gpuheal/, UI :8233), fake API
    server, moto, controller, one simulated agent per node, and the built-in scenario."""
    from sim import runner
    from sim.scenario import BUILTIN_SCENARIOS, load_scenario
    from workers import demo

    if not args.temporal:
        if stopped := demo.stop_leftover_dev_server():
            print(stopped, flush=True)
        busy = [f"{what} port {port}" for what, port in DEMO_PORTS.items() if not _port_free(port)]
        if busy:
            print(f"gpuheal demo: {', '.join(busy)} already in use: stop what holds it, or pass --temporal HOST:PORT",
                  file=sys.stderr)
            return 2
    scenario, policy = load_scenario(BUILTIN_SCENARIOS / "demo.yaml")
    log_file = demo.LOGS / "demo.log"

    async def run() -> None:
        demo.end_with_signals()
        opts = temporal_options(args, "gpuheal-demo")
        async with (runner.temporal(opts, db_file=str(demo.STATE / "temporal.db"), ui_port=8233) as client,
                    demo.dev_server_watched()):
            address, ns = client.service_client.config.target_host, client.namespace

            async def results(doc: dict, fleet) -> None:
                print(runner.outcome_table(doc))
                print("\nTemporal UI, each node's remediation history:")
                for r in doc["nodes"]:
                    if r["workflow_id"]:
                        print(f"  {r['node']:<12} {args.ui}/namespaces/{ns}/workflows?query=GpuNode%3D%22{r['node']}%22")
                sys.stdout.flush()
                if args.keep:
                    await demo.keep_playing(fleet, address, ns)

            await runner.run_scenario(scenario, policy, opts, on_tick=runner.Progress(), client=client, after=results,
                                      ledger_path=demo.fresh_ledger())

    with demo.logs_to_file(log_file):
        print(f"gpuheal demo: servers' logs go to {log_file}", flush=True)
        try:
            asyncio.run(run())
        except (KeyboardInterrupt, asyncio.CancelledError):
            pass
        except Exception as err:  # noqa: BLE001 - one line on the console, the trace in the log
            logging.getLogger("gpuheal.demo").exception("demo failed")
            print(f"gpuheal demo: {type(err).__name__}: {err} (see {log_file})", flush=True)
            return 1
    return 0
