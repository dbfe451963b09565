"""Fleet safety: the storm breaker, budgets under a storm, vanished holders, repeat offenders, admission."""

import asyncio
from datetime import timedelta

import pytest

from api.admission import AdmissionInput
from api.names import admission_workflow_id, guard_workflow_id
from policies.loader import default_policy
from tests.workflows.fake_node import FakeNode
from tests.workflows.fakes import FakeFleet, xid
from workflows.fleet_guard import FleetGuard
from workflows.node_admission import NodeAdmission


def fleet_for(ts_env, uniq, policy) -> FakeFleet:
    return FakeFleet(client=ts_env.client, task_queue=f"tq-{uniq}", policy=policy, cluster=f"c-{uniq}")


@pytest.mark.timeout(400)
async def test_storm_of_half_the_fleet_held_to_budget_breaker_closes_itself(dev_env, uniq):
    # Real time, scaled, on the dev server: twenty concurrent episodes outrun the time-skipping
    # server's global clock, and its history builder fails under this many signals and timers.
    ts_env = dev_env
    policy = default_policy().scaled(0.001)
    policy.guard.max_disruptive = 3
    policy.guard.storm_faults = 10
    policy.guard.storm_window = timedelta(seconds=3)
    policy.guard.storm_cooldown = timedelta(seconds=2)
    fleet = fleet_for(ts_env, uniq, policy)
    fleet.fleet_size = 40
    fleet.act_delay = 0.1
    nodes = [fleet.add(FakeNode(f"s{i}-{uniq}", [xid(48)], cured_by="reset")) for i in range(20)]
    guard = ts_env.client.get_workflow_handle(guard_workflow_id(fleet.cluster))
    with ts_env.auto_time_skipping_disabled():
        async with fleet.workers():
            handles = await asyncio.gather(*(fleet.report(n.name) for n in nodes))
            for _ in range(100):  # quarantine needs no budget: all twenty are cordoned at once
                if all(n.cordoned for n in nodes):
                    break
                await asyncio.sleep(0.05)
            assert all(n.cordoned for n in nodes)
            for _ in range(100):
                status = await guard.query(FleetGuard.status)
                if status.breaker_open:
                    break
                await asyncio.sleep(0.05)
            assert status.breaker_open and "storm" in status.breaker_reason
            held_while_open = fleet.max_disruptive
            # About 20 s alone on 2 cores; generous for a loaded CI machine.
            results = await asyncio.wait_for(asyncio.gather(*(h.result() for h in handles)), 300)
            final = await guard.query(FleetGuard.status)
    assert all(r.outcome == "returned" for r in results)
    assert held_while_open <= 3, "leases granted before the breaker opened still kept to the budget"
    assert 1 <= fleet.max_disruptive <= 3 and final.max_seen_holders <= 3
    assert not final.breaker_open and final.trips == 1, "the breaker closed by itself after the cooldown"
    assert [e.reason for e in fleet.events] == ["GpuRemediationStorm"]


async def test_vanished_holder_frees_its_slot(dev_env, uniq):
    ts_env = dev_env  # real time on the dev server, as the storm test above
    policy = default_policy().scaled(0.001)
    policy.guard.max_disruptive = 1
    policy.guard.holder_check_interval = timedelta(seconds=1)
    fleet = fleet_for(ts_env, uniq, policy)
    fleet.fleet_size = 40
    stuck = fleet.add(FakeNode(f"stuck-{uniq}", [xid(48)], cured_by="reset", hold=asyncio.Event()))
    other = fleet.add(FakeNode(f"other-{uniq}", [xid(48)], cured_by="reset"))
    guard = ts_env.client.get_workflow_handle(guard_workflow_id(fleet.cluster))
    with ts_env.auto_time_skipping_disabled():
        async with fleet.workers():
            h1 = await fleet.report(stuck.name)
            for _ in range(100):
                if "kube.drain" in stuck.calls:
                    break
                await asyncio.sleep(0.05)
            h2 = await fleet.report(other.name)
            await asyncio.sleep(0.5)
            assert "kube.drain" not in other.calls, "budget of one: the second waits"
            await h1.terminate("operator killed the episode")
            stuck.hold.set()
            result = await asyncio.wait_for(h2.result(), 30)
            status = await guard.query(FleetGuard.status)
    assert result.outcome == "returned"
    assert all(h.holder != h1.id or False for h in status.holders)


async def test_third_episode_on_one_serial_goes_straight_to_replace(ts_env, uniq):
    fleet = fleet_for(ts_env, uniq, default_policy())
    n = fleet.add(FakeNode(f"rep-{uniq}", [xid(48)], cured_by="reset"))
    async with fleet.workers():
        rungs = []
        for _ in range(3):
            n.faulty = True
            rungs.append((await (await fleet.report(n.name)).result()).rungs)
    assert rungs == [["reset"], ["reset"], ["replace"]]
    assert f"SN-{n.name}-1" in fleet.denylist


async def admit(fleet, node: FakeNode, policy):
    return await fleet.client.execute_workflow(
        NodeAdmission.run, AdmissionInput(node=node.name, hardware_ids=[g.uuid for g in node.ids()] +
                                          sorted({g.serial for g in node.ids()})),
        id=admission_workflow_id(node.name, fleet.cluster), task_queue=fleet.task_queue)


async def test_admission_refuses_denylisted_serial(ts_env, uniq):
    policy = default_policy()
    fleet = fleet_for(ts_env, uniq, policy)
    n = fleet.add(FakeNode(f"new-{uniq}", [], faulty=False))
    fleet.denylist[f"SN-{n.name}-2"] = "replaced: Xid 79 on node old-7"
    async with fleet.workers():
        result = await admit(fleet, n, policy)
    assert result.outcome == "denied_admission" and f"SN-{n.name}-2" in result.reason
    assert "cloud.replace" in n.calls and "node.validate" not in n.calls
    assert fleet.events[0].reason == "GpuHardwareDenied" and f"SN-{n.name}-2" in fleet.events[0].message


async def test_admission_validates_twice_before_untainting(ts_env, uniq):
    policy = default_policy()
    fleet = fleet_for(ts_env, uniq, policy)
    good = fleet.add(FakeNode(f"good-{uniq}", [], faulty=False))
    bad = fleet.add(FakeNode(f"bad-{uniq}", [xid(48)], faulty=True))
    async with fleet.workers():
        ok = await admit(fleet, good, policy)
        refused = await admit(fleet, bad, policy)
    assert (ok.outcome, ok.validations) == ("healthy", 2)
    assert good.calls.count("node.validate") == 2 and not good.cordoned
    assert refused.outcome == "quarantined" and bad.cordoned and "kube.return_to_service" not in bad.calls
