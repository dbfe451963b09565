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


def guard_state(cluster: str, leases: int, budget: int, waiting: int, breaker_open: bool) -> None:
    meter = workflow.metric_meter().with_additional_attributes({"cluster": cluster})
    meter.create_gauge("gpuheal_guard_leases", "disruptive leases held now").set(leases)
    meter.create_gauge("gpuheal_guard_budget", "disruptive leases allowed now").set(budget)
    meter.create_gauge("gpuheal_guard_waiting", "nodes waiting for a lease").set(waiting)
    meter.create_gauge("gpuheal_storm_breaker_open", "1 while the storm breaker is open").set(int(breaker_open))
