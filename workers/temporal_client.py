"""Connecting to Temporal with gpuheal's data converter (pydantic models on the wire)."""

from __future__ import annotations

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

DEFAULT_ADDRESS = "127.0.0.1:7233"
DEFAULT_NAMESPACE = "default"
DEFAULT_TASK_QUEUE = "gpuheal"


async def connect(address: str = DEFAULT_ADDRESS, namespace: str = DEFAULT_NAMESPACE, **kwargs) -> Client:
    return await Client.connect(address, namespace=namespace, data_converter=pydantic_data_converter, **kwargs)
