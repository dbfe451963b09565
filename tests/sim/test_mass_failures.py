"""Mass failures recover by themselves, slowly and safely (issue: never wedged): the real agents,
activities and workflows on the simulated fleet, the guard watched while it runs."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest

from api.episode import RemediationResult
from api.names import guard_workflow_id
from sim.fleet import SimulatedFleet
from sim.scenario import load_scenario
from workflows.fleet_guard import FleetGuard
from workflows.node_remediation import NodeRemediation

ROOT = Path(__file__).resolve().parents[2]


def scenario(nodes: int, failing: int, budget: int, kind: str = "kind: ecc_dbe, gpu: 2") -> str:
    faults = "\n".join(f"  - {{node: gpu-node-{i}, {kind}, cured_by: reset}}" for i in range(failing))
    return f"name: mass-{failing}-of-{nodes}\ntime_scale: 0.002\nbudget: {budget}\nfleet: {{nodes: {nodes}}}\nfaults:\n{faults}\n"


class GuardWatch:
    """Each beat: the guard's status, and how many nodes are cordoned at once."""

    def __init__(self, client, cluster: str, address: str):
        self.handle = client.get_workflow_handle(guard_workflow_id(cluster))
        self.cluster, self.address = cluster, address
        self.budgets: list[int] = []
        self.canary_budgets: list[int] = []
        self.max_cordoned = 0
        self.max_holders = 0
        self.cli_doc: dict | None = None

    async def __call__(self, fleet: SimulatedFleet) -> None:
        cordoned = sum(bool(fleet.kube.get("Node", "", h.name)["spec"].get("unschedulable")) for h in fleet.hosts.values())
        self.max_cordoned = max(self.max_cordoned, cordoned)
        try:
            st = await self.handle.query(FleetGuard.status)
        except Exception:  # noqa: BLE001 - not started yet
            return
        self.max_holders = max(self.max_holders, len(st.holders))
        self.budgets.append(st.budget)
        self.canary_budgets.append(st.canary_budget)
        if self.cli_doc is None and st.canary_budget:
            # What an operator sees, from the command line, while the canary runs.
            run = await asyncio.to_thread(subprocess.run, [
                sys.executable, "-m", "workers.cli", "guard", "--cluster", self.cluster, "--json",
                "--temporal", self.address], cwd=ROOT, capture_output=True, text=True, timeout=60)
            assert run.returncode == 0, run.stderr
            self.cli_doc = json.loads(run.stdout)


async def outcomes(client, fleet: SimulatedFleet, nodes: list[str]) -> dict[str, RemediationResult]:
    return {n: await client.get_workflow_handle(fleet.episode_id(n), result_type=RemediationResult).result()
            for n in nodes}


async def play_watched(env, moto_url: str, name: str, text: str, failing: int, deadline_s: float,
                       storm_window: timedelta | None = None):
    sc, policy = load_scenario(text=text)
    if storm_window is not None:  # scaled, the default window is about a second: too short to be sure of a storm
        policy.guard.storm_window = storm_window
    fleet = SimulatedFleet(sc, policy, env.client, task_queue=name, cluster=name)
    watch = GuardWatch(env.client, fleet.cluster, env.client.service_client.config.target_host)
    async with fleet.running(moto_url):
        await fleet.play(deadline_s=deadline_s, on_tick=watch)
        return watch, await outcomes(env.client, fleet, [f"gpu-node-{i}" for i in range(failing)])


@pytest.mark.timeout(300)
async def test_two_of_three_failing_at_once_all_come_back(dev_env, moto_url, aws, uniq):
    watch, results = await play_watched(dev_env, moto_url, f"mass3-{uniq}", scenario(3, 2, budget=1), 2, 240)
    assert {n: r.outcome for n, r in results.items()} == {"gpu-node-0": "returned", "gpu-node-1": "returned"}
    assert watch.max_cordoned <= 1, "max_unhealthy 50% of 3: one node quarantined at a time, the other deferred"
    assert watch.max_holders <= 1


@pytest.mark.timeout(600)
async def test_twelve_of_sixteen_recover_within_budget_canary_stepping_up(dev_env, moto_url, aws, uniq):
    watch, results = await play_watched(dev_env, moto_url, f"mass16-{uniq}", scenario(16, 12, budget=3), 12, 540,
                                        storm_window=timedelta(seconds=20))
    assert all(r.outcome == "returned" for r in results.values()), {n: r.outcome for n, r in results.items()}
    assert watch.max_holders <= 3 and max(watch.budgets) <= 3
    assert watch.max_cordoned <= 8, "max_unhealthy 50% of 16"
    stepped = [b for i, b in enumerate(watch.canary_budgets) if b and (i == 0 or b != watch.canary_budgets[i - 1])]
    assert stepped[:2] == [1, 2], f"the canary trickle starts at one and doubles: {stepped}"
    assert watch.cli_doc is not None and watch.cli_doc["canary_budget"] >= 1 and watch.cli_doc["gate"] is not None


@pytest.mark.timeout(300)
async def test_an_unknown_xid_on_every_node_cordons_at_most_max_unhealthy(dev_env, moto_url, aws, uniq):
    """A driver that starts printing a new Xid everywhere: most nodes wait uncordoned, with the reason."""
    sc, policy = load_scenario(text=scenario(10, 10, budget=2, kind="kind: xid, xid: 9999, gpu: 1"))
    fleet = SimulatedFleet(sc, policy, dev_env.client, task_queue=f"burst-{uniq}", cluster=f"burst-{uniq}")
    watch = GuardWatch(dev_env.client, fleet.cluster, dev_env.client.service_client.config.target_host)
    async with fleet.running(moto_url):
        await fleet.play(deadline_s=240, on_tick=watch)
        nodes = [f"gpu-node-{i}" for i in range(10)]
        results = await outcomes(dev_env.client, fleet, nodes)
        # The deferral is read from each episode's own record: the guard's deferred list is
        # transient (room opens as canaries return), and a watcher's beat can miss it.
        deferrals = {n: [a for a in (await dev_env.client.get_workflow_handle(fleet.episode_id(n))
                                     .query(NodeRemediation.status)).actions
                         if a.step == "quarantine" and "deferred by the fleet guard" in a.summary]
                     for n in nodes}
    assert watch.max_cordoned <= 5, f"max_unhealthy 50% of 10, saw {watch.max_cordoned} cordoned at once"
    deferred = [a for acts in deferrals.values() for a in acts]
    assert sum(bool(acts) for acts in deferrals.values()) >= 5, "10 faults at once, room for 5: the rest wait uncordoned"
    assert all("quarantine deferred" in a.detail for a in deferred), [a.detail for a in deferred]
    assert all(r.outcome == "returned" for r in results.values()), {n: r.outcome for n, r in results.items()}
