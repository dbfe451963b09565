"""Operator commands against a running Temporal: status, history, the episode and guard updates, report, config."""

from __future__ import annotations

import sys

from workers.cli_common import fail, print_json, run_operator


def cmd_status(args) -> int:
    from workers import operator as op

    return run_operator(args, lambda c: op.node_status(c, args.node, args.cluster) if args.node else op.fleet_status(c))


def cmd_history(args) -> int:
    from workers import operator as op

    return run_operator(args, lambda c: op.history(c, args.node, args.cluster))


def cmd_episode_update(args) -> int:
    from workers import operator as op

    update, extra = {"approve": ("approve", [getattr(args, "rung", "")]), "replace": ("skip_to", ["replace"]),
                     "lift": ("lift", [getattr(args, "reason", "")])}[args.command]
    return run_operator(args, lambda c: op.update_episode(c, args.node, args.cluster, update, *extra))


def cmd_guard_update(args) -> int:
    from workers import operator as op

    if args.command == "resume" and args.force:
        from policies.durations import parse_duration

        try:
            span = parse_duration(args.for_) if args.for_ else None
        except ValueError as err:
            return fail(f"gpuheal resume: --for {args.for_!r}: {err}")
        return run_operator(args, lambda c: op.lift_gates(c, args.cluster, args.leases, span))
    if args.command == "pause":
        return run_operator(args, lambda c: op.guard_update(c, args.cluster, "pause", args.reason, c.identity))
    return run_operator(args, lambda c: op.guard_update(c, args.cluster, args.command))


def cmd_guard(args) -> int:
    from workers import operator as op

    return run_operator(args, lambda c: op.guard_status(c, args.cluster))


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
            # Anyone able to signal could send this report: kill and reset target only GPUs the node's own agent named.
            return {"workflow_id": handle.id, "sent": True,
                    "note": f"GPU {args.gpu} is not killed or reset on a person's word: unless {args.node}'s own agent "
                            "reports it too, the ladder goes past the reset (see `gpuheal status`)"}
        return {"workflow_id": handle.id, "sent": True}

    return run_operator(args, work)


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
                return fail(f"gpuheal config: no context {args.name!r} in {cli_config.config_path()}")
            doc["current-context"] = args.name
            print(f"switched to context {args.name!r} ({cli_config.save(doc)})")
        else:
            doc = cli_config.load()
            rows = [{"current": name == doc.get("current-context"), "name": name, **(ctx or {})}
                    for name, ctx in doc["contexts"].items()]
            if args.json:
                print_json(rows)
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
