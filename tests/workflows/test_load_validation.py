"""Validation under load in the episode: the tiers each validation asks for, and suspect nodes
load-tested before any rung (time-skipping server, stand-in activities)."""

from __future__ import annotations

import api as c
from policies.findings import Finding
from policies.loader import default_policy
from tests.workflows.fake_node import FakeNode
from tests.workflows.fakes import FakeFleet, xid
from workflows.node_remediation import NodeRemediation


def make_fleet(ts_env, uniq) -> FakeFleet:
    return FakeFleet(client=ts_env.client, task_queue=f"tq-{uniq}", policy=default_policy(), cluster=f"c-{uniq}")


def suspect() -> Finding:
    return Finding(kind="suspect", message="suspect: NCCL timeouts on rank 3")


def tiers(n: FakeNode) -> list[str | None]:
    return [r.tier for r in n.requests.get(c.NODE_VALIDATE, [])]


async def test_a_drained_node_is_load_tested_quick_then_repair(ts_env, uniq):
    fleet = make_fleet(ts_env, uniq)
    n = fleet.add(FakeNode(f"reset-{uniq}", [xid(48)], cured_by="reset"))
    async with fleet.workers():
        result = await (await fleet.report(n.name)).result()
    assert (result.outcome, result.rungs, result.validations) == ("returned", ["reset"], 2)
    assert tiers(n) == ["quick", "repair"]
    req = n.requests[c.NODE_VALIDATE][0]
    assert req.load == default_policy().validation.load


async def test_a_node_still_in_service_gets_no_load_test(ts_env, uniq):
    fleet = make_fleet(ts_env, uniq)
    n = fleet.add(FakeNode(f"app-{uniq}", [xid(13)], cured_by="kill"))
    async with fleet.workers():
        result = await (await fleet.report(n.name)).result()
    assert result.rungs == ["kill"] and tiers(n) == [None]  # tenants still run on its other GPUs


async def test_suspect_node_that_passes_returns_without_a_rung(ts_env, uniq):
    fleet = make_fleet(ts_env, uniq)
    # Nothing is wrong with it: the fake's validation passes.
    n = fleet.add(FakeNode(f"sus-ok-{uniq}", [suspect()], cured_by="kill", faulty=False))
    async with fleet.workers():
        handle = await fleet.report(n.name, healthy=False)
        result = await handle.result()
        status = await handle.query(NodeRemediation.status)
    assert (result.outcome, result.fault_class, result.rungs, result.validations) == ("healthy", "suspect", [], 1)
    assert n.calls.index("kube.drain") < n.calls.index(c.NODE_VALIDATE) < n.calls.index("kube.return_to_service")
    assert tiers(n) == ["repair"] and not n.cordoned
    assert "uncordon" in status.actions[-1].summary or any("passed the load test" in a.summary for a in status.actions)


async def test_suspect_node_that_fails_climbs_the_ladder(ts_env, uniq):
    fleet = make_fleet(ts_env, uniq)
    n = fleet.add(FakeNode(f"sus-bad-{uniq}", [suspect()], cured_by="reset"))
    async with fleet.workers():
        handle = await fleet.report(n.name)
        result = await handle.result()
        status = await handle.query(NodeRemediation.status)
    assert (result.outcome, result.rungs) == ("returned", ["reset"])
    assert tiers(n) == ["repair", "quick", "repair"]  # the suspect's test, then the usual two
    confirmed = next(a for a in status.actions if a.step == "suspect")
    assert not confirmed.ok and "climbing the ladder from reset" in confirmed.detail
