"""What the ledger's records say the fleet's failures cost (`gpuheal outcomes`, the what-if), and
the same figures as metrics, counted when the ledger takes each record (activities/ledger.py).

A record's `out_of_service_s` is the node's time out of service (0 for an episode that never
cordoned it, an application fault's kill); its `phases` split the episode's time by phase
(workflows/outcome.py); its `pods` are the pods it interrupted, each with its attribution.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from datetime import datetime, timedelta

import api as c

REPEAT_WINDOWS_D = (7, 30)
GROUPS = {"fault": lambda r: r.fault_class or "none", "profile": lambda r: r.profile or "none",
          "sku": lambda r: r.sku or "unknown"}


def _lost_by_phase(r: c.RemediationRecord) -> dict[str, float]:
    """The node's out-of-service seconds by phase: the phases scaled to the time it was out."""
    out = r.out_of_service_s or 0.0
    phases = {p: s for p, s in r.phases.items() if p != c.IN_SERVICE}
    total = sum(phases.values())
    if out <= 0:
        return {}
    if total <= 0:
        return {"unrecorded": out}
    return {p: s * out / total for p, s in phases.items()}


def _shares(a: c.RemediationRecord, b: c.RemediationRecord) -> bool:
    return bool(set(a.hardware_ids) & set(b.hardware_ids)) if a.hardware_ids and b.hardware_ids else a.node == b.node


def failed_again(records: list[c.RemediationRecord], days: int) -> int:
    """Repaired nodes (a platform episode that returned the node to service) whose hardware had
    another platform episode start within `days` of the return."""
    platform = [r for r in records if r.attribution == "platform"]
    n = 0
    for r in platform:
        if r.outcome != "returned":
            continue
        back = r.returned_at or r.ended_at
        if any(o.episode != r.episode and back < o.started_at <= back + timedelta(days=days) and _shares(r, o)
               for o in platform):
            n += 1
    return n


def figures(records: list[c.RemediationRecord]) -> dict:
    """Episodes, node-hours lost by cause and phase, MTTR, repeats, interruptions by attribution."""
    by_cause: Counter = Counter()
    by_phase: Counter = Counter()
    repairs = [r.out_of_service_s for r in records if (r.out_of_service_s or 0) > 0]
    pods: Counter = Counter()
    for r in records:
        for phase, s in _lost_by_phase(r).items():
            by_phase[phase] += s / 3600.0
            by_cause[r.fault_class or "none"] += s / 3600.0
        pods.update(p.attribution for p in r.pods)
    return {
        "episodes": len(records),
        "by_outcome": dict(sorted(Counter(r.outcome for r in records).items())),
        "node_hours_lost": round(sum(by_cause.values()), 2),
        "node_hours_lost_by_cause": {k: round(v, 2) for k, v in sorted(by_cause.items()) if v >= 0.005},
        "node_hours_lost_by_phase": {k: round(v, 2) for k, v in sorted(by_phase.items()) if v >= 0.005},
        "mttr_h": round(sum(repairs) / len(repairs) / 3600.0, 3) if repairs else None,
        "repaired": sum(1 for r in records if r.attribution == "platform" and r.outcome == "returned"),
        **{f"failed_again_{d}d": failed_again(records, d) for d in REPEAT_WINDOWS_D},
        "pod_interruptions": {a: pods.get(a, 0) for a in ("platform", "application")},
    }


def outcome_report(records: list[c.RemediationRecord], since: datetime | None, by: str | None = None) -> dict:
    """`gpuheal outcomes --json`: the figures, per group with --by, and each episode."""
    doc = {"since": since.isoformat() if since else None, **figures(records)}
    if by:
        groups = defaultdict(list)
        for r in records:
            groups[GROUPS[by](r)].append(r)
        doc["by"] = by
        doc["groups"] = {k: figures(v) for k, v in sorted(groups.items())}
    doc["episodes_list"] = [{
        "node": r.node, "episode": r.episode, "fault_class": r.fault_class, "attribution": r.attribution,
        "outcome": r.outcome, "rungs": r.rungs, "started_at": r.started_at.isoformat(),
        "out_of_service_h": None if r.out_of_service_s is None else round(r.out_of_service_s / 3600.0, 4),
        "phases_s": r.phases, "pods": [p.model_dump() for p in r.pods], "sku": r.sku, "profile": r.profile,
        "hardware_ids": r.hardware_ids,
        "finding": r.finding.model_dump(mode="json", exclude_none=True) if r.finding else None,
    } for r in records]
    return doc


def count_outcome(meter, r: c.RemediationRecord, repeats: dict[int, int]) -> None:
    """The record as metrics (one write, counted once: the caller checks it was the first)."""
    fault = r.fault_class or "none"
    meter.create_counter("gpuheal_episodes_recorded", "episodes the ledger recorded, by outcome").add(1, {
        "outcome": r.outcome, "fault_class": fault, "attribution": r.attribution or "none",
        "profile": r.profile or "none", "sku": r.sku or "unknown"})
    lost = meter.create_counter("gpuheal_node_seconds_lost", "node-seconds out of service, by cause and phase", "s")
    for phase, s in _lost_by_phase(r).items():
        if int(s) > 0:
            lost.add(int(s), {"fault_class": fault, "phase": phase})
    if (r.out_of_service_s or 0) > 0:
        meter.create_histogram("gpuheal_time_to_repair", "detection to back in service (or the episode's end)",
                               "s").record(int(r.out_of_service_s), {"fault_class": fault, "outcome": r.outcome})
    pods = meter.create_counter("gpuheal_pod_interruptions", "pods an episode interrupted, by attribution")
    for attribution, n in Counter(p.attribution for p in r.pods).items():
        pods.add(n, {"attribution": attribution})
    checks = meter.create_counter("gpuheal_validations", "validation runs of ended episodes, by SKU and result")
    for result, n in r.validations.items():
        if n:
            checks.add(n, {"sku": r.sku or "unknown", "result": result})
    if r.agent_missing:
        meter.create_counter("gpuheal_agent_missing_episodes", "episodes that found no agent on their node").add(
            1, {"fault_class": fault, "sku": r.sku or "unknown"})
    again = meter.create_counter("gpuheal_repeat_failures",
                                 "platform episodes on hardware remediated within the window before")
    for days, n in repeats.items():
        if n > 0:
            again.add(1, {"window": f"{days}d"})
