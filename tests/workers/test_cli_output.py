"""The CLI's output habits (kubectl's): tables by default, -o wide|json|yaml on every command, one
JSON shape per resource, an empty list that says so."""

import asyncio
import json

import yaml

from api.episode import RemediationStatus
from api.guard import GuardStatus
from policies.loader import default_policy
from tests.workers.test_operator_cli import cli
from tests.workflows.fake_node import FakeNode
from tests.workflows.fakes import FakeFleet, xid
from workers.render import human, table
from workflows.node_remediation import NodeRemediation

EPISODE_ROW = {"node", "stage", "next_rung", "fault_class", "paused", "awaiting_approval"}
HISTORY_ROW = {"run_id", "started", "status", "outcome", "reason", "rungs", "steps"}
STEP = {"at", "step", "summary", "ok", "detail"}


def parked_fleet(dev_env, node: str, task_queue: str, cluster: str):
    """A node whose Xid 79 waits (a day) for approval to reboot: an episode that stays open."""
    policy = default_policy().scaled(0.001)
    policy.ladder.reboot.requires_approval = True
    policy.ladder.reboot.approval_timeout = policy.ladder.reboot.approval_timeout * 1000
    fleet = FakeFleet(client=dev_env.client, task_queue=task_queue, policy=policy, cluster=cluster)
    return fleet, fleet.add(FakeNode(node, [xid(79)], cured_by="reboot"))


async def awaiting_approval(fleet: FakeFleet, node: str):
    handle = await fleet.report(node)
    for _ in range(200):
        if (await handle.query(NodeRemediation.status)).awaiting_approval:
            break
        await asyncio.sleep(0.05)
    return handle


def test_an_empty_listing_says_so_and_tables_read_like_kubectl():
    assert human("status", []) == "No remediation episodes are running."
    out = table(["node", "stage"], [["gpu-node-1", "ladder"], ["n2", None]]).splitlines()
    assert out[0].split() == ["NODE", "STAGE"] and out[2].split() == ["n2", "<none>"]
    assert all(line == line.rstrip() for line in out), "no trailing blanks when piped"


async def test_every_operator_command_in_each_form(dev_env, uniq):
    address = dev_env.client.service_client.config.target_host
    fleet, n = parked_fleet(dev_env, f"out-{uniq}", "gpuheal", "default")
    async with fleet.workers():
        handle = await awaiting_approval(fleet, n.name)
        listing = await cli(address, "status")
        assert listing.returncode == 0, listing.stderr
        head, *rows = listing.stdout.splitlines()
        assert head.split() == ["NODE", "STAGE", "FAULT", "NEXT-RUNG", "PAUSED", "APPROVAL"]
        mine = next(r.split() for r in rows if r.startswith(n.name))
        assert mine[1:] == ["ladder", "gpu_lost", "reboot", "no", "reboot"], mine
        as_json = json.loads((await cli(address, "status", "-o", "json")).stdout)
        assert isinstance(as_json, list) and all(EPISODE_ROW <= set(r) for r in as_json)
        one = (await cli(address, "status", n.name)).stdout
        assert "Stage:" in one and "Approval:" in one and "reboot" in one and "Steps:" in one, one
        RemediationStatus.model_validate(yaml.safe_load((await cli(address, "status", n.name, "-o", "yaml")).stdout))
        RemediationStatus.model_validate_json((await cli(address, "status", n.name, "--json")).stdout)
        guard = await cli(address, "guard")
        assert guard.returncode == 0 and "Budget:" in guard.stdout and n.name in guard.stdout, guard.stdout
        seen = GuardStatus.model_validate_json((await cli(address, "guard", "-o", "json")).stdout)
        assert f"Granted:          {seen.grants} lease(s)" in guard.stdout and "closed; 0 trip(s)" in guard.stdout
        wide = (await cli(address, "history", n.name, "-o", "wide")).stdout
        assert wide.splitlines()[0].startswith("Episode ") and "DETAIL" in wide, wide
        hist = json.loads((await cli(address, "history", n.name, "-o", "json")).stdout)
        assert all(HISTORY_ROW <= set(e) and all(STEP <= set(s) for s in e["steps"]) for e in hist)
        approved = await cli(address, "approve", n.name, "reboot", "-o", "json")
        RemediationStatus.model_validate_json(approved.stdout)
        await handle.result()
        await fleet.stop_guard()


async def test_a_named_context_replaces_the_connection_flags(dev_env, uniq, tmp_path):
    """kubectl's habit: `gpuheal config set-context NAME --temporal ... --use`, then commands need no
    connection flags; a flag still wins, and an unknown context is refused in one line (exit 2)."""
    import os
    import subprocess
    import sys

    address = dev_env.client.service_client.config.target_host
    env = {**os.environ, "GPUHEAL_CONFIG": str(tmp_path / "config.yaml")}

    def run(*argv):
        return subprocess.run([sys.executable, "-m", "workers.cli", *argv], capture_output=True, text=True,
                              timeout=60, env=env)

    assert run("config", "set-context", "here", "--temporal", address, "--cluster", f"c-{uniq}", "--use").returncode == 0
    assert run("config", "set-context", "nowhere", "--temporal", "127.0.0.1:1").returncode == 0
    contexts = json.loads(run("config", "get-contexts", "-o", "json").stdout)
    assert [(c["name"], c["current"]) for c in contexts] == [("here", True), ("nowhere", False)]
    guard = run("guard", "-o", "json")  # no flags: the context's address and cluster
    assert guard.returncode == 1 and f"no fleet guard runs for cluster 'c-{uniq}'" in guard.stderr, guard.stderr
    assert run("status", "--context", "nowhere").returncode == 2, "cannot reach Temporal: could not run"
    assert run("status", "--context", "nowhere", "--temporal", address).returncode == 0, "a flag wins"
    unknown = run("status", "--context", "gone")
    assert unknown.returncode == 2 and "no context 'gone'" in unknown.stderr


async def test_status_watch_prints_each_change_until_interrupted(dev_env, uniq):
    """`gpuheal status NODE -w`: printed again when it changes (piped: one block per change), and
    Ctrl-C ends it with 0."""
    import signal
    import subprocess
    import sys

    address = dev_env.client.service_client.config.target_host
    fleet, n = parked_fleet(dev_env, f"watch-{uniq}", f"tq-{uniq}", f"w-{uniq}")
    async with fleet.workers():
        handle = await awaiting_approval(fleet, n.name)
        proc = subprocess.Popen([sys.executable, "-m", "workers.cli", "status", n.name, "-w", "--temporal", address,
                                 "--cluster", f"w-{uniq}"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        await asyncio.sleep(4)
        await handle.execute_update(NodeRemediation.pause, "vendor on site")
        await asyncio.sleep(4)
        assert proc.poll() is None, proc.stderr.read()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
        await handle.terminate("test over")
    assert proc.returncode == 0, err
    blocks = out.count("Stage:")
    assert blocks == 2 and "Paused:           yes: vendor on site" in out, out
