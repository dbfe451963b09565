"""The fleet guard's books stay true and it never wedges (issue: never wedged): reconciliation with
the nodes' real state, a guard started afresh, its policy from the controller, failed canaries, and
an operator lifting a gate. On the dev server in real time, with a scaled policy."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from temporalio.worker import Worker

from api.guard import GuardInput, GuardState
from api.names import guard_workflow_id
from policies.loader import default_policy
from tests.workflows.fake_node import FakeNode
from tests.workflows.fakes import FakeFleet, xid
from tests.workflows.test_node_remediation import wait_for
from workers.controller import tell_guard_the_policy
from workers.operator import lift_gates
from workflows.fleet_guard import FleetGuard
from workflows.node_remediation import NodeRemediation


def quick_policy():
    policy = default_policy().scaled(0.001)
    policy.guard.holder_check_interval = timedelta(milliseconds=500)
    return policy


def fleet_of(env, uniq, policy, size: int = 10) -> FakeFleet:
    fleet = FakeFleet(client=env.client, task_queue=f"g-{uniq}", policy=policy, cluster=f"g-{uniq}")
    fleet.fleet_size = size
    return fleet


async def guard_status(fleet: FakeFleet):
    return await fleet.client.get_workflow_handle(guard_workflow_id(fleet.cluster)).query(FleetGuard.status)


async def test_quarantined_node_fixed_by_hand_leaves_the_unhealthy_count(dev_env, uniq):
    fleet = fleet_of(dev_env, uniq, quick_policy())
    n = fleet.add(FakeNode(f"stuck-{uniq}", [xid(48)], cured_by="reset", fail={"kube.return_to_service"}))
    async with fleet.workers():
        result = await (await fleet.report(n.name)).result()
        assert result.outcome == "quarantined"
        st = await guard_status(fleet)
        assert n.name in st.unhealthy, "a node left quarantined still counts"
        n.cordoned = False  # a person uncordons it and removes the taint

        async def dropped() -> bool:
            return n.name not in (await guard_status(fleet)).unhealthy

        await wait_for(dropped, timeout=15)


def one_lease_two_nodes(env, uniq):
    """A budget of one lease; `a` holds it as long as its `hold` is not set, `b` would need it."""
    policy = quick_policy()
    policy.guard.max_disruptive = 1
    fleet = fleet_of(env, uniq, policy)
    a = fleet.add(FakeNode(f"a-{uniq}", [xid(48)], cured_by="reset", hold=asyncio.Event()))
    b = fleet.add(FakeNode(f"b-{uniq}", [xid(48)], cured_by="reset"))
    return fleet, a, b


async def test_a_guard_started_afresh_learns_holders_back_and_keeps_the_budget(dev_env, uniq):
    fleet, a, b = one_lease_two_nodes(dev_env, uniq)
    guard = dev_env.client.get_workflow_handle(guard_workflow_id(fleet.cluster))
    async with fleet.workers():
        ha = await fleet.report(a.name)
        await wait_for(lambda: _async("kube.drain" in a.calls), timeout=15)
        hb = await fleet.report(b.name)

        async def b_waits() -> bool:
            return bool((await guard.query(FleetGuard.status)).waiters)

        await wait_for(b_waits, timeout=15)
        # The new guard's first holder check (about b only) outlasts its relearning (which finds a):
        # what was not checked must not be dropped (a CI run granted b on top of a this way).
        fleet.holder_check_delay = 2.0
        await guard.terminate("an operator terminated the guard")
        # b re-sends its request: the guard starts afresh and learns a (holding) and b (waiting) back.

        async def relearnt() -> bool:
            try:
                st = await dev_env.client.get_workflow_handle(guard_workflow_id(fleet.cluster)).query(FleetGuard.status)
            except Exception:  # noqa: BLE001 - not started again yet
                return False
            return any(h.node == a.name for h in st.holders)

        await wait_for(relearnt, timeout=30)
        await asyncio.sleep(3.5)  # past the slow check
        assert "kube.drain" not in b.calls, "the new guard must not grant b on top of a's lease"
        assert any(h.node == a.name for h in (await guard_status(fleet)).holders)
        fleet.holder_check_delay = 0.0
        a.hold.set()
        ra, rb = await asyncio.wait_for(asyncio.gather(ha.result(), hb.result()), 60)
    assert (ra.outcome, rb.outcome) == ("returned", "returned")


async def test_a_guard_that_cannot_list_episodes_grants_nothing_and_says_why(dev_env, uniq):
    fleet, a, b = one_lease_two_nodes(dev_env, uniq)
    async with fleet.workers():
        ha = await fleet.report(a.name)
        await wait_for(lambda: _async("kube.drain" in a.calls), timeout=15)
        guard = dev_env.client.get_workflow_handle(guard_workflow_id(fleet.cluster))
        fleet.episodes_unlisted = True
        await guard.terminate("an operator terminated the guard")
        hb = await fleet.report(b.name)  # starts a guard afresh, which cannot learn a back

        async def says_why() -> bool:
            try:
                st = await guard_status(fleet)
            except Exception:  # noqa: BLE001 - not started again yet
                return False
            return any("learning the lease holders back" in w.reason and "visibility unavailable" in w.reason
                       for w in st.waiting)

        await wait_for(says_why, timeout=30)
        await asyncio.sleep(1.5)  # three more failed rounds at 0.5 s
        assert "kube.drain" not in b.calls, "holders unknown: no lease, not even one"
        fleet.episodes_unlisted = False

        async def a_known() -> bool:
            return any(h.node == a.name for h in (await guard_status(fleet)).holders)

        await wait_for(a_known, timeout=15)
        assert "kube.drain" not in b.calls
        a.hold.set()
        ra, rb = await asyncio.wait_for(asyncio.gather(ha.result(), hb.result()), 60)
    assert (ra.outcome, rb.outcome) == ("returned", "returned")


async def test_the_controllers_policy_reaches_a_running_guard(dev_env, uniq):
    policy = quick_policy()
    fleet = fleet_of(dev_env, uniq, policy)
    n = fleet.add(FakeNode(f"p-{uniq}", [xid(48)], cured_by="reset"))
    async with fleet.workers():
        await (await fleet.report(n.name)).result()
        new = policy.guard.model_copy(update={"max_disruptive": 7})
        assert await tell_guard_the_policy(dev_env.client, fleet.cluster, new)
        assert await tell_guard_the_policy(dev_env.client, fleet.cluster, new)  # the same again: no change
        st = await guard_status(fleet)
    assert st.policy.max_disruptive == 7 and st.limit == 7
    assert len(st.policy_changes) == 1 and "max_disruptive" in st.policy_changes[0]
    assert not await tell_guard_the_policy(dev_env.client, f"nowhere-{uniq}", new), "no guard: nothing to update"


async def test_a_failed_canary_keeps_the_trickle_at_one_and_raises_the_alarm(dev_env, uniq):
    policy = quick_policy()
    policy.guard.storm_faults = 1  # two faults at once trip the breaker
    policy.guard.storm_cooldown = timedelta(minutes=10)
    fleet = fleet_of(dev_env, uniq, policy)
    nodes = [fleet.add(FakeNode(f"c{i}-{uniq}", [xid(48)], cured_by="reset", fail={"kube.return_to_service"}))
             for i in range(2)]
    async with fleet.workers():
        handles = await asyncio.gather(*(fleet.report(n.name) for n in nodes))
        results = await asyncio.wait_for(asyncio.gather(*(h.result() for h in handles)), 60)
        st = await guard_status(fleet)
    assert all(r.outcome == "quarantined" for r in results)
    assert st.breaker_open and st.canary_budget == 1 and st.max_seen_holders == 1
    assert st.alarm.startswith("canary ") and any(h.startswith("failed") for h in st.canary_history)
    assert "GpuRemediationCanaryFailed" in [e.reason for e in fleet.events]


async def test_an_operator_lifts_a_gate_for_one_lease(dev_env, uniq):
    """With the trickle turned off, nodes past max_unhealthy wait (the old wedge): `resume --force`
    lets one lease through, recorded with who asked; the rest follow as the count falls."""
    policy = quick_policy()
    policy.guard.canary = False
    policy.guard.defer_quarantine = False
    policy.guard.max_unhealthy = 1
    fleet = fleet_of(dev_env, uniq, policy)
    nodes = [fleet.add(FakeNode(f"f{i}-{uniq}", [xid(48)], cured_by="reset")) for i in range(2)]
    async with fleet.workers():
        handles = await asyncio.gather(*(fleet.report(n.name) for n in nodes))

        async def both_wait() -> bool:
            try:
                return len((await guard_status(fleet)).waiters) == 2
            except Exception:  # noqa: BLE001 - not started yet
                return False

        await wait_for(both_wait, timeout=15)
        await asyncio.sleep(1.0)
        assert not any("kube.drain" in n.calls for n in nodes), "past max_unhealthy nothing is granted"
        st = await lift_gates(dev_env.client, fleet.cluster, leases=1, span=None)
        assert st.forced is not None and "@" in st.forced.by
        results = await asyncio.wait_for(asyncio.gather(*(h.result() for h in handles)), 60)
    assert all(r.outcome == "returned" for r in results)


async def _async(value):
    return value


async def test_messages_wake_the_guard_without_cancelling_its_recheck_timer(dev_env, uniq):
    """A message is a wake, not a new deadline: the re-check timer is left to fire. A CancelTimer
    for a timer that fired during the task wedges the time-skipping server (sdk-java#3088), and each
    message used to cost two timer events."""
    from api.guard import LeaseRelease
    from api.names import GUARD_SIGNAL_RELEASE

    policy = quick_policy()
    policy.guard.max_disruptive = 1
    fleet = fleet_of(dev_env, uniq, policy)
    nodes = [fleet.add(FakeNode(f"t{i}-{uniq}", [xid(48)], cured_by="reset")) for i in range(3)]
    guard = dev_env.client.get_workflow_handle(guard_workflow_id(fleet.cluster))
    async with fleet.workers():
        handles = await asyncio.gather(*(fleet.report(n.name) for n in nodes))
        await wait_for(lambda: _async(any("kube.drain" in n.calls for n in nodes)), timeout=15)  # a lease: a guard
        for i in range(20):  # releases from holders it never had: handled, nothing changes
            await guard.signal(GUARD_SIGNAL_RELEASE, LeaseRelease(holder=f"remediate/{fleet.cluster}/ghost-{i}"))
            await asyncio.sleep(0.05)
        results = await asyncio.wait_for(asyncio.gather(*(h.result() for h in handles)), 60)
        await asyncio.sleep(1.5)  # past holder_check_interval: the timer fires on its own
        history = await guard.fetch_history()
    assert all(r.outcome == "returned" for r in results), [r.outcome for r in results]
    kinds = [e.WhichOneof("attributes") for e in history.events]
    signals = kinds.count("workflow_execution_signaled_event_attributes")
    assert signals >= 26, f"only {signals} messages reached the guard"
    assert "timer_canceled_event_attributes" not in kinds, "a message cancelled the re-check timer"
    assert kinds.count("timer_fired_event_attributes") >= 1, "the re-check timer never fired"
    started = kinds.count("timer_started_event_attributes")
    assert started < signals / 2, f"{started} timers for {signals} messages: one per message again"


async def test_a_cordon_the_guard_did_not_answer_in_time_is_counted_before_others_are_admitted(dev_env, uniq):
    """Two faults with room for one, and a stuck guard (no worker polls its queue) that answers
    neither within admission_timeout: both cordon anyway, and each tells the guard first, so its
    books count both. Uncounted, the
    second (deferred once the guard got to it) left room the guard gave to the next fault."""
    policy = quick_policy()
    policy.guard.max_unhealthy, policy.guard.admission_timeout = 1, timedelta(seconds=1)
    policy.guard.holder_check_interval = timedelta(hours=1)  # no reconcile with the taints meanwhile
    fleet = fleet_of(dev_env, uniq, policy)
    first = fleet.add(FakeNode(f"first-{uniq}", [xid(48)], cured_by="reset"))
    second = fleet.add(FakeNode(f"second-{uniq}", [xid(48)], cured_by="reset"))
    slow = f"slow-guard-{uniq}"  # no worker yet: the guard takes messages and answers none
    await dev_env.client.start_workflow(FleetGuard.run, GuardInput(cluster=fleet.cluster, policy=policy.guard,
                                        state=GuardState(fleet_size=10)),
                                        id=guard_workflow_id(fleet.cluster), task_queue=slow)
    async with fleet.workers():
        handles = [await fleet.report(first.name), await fleet.report(second.name)]

        async def both_cordoned() -> bool:
            return first.cordoned and second.cordoned

        await wait_for(both_cordoned, timeout=20)
        async with Worker(dev_env.client, task_queue=slow, workflows=[FleetGuard], activities=fleet.activities()):

            async def answered() -> bool:
                st = await guard_status(fleet)
                return not st.deferred and first.name in st.unhealthy

            await wait_for(answered, timeout=20)
            st = await guard_status(fleet)
            assert {first.name, second.name} <= set(st.unhealthy), "every cordoned node is counted"
        for h in handles:
            actions = (await h.query(NodeRemediation.status)).actions
            assert any("the guard counts it quarantined" in (a.detail or "") for a in actions), actions
            assert any("no worker polls the fleet guard's task queue" in (a.detail or "") for a in actions), actions
