"""The ledger's two stores behind one interface: SQLite, and DynamoDB on moto's server."""

import threading
from datetime import UTC, datetime, timedelta

from temporalio.testing import ActivityEnvironment

import api as c
from activities.ledger import LedgerActivities


def rec(episode: str, ids: list[str], ended: datetime, outcome="returned", attribution="platform",
        rungs=("reset",)) -> c.RemediationRecord:
    return c.RemediationRecord(node="n1", episode=episode, hardware_ids=ids, fault_class="memory", attribution=attribution,
                               rungs=list(rungs), outcome=outcome, started_at=ended - timedelta(minutes=5), ended_at=ended)


def test_only_platform_episodes_that_acted_count(ledger):
    """Two user-bug Xid 13s, a dry run and a parked episode say nothing about the board."""
    now = datetime.now(UTC)
    ledger.record(rec("app1", ["SN-7"], now, attribution="application", rungs=["kill"]))
    ledger.record(rec("app2", ["SN-7"], now, attribution="application", rungs=["kill"]))
    ledger.record(rec("dry", ["SN-7"], now, outcome="dry_run", rungs=["reset"]))
    ledger.record(rec("parked", ["SN-7"], now, outcome="awaiting_approval", rungs=[]))
    assert ledger.count_recent(["SN-7"], now - timedelta(days=7), None) == 0
    ledger.record(rec("real", ["SN-7"], now, rungs=["reset", "reboot"]))
    assert ledger.count_recent(["SN-7"], now - timedelta(days=7), None) == 1


def test_record_is_idempotent_and_counted_per_hardware_id(ledger):
    now = datetime.now(UTC)
    assert ledger.record(rec("e1", ["GPU-a", "SN-1"], now - timedelta(days=1)))
    assert not ledger.record(rec("e1", ["GPU-a", "SN-1"], now - timedelta(days=1))), "a retry writes nothing new"
    ledger.record(rec("e2", ["GPU-b", "SN-1"], now - timedelta(days=2)))
    ledger.record(rec("e3", ["GPU-a"], now - timedelta(days=30)))
    week = now - timedelta(days=7)
    assert ledger.count_recent(["SN-1"], week, None) == 2
    assert ledger.count_recent(["GPU-a", "SN-1"], week, None) == 2, "one episode counts once"
    assert ledger.count_recent(["GPU-a"], now - timedelta(days=60), None) == 2
    assert ledger.count_recent(["SN-1"], week, "e2") == 1
    assert ledger.count_recent([], week, None) == 0


def test_denylist(ledger):
    assert ledger.deny(["GPU-a", "SN-1"], "n1", "replaced: Xid 79") == ["GPU-a", "SN-1"]
    assert ledger.deny(["SN-1", "GPU-z"], "n2", "again") == ["GPU-z"]
    assert ledger.denied(["SN-1", "GPU-q"]) == {"SN-1": "replaced: Xid 79"}


def test_racing_writers_deny_once(ledger):
    wins = []

    def writer(i):
        wins.append(ledger.deny(["SN-race"], f"n{i}", f"writer {i}"))

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(len(w) for w in wins) == 1


async def test_activities(ledger):
    acts = LedgerActivities(ledger)
    env = ActivityEnvironment()
    await env.run(acts.record, rec("e9", ["SN-9"], datetime.now(UTC)))
    assert await env.run(acts.count_recent, c.CountRecentRequest(hardware_ids=["SN-9"], window_s=3600)) == 1
    r = await env.run(acts.denylist, c.DenylistRequest(hardware_ids=["SN-9"], node="n", reason="bad"))
    assert r.added == ["SN-9"]
    assert (await env.run(acts.check_denied, c.CheckDeniedRequest(hardware_ids=["SN-9", "x"]))).denied == {"SN-9": "bad"}


def test_repeat_offenders_are_counted_per_board(ledger):
    """Each record lists every id of its node, but implicates one board: by board, three faults on
    three GPUs of one node are three boards once each (issue 22, 15b)."""
    now, week = datetime.now(UTC), datetime.now(UTC) - timedelta(days=7)
    node_ids = ["GPU-a", "SN-1", "GPU-b", "SN-2", "GPU-c", "SN-3"]
    for episode, board in (("e1", ["GPU-a", "SN-1"]), ("e2", ["GPU-b", "SN-2"]), ("e3", ["GPU-b", "SN-2"])):
        ledger.record(rec(episode, node_ids, now).model_copy(update={"boards": board}))
    assert ledger.count_recent(["GPU-c", "SN-3"], week, None) == 3, "by node: every episode"
    assert ledger.count_recent(["GPU-c", "SN-3"], week, None, by_board=True) == 0
    assert ledger.count_recent(["GPU-b", "SN-2"], week, None, by_board=True) == 2
    assert ledger.count_recent(["GPU-b", "SN-2"], week, "e3", by_board=True) == 1


def test_admissions_are_kept_per_node_and_hardware(ledger):
    """What admission checks before it taints anything: was this node admitted with this hardware."""
    assert ledger.admitted("n1") == []
    ledger.admit("n1", ["GPU-a", "SN-1"])
    ledger.admit("n1", ["GPU-a"])  # a retry adds nothing
    ledger.admit("n2", ["GPU-z"])
    assert ledger.admitted("n1") == ["GPU-a", "SN-1"]
    assert ledger.admitted("n2") == ["GPU-z"]


def test_last_started_is_the_nodes_latest_episode_but_the_one_asking(ledger):
    now = datetime.now(UTC)
    assert ledger.last_started("n1", None) is None
    ledger.record(rec("old", ["SN-1"], now - timedelta(days=2)))
    ledger.record(rec("new", ["SN-1"], now - timedelta(hours=1)))
    latest = ledger.last_started("n1", None)
    assert latest is not None and abs((latest - (now - timedelta(hours=1, minutes=5))).total_seconds()) < 1
    earlier = ledger.last_started("n1", "new")
    assert earlier is not None and earlier < latest, "the asking episode is left out"
    assert ledger.last_started("n2", None) is None
