"""A what-if run's figures for one policy: node-hours out of service by cause, MTTR, episodes and
rungs, jobs interrupted, denylisted hardware, from the stand-in fleet's records."""

from __future__ import annotations

from collections import Counter

from pydantic import BaseModel, Field

import api as c
from activities.outcomes import figures
from api.guard import GuardStatus
from sim.whatif.fleet import WhatIfFleet
from sim.whatif.jobs import JobOutcome, simulate_jobs
from sim.whatif.outages import fleet_outages
from sim.whatif.workload import WorkloadModel


class PolicyOutcome(BaseModel):
    policy: str
    nodes: int
    days: float
    availability: float = Field(description="Node-hours in service / node-hours.")
    node_hours: float
    node_hours_lost: float
    lost_by_cause: dict[str, float]
    faults: int
    faults_dropped: int = Field(description="Faults that struck a slot whose node was being replaced.")
    episodes: dict[str, int] = Field(description="Episodes by outcome; `running` at the end of the run.")
    kills: int
    resets: int
    reboots: int
    replacements: int
    denylisted_nodes: int
    jobs_interrupted: int
    p95_return_h: float | None = Field(description="95th percentile, fault to back in service, hours.")
    availability_by_hour: list[float] = Field(default_factory=list)
    events_per_episode: float | None = None
    wall_s: float = 0.0
    clock_restarts: int = Field(default=0, description="Runs started again after the test server's clock stopped.")
    mttr_h: float | None = Field(default=None, description="Mean time from a fault to its slot back in service, hours.")
    failed_again_7d: int = Field(default=0, description="Repaired nodes with another platform episode within 7 days.")
    failed_again_30d: int = 0
    node_hours_lost_by_phase: dict[str, float] = Field(default_factory=dict)
    jobs: list[JobOutcome] = Field(default_factory=list, description="Each workload's jobs on this run's outages.")
    peak_quarantined: int = Field(default=0, description="The most nodes under gpuheal's quarantine at once.")
    max_unhealthy: int | None = Field(default=None, description="The guard's max_unhealthy, resolved on the fleet.")
    guard_trips: int = Field(default=0, description="How often the storm breaker opened.")
    canaries: list[str] = Field(default_factory=list, description="The guard's canary history (newest 32).")
    down_at_end: int = Field(default=0, description="Node slots out of service when the run ended.")


def _p95(values: list[float]) -> float | None:
    if not values:
        return None
    v = sorted(values)
    return v[min(len(v) - 1, int(round(0.95 * (len(v) - 1))))]


def summarize(fleet: WhatIfFleet, label: str, days: float, workloads: list[WorkloadModel] = (),
              guard: GuardStatus | None = None) -> PolicyOutcome:
    """Every figure from the slots' out-of-service intervals and the stand-ins' counts, rounded so
    that the sub-second jitter of a real-time run never shows."""
    end = days * 86400.0
    hours = int(end // 3600) or 1
    lost_h = [0.0] * hours
    by_cause: Counter = Counter()
    returns: list[float] = []
    for slot in fleet.slots:
        spans = list(slot.intervals) + ([(slot.down_since, end, slot.cause)] if slot.down_since is not None else [])
        for start, stop, cause in spans:
            stop_c = min(stop, end)
            if stop_c <= start:
                continue
            by_cause[cause] += stop_c - start
            if stop <= end:
                returns.append((stop - start) / 3600.0)
            h = int(start // 3600)
            while h < hours and h * 3600 < stop_c:
                lost_h[h] += min(stop_c, (h + 1) * 3600) - max(start, h * 3600)
                h += 1
    total_h = fleet.nodes_count * end / 3600.0
    lost = sum(by_cause.values()) / 3600.0
    episodes = Counter(r.outcome for r in fleet.records)
    if fleet.open_episodes:
        episodes["running"] = len(fleet.open_episodes)
    k = fleet.calls
    p95 = _p95(returns)
    books = figures(fleet.records)
    outages = fleet_outages(fleet, fleet.policy) if workloads else []
    jobs = [simulate_jobs(w, outages, fleet.nodes_count, days, fleet.model.durations.detect.total_seconds())
            for w in workloads]
    return PolicyOutcome(
        policy=label, nodes=fleet.nodes_count, days=days,
        availability=round(1 - lost / total_h, 6), node_hours=round(total_h, 1), node_hours_lost=round(lost, 1),
        lost_by_cause={c: round(s / 3600.0, 1) for c, s in sorted(by_cause.items())},
        faults=len(fleet.faults), faults_dropped=fleet.dropped, episodes=dict(sorted(episodes.items())),
        kills=k[c.NODE_KILL] - k[c.NODE_RESET],  # a reset stops the GPU processes first: not a kill rung
        resets=k[c.NODE_RESET], reboots=k[c.CLOUD_REBOOT], replacements=k[c.CLOUD_REPLACE],
        denylisted_nodes=len(fleet.denylisted_nodes), jobs_interrupted=fleet.jobs_interrupted,
        p95_return_h=None if p95 is None else round(p95, 2),
        availability_by_hour=[round(1 - s / (fleet.nodes_count * 3600.0), 5) for s in lost_h],
        mttr_h=round(sum(returns) / len(returns), 3) if returns else None, failed_again_7d=books["failed_again_7d"], failed_again_30d=books["failed_again_30d"],
        node_hours_lost_by_phase=books["node_hours_lost_by_phase"], jobs=jobs,
        peak_quarantined=fleet.peak_quarantined, down_at_end=sum(1 for s in fleet.slots if s.node.down()),
        # A guard that never counted the fleet reports max_unhealthy 0: unknown, not a limit of none.
        **({"max_unhealthy": guard.max_unhealthy or None, "guard_trips": guard.trips, "canaries": guard.canary_history}
           if guard else {}),
    )
