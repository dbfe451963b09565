"""The operator commands against the dev server, as a person runs them (a subprocess each)."""

import asyncio
import json
import subprocess
import sys

from api.episode import RemediationResult
from api.names import remediation_workflow_id
from policies.loader import default_policy
from tests.workflows.fake_node import FakeNode
from tests.workflows.fakes import FakeFleet, xid
from workflows.node_remediation import NodeRemediation


async def cli(address: str, *argv: str) -> subprocess.CompletedProcess:
    return await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "workers.cli", *argv, "--temporal", address],
                                   capture_output=True, text=True, timeout=60)


async def test_status_approve_history_report_pause(dev_env, uniq, tmp_path):
    address = dev_env.client.service_client.config.target_host
    policy = default_policy().scaled(0.001)
    policy.ladder.reboot.requires_approval = True
    policy.ladder.reboot.approval_timeout = policy.ladder.reboot.approval_timeout * 1000  # a day: waits for us
    fleet = FakeFleet(client=dev_env.client, task_queue="gpuheal", policy=policy, cluster="default")
    n = fleet.add(FakeNode(f"op-{uniq}", [xid(79)], cured_by="reboot"))
    other = fleet.add(FakeNode(f"op2-{uniq}", [xid(48)], cured_by="reset"))
    async with fleet.workers():
        handle = await fleet.report(n.name)
        for _ in range(100):
            if (await handle.query(NodeRemediation.status)).awaiting_approval:
                break
            await asyncio.sleep(0.05)
        st = await cli(address, "status", n.name, "--json")
        assert st.returncode == 0, st.stderr
        assert json.loads(st.stdout)["awaiting_approval"] == "reboot"
        everyone = json.loads((await cli(address, "status", "--json")).stdout)
        assert any(r["node"] == n.name and r["awaiting_approval"] == "reboot" for r in everyone)
        assert (await cli(address, "approve", n.name, "reboot")).returncode == 0
        result = await dev_env.client.get_workflow_handle(handle.id, result_type=RemediationResult).result()
        assert result.outcome == "returned"
        again = await cli(address, "approve", n.name, "reboot")
        assert again.returncode == 1 and "no open remediation episode" in again.stderr
        hist = json.loads((await cli(address, "history", n.name, "--json")).stdout)
        steps = [s["summary"] for s in hist[-1]["steps"]]
        assert hist[-1]["outcome"] == "returned" and any(s.startswith(f"reboot {n.name}") for s in steps)
        asked = [s for s in hist[-1]["steps"] if s["step"] == "operator"]
        assert len(asked) == 1 and asked[0]["summary"].startswith("approve by ") and "@" in asked[0]["summary"], \
            "who approved is recorded (the CLI's client identity)"
        assert asked[0]["detail"] == "reboot"
        rep = await cli(address, "report", other.name, "--xid", "48", "--gpu", "3")
        assert rep.returncode == 0, rep.stderr
        assert "not killed or reset on a person's word" in rep.stdout, rep.stdout
        h2 = dev_env.client.get_workflow_handle(remediation_workflow_id(other.name, fleet.cluster), result_type=RemediationResult)
        # A person's report is no probe on the GPU (patch target-agent-gpus-only): GPU 3 is not reset on
        # its word, the ladder climbs to the reboot, which waits for approval here.
        for _ in range(200):
            if (await h2.query(NodeRemediation.status)).awaiting_approval == "reboot":
                break
            await asyncio.sleep(0.05)
        shown = json.loads((await cli(address, "status", other.name, "--json")).stdout)
        assert shown["awaiting_approval"] == "reboot", shown
        reset = [a for a in shown["actions"] if a["step"] == "reset"]
        assert reset and reset[0]["ok"] is False and "not from" in reset[0]["detail"], shown["actions"]
        assert (await cli(address, "approve", other.name, "reboot")).returncode == 0
        r2 = await h2.result()
        assert (r2.fault_class, r2.outcome) == ("memory", "returned") and "reboot" in r2.rungs, r2
        assert not other.requests.get("node.reset_gpu"), "GPU 3 was reset on a person's word"
        paused = json.loads((await cli(address, "pause", "--reason", "driver rollout", "--json")).stdout)
        assert paused["paused"] and paused["pause_reason"].startswith("driver rollout (by ") and "@" in paused["pause_reason"], \
            "who paused is kept with the reason"
        assert not json.loads((await cli(address, "resume", "--json")).stdout)["paused"]
        await fleet.stop_guard()
    missing = await cli(address, "history", f"ghost-{uniq}")
    assert missing.returncode == 1 and "no remediation has ever run" in missing.stderr


