"""The gpuheal command line: a thin layer over the packages; `--json` prints one document on stdout."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from pathlib import Path

from activities import contracts as c
from policies.loader import PolicyError, load_policy
from workers.telemetry import METRICS_HELP, TRACING_HELP, FlagError, configure_logging


def _print_json(doc) -> None:
    sys.stdout.write(json.dumps(doc, indent=1, default=str) + "\n")


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
    from health.kmsg import KmsgParser
    from policies.classify import classify
    from policies.loader import default_policy

    try:
        with open(args.file, errors="replace") as fh:
            findings = KmsgParser().parse(fh)
    except OSError as err:
        print(f"gpuheal probe kmsg: cannot read {args.file}: {err.strerror}", file=sys.stderr)
        return 2
    triage = classify(findings, args.generation, default_policy())
    if args.json:
        _print_json({"findings": [f.model_dump(mode="json") for f in findings],
                     "triage": triage.model_dump(mode="json", exclude={"verdicts"})})
    else:
        for f in findings:
            print(f"{f.kind.value:16} xid={f.xid!s:5} pci={f.pci} {f.message[:100]}")
        print(f"triage ({args.generation}): " + (f"{triage.fault_class}, {triage.attribution}, start at "
              f"{triage.start_rung.value}" if triage.actionable else triage.reason))
    return 0


NPD_MESSAGE_MAX = 80  # node-problem-detector truncates custom plugin output at 80 characters


def cmd_probe_nvml(args) -> int:
    """Exit 0 healthy, 1 a fault found; with --npd, 2 when the checks could not run (NPD's Unknown)."""
    import pynvml

    from health.nvml import probe_nvml
    from policies.classify import classify
    from policies.loader import default_policy

    result = probe_nvml(pynvml, expected_gpus=args.expected_gpus)
    triage = classify(result.findings, args.generation, default_policy())
    broken_only = bool(result.findings) and all(f.kind.value == "probe_broken" for f in result.findings)
    if args.npd:
        if not result.findings:
            print(f"{len(result.gpus)} GPUs healthy"[:NPD_MESSAGE_MAX])
            return 0
        print(("; ".join(f"{f.label()}: {f.message}" for f in result.findings))[:NPD_MESSAGE_MAX])
        return 2 if broken_only else 1
    if args.json:
        _print_json({"findings": [f.model_dump(mode="json") for f in result.findings],
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


def _serve(args, body) -> int:
    """A long-running process: connect (one line if Temporal is not there), run until SIGINT/SIGTERM."""
    import signal

    from workers.temporal_client import connect

    async def run() -> int:
        try:
            client = await connect(opts=_temporal_options(args, f"gpuheal-{args.command}"))
        except FlagError:
            raise
        except Exception as err:  # noqa: BLE001 - one line, not a stack trace
            print(f"gpuheal {args.command}: cannot reach Temporal at {_address(args)}: {err}", file=sys.stderr)
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
    """The node agent: probes this host and serves node-local activities on node/<name>."""
    from health.runner import ProbeConfig
    from workers.agent import AgentConfig, run_agent

    try:
        policy = load_policy(args.policy)
    except PolicyError as err:
        print(f"gpuheal agent: {err}", file=sys.stderr)
        return 2
    config = AgentConfig(node=args.node, policy=policy, cluster=args.cluster, task_queue=args.task_queue,
                         generation=args.generation, poll_interval_s=args.poll_interval,
                         kmsg_state=Path(args.kmsg_state) if args.kmsg_state else None,
                         probe=ProbeConfig(expected_gpus=args.expected_gpus, generation=args.generation))

    async def body(client, stop) -> None:
        await run_agent(client, config, stop)

    return _serve(args, body)


def cmd_simulate(args) -> int:
    from sim.scenario import ScenarioError, load_scenario
    from workers.simulate import run_scenario

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


def outcome_table(doc: dict) -> str:
    lines = [f"scenario {doc['scenario']}", f"{'node':<14} {'outcome':<18} {'fault':<16} {'attribution':<12} "
             f"{'rungs':<24} {'valid.':>6} {'cordon ms':>9} {'secs':>6}"]
    for r in doc["nodes"]:
        lines.append(f"{r['node']:<14} {r['outcome']:<18} {r['fault_class'] or '-':<16} {r['attribution'] or '-':<12} "
                     f"{','.join(r['rungs']) or '-':<24} {r['validations']:>6} {r['detect_to_cordon_ms'] or '-':>9} "
                     f"{r['duration_s']:>6}")
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


DEMO_PORTS = {"Temporal frontend": 7233, "Temporal UI": 8233}


def _port_free(port: int) -> bool:
    import socket

    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


def cmd_demo(args) -> int:
    """The whole system on this machine: dev server (SQLite under .gpuheal/, UI :8233), fake API
    server, moto, controller, one simulated agent per node, and the built-in scenario."""
    from sim.scenario import BUILTIN_SCENARIOS, load_scenario
    from workers import demo, simulate

    if not args.temporal:
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
        async with simulate.temporal(opts, db_file=str(demo.STATE / "temporal.db"), ui_port=8233) as client:
            address, ns = client.service_client.config.target_host, client.namespace

            async def results(doc: dict, fleet) -> None:
                print(outcome_table(doc))
                print("\nTemporal UI, each node's remediation history:")
                for r in doc["nodes"]:
                    if r["workflow_id"]:
                        print(f"  {r['node']:<12} {args.ui}/namespaces/{ns}/workflows?query=GpuNode%3D%22{r['node']}%22")
                sys.stdout.flush()
                if args.keep:
                    await demo.keep_playing(fleet, address, ns)

            await simulate.run_scenario(scenario, policy, opts, on_tick=demo.Progress(), client=client, after=results)

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


def _operator(args, work) -> int:
    """Run one operator command: JSON or a human line; a one-line reason and non-zero on failure."""
    from workers.operator import OperatorError
    from workers.temporal_client import connect

    async def go():
        try:
            client = await connect(opts=_temporal_options(args, "gpuheal-cli"))
        except FlagError:
            raise
        except Exception as err:  # noqa: BLE001 - one line, not a stack trace
            raise OperatorError(f"cannot reach Temporal at {_address(args)}: {err}") from None
        try:
            return await asyncio.wait_for(work(client), COMMAND_DEADLINE_S)
        except TimeoutError:
            raise OperatorError(f"no answer from Temporal at {_address(args)} within {COMMAND_DEADLINE_S} s") from None

    try:
        doc = asyncio.run(go())
    except OperatorError as err:
        return _fail(f"gpuheal {args.command}: {err}")
    except Exception as err:  # noqa: BLE001 - rejected updates and the like
        return _fail(f"gpuheal {args.command}: {getattr(err, 'cause', None) or err}")
    doc = doc.model_dump(mode="json") if hasattr(doc, "model_dump") else doc
    if args.json:
        _print_json(doc)
    elif isinstance(doc, list):
        for row in doc:
            print(json.dumps(row, default=str))
    else:
        print(json.dumps(doc, indent=1, default=str))
    return 0


def cmd_status(args) -> int:
    from workers import operator as op

    return _operator(args, lambda c: op.node_status(c, args.node) if args.node else op.fleet_status(c))


def cmd_history(args) -> int:
    from workers import operator as op

    return _operator(args, lambda c: op.history(c, args.node))


def cmd_episode_update(args) -> int:
    from workers import operator as op

    update, extra = {"approve": ("approve", []), "replace": ("skip_to", ["replace"])}[args.command]
    return _operator(args, lambda c: op.update_episode(c, args.node, update, *extra))


def cmd_guard_update(args) -> int:
    from workers import operator as op

    if args.command == "resume" and args.force:
        from policies.durations import parse_duration

        try:
            span = parse_duration(args.for_) if args.for_ else None
        except ValueError as err:
            return _fail(f"gpuheal resume: --for {args.for_!r}: {err}")
        return _operator(args, lambda c: op.lift_gates(c, args.cluster, args.leases, span))
    extra = [args.reason] if args.command == "pause" else []
    return _operator(args, lambda c: op.guard_update(c, args.cluster, args.command, *extra))


def cmd_guard(args) -> int:
    from workers import operator as op

    return _operator(args, lambda c: op.guard_status(c, args.cluster))


def cmd_report(args) -> int:
    from workers import operator as op

    async def work(c):
        handle = await op.manual_report(c, args.node, args.xid, args.gpu, args.cluster, args.task_queue)
        return {"workflow_id": handle.id, "sent": True}

    return _operator(args, work)


def cmd_cli_reference(args) -> int:
    from workers.cli_reference import cli_reference

    print(cli_reference(build_parser()))
    return 0


def add_temporal_args(p: argparse.ArgumentParser, embedded: bool = False) -> None:
    """The flags every command that talks to Temporal takes."""
    g = p.add_argument_group("Temporal (flags override TEMPORAL_* env and the Temporal config file)")
    g.add_argument("--temporal", default=None, metavar="HOST:PORT",
                   help="an existing Temporal server (default: an embedded dev server)" if embedded
                   else "the Temporal frontend (default: TEMPORAL_ADDRESS, else 127.0.0.1:7233)")
    g.add_argument("--namespace", default=None, help="default: TEMPORAL_NAMESPACE, else default")
    g.add_argument("--tls-ca", default=None, metavar="PEM", help="CA of the server's certificate; turns TLS on")
    g.add_argument("--tls-cert", default=None, metavar="PEM", help="client certificate for mutual TLS")
    g.add_argument("--tls-key", default=None, metavar="PEM", help="client key for mutual TLS")
    g.add_argument("--tls-server-name", default=None, help="server name to verify, if not the address's host")
    g.add_argument("--api-key", default=None, help="an API key (Temporal Cloud); default TEMPORAL_API_KEY")
    g.add_argument("--metrics", default=None, help=METRICS_HELP)
    g.add_argument("--tracing", default=None, help=TRACING_HELP)


def _address(args) -> str:
    return args.temporal or os.environ.get("TEMPORAL_ADDRESS") or "127.0.0.1:7233"


def _temporal_options(args: argparse.Namespace, service: str):
    from workers.temporal_client import TemporalOptions

    return TemporalOptions(address=args.temporal, namespace=args.namespace, tls_ca=args.tls_ca,
                           tls_cert=args.tls_cert, tls_key=args.tls_key, tls_server_name=args.tls_server_name,
                           api_key=args.api_key, metrics=args.metrics, tracing=args.tracing, service=service)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gpuheal", description="GPU-fleet remediation on Temporal.")
    p.add_argument("--log-level", default="WARNING")
    p.add_argument("--log-format", default="text", choices=["text", "json"],
                   help="json: one object a line with node and workflow id")
    sub = p.add_subparsers(dest="command", required=True)

    policy = sub.add_parser("policy", help="policy files").add_subparsers(dest="policy_command", required=True)
    check = policy.add_parser("check", help="validate a policy file")
    check.add_argument("file")
    check.add_argument("--json", action="store_true")
    check.set_defaults(func=cmd_policy_check)
    reference = policy.add_parser("reference", help="print the policy reference (markdown) from the model's field docs")
    reference.set_defaults(func=cmd_policy_reference)
    sub.add_parser("cli-reference", help="print this CLI reference (markdown) from the parser").set_defaults(
        func=cmd_cli_reference)

    replay = sub.add_parser("replay", help="replay exported histories (*.json) against the current code")
    replay.add_argument("dir")
    replay.add_argument("--json", action="store_true")
    replay.set_defaults(func=cmd_replay)

    probe = sub.add_parser("probe", help="run one probe here").add_subparsers(dest="probe_command", required=True)
    kmsg = probe.add_parser("kmsg", help="classify kernel-log lines from a file (or /dev/kmsg)")
    kmsg.add_argument("file")
    kmsg.add_argument("--generation", default="hopper", choices=["ampere", "hopper", "blackwell"])
    kmsg.add_argument("--json", action="store_true")
    kmsg.set_defaults(func=cmd_probe_kmsg)
    nvml = probe.add_parser("nvml", help="run the NVML probes on this host")
    nvml.add_argument("--expected-gpus", type=int, default=None)
    nvml.add_argument("--generation", default="hopper", choices=["ampere", "hopper", "blackwell"])
    nvml.add_argument("--json", action="store_true")
    nvml.add_argument("--npd", action="store_true", help="node-problem-detector custom plugin protocol")
    nvml.set_defaults(func=cmd_probe_nvml)

    ctl = sub.add_parser("controller", help="run the controller (workflows and cluster-side activities)")
    add_temporal_args(ctl)
    ctl.add_argument("--task-queue", default=c.DEFAULT_TASK_QUEUE)
    ctl.add_argument("--kubeconfig", default=None, help="default: in-cluster config, else ~/.kube/config")
    ctl.add_argument("--ledger", default=".gpuheal/ledger.db", help="SQLite path or dynamodb://TABLE")
    ctl.add_argument("--gpu-node-selector", default="nvidia.com/gpu.present=true")
    ctl.add_argument("--watch-condition", action="append", default=[], metavar="TYPE[=STATUS][:SECONDS]",
                     help="a node condition (NPD, DCGM exporter) that means a GPU fault once held SECONDS; repeatable")
    ctl.add_argument("--policy", default="default",
                     help="the policy every episode acts on (episodes take it from the controller, never from a report)")
    ctl.add_argument("--cluster", default="default")
    ctl.set_defaults(func=cmd_controller)

    agent = sub.add_parser("agent", help="run the node agent on this GPU node")
    agent.add_argument("--node", required=True)
    add_temporal_args(agent)
    agent.add_argument("--task-queue", default=c.DEFAULT_TASK_QUEUE)
    agent.add_argument("--cluster", default="default")
    agent.add_argument("--policy", default="default",
                       help="for the agent's own judgement of which findings are fatal; episodes use the controller's")
    agent.add_argument("--generation", default="hopper", choices=["ampere", "hopper", "blackwell"])
    agent.add_argument("--expected-gpus", type=int, default=8)
    agent.add_argument("--poll-interval", type=float, default=10.0)
    agent.add_argument("--kmsg-state", default="/var/lib/gpuheal/kmsg-position",
                       help="file on the host keeping the kernel-log position, so a restarted agent reads on")
    agent.set_defaults(func=cmd_agent)

    sim = sub.add_parser("simulate", help="run a scenario on a simulated fleet, print each node's outcome")
    sim.add_argument("scenario")
    sim.add_argument("--json", action="store_true")
    add_temporal_args(sim, embedded=True)
    sim.set_defaults(func=cmd_simulate)

    demo = sub.add_parser("demo", help="the whole system on this machine with the built-in scenario")
    demo.add_argument("--keep", action="store_true", help="leave everything running until Ctrl-C")
    add_temporal_args(demo, embedded=True)
    demo.add_argument("--ui", default="http://localhost:8233", help="the Temporal UI of --temporal's server, for links")
    demo.set_defaults(func=cmd_demo)

    def operator_cmd(name: str, help_: str, func, node: str | None = None):
        sp = sub.add_parser(name, help=help_)
        if node == "required":
            sp.add_argument("node")
        elif node == "optional":
            sp.add_argument("node", nargs="?")
        add_temporal_args(sp)
        sp.add_argument("--cluster", default="default")
        sp.add_argument("--json", action="store_true")
        sp.set_defaults(func=func)
        return sp

    operator_cmd("status", "what is happening to a node, or every open episode", cmd_status, "optional")
    operator_cmd("history", "every episode of a node, each step with its time and result", cmd_history, "required")
    operator_cmd("approve", "approve the rung a node's episode waits on", cmd_episode_update, "required")
    operator_cmd("replace", "skip a node's episode straight to replacement", cmd_episode_update, "required")
    operator_cmd("guard", "the fleet guard: budget, leases and holders, waiters and why, gates, canaries", cmd_guard)
    operator_cmd("pause", "pause new disruptive leases in the cluster", cmd_guard_update).add_argument("--reason", default="")
    res = operator_cmd("resume", "resume disruptive leases (also closes a tripped storm breaker)", cmd_guard_update)
    res.add_argument("--force", action="store_true",
                     help="also lift every gate (max_unhealthy, canary trickle) for --leases grants or --for a time")
    res.add_argument("--leases", type=int, default=1, help="with --force: how many leases (default 1)")
    res.add_argument("--for", dest="for_", default=None, metavar="DURATION", help="with --force: lift the gates this long (e.g. 30m)")
    rep = operator_cmd("report", "report a fault by hand", cmd_report, "required")
    rep.add_argument("--xid", type=int, required=True)
    rep.add_argument("--gpu", type=int, required=True)
    rep.add_argument("--task-queue", default=c.DEFAULT_TASK_QUEUE)
    _logging_flags_everywhere(sub)
    return p


def _logging_flags_everywhere(sub) -> None:
    """--log-level and --log-format also after the command (`gpuheal controller --log-format json`)."""
    for sp in sub.choices.values():
        nested = [a for a in sp._actions if isinstance(a, argparse._SubParsersAction)]
        if nested:
            _logging_flags_everywhere(nested[0])
            continue
        sp.add_argument("--log-level", default=argparse.SUPPRESS, help="DEBUG, INFO, WARNING (default), ERROR")
        sp.add_argument("--log-format", default=argparse.SUPPRESS, choices=["text", "json"])


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure_logging(args.log_level, args.log_format)
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
