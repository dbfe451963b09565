"""Connecting to Temporal with gpuheal's data converter (pydantic models on the wire), the standard
Temporal environment configuration (TEMPORAL_ADDRESS, TEMPORAL_NAMESPACE, TEMPORAL_API_KEY,
TEMPORAL_TLS_*, TEMPORAL_PROFILE and the config file), TLS, metrics and tracing."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.envconfig import ClientConfigProfile
from temporalio.service import TLSConfig

from workers import telemetry

DEFAULT_ADDRESS = "127.0.0.1:7233"
DEFAULT_NAMESPACE = "default"


@dataclass
class TemporalOptions:
    """Where and how to reach Temporal. Unset fields fall back to the environment configuration."""

    address: str | None = None  # HOST:PORT; env TEMPORAL_ADDRESS; else 127.0.0.1:7233
    namespace: str | None = None  # env TEMPORAL_NAMESPACE; else default
    tls_ca: str | None = None  # PEM of the server's CA; any TLS flag turns TLS on
    tls_cert: str | None = None  # client certificate (mTLS), with tls_key
    tls_key: str | None = None
    tls_server_name: str | None = None
    api_key: str | None = None  # env TEMPORAL_API_KEY; implies TLS
    metrics: str | None = None  # prometheus://HOST:PORT or otlp://HOST:PORT
    tracing: str | None = None  # otlp://HOST:PORT or console
    service: str = "gpuheal"  # the OpenTelemetry service name


def connect_config(opts: TemporalOptions) -> dict:
    """Client.connect keyword arguments: the environment's profile, then the explicit options."""
    try:
        conf = dict(ClientConfigProfile.load().to_client_connect_config())
    except OSError as err:  # e.g. TEMPORAL_TLS_CLIENT_CERT_PATH naming a Secret that is not mounted
        raise telemetry.FlagError(f"Temporal client configuration: cannot read {err.filename}: {err.strerror}") from None
    conf.setdefault("target_host", DEFAULT_ADDRESS)
    conf.setdefault("namespace", DEFAULT_NAMESPACE)
    if opts.address:
        conf["target_host"] = opts.address
    if opts.namespace:
        conf["namespace"] = opts.namespace
    if opts.api_key:
        conf["api_key"], conf["tls"] = opts.api_key, conf.get("tls") or True
    if opts.tls_ca or opts.tls_cert or opts.tls_key or opts.tls_server_name:
        if bool(opts.tls_cert) != bool(opts.tls_key):
            raise telemetry.FlagError("--tls-cert and --tls-key go together (mutual TLS)")
        def read(path: str | None) -> bytes | None:
            try:
                return Path(path).read_bytes() if path else None
            except OSError as err:
                raise telemetry.FlagError(f"TLS file {path}: {err.strerror}") from None

        conf["tls"] = TLSConfig(server_root_ca_cert=read(opts.tls_ca), client_cert=read(opts.tls_cert),
                                client_private_key=read(opts.tls_key), domain=opts.tls_server_name)
    return conf


async def connect(address: str | None = None, namespace: str | None = None,
                  opts: TemporalOptions | None = None, **kwargs) -> Client:
    """Explicit options first, then TEMPORAL_* and the config profile, then 127.0.0.1:7233."""
    opts = opts or TemporalOptions()
    opts.address, opts.namespace = opts.address or address, opts.namespace or namespace
    conf = connect_config(opts)
    runtime = telemetry.make_runtime(opts.metrics)
    if runtime is not None:
        kwargs.setdefault("runtime", runtime)
    kwargs.setdefault("interceptors", telemetry.tracing_interceptors(opts.tracing, opts.service))
    return await Client.connect(conf.pop("target_host"), data_converter=pydantic_data_converter, **conf, **kwargs)
