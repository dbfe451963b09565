"""Re-record tests/histories/ from the dev server (`make histories`): one history per ladder path.

Runs the stand-in fleet from tests/workflows/fakes.py in real time with a scaled policy, so the
recorded histories are what the current workflow code produces; the replay tests read them back.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid
from pathlib import Path

from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from policies.findings import Finding
from policies.loader import default_policy
from policies.model import Policy
from tests.workflows.fake_node import FakeNode
from tests.workflows.fakes import FakeFleet, xid
from workers.embedded_temporal import binary, search_attribute_flags
from workflows.node_remediation import NodeRemediation

HISTORIES = Path(__file__).resolve().parent.parent / "histories"
GUARD_HISTORIES = HISTORIES / "guard"  # FleetGuard's paths (issue: never wedged)
ADMISSION_HISTORIES = HISTORIES / "admission"  # NodeAdmission's paths


def fast_policy(**ladder_approval) -> Policy:
    policy = default_policy().scaled(0.002)
    for rung in ladder_approval.get("approve", []):
        policy.ladder.for_rung(rung).requires_approval = True
    return policy


# path name -> (fault, cured_by, recurs, rungs needing approval, FakeNode options)
PATHS = {
    "kill_only": (13, "kill", 0, [], {}),
    "reset": (48, "reset", 0, [], {}),
    "reboot": (79, "reboot", 0, [], {}),
    "replace": (48, "none", 0, [], {}),
    "probation_recurrence": (48, "reset", 1, [], {}),
    "approval": (79, "reboot", 0, ["reboot"], {}),
    # The do-no-harm paths.
    "agent_missing": (48, "none", 0, [], {"agent": False}),
    "cordon_failed": (48, "reset", 0, [], {"fail": {"kube.quarantine"}}),
    "uncordon_failed": (48, "reset", 0, [], {"fail": {"kube.return_to_service"}}),
    "drain_failed": (79, "reboot", 0, [], {"fail": {"kube.drain"}}),
    "rejected": (79, "reboot", 0, [], {"exists": False}),
    # Validation under load, and a suspect's load test before any remedy.
    "reset_under_load": (48, "reset", 0, [], {}),
    "suspect_cleared": ("suspect", "kill", 0, [], {"faulty": False}),
    "suspect_confirmed": ("suspect", "reset", 0, [], {}),
    # A node whose profile is in observe mode: triage recorded, nothing done.
    "observed": (79, "reboot", 0, [], {}),
}


async def record(env: WorkflowEnvironment, name: str, write: bool = True) -> dict:
    code, cured_by, recurs, approve, options = PATHS[name]
    u = uuid.uuid4().hex[:6]
    policy = fast_policy(approve=approve)
    policy.observe = name == "observed"
    fleet = FakeFleet(client=env.client, task_queue=f"rec-{u}", policy=policy, cluster=f"rec-{u}")
    found = [Finding(kind="suspect", message="suspect: a job's slow rank")] if code == "suspect" else [xid(code)]
    node = fleet.add(FakeNode(f"{name.replace('_', '-')}-node", found, cured_by=cured_by, recurs=recurs, **options))
    async with fleet.workers():
        handle = await fleet.report(node.name, **({"healthy": False} if code == "suspect" else {}))
        if approve:
            while (await handle.query(NodeRemediation.status)).awaiting_approval is None:
                await asyncio.sleep(0.05)
            status = await handle.query(NodeRemediation.status)
            await handle.execute_update(NodeRemediation.approve, status.awaiting_approval.value)
        result = await handle.result()
        history = await handle.fetch_history()
    if write:
        (HISTORIES / f"{name}.json").write_text(json.dumps(json.loads(history.to_json()), indent=1) + "\n")
    return {"path": name, "outcome": result.outcome.value, "rungs": [r.value for r in result.rungs],
            "events": len(history.events)}


def guard_policy(**guard) -> Policy:
    policy = default_policy().scaled(0.002)
    policy.guard = policy.guard.model_copy(update=guard)
    return policy


# guard path -> (policy, fleet size, nodes failing, FakeNode options)
GUARD_PATHS = {
    "canary_failed": (lambda: guard_policy(storm_faults=1), 10, 2, {"fail": {"kube.return_to_service"}}),
    "quarantine_deferred": (lambda: guard_policy(max_unhealthy=1), 4, 2, {}),
}


async def record_guard(env: WorkflowEnvironment, name: str) -> dict:
    """One FleetGuard history: episodes on the stand-in fleet, a policy update from the controller,
    then the guard terminated at the end as the tests do."""
    from api.names import guard_workflow_id
    from workers.controller import tell_guard_the_policy

    make_policy, size, failing, options = GUARD_PATHS[name]
    u = uuid.uuid4().hex[:6]
    policy = make_policy()
    fleet = FakeFleet(client=env.client, task_queue=f"rec-{u}", policy=policy, cluster=f"rec-{u}", fleet_size=size)
    nodes = [fleet.add(FakeNode(f"{name.replace('_', '-')}-{i}", [xid(48)], cured_by="reset", **options))
             for i in range(failing)]
    async with fleet.workers():
        handles = await asyncio.gather(*(fleet.report(n.name) for n in nodes))
        results = await asyncio.gather(*(h.result() for h in handles))
        # The run that saw the storm: the controller's start below has the guard continue as new.
        first_run = (await env.client.get_workflow_handle(guard_workflow_id(fleet.cluster)).describe()).run_id
        await tell_guard_the_policy(env.client, fleet.cluster, policy.guard.model_copy(update={"max_disruptive": 3}))
        for h in handles:  # an episode that waited for room to quarantine is a path of its own
            st = await h.query(NodeRemediation.status)
            if any("deferred" in a.summary for a in st.actions):
                episode = await h.fetch_history()
                (HISTORIES / f"{name}.json").write_text(json.dumps(json.loads(episode.to_json()), indent=1) + "\n")
    history = await env.client.get_workflow_handle(guard_workflow_id(fleet.cluster), run_id=first_run).fetch_history()
    GUARD_HISTORIES.mkdir(exist_ok=True)
    (GUARD_HISTORIES / f"{name}.json").write_text(json.dumps(json.loads(history.to_json()), indent=1) + "\n")
    return {"guard_path": name, "outcomes": sorted(r.outcome.value for r in results), "events": len(history.events)}


# admission path -> (a fault on the node while it is admitted, its hardware denylisted)
ADMISSION_PATHS = {
    "admitted": (False, False),  # a new node: tainted, validated twice, admitted
    "denied_replaced": (False, True),  # its hardware is denylisted: replaced under a lease
    "after_episode": (True, False),  # a remediation runs: the admission waits, checks again, goes on
}


async def record_admission(env: WorkflowEnvironment, name: str) -> dict:
    from api.names import admission_workflow_id
    from workers.reporting import start_admission
    from workflows.node_admission import NodeAdmission

    faulty, denied = ADMISSION_PATHS[name]
    u = uuid.uuid4().hex[:6]
    policy = fast_policy()
    fleet = FakeFleet(client=env.client, task_queue=f"rec-{u}", policy=policy, cluster=f"rec-{u}")
    hold = asyncio.Event() if faulty else None  # the episode's drain waits while the admission starts
    node = fleet.add(FakeNode(f"{name.replace('_', '-')}-node", [xid(48)] if faulty else [], faulty=faulty,
                              cured_by="reset", hold=hold))
    if denied:
        fleet.denylist[node.ids()[1].uuid] = "replaced: Xid 79"
    async with fleet.workers():
        episode = await fleet.report(node.name) if faulty else None
        await start_admission(env.client, node=node.name, cluster=fleet.cluster, hardware_ids=[],
                              task_queue=fleet.task_queue)
        handle = env.client.get_workflow_handle_for(NodeAdmission.run, admission_workflow_id(node.name, fleet.cluster))
        if hold is not None:
            while not any(a.step == "remediation" for a in await handle.query(NodeAdmission.actions_so_far)):
                await asyncio.sleep(0.05)
            hold.set()
        result = await handle.result()
        if episode is not None:
            await episode.result()
        history = await handle.fetch_history()
    ADMISSION_HISTORIES.mkdir(exist_ok=True)
    (ADMISSION_HISTORIES / f"{name}.json").write_text(json.dumps(json.loads(history.to_json()), indent=1) + "\n")
    return {"admission_path": name, "outcome": result.outcome, "events": len(history.events)}


async def main() -> None:
    HISTORIES.mkdir(exist_ok=True)
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=binary("temporal"), data_converter=pydantic_data_converter,
        dev_server_extra_args=search_attribute_flags(),
    )
    try:
        only_guard, only_admission = "--guard" in sys.argv, "--admission" in sys.argv
        for name in [] if only_guard or only_admission else PATHS:
            print(json.dumps(await record(env, name)))
        for name in [] if only_admission else GUARD_PATHS:
            print(json.dumps(await record_guard(env, name)))
        for name in [] if only_guard else ADMISSION_PATHS:
            print(json.dumps(await record_admission(env, name)))
    finally:
        await env.shutdown()


if __name__ == "__main__":
    asyncio.run(main())
    sys.stdout.flush()
    os._exit(0)  # the SDK's native threads can abort a finalizing interpreter (as in workers.cli.entry)
