"""Quarantine room reserved ahead (issue 25's fast path): the guard's books for reserved slots, pure,
and on the dev server a controller's pool whose episodes cordon with no round trip to the guard while
max_unhealthy holds under a storm."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta

from temporalio.api.enums.v1 import EventType
from temporalio.service import RPCError

from activities.room_pool import RoomPool
from api.guard import FaultNotice, GuardState, RoomGrant, RoomRequest
from api.names import (
    GUARD_SIGNAL_FAULT,
    GUARD_UPDATE_RESERVE_ROOM,
    HOLDER_SIGNAL_QUARANTINE,
    guard_workflow_id,
)
from policies.guard_policy import GuardPolicy
from tests.workflows.fake_node import FakeNode
from tests.workflows.fakes import xid
from tests.workflows.test_guard_never_wedged import fleet_of, guard_status, quick_policy
from tests.workflows.test_node_remediation import wait_for
from workers.render import human
from workflows import guard_room
from workflows.node_remediation import NodeRemediation

T0 = datetime(2026, 12, 1, tzinfo=UTC)


def ids():
    n = iter(range(1000))
    return lambda: f"t{next(n)}"


def test_reserved_slots_stay_within_free_room_and_the_cap_per_controller():
    s, policy, new = GuardState(), GuardPolicy(room_ahead=4, room_ttl=timedelta(minutes=10)), ids()
    a = guard_room.reserve(s, RoomRequest(controller="a", want=10), policy, T0, 3, new)
    assert len(a.new) == 3, "no more than the free room"
    b = guard_room.reserve(s, RoomRequest(controller="b", want=10), policy, T0, None, new)
    assert len(b.new) == 4, "no more than room_ahead per controller"
    again = guard_room.reserve(s, RoomRequest(controller="a", want=10, keep=a.new), policy, T0, 5, new)
    assert len(again.new) == 1 and set(again.held) == {*a.new, *again.new}, "the cap counts what it holds"
    assert guard_room.by_controller(s) == {"a": 4, "b": 4}


def test_a_pool_holds_at_most_half_the_room_others_do_not_hold():
    """Not all the free room: another controller's cordon, or one that asks the guard, is not
    deferred while room sits unused in a pool."""
    s, policy, new = GuardState(), GuardPolicy(room_ahead=16), ids()
    a = guard_room.reserve(s, RoomRequest(controller="a", want=16), policy, T0, 10, new, half=True)
    assert len(a.new) == 5, "half of the 10 free"
    again = guard_room.reserve(s, RoomRequest(controller="a", want=16, keep=a.new), policy, T0, 5, new, half=True)
    assert not again.new and set(again.held) == set(a.new), "renewed, not grown past half"
    b = guard_room.reserve(s, RoomRequest(controller="b", want=16), policy, T0, 5, new, half=True)
    assert len(b.new) == 2, "half of what a does not hold"
    last = guard_room.reserve(s, RoomRequest(controller="c", want=16), policy, T0, 1, new, half=True)
    assert not last.new, "the last free slot is left for a cordon that asks"


def test_a_slot_handed_out_and_never_told_lapses_while_kept_ones_are_renewed():
    s, policy, new = GuardState(), GuardPolicy(room_ahead=4, room_ttl=timedelta(minutes=10)), ids()
    first = guard_room.reserve(s, RoomRequest(controller="a", want=2), policy, T0, None, new)
    lost, kept = first.new  # `lost`: handed to an episode whose notice never came
    later = T0 + timedelta(minutes=8)
    renewed = guard_room.reserve(s, RoomRequest(controller="a", keep=[kept]), policy, later, None, new)
    assert renewed.held == [kept] and s.room[kept].expires == later + policy.room_ttl
    guard_room.lapse(s, T0 + timedelta(minutes=11))
    assert set(s.room) == {kept}, "the slot not kept lapses at its last expiry; the kept one was renewed"
    gone = guard_room.reserve(s, RoomRequest(controller="b", returned=[kept]), policy, later, None, new)
    assert kept in s.room and gone.held == [], "only its own controller gives a slot back"
    guard_room.reserve(s, RoomRequest(controller="a", returned=[kept]), policy, later, None, new)
    assert not s.room


def test_room_wanted_elsewhere_is_taken_back_and_a_lowered_cap_gives_back_the_excess():
    s, policy, new = GuardState(), GuardPolicy(room_ahead=4, room_ttl=timedelta(minutes=10)), ids()
    held = guard_room.reserve(s, RoomRequest(controller="a", want=4), policy, T0, None, new).held
    back = guard_room.reserve(s, RoomRequest(controller="a", want=4, keep=held[:3]), policy, T0, 10, new, reclaim=True)
    assert back.held == [] and back.new == [] and list(s.room) == [held[3]], \
        "the unused slots it kept are taken back; the one handed out stays until told or lapsed"
    s, new = GuardState(), ids()
    held = guard_room.reserve(s, RoomRequest(controller="a", want=4), policy, T0, None, new).held
    lowered = GuardPolicy(room_ahead=1, room_ttl=timedelta(minutes=10))
    kept = guard_room.reserve(s, RoomRequest(controller="a", want=4, keep=held), lowered, T0, None, new)
    assert kept.held == held[:1] and list(s.room) == held[:1] and kept.new == []


def pooled_fleet(env, uniq, max_unhealthy: int, size: int = 10):
    """A stand-in fleet whose controller keeps room reserved ahead (room_ahead 16)."""
    policy = quick_policy()
    policy.guard.max_unhealthy, policy.guard.room_ahead = max_unhealthy, 16
    fleet = fleet_of(env, uniq, policy, size=size)
    fleet.room = RoomPool(env.client, identity=f"ctl-{uniq}", retry_s=0.1)
    return fleet


async def test_a_cordon_in_room_reserved_ahead_needs_no_answer_from_the_guard(dev_env, uniq):
    fleet = pooled_fleet(dev_env, uniq, 5)
    first = fleet.add(FakeNode(f"first-{uniq}", [xid(48)], cured_by="reset"))
    second = fleet.add(FakeNode(f"second-{uniq}", [xid(48)], cured_by="reset"))
    async with fleet.workers():
        fleet.room.start(fleet.cluster)
        h1 = await fleet.report(first.name)  # starts the guard; the pool's room comes once it runs

        async def room_kept() -> bool:
            return fleet.room.held(fleet.cluster) > 0 and first.cordoned

        await wait_for(room_kept, timeout=20)
        shown = human("guard", (await guard_status(fleet)).model_dump(mode="json"))
        assert f"for ctl-{uniq}" in shown, shown  # `gpuheal guard` says whose room is reserved
        h2 = await fleet.report(second.name)

        async def counted() -> bool:
            return second.name in (await guard_status(fleet)).unhealthy

        await wait_for(counted, timeout=20)
        st = await guard_status(fleet)
        assert second.cordoned and sum(st.room_reserved.values()) + len(st.unhealthy) <= 5, st
        r1, r2 = await h1.result(), await h2.result()
    answered = [e for e in (await h2.fetch_history()).events
                if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED
                and e.workflow_execution_signaled_event_attributes.signal_name == HOLDER_SIGNAL_QUARANTINE]
    assert answered == [], "the second cordon took a reserved slot: no round trip to the guard"
    # Its notice went with the slot, in the take: no local activity of its own before or beside the cordon.
    local = [json.loads(e.marker_recorded_event_attributes.details["data"].payloads[0].data)["activity_type"]
             for e in (await h2.fetch_history()).events if e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED
             and e.marker_recorded_event_attributes.marker_name == "core_local_activity"]
    before = local[:local.index("kube.quarantine")]
    assert "guard.take_room" in before and "guard.signal" not in before, local
    assert (r1.outcome, r2.outcome) == ("returned", "returned")
    # Its slot notice went in the pool's ask (many to one update in a storm), not as a signal.
    told, signalled = [], []
    async for e in dev_env.client.get_workflow_handle(guard_workflow_id(fleet.cluster)).fetch_history_events():
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED:
            req = e.workflow_execution_update_accepted_event_attributes.accepted_request.input
            if req.name == GUARD_UPDATE_RESERVE_ROOM:
                told += [n["node"] for p in req.args.payloads for n in json.loads(p.data).get("told", [])
                         if n.get("before_cordon")]  # told with the take, before the cordon
        elif e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED:
            a = e.workflow_execution_signaled_event_attributes
            if a.signal_name == GUARD_SIGNAL_FAULT:
                signalled += [n.get("node") for p in a.input.payloads if (n := json.loads(p.data)).get("room_token")]
    assert second.name in told and second.name not in signalled, (told, signalled)


async def test_a_notice_told_before_its_cordon_counts_only_in_a_slot_the_guard_holds(dev_env, uniq):
    """A slot's notice told with the take, before the cordon: in a slot the guard holds it is taken
    (echoed, the node counted); in one it does not hold (lapsed, or a guard started afresh), it is
    neither counted nor echoed, so the episode asks for room and the guard's limit decides."""
    fleet = pooled_fleet(dev_env, uniq, 5)
    first = fleet.add(FakeNode(f"first-{uniq}", [xid(48)], cured_by="reset"))
    async with fleet.workers():
        await fleet.report(first.name)  # starts the guard
        guard = dev_env.client.get_workflow_handle(guard_workflow_id(fleet.cluster))

        async def ask(told: list[FaultNotice], want: int = 0) -> RoomGrant:
            return await guard.execute_update(GUARD_UPDATE_RESERVE_ROOM, RoomRequest(
                controller=f"probe-{uniq}", want=want, told=told), result_type=RoomGrant)

        given: list[str] = []

        async def room_given() -> bool:
            try:
                given[:] = (await ask([], want=1)).held
            except RPCError:
                return False  # the guard starts with the first episode's notice
            return bool(given)

        await wait_for(room_given, timeout=20)
        token = given[0]
        now = datetime.now(UTC)
        unknown = FaultNotice(node=f"ghost-{uniq}", holder=f"remediate/{fleet.cluster}/ghost-{uniq}", sent_at=now,
                              room_token="no-such-slot", before_cordon=True)
        held = FaultNotice(node=f"held-{uniq}", holder=f"remediate/{fleet.cluster}/held-{uniq}", sent_at=now,
                           room_token=token, before_cordon=True)
        grant = await ask([unknown, held])
        st = await guard_status(fleet)
    assert grant.took == [token], grant
    assert f"held-{uniq}" in st.unhealthy and f"ghost-{uniq}" not in st.unhealthy, st.unhealthy