async def test_status_of_an_episode_nobody_serves_ends_naming_the_queue(dev_env, uniq):
    """A query with no worker polling would wait forever: the CLI says why, within seconds."""
    from api.episode import RemediationInput

    node, queue = f"orphan-{uniq}", f"nobody-{uniq}"
    handle = await dev_env.client.start_workflow(NodeRemediation.run, RemediationInput(node=node),
                                                 id=remediation_workflow_id(node, "default"), task_queue=queue)
    address = dev_env.client.service_client.config.target_host
    try:
        t0 = asyncio.get_running_loop().time()
        st = await cli(address, "status", node)
        took = asyncio.get_running_loop().time() - t0
    finally:
        await handle.terminate()
    assert st.returncode == 1 and f"no controller polls task queue {queue!r}" in st.stderr, st.stderr
    assert took < 40, took


async def test_report_after_an_episode_was_terminated_by_hand_starts_a_new_one(dev_env, uniq):
    policy = default_policy().scaled(0.001)
    fleet = FakeFleet(client=dev_env.client, task_queue=f"tq-{uniq}", policy=policy, cluster="default")
    n = fleet.add(FakeNode(f"term-{uniq}", [xid(48)], cured_by="reset"))
    policy.ladder.reset.requires_approval = True  # park the first episode
    address = dev_env.client.service_client.config.target_host
    async with fleet.workers():
        first = await fleet.report(n.name)
        await first.terminate(reason="from the Temporal UI")
        policy.ladder.reset.requires_approval = False
        rep = await cli(address, "report", n.name, "--xid", "48", "--gpu", "3", "--task-queue", fleet.task_queue)
        assert rep.returncode == 0, rep.stderr
        second = dev_env.client.get_workflow_handle(remediation_workflow_id(n.name, fleet.cluster), result_type=RemediationResult)
        result = await second.result()
        await fleet.stop_guard()
    assert (await second.describe()).run_id != first.result_run_id
    assert result.outcome == "returned"


async def test_history_reads_closed_runs_nobody_serves_and_marks_an_unreachable_one(dev_env, uniq):
    """After an earlier demo (`--keep` reuses the dev server's database) nobody polls the closed runs'
    task queue: `history` reads them from their event histories; a running episode that cannot answer
    is one row saying why, not a failed listing."""
    from api.episode import RemediationInput

    policy = default_policy().scaled(0.001)
    fleet = FakeFleet(client=dev_env.client, task_queue=f"gone-{uniq}", policy=policy, cluster="default")
    n = fleet.add(FakeNode(f"hist-{uniq}", [xid(48)], cured_by="reset"))
    async with fleet.workers():
        handle = await fleet.report(n.name)
        first = await dev_env.client.get_workflow_handle(handle.id, result_type=RemediationResult).result()
        await fleet.stop_guard()
    assert first.outcome == "returned"
    # The workers are gone; a second episode starts on a queue nobody polls.
    stuck = await dev_env.client.start_workflow(NodeRemediation.run, RemediationInput(node=n.name),
                                                id=remediation_workflow_id(n.name, "default"), task_queue=f"nobody-{uniq}")
    address = dev_env.client.service_client.config.target_host
    try:
        shown = await cli(address, "history", n.name, "--json")
        listed = await cli(address, "status", "--json")
    finally:
        await stuck.terminate()
    assert listed.returncode == 0, listed.stderr
    row = next(r for r in json.loads(listed.stdout) if r["node"] == n.name)
    assert "no controller polls task queue" in row["unreachable"], row
    assert shown.returncode == 0, shown.stderr
    closed, running = json.loads(shown.stdout)
    assert closed["outcome"] == "returned" and closed["rungs"] == ["reset"]
    summaries = [s["summary"] for s in closed["steps"]]
    assert any(s.startswith(f"reset {n.name}") or s.startswith("reset GPU") for s in summaries), summaries
    assert all(s["ok"] is not None for s in closed["steps"] if s["step"] != "timer")
    assert running["reason"].startswith("unreachable: no controller polls task queue"), running
