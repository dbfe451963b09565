"""A replaced node is replaced once (issue 22, defect 14), on the simulated fleet: the real agent,
the real activities against the fake API server and moto, the controller's workflows."""

from __future__ import annotations

import pytest

from api.episode import RemediationResult
from sim.fleet import SimulatedFleet
from sim.scenario import load_scenario


@pytest.mark.timeout(240)
async def test_terminated_host_reporting_once_more_starts_nothing(dev_env, moto_url, aws, uniq):
    """EC2 runs an instance on for a while after the terminate: its agent reports once more. That
    report ends rejected, and the ledger and denylist hold one replacement."""
    sc, policy = load_scenario(text="""
name: replaced-once
time_scale: 0.002
fleet: {nodes: 2}
faults:
  - {node: gpu-node-1, kind: row_remap_failure, gpu: 5, cured_by: none}
""")
    fleet = SimulatedFleet(sc, policy, dev_env.client, task_queue=f"once-{uniq}", cluster=f"once-{uniq}")
    async with fleet.running(moto_url):
        await fleet.play(deadline_s=200)
        denied = fleet.ledger.db.execute("SELECT count(*) FROM denylist").fetchone()[0]
        host = fleet.hosts["gpu-node-1"]
        host.agent.sent = ()  # the old host's agent sends what it still finds (it may have raced already)
        assert await host.agent.step() is not None
        last = await dev_env.client.get_workflow_handle(fleet.episode_id("gpu-node-1"),
                                                         result_type=RemediationResult).result()
        records = fleet.ledger.db.execute("SELECT outcome FROM remediation WHERE node = 'gpu-node-1'").fetchall()
        denied_after = fleet.ledger.db.execute("SELECT count(*) FROM denylist").fetchone()[0]
    assert last.outcome == "rejected" and "was replaced" in last.reason, last
    assert records == [("replaced",)], "one ledger record: one replacement (a rejected episode writes none)"
    assert denied_after == denied > 0
