"""gpuheal's Grafana dashboard (grafana-dashboard.json beside this file), written out by this script:
`python deploy/monitoring/dashboard.py`. Every query names metrics gpuheal exports
(workers/telemetry.EXPORTED_METRICS; tests/deploy/test_monitoring.py checks it).

The outcome ledger's panels (interruptions, node-hours lost, MTTR, repeats, validations) count each
episode when it ends and its record reaches the ledger: they trail the live gauges above them.
"""

from __future__ import annotations

import json
from pathlib import Path

OUT = Path(__file__).resolve().parent / "grafana-dashboard.json"
DS = {"type": "prometheus", "uid": "${datasource}"}
C = '{cluster=~"$cluster"}'
panels: list[dict] = []
y = 0


def row(title):
    global y
    panels.append({"type": "row", "title": title, "collapsed": False, "gridPos": {"h": 1, "w": 24, "x": 0, "y": y},
                   "id": len(panels) + 1, "panels": []})
    y += 1


def panel(title, kind, targets, x, w, h=8, unit=None, desc="", stack=False):
    p = {"id": len(panels) + 1, "type": kind, "title": title, "description": desc, "datasource": DS,
         "gridPos": {"h": h, "w": w, "x": x, "y": y},
         "targets": [{"refId": chr(65 + i), "datasource": DS, "expr": e, "legendFormat": legend}
                     for i, (e, legend) in enumerate(targets)],
         "fieldConfig": {"defaults": {"unit": unit or "short"}, "overrides": []}, "options": {}}
    if kind == "timeseries" and stack:
        p["fieldConfig"]["defaults"]["custom"] = {"stacking": {"mode": "normal"}, "fillOpacity": 40}
    panels.append(p)


def nextrow(h=8):
    global y
    y += h


row("Fleet")
panel("Availability (nodes in service now)", "stat", [(f"1 - sum(gpuheal_nodes_unhealthy{C}) / sum(gpuheal_fleet_nodes{C})", "availability")], 0, 6, unit="percentunit",
      desc="Share of the guard's GPU nodes not quarantined for a fault.")
panel("Availability over time", "timeseries", [(f"1 - sum by (cluster) (gpuheal_nodes_unhealthy{C}) / sum by (cluster) (gpuheal_fleet_nodes{C})", "{{cluster}}")], 6, 10, unit="percentunit")
panel("Open episodes by stage (the guard's view)", "timeseries", [
    (f"sum(gpuheal_nodes_unhealthy{C})", "quarantined"), (f"sum(gpuheal_guard_leases{C})", "holding a lease (drain, rung)"),
    (f"sum(gpuheal_guard_waiting{C})", "waiting for a lease"), (f"sum(gpuheal_guard_deferred{C})", "deferred (no room to quarantine)")], 16, 8)
nextrow()
panel("Episodes ended, by outcome", "timeseries", [(f"sum by (outcome) (increase(gpuheal_remediations{C}[1h]))", "{{outcome}}")], 0, 12, stack=True)
panel("Episodes ended, by the rung that ended them", "timeseries", [(f"sum by (rung) (increase(gpuheal_remediations{C}[1h]))", "{{rung}}")], 12, 12, stack=True)
nextrow()
row("Detection and the guard")
panel("Detect to cordon (p50, p99)", "timeseries", [
    (f"histogram_quantile(0.5, sum by (le) (rate(gpuheal_detect_to_cordon_bucket{C}[$__rate_interval])))", "p50"),
    (f"histogram_quantile(0.99, sum by (le) (rate(gpuheal_detect_to_cordon_bucket{C}[$__rate_interval])))", "p99")], 0, 8, unit="ms",
      desc="Goal: p99 at or under 250 ms.")
panel("Guard budget and leases", "timeseries", [(f"sum by (cluster) (gpuheal_guard_budget{C})", "budget {{cluster}}"),
                                                 (f"sum by (cluster) (gpuheal_guard_leases{C})", "leases {{cluster}}")], 8, 8)
