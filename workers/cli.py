"""The gpuheal command line: a thin layer over the packages; `--json` prints one document on stdout."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from pathlib import Path

from policies.loader import PolicyError, load_policy
from workers.telemetry import FlagError, configure_logging


def _machine_text(doc) -> str:
    """The one document a command prints with --json or -o json|yaml."""
    from workers import render

    return render.document(doc, render.MACHINE["format"])


def _print_json(doc) -> None:
    sys.stdout.write(_machine_text(doc) + "\n")


def cmd_policy_check(args) -> int:
    try:
        policy = load_policy(args.file)
    except PolicyError as err:
        for problem in err.problems:
            print(f"{err.source}: {problem}", file=sys.stderr)
        return 1
    if args.json:
        _print_json({"ok": True, "policy": policy.model_dump(mode="json", exclude={"xids"})})
    else:
        print(f"{args.file}: ok (policy {policy.name!r}, Xid catalog {policy.xid_catalog_version}, "
              f"{len(policy.xids)} codes)")
    return 0


def cmd_policy_reference(args) -> int:
    from policies.reference import policy_reference

    print(policy_reference())
    return 0


def cmd_replay(args) -> int:
    from workers.replay import replay_dir

    try:
        outcomes = asyncio.run(replay_dir(Path(args.dir)))
    except FileNotFoundError as err:
        print(f"gpuheal replay: {err}", file=sys.stderr)
        return 2
    if args.json:
        _print_json({"histories": [o.model_dump() for o in outcomes]})
    else:
        for o in outcomes:
            print(f"{'ok  ' if o.ok else 'FAIL'} {o.file} ({o.events} events){': ' + o.error if o.error else ''}")
    return 0 if all(o.ok for o in outcomes) else 1


def cmd_probe_kmsg(args) -> int:
    """Reads what the log holds and exits (/dev/kmsg and FIFOs are read non-blocking, to EAGAIN);
    --follow reads on until SIGINT/SIGTERM."""
    import signal
    import time

    from health.kmsg import KmsgFollower, KmsgParser
    from policies.classify import classify
    from policies.loader import default_policy

    follower, parser, findings = KmsgFollower(args.file), KmsgParser(), []
    stop = []
    if args.follow:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.append(True))
    while True:
        try:
            fresh = parser.parse(follower.poll())
        except OSError as err:
            print(f"gpuheal probe kmsg: cannot read {args.file}: {err.strerror}", file=sys.stderr)
            return 2
        findings += fresh
        if args.follow and not args.json:
            for f in fresh:
                print(f"{f.kind.value:16} xid={f.xid!s:5} pci={f.pci} {f.message[:100]}", flush=True)
        if not args.follow or stop:
            break
        time.sleep(0.5)
    findings += parser.parse(follower.rest())
    follower.close()
    triage = classify(findings, args.generation, default_policy())
    if args.json:
        _print_json({"findings": [f.model_dump(mode="json") for f in findings],
                     "triage": triage.model_dump(mode="json", exclude={"verdicts"})})
    else:
        for f in findings if not args.follow else []:
            print(f"{f.kind.value:16} xid={f.xid!s:5} pci={f.pci} {f.message[:100]}")
        print(f"triage ({args.generation}): " + (f"{triage.fault_class}, {triage.attribution}, start at "
              f"{triage.start_rung.value}" if triage.actionable else triage.reason))
    return 0


NPD_MESSAGE_MAX = 80  # node-problem-detector truncates custom plugin output at 80 characters


def cmd_probe_nvml(args) -> int:
    """Exit 0 healthy, 1 a fault found; with --npd, 2 when the checks could not run (NPD's Unknown)."""
    import pynvml

    from health.runner import probe_nvml_for
    from policies.classify import classify
    from policies.loader import default_policy
    from workers.cli_profiles import local_profile

    config = local_profile(args, "gpuheal probe nvml")
    if isinstance(config, int):
        return config
    result = probe_nvml_for(config, pynvml)
    triage = classify(result.findings, config.generation, default_policy())
    broken_only = bool(result.findings) and all(f.kind.value == "probe_broken" for f in result.findings)
    if args.npd:
        if not result.findings:
            print(f"{len(result.gpus)} GPUs healthy"[:NPD_MESSAGE_MAX])
            return 0
        print(("; ".join(f"{f.label()}: {f.message}" for f in result.findings))[:NPD_MESSAGE_MAX])
        return 2 if broken_only else 1
    if args.json:
        _print_json({"profile": config.profile_name or None,
                     "findings": [f.model_dump(mode="json") for f in result.findings],
                     "gpus": [g.model_dump(mode="json") for g in result.gpus],
                     "mig_enabled": result.mig_enabled,
                     "triage": triage.model_dump(mode="json", exclude={"verdicts"})})
    else:
        for g in result.gpus:
            print(f"GPU {g.index}: {g.uuid} serial={g.serial} pci={g.pci}")
        for f in result.findings:
            print(f"{f.label()}: {f.message}")
        print("healthy" if not result.findings else f"unhealthy: {triage.fault_class}, start at {triage.start_rung}")
    return 0 if not result.findings else 1


class ConnectError(Exception):
    """Temporal could not be reached: said in one line."""


async def _connect(args, service: str):
    """The one way a command connects: a bad flag raises FlagError, an unreachable server ConnectError (one line)."""
    from workers.temporal_client import connect

    try:
        return await connect(opts=_temporal_options(args, service))
    except FlagError:
        raise
    except Exception as err:  # noqa: BLE001 - one line, not a stack trace
        raise ConnectError(f"cannot reach Temporal at {_address(args)}: {err}") from None


def _serve(args, body) -> int:
    """A long-running process: connect (one line if Temporal is not there), run until SIGINT/SIGTERM."""
    import signal

    async def run() -> int:
        try:
            client = await _connect(args, f"gpuheal-{args.command}")
        except ConnectError as err:
            print(f"gpuheal {args.command}: {err}", file=sys.stderr)
            return 2
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await body(client, stop)
        return 0

    return asyncio.run(run())


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
                           policy=policy, policy_source=args.policy, cluster=args.cluster)

    async def body(client, stop) -> None:
        print(f"gpuheal controller: serving {args.task_queue} on {_address(args)}", file=sys.stderr, flush=True)
        await run_controller(client, cfg, stop)

    return _serve(args, body)


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

    return _serve(args, body)


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
        doc = asyncio.run(run_scenario(scenario, policy, _temporal_options(args, "gpuheal-simulate")))
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)
    if args.json:
        _print_json(doc)
    else:
        print(outcome_table(doc))
    return 1 if doc.get("deadline_passed") else 0


