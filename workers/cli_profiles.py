"""`gpuheal profiles`, and the probes' `--profile NAME|FILE` outside a cluster."""

from __future__ import annotations

import sys

from policies.loader import PolicyError, load_policy


def cmd_profiles(args) -> int:
    """Which profile every GPU node gets and why, with its baseline: read through the kubernetes client."""
    from activities.kube_client import load_core_api
    from activities.node_profile import read_baseline
    from policies.profiles import select_profile

    try:
        policy = load_policy(args.policy)
    except PolicyError as err:
        print(f"gpuheal profiles: {err}", file=sys.stderr)
        return 2
    try:
        nodes = load_core_api(args.kubeconfig).list_node(label_selector=args.gpu_node_selector or None).items
    except Exception as err:  # noqa: BLE001 - one line, not a stack trace
        print(f"gpuheal profiles: cannot list nodes: {err}", file=sys.stderr)
        return 2
    rows = []
    for n in sorted(nodes, key=lambda n: n.metadata.name):
        sel = select_profile(policy, n.metadata.labels or {}, n.metadata.name)
        base = read_baseline(n.metadata.annotations)
        p = policy.profiles.get(sel.profile) if sel.profile else None
        rows.append({"node": n.metadata.name, "profile": sel.profile, "reason": sel.reason,
                     "mode": p.mode if p else "act",
                     "baseline": base.model_dump(mode="json") if base else None,
                     "baseline_summary": f"{base.summary()} ({base.origin()})" if base else ""})
    from workers import render

    if args.json:
        sys.stdout.write(render.document({"policy": policy.name, "nodes": rows}, render.MACHINE["format"]) + "\n")
        return 0
    if not rows:
        print(f"no nodes match {args.gpu_node_selector!r}")
        return 0
    wide = getattr(args, "output", "table") == "wide"
    columns = ["node", "profile", "mode", "baseline", "why"] if wide else ["node", "profile", "mode", "why"]
    print(render.table(columns, [[r["node"], r["profile"] or "(none)", r["mode"],
                                  *([r["baseline_summary"] or "(none)"] if wide else []), r["reason"]] for r in rows]))
    return 0


def local_profile(args, prog: str):
    """The ProbeConfig for `--profile NAME|FILE` (and `--expected-gpus`), or an exit code on a bad one."""
    from health.runner import ProbeConfig
    from policies.loader import resolve_profile

    config = ProbeConfig(expected_gpus=args.expected_gpus, generation=args.generation)
    if not getattr(args, "profile", None):
        return config
    try:
        name, profile = resolve_profile(load_policy(getattr(args, "policy", "default")), args.profile)
    except PolicyError as err:
        for problem in err.problems:
            print(f"{prog}: {err.source}: {problem}", file=sys.stderr)
        return 2
    config.apply_profile(name, profile, None)
    return config
