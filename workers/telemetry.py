"""Observability for gpuheal's processes: the Temporal runtime's metrics sink, OpenTelemetry tracing,
and structured logs that carry the node and workflow id.

Metrics, the SDK's and gpuheal's own (`workflows/metrics.py`, probe failures here), all go through
the Temporal runtime: one Prometheus endpoint or one OTLP exporter per process.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime

import api as c

METRICS_HELP = "prometheus://HOST:PORT (an endpoint to scrape) or otlp://HOST:PORT (push over gRPC); default none"
TRACING_HELP = "otlp://HOST:PORT (OTLP over HTTP), console (stderr), or none"  # kept in step with workers/cli.py


# The runtime's default buckets jump from 100 ms to 500 ms; the detect-to-cordon goal is p99 <= 250 ms.
HISTOGRAM_BUCKETS = {"gpuheal_detect_to_cordon": [10, 25, 50, 100, 150, 200, 250, 500, 1000, 2500, 10000, 60000]}


# Every metric gpuheal itself exports, as Prometheus shows it (a counter has no `_total`; a
# histogram adds _bucket, _sum and _count). The dashboard and alert rules under deploy/monitoring/
# may name only these (and the SDK's temporal_*); tests/deploy/test_monitoring.py checks both ways.
EXPORTED_METRICS = {
    "gpuheal_remediations": "counter", "gpuheal_detect_to_cordon": "histogram",
    "gpuheal_guard_leases": "gauge", "gpuheal_guard_budget": "gauge", "gpuheal_guard_waiting": "gauge",
    "gpuheal_storm_breaker_open": "gauge", "gpuheal_storm_breaker_trips": "counter",
    "gpuheal_guard_canary_failures": "counter", "gpuheal_fleet_nodes": "gauge", "gpuheal_nodes_unhealthy": "gauge",
    "gpuheal_guard_deferred": "gauge", "gpuheal_guard_oldest_deferred_seconds": "gauge",
    "gpuheal_probe_failures": "counter",
    # the outcome ledger (activities/outcomes.py), counted as each episode's record is written
    "gpuheal_episodes_recorded": "counter", "gpuheal_node_seconds_lost": "counter",
    "gpuheal_time_to_repair": "histogram", "gpuheal_pod_interruptions": "counter", "gpuheal_repeat_failures": "counter",
    "gpuheal_validations": "counter", "gpuheal_agent_missing_episodes": "counter",
}


class FlagError(ValueError):
    """A connection, metrics or tracing flag that cannot be used as given (one line, exit 2)."""


def make_runtime(metrics: str | None):
    """A Temporal runtime exporting metrics to `metrics`, or None for the SDK's default (no export)."""
    if not metrics or metrics == "none":
        return None
    from temporalio.runtime import OpenTelemetryConfig, PrometheusConfig, Runtime, TelemetryConfig

    scheme, _, where = metrics.partition("://")
    if scheme == "prometheus" and where:
        return Runtime(telemetry=TelemetryConfig(metrics=PrometheusConfig(
            bind_address=where, histogram_bucket_overrides=HISTOGRAM_BUCKETS)))
    if scheme in ("otlp", "http", "https") and where:
        url = metrics if scheme != "otlp" else f"http://{where}"
        return Runtime(telemetry=TelemetryConfig(metrics=OpenTelemetryConfig(
            url=url, histogram_bucket_overrides=HISTOGRAM_BUCKETS)))
    raise FlagError(f"--metrics {metrics!r}: expected {METRICS_HELP}")


def tracing_interceptors(tracing: str | None, service: str, exporter=None) -> list:
    """The client interceptors for `tracing` (workers created from the client inherit them).

    `exporter` overrides the sink (tests pass an in-memory one)."""
    if (not tracing or tracing == "none") and exporter is None:
        return []
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SimpleSpanProcessor
    from temporalio.contrib.opentelemetry import TracingInterceptor

    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    if exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    elif tracing == "console":
        provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter(out=sys.stderr)))
    elif tracing.startswith("otlp://"):
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        endpoint = f"http://{tracing.removeprefix('otlp://')}/v1/traces"
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    else:
        raise FlagError(f"--tracing {tracing!r}: expected {TRACING_HELP}")
    return [TracingInterceptor(provider.get_tracer("gpuheal"))]


def broken_probe(message: str) -> str:
    """Which probe a `probe_broken` finding is about, from the text the probes write."""
    text = message.lower()
    for probe, marks in (("kmsg", ("kernel log",)), ("nics", ("nics", "network ports", "infiniband")),
                         ("nvml", ("nvml",)), ("dependencies", ("nvidia-smi", "dependencies"))):
        if any(m in text for m in marks):
            return probe
    return "other"


def count_probe_failures(runtime, node: str, findings) -> None:
    """Count the probes that could not run this cycle (they fail closed as `probe_broken`), by probe."""
    broken = [f for f in findings if f.kind.value == "probe_broken"]
    if not broken:
        return
    from temporalio.runtime import Runtime

    counter = (runtime or Runtime.default()).metric_meter.create_counter(
        "gpuheal_probe_failures", "probe runs that failed, by probe")
    for f in broken:
        counter.add(1, {"node": node, "probe": broken_probe(f.message)})


class JsonFormatter(logging.Formatter):
    """One JSON object a line, with the node and the workflow or activity ids Temporal's loggers attach."""

    def format(self, record: logging.LogRecord) -> str:
        doc = {"ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
               "level": record.levelname.lower(), "logger": record.name, "msg": record.getMessage()}
        wf = getattr(record, "temporal_workflow", None) or {}
        act = getattr(record, "temporal_activity", None) or {}
        workflow_id = wf.get("workflow_id") or act.get("workflow_id")
        if workflow_id:
            doc["workflow_id"] = workflow_id
            doc["run_id"] = wf.get("run_id") or act.get("workflow_run_id")
        if act:
            doc["activity"] = act.get("activity_type")
            doc["attempt"] = act.get("attempt")
        node = getattr(record, "node", None) or _node_from_workflow_id(workflow_id)
        if node:
            doc["node"] = node
        if record.exc_info:
            doc["error"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str)


def _node_from_workflow_id(workflow_id: str | None) -> str | None:
    """remediate/<cluster>/<node> and admit/<cluster>/<node> (or, from before, without the cluster) name their node."""
    if not workflow_id:
        return None
    return c.node_in_workflow_id(workflow_id, "remediate") or c.node_in_workflow_id(workflow_id, "admit")


class ExpectedFailureOneLine(logging.Filter):
    """An activity that failed with one of gpuheal's typed, non-retryable errors (a reset refused
    while processes remain, a cordon that did not stick) is an answer the workflow acts on, not a
    crash: one line with its type and message, no traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        from temporalio.exceptions import ApplicationError

        from activities.errors import NON_RETRYABLE

        err = record.exc_info[1] if record.exc_info else None
        if isinstance(err, ApplicationError) and err.type in NON_RETRYABLE:
            record.msg = f"{record.getMessage()}: {err.type}: {err.message}"
            record.args, record.exc_info, record.exc_text = None, None, None
        return True


def configure_logging(level: str, fmt: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(ExpectedFailureOneLine())
    # On the handler too: libraries that set their own logger level (werkzeug, under moto) still
    # propagate to it.
    handler.setLevel(level.upper())
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
