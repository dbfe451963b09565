"""`gpuheal outcomes`: what the ledger's episodes cost (activities/outcomes.py), as a table or JSON."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from activities.ledger import DynamoLedger, SqliteLedger
from activities.outcomes import outcome_report
from policies.durations import parse_duration


class OutcomesError(ValueError):
    pass


def open_ledger(spec: str):
    """A SQLite path (read where it is: nothing is created) or dynamodb://TABLE (boto3's usual config)."""
    if spec.startswith("dynamodb://"):
        import boto3

        return DynamoLedger(boto3.Session().client("dynamodb"), spec.removeprefix("dynamodb://"))
    if not Path(spec).is_file():
        raise OutcomesError(f"--ledger {spec}: no such ledger file (the controller's --ledger; the demo's is "
                            ".gpuheal/ledger.db)")
    return SqliteLedger(spec)


def parse_since(text: str | None) -> datetime | None:
    if not text or text == "all":
        return None
    try:
        return datetime.now(UTC) - parse_duration(text)
    except ValueError:
        raise OutcomesError(f"--since {text!r}: expected a duration like 30d, 12h, or all") from None


def report(ledger_spec: str, since: str | None, by: str | None) -> dict:
    start = parse_since(since)
    return outcome_report(open_ledger(ledger_spec).records(start), start, by)


def _line(name: str, d: dict) -> str:
    lost = ", ".join(f"{k} {v:.2f}" for k, v in sorted(d["node_hours_lost_by_cause"].items(), key=lambda kv: -kv[1]))
    return (f"{name}: {d['episodes']} episodes ({', '.join(f'{k} {v}' for k, v in d['by_outcome'].items()) or '-'}); "
            f"node-hours lost {d['node_hours_lost']:.2f}" + (f" ({lost})" if lost else ""))


def table(doc: dict) -> str:
    mttr = "-" if doc["mttr_h"] is None else f"{doc['mttr_h']:.2f} h"
    pods = doc["pod_interruptions"]
    lines = [
        _line(f"since {doc['since'] or 'the first record'}", doc),
        "node-hours lost by phase: " + (", ".join(f"{k} {v:.2f}" for k, v in doc["node_hours_lost_by_phase"].items())
                                        or "none"),
        f"mean time to repair: {mttr}; repaired {doc['repaired']}, failed again within 7 days "
        f"{doc['failed_again_7d']}, within 30 days {doc['failed_again_30d']}",
        f"pods interrupted: platform {pods['platform']}, application {pods['application']}",
    ]
    for key, g in (doc.get("groups") or {}).items():
        lines.append("  " + _line(f"{doc['by']} {key}", g))
    if doc["episodes_list"]:
        lines.append("")
        lines.append(f"{'node':<14} {'fault':<22} {'attribution':<12} {'outcome':<18} {'out (h)':>8}  phases (s)")
        for e in doc["episodes_list"]:
            out = "-" if e["out_of_service_h"] is None else f"{e['out_of_service_h']:.3f}"
            phases = ", ".join(f"{k} {v:.0f}" for k, v in e["phases_s"].items())
            lines.append(f"{e['node']:<14} {(e['fault_class'] or '-'):<22} {(e['attribution'] or '-'):<12} "
                         f"{e['outcome']:<18} {out:>8}  {phases}")
    return "\n".join(lines)
