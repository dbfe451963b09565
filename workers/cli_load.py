"""`gpuheal validate` (the load-test battery on this host, by hand) and `gpuheal baseline` (each
SKU's fleet figures from the ledger, and the outliers)."""

from __future__ import annotations

import json
import sys

EXIT_PASSED, EXIT_FAILED, EXIT_COULD_NOT_RUN = 0, 1, 2


def _policy(path: str | None):
    from policies.loader import default_policy, load_policy

    return load_policy(path) if path else default_policy()


def _gpus(text: str | None) -> list[int] | None:
    if not text:
        return None
    try:
        return sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise ValueError(f"--gpus {text!r}: a comma-separated list of GPU indices like 0,3") from None


def cmd_validate(args) -> int:
    """Exit 0 passed, 1 failed, 2 could not run (no driver, no CuPy, a GPU in use or unusable)."""
    import pynvml

    from health.load.battery import run_battery
    from health.load.cupy_device import cupy_opener
    from policies.load import describe
    from policies.loader import PolicyError

    try:
        policy, gpus = _policy(args.policy), _gpus(args.gpus)
    except (PolicyError, ValueError) as err:
        print(f"gpuheal validate: {err}", file=sys.stderr)
        return EXIT_COULD_NOT_RUN
    report = run_battery(cupy_opener(pynvml), pynvml, policy.validation.load, args.tier, gpus,
                         tool_names={"dcgmi": args.dcgmi})
    broken = [f for f in report.findings if f.kind.value == "probe_broken"]
    code = EXIT_PASSED if report.passed else EXIT_COULD_NOT_RUN if broken else EXIT_FAILED
    if broken:
        reason = "; ".join(f.message for f in broken)
        if args.json:
            print(json.dumps({"tier": args.tier, "passed": False, "could_not_run": reason}))
        print(f"gpuheal validate: {reason}", file=sys.stderr)
        return code
    if args.json:
        print(json.dumps(report.model_dump(mode="json")))
    else:
        print(describe(report))
        for f in report.findings:
            print(f"FAILED {f.message}")
    return code


def cmd_baseline(args) -> int:
    """Each SKU's fleet medians, the floors they replace, and the GPUs under the policy's share."""
    from activities.ledger import DynamoLedger, SqliteLedger
    from activities.load_ledger import figures_store, outliers, references
    from policies.loader import PolicyError

    try:
        load = _policy(args.policy).validation.load
    except PolicyError as err:
        print(f"gpuheal baseline: {err}", file=sys.stderr)
        return 2
    if args.ledger.startswith("dynamodb://"):
        import boto3

        ledger = DynamoLedger(boto3.client("dynamodb"), args.ledger.removeprefix("dynamodb://"))
    else:
        from pathlib import Path

        if not Path(args.ledger).exists():
            print(f"gpuheal baseline: no ledger at {args.ledger}", file=sys.stderr)
            return 2
        ledger = SqliteLedger(args.ledger)
    rows = figures_store(ledger).rows()
    refs = references(rows)
    doc = {"skus": [], "outliers": outliers(rows, refs, load.degraded_fraction)}
    for sku, ref in refs.items():
        fleet = ref.nodes >= load.min_nodes_for_median
        floors = load.floors.get(sku)
        doc["skus"].append({"sku": sku, "nodes": ref.nodes, "judged_by": "fleet median" if fleet else "shipped floors",
                            "medians": ref.medians, "floors": floors.model_dump(exclude_none=True) if floors else {}})
    if args.json:
        print(json.dumps(doc, indent=1))
        return 0
    if not doc["skus"]:
        print("no load-test figures in the ledger yet: shipped floors apply")
    for s in doc["skus"]:
        figs = ", ".join(f"{k} {v:.3g}" for k, v in s["medians"].items())
        print(f"{s['sku']}: {s['nodes']} nodes, judged by {s['judged_by']}; medians: {figs}")
    for o in doc["outliers"]:
        print(f"outlier: {o}")
    return 0