panel("Waiters", "timeseries", [(f"sum by (cluster) (gpuheal_guard_waiting{C})", "lease waiters {{cluster}}"),
                                (f"sum by (cluster) (gpuheal_guard_deferred{C})", "deferred faults {{cluster}}"),
                                (f"max by (cluster) (gpuheal_guard_oldest_deferred_seconds{C}) / 60", "oldest deferred, min {{cluster}}")], 16, 8)
nextrow()
panel("Storm breaker and canaries", "timeseries", [(f"max by (cluster) (gpuheal_storm_breaker_open{C})", "breaker open {{cluster}}"),
                                                   (f"sum by (cluster) (increase(gpuheal_storm_breaker_trips{C}[1h]))", "breaker trips/h {{cluster}}"),
                                                   (f"sum by (cluster) (increase(gpuheal_guard_canary_failures{C}[1h]))", "canary failures/h {{cluster}}")], 0, 12)
panel("Probe failures, by probe", "timeseries", [("sum by (probe) (increase(gpuheal_probe_failures[1h]))", "{{probe}}")], 12, 12, stack=True)
nextrow()
row("What the users feel (the outcome ledger, counted as each episode ends)")
panel("Job interruptions, by attribution", "timeseries", [("sum by (attribution) (increase(gpuheal_pod_interruptions[1h]))", "{{attribution}}")], 0, 8, stack=True,
      desc="Pods an episode interrupted: platform (the node failed them, or the drain evicted them) or application (their own fault).")
panel("Node-hours lost, by cause (24 h)", "timeseries", [("sum by (fault_class) (increase(gpuheal_node_seconds_lost[1d])) / 3600", "{{fault_class}}")], 8, 8, stack=True)
panel("Node-hours lost, by phase (24 h)", "timeseries", [("sum by (phase) (increase(gpuheal_node_seconds_lost[1d])) / 3600", "{{phase}}")], 16, 8, stack=True)
nextrow()
panel("Mean time to repair (7 d)", "stat", [("sum(increase(gpuheal_time_to_repair_sum[7d])) / sum(increase(gpuheal_time_to_repair_count[7d]))", "MTTR")], 0, 6, unit="s")
panel("Repaired hardware failing again (30 d)", "stat", [("sum by (window) (increase(gpuheal_repeat_failures[30d]))", "within {{window}}")], 6, 6)
panel("Validation failures, by SKU (6 h)", "timeseries", [
    ('sum by (sku) (increase(gpuheal_validations{result="failed"}[6h])) / sum by (sku) (increase(gpuheal_validations[6h]))', "{{sku}}")], 12, 6, unit="percentunit")
panel("Episodes without their agent", "timeseries", [("sum by (sku) (increase(gpuheal_agent_missing_episodes[1h]))", "{{sku}}")], 18, 6)
nextrow()

DASHBOARD = {
    "title": "gpuheal: GPU fleet remediation", "uid": "gpuheal-fleet", "tags": ["gpuheal"], "timezone": "utc",
    "schemaVersion": 39, "version": 1, "editable": True, "refresh": "1m", "time": {"from": "now-24h", "to": "now"},
    "description": "gpuheal's metrics (README: Observability). Regenerate with deploy/monitoring/dashboard.py.",
    "templating": {"list": [
        {"name": "datasource", "type": "datasource", "query": "prometheus", "label": "Prometheus"},
        {"name": "cluster", "type": "query", "datasource": DS, "query": "label_values(gpuheal_guard_budget, cluster)",
         "definition": "label_values(gpuheal_guard_budget, cluster)", "refresh": 2, "includeAll": True, "multi": True,
         "allValue": ".*", "current": {"text": "All", "value": "$__all"}}]},
    "annotations": {"list": []}, "panels": panels,
}


def render() -> str:
    return json.dumps(DASHBOARD, indent=2) + "\n"


if __name__ == "__main__":
    OUT.write_text(render())
