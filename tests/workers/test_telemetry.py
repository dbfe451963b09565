"""Observability: SDK and gpuheal metrics through the runtime's Prometheus endpoint, OpenTelemetry
spans through the tracing interceptor, JSON logs with node and workflow id, Temporal env config."""

import json
import logging
import subprocess
import sys
import urllib.request

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from temporalio.service import TLSConfig

from api.episode import RemediationResult
from policies.findings import Finding
from policies.loader import default_policy
from tests.net import free_port
from tests.workflows.fake_node import FakeNode
from tests.workflows.fakes import FakeFleet, xid
from workers import telemetry
from workers.temporal_client import TemporalOptions, connect, connect_config


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return r.read().decode()


def samples(text: str, name: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(name)]


async def test_metrics_and_spans_of_a_reset_episode(dev_env, uniq):
    port, spans = free_port(), InMemorySpanExporter()
    address = dev_env.client.service_client.config.target_host
    client = await connect(opts=TemporalOptions(address=address, metrics=f"prometheus://127.0.0.1:{port}"),
                           interceptors=telemetry.tracing_interceptors(None, "gpuheal-test", exporter=spans))
    cluster = f"tel-{uniq}"
    fleet = FakeFleet(client=client, task_queue=f"tel-{uniq}", policy=default_policy().scaled(0.001), cluster=cluster)
    node = fleet.add(FakeNode(f"tel-{uniq}", [xid(48)], cured_by="reset"))
    async with fleet.workers():
        handle = await fleet.report(node.name)
        result = await client.get_workflow_handle(handle.id, result_type=RemediationResult).result()
        assert result.outcome == "returned"
        text = scrape(port)
    mine = [s for s in samples(text, "gpuheal_remediations") if f'cluster="{cluster}"' in s]
    assert any('outcome="returned"' in s and 'rung="reset"' in s and s.endswith(" 1") for s in mine), mine
    cordon = [s for s in samples(text, "gpuheal_detect_to_cordon") if f'cluster="{cluster}"' in s]
    assert any("_count" in s and s.endswith(" 1") for s in cordon), cordon
    budget = [s for s in samples(text, "gpuheal_guard_budget") if f'cluster="{cluster}"' in s]
    assert budget and not budget[0].endswith(" 0"), budget
    assert samples(text, "gpuheal_storm_breaker_open"), "breaker gauge missing"
    assert samples(text, "temporal_workflow_completed"), "the SDK's own metrics are missing"
    names = {s.name for s in spans.get_finished_spans()}
    assert "SignalWithStartWorkflow:NodeRemediation" in names, names
    assert "RunWorkflow:NodeRemediation" in names and "RunActivity:kube.quarantine" in names, names


def test_probe_failures_are_counted_by_probe():
    port = free_port()
    runtime = telemetry.make_runtime(f"prometheus://127.0.0.1:{port}")
    telemetry.count_probe_failures(runtime, "n1", [
        Finding(kind="probe_broken", message="NVML not loadable (NVMLError_LibraryNotFound)"),
        Finding(kind="probe_broken", message="kernel log /dev/kmsg unreadable: Permission denied"),
        Finding(kind="probe_broken", message="/sys/class/infiniband missing: cannot count network ports"),
        xid(79),
    ])
    text = scrape(port)
    got = {p for p in ("nvml", "kmsg", "nics") if any(f'probe="{p}"' in s for s in samples(text, "gpuheal_probe_failures"))}
    assert got == {"nvml", "kmsg", "nics"}, text
    assert not any('probe="other"' in s for s in samples(text, "gpuheal_probe_failures"))


def test_json_logs_carry_node_and_workflow_id():
    rec = logging.LogRecord("temporalio.workflow", logging.INFO, __file__, 1, "cordoned %s", ("n7",), None)
    rec.temporal_workflow = {"workflow_id": "remediate/n7", "run_id": "r1", "workflow_type": "NodeRemediation"}
    doc = json.loads(telemetry.JsonFormatter().format(rec))
    assert doc["msg"] == "cordoned n7" and doc["node"] == "n7" and doc["workflow_id"] == "remediate/n7"
    act = logging.LogRecord("temporalio.activity", logging.WARNING, __file__, 1, "drain slow", (), None)
    act.temporal_activity = {"workflow_id": "remediate/n8", "workflow_run_id": "r2", "activity_type": "kube.drain",
                             "attempt": 2}
    doc = json.loads(telemetry.JsonFormatter().format(act))
    assert (doc["node"], doc["activity"], doc["attempt"], doc["run_id"]) == ("n8", "kube.drain", 2, "r2")


def test_env_config_then_flags(monkeypatch, tmp_path):
    monkeypatch.setenv("TEMPORAL_ADDRESS", "temporal.example:7233")
    monkeypatch.setenv("TEMPORAL_NAMESPACE", "gpu-prod")
    conf = connect_config(TemporalOptions())
    assert (conf["target_host"], conf["namespace"]) == ("temporal.example:7233", "gpu-prod")
    ca, cert, key = (tmp_path / n for n in ("ca.pem", "cert.pem", "key.pem"))
    for f in (ca, cert, key):
        f.write_bytes(b"-----BEGIN X-----\n" + f.name.encode() + b"\n")
    conf = connect_config(TemporalOptions(address="other:7233", tls_ca=str(ca), tls_cert=str(cert), tls_key=str(key)))
    assert conf["target_host"] == "other:7233" and isinstance(conf["tls"], TLSConfig)
    assert conf["tls"].client_cert.endswith(b"cert.pem\n") and conf["tls"].server_root_ca_cert.endswith(b"ca.pem\n")
    with pytest.raises(telemetry.FlagError, match="--tls-cert and --tls-key go together"):
        connect_config(TemporalOptions(tls_cert=str(cert)))
    monkeypatch.setenv("TEMPORAL_API_KEY", "k")
    assert connect_config(TemporalOptions())["tls"] is True


def test_bad_telemetry_flag_is_one_line():
    out = subprocess.run([sys.executable, "-m", "workers.cli", "status", "--metrics", "statsd://x:1"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and out.stderr.count("\n") == 1 and "--metrics 'statsd://x:1'" in out.stderr, out.stderr
