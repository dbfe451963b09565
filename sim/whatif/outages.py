"""The outages the jobs meet (sim/whatif/jobs.py): a policy's run's (`fleet_outages`), or the fast
job-level model's (`analytic_outages`).

The fast job-level model: each drawn fault's outage from the model's durations and the ladder the
policy's triage would climb, without running the workflows. It answers in seconds where the full
what-if (sim/whatif/engine.py) takes minutes (a 2,048-node, 54-day run), at the cost of what the
workflows add (the guard's waits, admission, probation's escalations): use it for the jobs'
figures at scale (the Llama 3 calibration), and the full what-if to judge a policy.
"""

from __future__ import annotations

import api as c
from policies.classify import classify
from policies.findings import Finding
from policies.model import Policy
from policies.terms import Generation, Rung
from sim.whatif.faultmodel import NODE_WIDE, FaultDraw, FaultModel
from sim.whatif.fleet import WhatIfFleet
from sim.whatif.jobs import Outage


def attribution_of(model: FaultModel, policy: Policy) -> dict[str, tuple[str, Rung | None]]:
    """Each fault class's attribution and first rung under the policy's triage."""
    out = {}
    for name, fc in model.classes.items():
        f = Finding(kind=fc.finding.kind, xid=fc.finding.xid, gpu_index=None if fc.finding.kind in NODE_WIDE else 0)
        t = classify([f], Generation.HOPPER, policy)
        out[name] = (t.attribution or "platform", t.start_rung)
    return out


def _repair_s(model: FaultModel, start: Rung, cured_by: Rung, application: bool) -> tuple[float, dict[str, float]]:
    """Seconds from detection to back in service, climbing from `start`, and their phases."""
    d = {k: getattr(model.durations, k).total_seconds() for k in type(model.durations).model_fields}
    action = {Rung.KILL: d["kill"], Rung.RESET: d["kill"] + d["reset"], Rung.REBOOT: d["reboot"],
              Rung.REPLACE: d["replacement"]}
    phases: dict[str, float] = {}
    rung = start
    while True:
        phases[rung.value] = phases.get(rung.value, 0.0) + action[rung]
        cured = rung is Rung.REPLACE or Rung.cures(rung.value, cured_by.value)
        checks = 1 if application or not cured else 2  # a failed first validation ends the rung
        phases["validation"] = phases.get("validation", 0.0) + checks * d["validation"]
        if cured:
            return sum(phases.values()), phases
        rung = rung.above()


def analytic_outages(model: FaultModel, faults: list[FaultDraw], policy: Policy) -> list[Outage]:
    """One outage per fault (and per recurrence), merged where they overlap on a slot."""
    kinds = attribution_of(model, policy)
    detect = model.durations.detect.total_seconds()
    raw: list[Outage] = []
    for f in faults:
        attribution, start = kinds[f.fault_class]
        if start is None:
            continue  # the policy does not act on it: no outage the jobs see
        took, phases = _repair_s(model, start, f.cured_by, attribution == "application")
        end = f.at_s + detect + took
        raw.append(Outage(f.slot, f.at_s, end, f.fault_class, attribution,
                          (("detect", detect), *sorted(phases.items()))))
        fixed = max(start, f.cured_by, key=lambda r: r.rank)
        if f.recurs_after_s is not None and fixed is not Rung.REPLACE:
            again = end + f.recurs_after_s
            took2, phases2 = _repair_s(model, fixed.above(), fixed.above(), attribution == "application")
            raw.append(Outage(f.slot, again, again + detect + took2, f.fault_class, attribution,
                              (("detect", detect), *sorted(phases2.items()))))
    return merge(raw)


def merge(outages: list[Outage]) -> list[Outage]:
    """Overlapping outages of one slot as one, named by the first (the one the jobs met)."""
    out: list[Outage] = []
    last: dict[int, int] = {}
    for o in sorted(outages, key=lambda o: (o.start_s, o.slot)):
        i = last.get(o.slot)
        if i is not None and o.start_s <= out[i].end_s:
            p = out[i]
            out[i] = Outage(p.slot, p.start_s, max(p.end_s, o.end_s), p.cause, p.attribution, p.phases)
            continue
        last[o.slot] = len(out)
        out.append(o)
    return out


def fleet_outages(fleet: WhatIfFleet, policy: Policy) -> list[Outage]:
    """Each slot's times out of service, with the attribution of their cause and, where a ledger
    record of the node's episode covers one, its phases."""
    kinds = attribution_of(fleet.model, policy)
    records: dict[int, list[c.RemediationRecord]] = {}
    for r in fleet.records:
        records.setdefault(int(r.node[1:].split("-")[0]), []).append(r)
    out = []
    for slot in fleet.slots:
        spans = list(slot.intervals) + ([(slot.down_since, float("inf"), slot.cause)] if slot.down_since is not None else [])
        for start, stop, cause in spans:
            rec = next((r for r in records.get(slot.index, [])
                        if start - 120 <= (r.started_at - fleet.t0).total_seconds() <= stop), None)
            out.append(Outage(slot.index, start, stop, cause, kinds.get(cause, ("platform", None))[0],
                              tuple(sorted(rec.phases.items())) if rec else ()))
    return merge(out)
