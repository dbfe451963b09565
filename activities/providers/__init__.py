"""Cloud providers by name: the controller's `--provider` picks one. A new provider is one module
here plus its line below (and its tests)."""

from __future__ import annotations

from importlib import import_module

from kubernetes import client

from activities.providers.base import CloudProvider, ProviderSettings

# name -> module:class, imported only when chosen (boto3 is not loaded for a Cluster API fleet).
PROVIDERS = {
    "aws": "activities.providers.aws:AwsProvider",
    "clusterapi": "activities.providers.clusterapi:ClusterApiProvider",
}


def make_provider(name: str, core: client.CoreV1Api, settings: ProviderSettings | None = None) -> CloudProvider:
    if name not in PROVIDERS:
        raise ValueError(f"provider {name!r}: not one of {', '.join(PROVIDERS)}")
    module, _, cls = PROVIDERS[name].partition(":")
    return getattr(import_module(module), cls).from_settings(core, settings or ProviderSettings())