async def test_a_storm_through_reserved_room_never_passes_max_unhealthy(dev_env, uniq):
    fleet = pooled_fleet(dev_env, uniq, 3, size=20)
    first = fleet.add(FakeNode(f"n0-{uniq}", [xid(48)], cured_by="reset", fail={"kube.return_to_service"}))
    rest = [fleet.add(FakeNode(f"n{i}-{uniq}", [xid(48)], cured_by="reset", fail={"kube.return_to_service"}))
            for i in range(1, 9)]
    peak = 0
    async with fleet.workers():
        fleet.room.start(fleet.cluster)
        await fleet.report(first.name)

        async def room_kept() -> bool:
            return fleet.room.held(fleet.cluster) > 0

        await wait_for(room_kept, timeout=20)
        await asyncio.gather(*(fleet.report(n.name) for n in rest))
        for _ in range(60):
            st = await guard_status(fleet)
            peak = max(peak, sum(n.cordoned for n in [first, *rest]))
            assert len(st.unhealthy) + sum(st.room_reserved.values()) <= 3, st
            await asyncio.sleep(0.1)
    assert peak == 3, f"{peak} cordoned at most: max_unhealthy 3 held, and used"


async def test_a_pool_keeps_half_the_room_and_gives_it_back_to_a_fault_that_waits(dev_env, uniq):
    """A pool keeps half the free room, so another controller's episode (no room of its own) is
    admitted at once; its second fault, with no room left, gets the pool's slot: deferred until the
    pool's next renewal gives it back, or at once when that renewal lands while the fault's notice
    waits in the guard's queue (about one run in four: both are the guard reclaiming for a fault)."""
    fleet = pooled_fleet(dev_env, uniq, 2)
    first = fleet.add(FakeNode(f"first-{uniq}", [xid(48)], cured_by="reset"))
    hold = asyncio.Event()  # the other controller's nodes stay quarantined meanwhile
    other = [fleet.add(FakeNode(f"o{i}-{uniq}", [xid(48)], cured_by="reset", hold=hold)) for i in range(2)]
    async with fleet.workers():
        try:
            # Bounded: a wait that never ends must fail the test, not hang the suite.
            result = await asyncio.wait_for(_half_then_back(fleet, first, other), timeout=120)
        finally:
            hold.set()  # else the held drains keep the workers from shutting down
    (actions, st) = result
    assert not any("deferred" in a.summary for a in actions[0]), "admitted at once: room was left free"
    assert sorted(st.unhealthy) == sorted(n.name for n in other), st
    assert sum(st.room_reserved.values()) == 0, f"the pool's slot went to the second fault: {st}"


async def _half_then_back(fleet, first, other):
    fleet.room.start(fleet.cluster)
    await (await fleet.report(first.name)).result()  # starts the guard; the pool then keeps a slot

    async def one_kept() -> bool:
        return fleet.room.held(fleet.cluster) == 1

    await wait_for(one_kept, timeout=20)
    await asyncio.sleep(0.5)
    assert fleet.room.held(fleet.cluster) == 1, "half the free room, never all of it"
    fleet.room.take = lambda cluster, now: ""  # these episodes are another controller's
    handles = []
    for n in other:
        handles.append(await fleet.report(n.name))
        await wait_for(lambda n=n: _async(n.cordoned), timeout=30)
    st = await guard_status(fleet)
    assert len(st.unhealthy) + sum(st.room_reserved.values()) <= 2, st
    return [(await h.query(NodeRemediation.status)).actions for h in handles], st


async def _async(value: bool) -> bool:
    return value
