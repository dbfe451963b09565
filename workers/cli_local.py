"""Commands that need no server: policy check and reference, replay, the local probes, the CLI reference."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from policies.loader import PolicyError, load_policy
from workers.cli_common import print_json


def cmd_policy_check(args) -> int:
    try:
        policy = load_policy(args.file)
    except PolicyError as err:
        for problem in err.problems:
            print(f"{err.source}: {problem}", file=sys.stderr)
        return 1
    if args.json:
        print_json({"ok": True, "policy": policy.model_dump(mode="json", exclude={"xids"})})
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
        print_json({"histories": [o.model_dump() for o in outcomes]})
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
        print_json({"findings": [f.model_dump(mode="json") for f in findings],
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
        print_json({"profile": config.profile_name or None,
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




def cmd_cli_reference(args) -> int:
    from workers.cli_reference import cli_reference

    print(cli_reference(args.parser))  # the parser main built: no import of it back from here
    return 0
