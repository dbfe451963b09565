"""The guard's holder check at scale (issue 22: 10): with two thousand ids to check and every call to
the server taking 20 ms (a loaded frontend), the check completes and leases and admissions are
granted while it runs. On the dev server (it has visibility), in real time."""

from __future__ import annotations

import functools

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from api.guard import GuardInput, GuardState
from api.names import guard_workflow_id, remediation_workflow_id
from tests.workflows.fake_node import FakeNode
from tests.workflows.fakes import xid
from tests.workflows.test_guard_never_wedged import fleet_of, guard_status, quick_policy
from tests.workflows.test_node_remediation import wait_for
from workflows.fleet_guard import FleetGuard

GHOSTS = 2000
RPC_S = 0.02


async def slow_client(env) -> Client:
    """A client of its own whose describe and list calls each take RPC_S longer (a loaded server)."""
    import asyncio

    client = await Client.connect(env.client.service_client.config.target_host, namespace=env.client.namespace,
                                  data_converter=pydantic_data_converter)
    svc = client.workflow_service
    for name in ("describe_workflow_execution", "list_workflow_executions"):
        real = getattr(svc, name)

        @functools.wraps(real)
        async def slowed(*args, _real=real, **kw):
            await asyncio.sleep(RPC_S)
            return await _real(*args, **kw)

        setattr(svc, name, slowed)
    return client


async def test_the_holder_check_of_thousands_of_ids_completes_and_grants_meanwhile(dev_env, uniq):
    policy = quick_policy()
    policy.guard.defer_quarantine = False
    fleet = fleet_of(dev_env, uniq, policy)
    fleet.guard_client = await slow_client(dev_env)
    n = fleet.add(FakeNode(f"real-{uniq}", [xid(48)], cured_by="reset"))
    # Episodes long gone, still in the books (a guard carried them through continue-as-new).
    ghosts = {f"ghost{i}-{uniq}": remediation_workflow_id(f"ghost{i}-{uniq}", fleet.cluster) for i in range(GHOSTS)}
    async with fleet.workers():
        await dev_env.client.start_workflow(
            FleetGuard.run, GuardInput(cluster=fleet.cluster, policy=policy.guard, fleet_size=10,
                                       state=GuardState(unhealthy=ghosts, fleet_size=10)),
            id=guard_workflow_id(fleet.cluster), task_queue=fleet.task_queue)
        handle = await fleet.report(n.name)
        await wait_for(lambda: _async("kube.drain" in n.calls), timeout=25)

        async def ghosts_dropped() -> bool:
            return not any(u.startswith("ghost") for u in (await guard_status(fleet)).unhealthy)

        await wait_for(ghosts_dropped, timeout=25)
        result = await handle.result()
    assert result.outcome == "returned"
    # The guard's history, its holder check beside the loop included, replays on this code.
    history = await dev_env.client.get_workflow_handle(guard_workflow_id(fleet.cluster)).fetch_history()
    await Replayer(workflows=[FleetGuard], data_converter=pydantic_data_converter).replay_workflow(history)


async def _async(value: bool) -> bool:
    return value
