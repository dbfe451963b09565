"""gpuheal's own metrics, emitted from workflow code through the Temporal runtime's meter.

`workflow.metric_meter()` is replay-safe (nothing is emitted while a history replays) and goes out
through the same Prometheus endpoint or OTLP exporter as the SDK's own metrics.
"""

from __future__ import annotations

from temporalio import workflow


def remediation_finished(cluster: str, outcome: str, rung: str, fault_class: str) -> None:
    workflow.metric_meter().create_counter(
        "gpuheal_remediations", "remediation episodes finished, by outcome and the rung that ended them",
    ).add(1, {"cluster": cluster, "outcome": outcome, "rung": rung, "fault_class": fault_class})


def node_cordoned(cluster: str, fault_class: str, detect_to_cordon_ms: int) -> None:
    workflow.metric_meter().create_histogram(
        "gpuheal_detect_to_cordon", "from the detector's report to a verified cordon", "ms",
    ).record(detect_to_cordon_ms, {"cluster": cluster, "fault_class": fault_class})


def guard_state(cluster: str, leases: int, budget: int, waiting: int, breaker_open: bool,
                fleet_nodes: int | None = None, unhealthy: int | None = None, deferred: int | None = None,
                oldest_deferred_s: int | None = None) -> None:
    meter = workflow.metric_meter().with_additional_attributes({"cluster": cluster})
    for name, help_, value in (
            ("gpuheal_fleet_nodes", "GPU nodes the guard counts in the fleet", fleet_nodes),
            ("gpuheal_nodes_unhealthy", "nodes quarantined for a fault now (the guard's count)", unhealthy),
            ("gpuheal_guard_deferred", "faults waiting uncordoned for room under max_unhealthy", deferred),
            ("gpuheal_guard_oldest_deferred_seconds", "how long the oldest fault deferred under max_unhealthy has "
             "waited for its quarantine", oldest_deferred_s)):
        if value is not None:
            meter.create_gauge(name, help_).set(value)
    meter.create_gauge("gpuheal_guard_leases", "disruptive leases held now").set(leases)
    meter.create_gauge("gpuheal_guard_budget", "disruptive leases allowed now").set(budget)
    meter.create_gauge("gpuheal_guard_waiting", "nodes waiting for a lease").set(waiting)
    meter.create_gauge("gpuheal_storm_breaker_open", "1 while the storm breaker is open").set(int(breaker_open))


def fleet_figures(s, now) -> dict:
    """The guard state's fleet gauges (GuardState: fleet size, unhealthy, deferred faults). Lease
    waiters carry no time: `gpuheal_guard_waiting` held above 0 says they wait."""
    return {"fleet_nodes": s.fleet_size, "unhealthy": len(s.unhealthy), "deferred": len(s.deferred),
            "oldest_deferred_s": int(max(((now - w.since).total_seconds() for w in s.deferred), default=0))}
