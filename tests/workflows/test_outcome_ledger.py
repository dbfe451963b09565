"""The outcome ledger: each episode's record carries its time per phase, the node's time out of
service, the pods it interrupted with their attribution, and the finding a what-if replays."""

from __future__ import annotations

import pytest

from activities.outcomes import figures
from policies.loader import default_policy
from tests.workflows.fake_node import FakeNode
from tests.workflows.fakes import FakeFleet, xid
from workflows.outcome import IN_SERVICE


def make_fleet(ts_env, uniq) -> FakeFleet:
    return FakeFleet(client=ts_env.client, task_queue=f"tq-{uniq}", policy=default_policy(), cluster=f"c-{uniq}")


async def test_a_reset_episode_records_its_phases_and_the_pods_it_interrupted(ts_env, uniq):
    fleet = make_fleet(ts_env, uniq)
    n = fleet.add(FakeNode(f"reset-{uniq}", [xid(48)], cured_by="reset"))
    async with fleet.workers():
        await (await fleet.report(n.name)).result()
    [rec] = fleet.records
    assert (rec.outcome, rec.rungs, rec.attribution) == ("returned", ["reset"], "platform")
    assert rec.finding is not None and (rec.finding.kind, rec.finding.xid) == ("xid", 48)
    assert rec.sku == "hopper" and rec.profile is None  # no profile applies to the stand-in fleet's nodes
    assert rec.returned_at is not None and rec.started_at <= rec.returned_at <= rec.ended_at
    # The reset settles and validates twice (the time-skipping server runs those timers): the
    # phases cover the time out of service, which ends at the uncordon, before probation.
    assert {"quarantine", "reset", "validation"} <= set(rec.phases), rec.phases
    assert rec.phases["validation"] > 0
    assert rec.out_of_service_s == pytest.approx(sum(rec.phases.values()), abs=0.01)
    assert rec.out_of_service_s < (rec.ended_at - rec.started_at).total_seconds(), "probation is not out of service"
    assert [(p.pod, p.attribution, p.how) for p in rec.pods] == [(f"default/job-on-{n.name}", "platform", "marked")]


async def test_an_application_episode_interrupts_its_pod_and_takes_no_node_time(ts_env, uniq):
    fleet = make_fleet(ts_env, uniq)
    n = fleet.add(FakeNode(f"app-{uniq}", [xid(13)], cured_by="kill"))
    async with fleet.workers():
        await (await fleet.report(n.name)).result()
    [rec] = fleet.records
    assert rec.attribution == "application" and rec.out_of_service_s == 0 and rec.returned_at is None
    assert "kill" in rec.phases
    assert [(p.attribution, p.how) for p in rec.pods] == [("application", "marked")]
    doc = figures(fleet.records)
    assert doc["pod_interruptions"] == {"platform": 0, "application": 1} and doc["node_hours_lost"] == 0


async def test_time_back_in_service_before_a_recurrence_is_not_out_of_service(ts_env, uniq):
    """Reset, returned, the fault comes back in probation, reboot, returned again: the node was in
    service between the two, and the record says so."""
    fleet = make_fleet(ts_env, uniq)
    n = fleet.add(FakeNode(f"again-{uniq}", [xid(48)], cured_by="reset", recurs=1))
    async with fleet.workers():
        await (await fleet.report(n.name)).result()
    [rec] = fleet.records
    assert rec.rungs == ["reset", "reboot"] and rec.outcome == "returned"
    assert rec.phases[IN_SERVICE] > 0 and {"reset", "reboot"} <= set(rec.phases)
    out = sum(v for k, v in rec.phases.items() if k != IN_SERVICE)
    assert rec.out_of_service_s == pytest.approx(out, abs=0.01)
    assert figures([rec])["node_hours_lost"] == pytest.approx(out / 3600, abs=0.01)
