"""The gpuheal command line's flags: one parser, each command's handler in workers/cli_local.py,
cli_serve.py or cli_operator.py."""

from __future__ import annotations

import argparse

import api as c
from activities.providers import PROVIDERS
from policies.terms import Generation, Rung
from workers import cli_local, cli_operator, cli_profiles, cli_serve
from workers.telemetry import METRICS_HELP, TRACING_HELP

GENERATIONS = [g.value for g in Generation]
PROFILE_HELP = "what this node should have: a profile of the policy by name, or a YAML file holding one"


def add_temporal_args(p: argparse.ArgumentParser, embedded: bool = False) -> None:
    """The flags every command that talks to Temporal takes."""
    g = p.add_argument_group("Temporal (flags override TEMPORAL_* env and the Temporal config file)")
    g.add_argument("--temporal", default=None, metavar="HOST:PORT",
                   help="an existing Temporal server (default: an embedded dev server)" if embedded
                   else "the Temporal frontend (default: TEMPORAL_ADDRESS, else 127.0.0.1:7233)")
    g.add_argument("--namespace", default=None, help="default: TEMPORAL_NAMESPACE, else default")
    g.add_argument("--context", default=None,
                   help="a named context from gpuheal's config file (default: its current context); flags win")
    g.add_argument("--tls-ca", default=None, metavar="PEM", help="CA of the server's certificate; turns TLS on")
    g.add_argument("--tls-cert", default=None, metavar="PEM", help="client certificate for mutual TLS")
    g.add_argument("--tls-key", default=None, metavar="PEM", help="client key for mutual TLS")
    g.add_argument("--tls-server-name", default=None, help="server name to verify, if not the address's host")
    g.add_argument("--api-key", default=None, help="an API key (Temporal Cloud); default TEMPORAL_API_KEY")
    g.add_argument("--metrics", default=None, help=METRICS_HELP)
    g.add_argument("--tracing", default=None, help=TRACING_HELP)


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
    check.set_defaults(func=cli_local.cmd_policy_check)
    reference = policy.add_parser("reference", help="print the policy reference (markdown) from the model's field docs")
    reference.set_defaults(func=cli_local.cmd_policy_reference)
    sub.add_parser("cli-reference", help="print this CLI reference (markdown) from the parser").set_defaults(
        func=cli_local.cmd_cli_reference)

    replay = sub.add_parser("replay", help="replay exported histories (*.json) against the current code")
    replay.add_argument("dir")
    replay.add_argument("--json", action="store_true")
    replay.set_defaults(func=cli_local.cmd_replay)

    probe = sub.add_parser("probe", help="run one probe here").add_subparsers(dest="probe_command", required=True)
    kmsg = probe.add_parser("kmsg", help="classify the kernel-log lines a file (or /dev/kmsg) holds, then exit")
    kmsg.add_argument("file")
    kmsg.add_argument("--generation", default="hopper", choices=GENERATIONS)
    kmsg.add_argument("--json", action="store_true")
    kmsg.add_argument("--follow", action="store_true", help="keep reading new lines until SIGINT/SIGTERM")
    kmsg.set_defaults(func=cli_local.cmd_probe_kmsg)
    nvml = probe.add_parser("nvml", help="run the NVML probes on this host")
    nvml.add_argument("--profile", default=None, metavar="NAME|FILE", help=PROFILE_HELP)
    nvml.add_argument("--policy", default="default", help="the policy whose profiles --profile names")
    nvml.add_argument("--expected-gpus", type=int, default=None)
    nvml.add_argument("--generation", default="hopper", choices=GENERATIONS)
    nvml.add_argument("--json", action="store_true")
    nvml.add_argument("--npd", action="store_true", help="node-problem-detector custom plugin protocol")
    nvml.set_defaults(func=cli_local.cmd_probe_nvml)
    from workers import cli_load

    val = sub.add_parser("validate", help="load-test this host's GPUs (exit 0 passed, 1 failed, 2 could not run)")
    val.add_argument("--tier", default="quick", choices=["quick", "repair", "admission"])
    val.add_argument("--gpus", default=None, metavar="0,3", help="GPU indices (default: all)")
    val.add_argument("--policy", default=None, help="policy file with the tiers (default: the built-in policy)")
    val.add_argument("--dcgmi", default="dcgmi", help="dcgmi binary for tiers that run DCGM diag")
    val.add_argument("--json", action="store_true")
    val.set_defaults(func=cli_load.cmd_validate)
    base = sub.add_parser("baseline", help="each GPU SKU's fleet figures from the ledger, and the outliers")
    base.add_argument("--ledger", default=".gpuheal/ledger.db", help="SQLite path or dynamodb://TABLE")
    base.add_argument("--policy", default=None, help="policy file (degraded fraction, floors)")
    base.add_argument("--json", action="store_true")
    base.set_defaults(func=cli_load.cmd_baseline)

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
    ctl.add_argument("--provider", default="aws", choices=sorted(PROVIDERS),
                     help="who reboots and replaces machines: aws (EC2, Auto Scaling, Karpenter) or clusterapi "
                          "(replace deletes the node's Machine; its cluster.x-k8s.io/cluster-name must be --cluster)")
    ctl.add_argument("--machines-kubeconfig", default=None,
                     help="clusterapi: the management cluster's kubeconfig, where the Machines are "
                          "(default: the Nodes' API, a self-hosted cluster)")
    ctl.set_defaults(func=cli_serve.cmd_controller)

    agent = sub.add_parser("agent", help="run the node agent on this GPU node")
    agent.add_argument("--node", required=True)
    add_temporal_args(agent)
    agent.add_argument("--task-queue", default=c.DEFAULT_TASK_QUEUE)
    agent.add_argument("--cluster", default="default")
    agent.add_argument("--policy", default="default",
                       help="for the agent's own judgement of which findings are fatal; episodes use the controller's")
    agent.add_argument("--profile", default=None, metavar="NAME|FILE",
                       help=PROFILE_HELP + " (default: the controller tells the agent its node's profile)")
    agent.add_argument("--generation", default="hopper", choices=GENERATIONS)
    agent.add_argument("--expected-gpus", type=int, default=None)
    agent.add_argument("--poll-interval", type=float, default=10.0)
    agent.add_argument("--kmsg-state", default="/var/lib/gpuheal/kmsg-position",
                       help="file on the host keeping the kernel-log position, so a restarted agent reads on")
    agent.set_defaults(func=cli_serve.cmd_agent)

    profiles = sub.add_parser("profiles", help="which profile each GPU node gets and why, and its baseline")
    profiles.add_argument("--kubeconfig", default=None, help="default: in-cluster config, else ~/.kube/config")
    profiles.add_argument("--policy", default="default", help="the controller's policy file")
    profiles.add_argument("--gpu-node-selector", default="nvidia.com/gpu.present=true")
    profiles.add_argument("--json", action="store_true")
    profiles.set_defaults(func=cli_profiles.cmd_profiles)

    sim = sub.add_parser("simulate", help="run a scenario on a simulated fleet, print each node's outcome")
    sim.add_argument("scenario")
    sim.add_argument("--json", action="store_true")
    add_temporal_args(sim, embedded=True)
    sim.set_defaults(func=cli_serve.cmd_simulate)

    whatif = sub.add_parser("whatif", help="run policies against a modelled month of faults in virtual time, "
                                           "print availability and what each did")
    whatif.add_argument("faults", nargs="?", default=None,
                        help="fault model YAML, or a shipped one by name (large-cluster, llama3); with --from-ledger "
                             "only its durations are used")
    whatif.add_argument("--nodes", type=int, default=1000, help="fleet size")
    whatif.add_argument("--days", type=float, default=30.0, help="virtual days to run")
    whatif.add_argument("--policy", action="append", dest="policies", metavar="POLICY",
                        help="policy file, default, replace-only or reboot-then-replace; again to compare "
                             "(default: default and replace-only)")
    whatif.add_argument("--seed", type=int, default=1, help="the faults drawn: one seed, the same faults for every policy")
    whatif.add_argument("--json", action="store_true")
    whatif.add_argument("--plot", metavar="OUT.png", help="draw availability over time and node-hours lost by cause")
    whatif.add_argument("--jobs", type=int, default=None, help="policies run at once, one process each (default 1: two at once can stall under load)")
    whatif.add_argument("--workload", action="append", dest="workloads", metavar="WORKLOAD",
                        help="jobs on the fleet (YAML, or shipped: llama3-pretrain, training, training-checkpointed): "
                             "job success, ETTR, goodput lost per policy; again for another on the same outages")
    whatif.add_argument("--mass-failure", metavar="N:CLASS",
                        help="instead of drawing faults, strike N nodes with the model's fault class CLASS at once, "
                             "10 minutes in (a bad driver push): what max_unhealthy, the breaker and canaries do")
    whatif.add_argument("--from-ledger", metavar="FILE",
                        help="replay the faults of a `gpuheal outcomes --json` export instead of drawing them")
    whatif.set_defaults(func=cli_serve.cmd_whatif)

    outcomes = sub.add_parser("outcomes", help="what the ledger's episodes cost: node-hours lost by cause and phase, "
                                               "MTTR, repeat failures, interrupted pods")
    outcomes.add_argument("--ledger", default=".gpuheal/ledger.db", help="SQLite path or dynamodb://TABLE")
    outcomes.add_argument("--since", default="30d", help="a duration back from now (30d, 12h) or all")
    outcomes.add_argument("--by", choices=["profile", "sku", "fault"], default=None)
    outcomes.add_argument("--json", action="store_true")
    outcomes.set_defaults(func=cli_serve.cmd_outcomes)

    config = sub.add_parser("config", help="named contexts: Temporal address, namespace, cluster, task queue").add_subparsers(
        dest="config_command", required=True)
    setc = config.add_parser("set-context", help="create or change a context (only the settings given)")
    setc.add_argument("name")
    for flag in ("--temporal", "--namespace", "--cluster", "--task-queue"):
        setc.add_argument(flag, default=None)
    setc.add_argument("--use", action="store_true", help="also make it the current context")
    setc.set_defaults(func=cli_operator.cmd_config)
    config.add_parser("use-context", help="make a context the current one").add_argument("name")
    config.choices["use-context"].set_defaults(func=cli_operator.cmd_config)
    getc = config.add_parser("get-contexts", help="every context, the current one marked")
    getc.add_argument("--json", action="store_true")
    getc.set_defaults(func=cli_operator.cmd_config)

    demo = sub.add_parser("demo", help="the whole system on this machine with the built-in scenario")
    demo.add_argument("--keep", action="store_true", help="leave everything running until Ctrl-C")
    add_temporal_args(demo, embedded=True)
    demo.add_argument("--ui", default="http://localhost:8233", help="the Temporal UI of --temporal's server, for links")
    demo.set_defaults(func=cli_serve.cmd_demo)

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

    operator_cmd("status", "what is happening to a node, or every open episode", cli_operator.cmd_status, "optional").add_argument(
        "-w", "--watch", action="store_true", help="show it again whenever it changes, until Ctrl-C")
    operator_cmd("history", "every episode of a node, each step with its time and result", cli_operator.cmd_history, "required")
    operator_cmd("approve", "approve the rung a node's episode waits on", cli_operator.cmd_episode_update, "required").add_argument(
        "rung", choices=[r.value for r in Rung], help="the rung you approve (as `status` shows it)")
    operator_cmd("replace", "skip a node's episode straight to replacement", cli_operator.cmd_episode_update, "required")
    operator_cmd("lift", "lift the hold on a node left quarantined for a person (uncordons it; you are recorded)",
                 cli_operator.cmd_episode_update, "required").add_argument("--reason", default="", help="what was done")
    operator_cmd("guard", "the fleet guard: budget, leases and holders, waiters and why, gates, canaries", cli_operator.cmd_guard).add_argument(
        "-w", "--watch", action="store_true", help="show it again whenever it changes, until Ctrl-C")
    operator_cmd("pause", "pause new disruptive leases in the cluster", cli_operator.cmd_guard_update).add_argument("--reason", default="")
    res = operator_cmd("resume", "resume disruptive leases (also closes a tripped storm breaker)", cli_operator.cmd_guard_update)
    res.add_argument("--force", action="store_true",
                     help="also lift every gate (max_unhealthy, canary trickle) for --leases grants or --for a time")
    res.add_argument("--leases", type=int, default=1, help="with --force: how many leases (default 1)")
    res.add_argument("--for", dest="for_", default=None, metavar="DURATION", help="with --force: lift the gates this long (e.g. 30m)")
    rep = operator_cmd("report", "report a fault by hand", cli_operator.cmd_report, "required")
    what = rep.add_mutually_exclusive_group(required=True)
    what.add_argument("--xid", type=int, help="an Xid seen on --gpu")
    what.add_argument("--suspect", metavar="WHY", help="suspect, not failed: drain and load-test it, remedy only on a failure")
    rep.add_argument("--gpu", type=int, help="with --xid: the GPU it was seen on")
    rep.add_argument("--min-interval", default="1h", metavar="DURATION",
                     help="with --suspect: refuse when the node's last episode ended less than this ago")
    rep.add_argument("--task-queue", default=c.DEFAULT_TASK_QUEUE)
    _logging_flags_everywhere(sub)
    _output_flag_where_json(sub)
    return p


def _output_flag_where_json(sub) -> None:
    """-o table|wide|json|yaml on every command that prints a document (`--json` stays, as -o json)."""
    from workers.render import OUTPUTS

    for sp in sub.choices.values():
        nested = [a for a in sp._actions if isinstance(a, argparse._SubParsersAction)]
        if nested:
            _output_flag_where_json(nested[0])
        elif any("--json" in a.option_strings for a in sp._actions):
            sp.add_argument("-o", "--output", default="table", choices=OUTPUTS,
                            help="table (default), wide (more columns), json or yaml")


def _logging_flags_everywhere(sub) -> None:
    """--log-level and --log-format also after the command (`gpuheal controller --log-format json`)."""
    for sp in sub.choices.values():
        nested = [a for a in sp._actions if isinstance(a, argparse._SubParsersAction)]
        if nested:
            _logging_flags_everywhere(nested[0])
            continue
        sp.add_argument("--log-level", default=argparse.SUPPRESS, help="DEBUG, INFO, WARNING (default), ERROR")
        sp.add_argument("--log-format", default=argparse.SUPPRESS, choices=["text", "json"])
