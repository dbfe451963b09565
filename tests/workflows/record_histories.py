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

from policies.loader import default_policy
from policies.model import Policy
from tests.workflows.fakes import FakeFleet, FakeNode, xid
from workers.embedded_temporal import binary, search_attribute_flags
from workflows.node_remediation import NodeRemediation

HISTORIES = Path(__file__).resolve().parent.parent / "histories"


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
    # The do-no-harm paths (PATCH_DO_NO_HARM): recorded from then on.
    "agent_missing": (48, "none", 0, [], {"agent": False}),
    "cordon_failed": (48, "reset", 0, [], {"fail": {"kube.quarantine"}}),
    "uncordon_failed": (48, "reset", 0, [], {"fail": {"kube.return_to_service"}}),
    "drain_failed": (79, "reboot", 0, [], {"fail": {"kube.drain"}}),
    "rejected": (79, "reboot", 0, [], {"exists": False}),
}


async def record(env: WorkflowEnvironment, name: str, write: bool = True) -> dict:
    code, cured_by, recurs, approve, options = PATHS[name]
    u = uuid.uuid4().hex[:6]
    fleet = FakeFleet(client=env.client, task_queue=f"rec-{u}", policy=fast_policy(approve=approve), cluster=f"rec-{u}")
    node = fleet.add(FakeNode(f"{name.replace('_', '-')}-node", [xid(code)], cured_by=cured_by, recurs=recurs,
                              **options))
    async with fleet.workers():
        handle = await fleet.report(node.name)
        if approve:
            while (await handle.query(NodeRemediation.status)).awaiting_approval is None:
                await asyncio.sleep(0.05)
            await handle.execute_update(NodeRemediation.approve)
        result = await handle.result()
        history = await handle.fetch_history()
    if write:
        (HISTORIES / f"{name}.json").write_text(json.dumps(json.loads(history.to_json()), indent=1) + "\n")
    return {"path": name, "outcome": result.outcome.value, "rungs": [r.value for r in result.rungs],
            "events": len(history.events)}


async def main() -> None:
    HISTORIES.mkdir(exist_ok=True)
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=binary("temporal"), data_converter=pydantic_data_converter,
        dev_server_extra_args=search_attribute_flags(),
    )
    try:
        for name in PATHS:
            print(json.dumps(await record(env, name)))
    finally:
        await env.shutdown()


if __name__ == "__main__":
    asyncio.run(main())
    sys.stdout.flush()
    os._exit(0)  # the SDK's native threads can abort a finalizing interpreter (as in workers.cli.entry)