def cmd_whatif(args) -> int:
    from policies.loader import PolicyError
    from sim.whatif.engine import WhatIfError, run_whatif
    from sim.whatif.faultmodel import FaultModelError, load_fault_model
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
        return _fail(f"gpuheal whatif: {err}")
    if args.plot:
        plot(outcomes, args.plot)
    if args.json:
        _print_json({"model": model.name, "nodes": args.nodes, "days": args.days, "seed": args.seed,
                     "workloads": args.workloads or [], "from_ledger": args.from_ledger,
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
        _print_json(doc)
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
        opts = _temporal_options(args, "gpuheal-demo")
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


def _fail(reason: str) -> int:
    print(reason, file=sys.stderr)
    return 1


COMMAND_DEADLINE_S = 120  # a backstop: each query and update has its own, shorter deadline


class _Unreachable(Exception):
    """Temporal could not be reached: the command could not run (exit 2)."""


def _operator(args, work) -> int:
    """Run one operator command: a table (or -o json|yaml), a one-line reason and non-zero on failure.
    With --watch, again every WATCH_EVERY_S until Ctrl-C: redrawn in place on a terminal, printed
    again when it changed otherwise."""
    from workers.operator import OperatorError

    def show(doc) -> str:
        doc = doc.model_dump(mode="json") if hasattr(doc, "model_dump") else doc
        if args.json:
            return _machine_text(doc)
        from workers.render import human

        return human(args.command, doc, wide=getattr(args, "output", None) == "wide")

    async def go():
        try:
            client = await _connect(args, "gpuheal-cli")
        except ConnectError as err:
            raise _Unreachable(str(err)) from None
        last = None
        while True:
            try:
                text = show(await asyncio.wait_for(work(client), COMMAND_DEADLINE_S))
            except TimeoutError:
                raise _Unreachable(f"no answer from Temporal at {_address(args)} within {COMMAND_DEADLINE_S} s") from None
            if not getattr(args, "watch", False):
                return print(text)
            if text != last:
                print(("\x1b[H\x1b[2J" if sys.stdout.isatty() else "") + text, flush=True)
                last = text
            await asyncio.sleep(WATCH_EVERY_S)

    try:
        asyncio.run(go())
    except KeyboardInterrupt:
        return 0
    except _Unreachable as err:
        print(f"gpuheal {args.command}: {err}", file=sys.stderr)
        return 2
    except OperatorError as err:
        return _fail(f"gpuheal {args.command}: {err}")
    except Exception as err:  # noqa: BLE001 - rejected updates and the like
        return _fail(f"gpuheal {args.command}: {getattr(err, 'cause', None) or err}")
    return 0


WATCH_EVERY_S = 2.0


def cmd_status(args) -> int:
    from workers import operator as op

    return _operator(args, lambda c: op.node_status(c, args.node, args.cluster) if args.node else op.fleet_status(c))


def cmd_history(args) -> int:
    from workers import operator as op

    return _operator(args, lambda c: op.history(c, args.node, args.cluster))


def cmd_episode_update(args) -> int:
    from workers import operator as op

    update, extra = {"approve": ("approve", [getattr(args, "rung", "")]), "replace": ("skip_to", ["replace"]),
                     "lift": ("lift", [getattr(args, "reason", "")])}[args.command]
    return _operator(args, lambda c: op.update_episode(c, args.node, args.cluster, update, *extra))


def cmd_guard_update(args) -> int:
    from workers import operator as op

    if args.command == "resume" and args.force:
        from policies.durations import parse_duration

        try:
            span = parse_duration(args.for_) if args.for_ else None
        except ValueError as err:
            return _fail(f"gpuheal resume: --for {args.for_!r}: {err}")
        return _operator(args, lambda c: op.lift_gates(c, args.cluster, args.leases, span))
    if args.command == "pause":
        return _operator(args, lambda c: op.guard_update(c, args.cluster, "pause", args.reason, c.identity))
    return _operator(args, lambda c: op.guard_update(c, args.cluster, args.command))


def cmd_guard(args) -> int:
    from workers import operator as op

    return _operator(args, lambda c: op.guard_status(c, args.cluster))


def cmd_report(args) -> int:
    from policies.durations import parse_duration
    from workers import operator as op

    if args.xid is not None and args.gpu is None:
        print("gpuheal report: --xid needs --gpu", file=sys.stderr)
        return 2  # a usage error, as argparse's own

    async def work(c):
        if args.suspect is not None:
            handle = await op.suspect_report(c, args.node, args.suspect, parse_duration(args.min_interval),
                                             args.cluster, args.task_queue)
        else:
            handle = await op.manual_report(c, args.node, args.xid, args.gpu, args.cluster, args.task_queue)
        return {"workflow_id": handle.id, "sent": True}

    return _operator(args, work)


def cmd_config(args) -> int:
    from workers import cli_config

    try:
        if args.config_command == "set-context":
            settings = {"temporal": args.temporal, "namespace": args.namespace, "cluster": args.cluster,
                        "task-queue": args.task_queue}
            print(f"context {args.name!r} saved in {cli_config.set_context(args.name, settings, args.use)}")
        elif args.config_command == "use-context":
            doc = cli_config.load()
            if args.name not in doc["contexts"]:
                return _fail(f"gpuheal config: no context {args.name!r} in {cli_config.config_path()}")
            doc["current-context"] = args.name
            print(f"switched to context {args.name!r} ({cli_config.save(doc)})")
        else:
            doc = cli_config.load()
            rows = [{"current": name == doc.get("current-context"), "name": name, **(ctx or {})}
                    for name, ctx in doc["contexts"].items()]
            if args.json:
                _print_json(rows)
            elif not rows:
                print(f"No contexts in {cli_config.config_path()} (gpuheal config set-context NAME ...)")
            else:
                from workers.render import table

                print(table(["current", "name", *cli_config.KEYS], [
                    ["*" if r["current"] else "", r["name"], *(r.get(k) for k in cli_config.KEYS)] for r in rows]))
    except cli_config.ConfigError as err:
        print(f"gpuheal config: {err}", file=sys.stderr)
        return 2
    return 0


def cmd_cli_reference(args) -> int:
    from workers.cli_parser import build_parser
    from workers.cli_reference import cli_reference

    print(cli_reference(build_parser()))
    return 0


def _address(args) -> str:
    return args.temporal or os.environ.get("TEMPORAL_ADDRESS") or "127.0.0.1:7233"


def _temporal_options(args: argparse.Namespace, service: str):
    from workers.temporal_client import TemporalOptions

    return TemporalOptions(address=args.temporal, namespace=args.namespace, tls_ca=args.tls_ca,
                           tls_cert=args.tls_cert, tls_key=args.tls_key, tls_server_name=args.tls_server_name,
                           api_key=args.api_key, metrics=args.metrics, tracing=args.tracing, service=service)


def main(argv: list[str] | None = None) -> int:
    from workers import cli_config
    from workers.cli_parser import build_parser

    args = build_parser().parse_args(argv)
    configure_logging(args.log_level, args.log_format)
    try:
        if args.command != "config":
            cli_config.apply(args, sys.argv[1:] if argv is None else argv)
    except cli_config.ConfigError as err:
        print(f"gpuheal {args.command}: {err}", file=sys.stderr)
        return 2
    if hasattr(args, "output"):  # -o json|yaml is --json in that form; table and wide are the human views
        from workers import render

        args.json = args.json or args.output in ("json", "yaml")
        render.MACHINE["format"] = args.output if args.output in ("json", "yaml") else "json"
    try:
        return args.func(args)
    except FlagError as err:  # a bad --metrics/--tracing/TLS flag: one line
        print(f"gpuheal {args.command}: {err}", file=sys.stderr)
        return 2


def entry() -> None:
    """The console script: run a command, then leave without interpreter finalization once the
    Temporal SDK is loaded, since its native threads can abort a finalizing interpreter (exit -6)
    even after a command that succeeded."""
    code = main()
    if "temporalio.bridge.temporal_sdk_bridge" not in sys.modules:
        sys.exit(code)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code or 0)


if __name__ == "__main__":
    entry()
