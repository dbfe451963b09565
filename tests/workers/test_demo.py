"""`gpuheal demo --keep` as a person runs it: a clean console, a playground that answers a
hand-sent report with a full episode, and SIGTERM ending every child it started."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from api.episode import RemediationResult
from api.names import remediation_workflow_id
from workers.demo import children

ROOT = Path(__file__).resolve().parents[2]
ACCESS_LOG = re.compile(r'"(GET|POST|PUT|PATCH|DELETE) [^"]+ HTTP/1\.[01]" \d{3}')


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def wait_for_line(path: Path, pattern: str, proc: subprocess.Popen, timeout: float) -> str:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        text = path.read_text()
        if pattern in text:
            return text
        assert proc.poll() is None, f"demo exited {proc.returncode}:\n{text[-3000:]}"
        time.sleep(0.5)
    raise AssertionError(f"{pattern!r} not printed within {timeout}s:\n{path.read_text()[-3000:]}")


@pytest.mark.timeout(420)
async def test_demo_keep_is_a_clean_playground_and_sigterm_ends_it(tmp_path):
    out = tmp_path / "demo.out"
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    with out.open("w") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "workers.cli", "demo", "--keep"], cwd=tmp_path, env=env,
                                stdout=fh, stderr=subprocess.STDOUT)
    try:
        text = await asyncio.to_thread(wait_for_line, out, "--keep:", proc, 300)
        assert "Traceback" not in text and not ACCESS_LOG.search(text), text
        assert "connection pool is full" not in text
        assert (tmp_path / ".gpuheal/logs/demo.log").stat().st_size > 0, "the servers' logs went to the file"
        await asyncio.sleep(1)
        # The printed commands work as pasted: a shell without the venv on its PATH.
        # The commands follow the --keep: line (a progress line above may mention a report too).
        lines = out.read_text().splitlines()
        after = next(i for i, line in enumerate(lines) if line.startswith("--keep:"))
        printed = [line.strip() for line in lines[after + 1:] if line.startswith("  ")]
        report_cmd = next(cmd for cmd in printed if " report " in cmd)
        argv = shlex.split(report_cmd)
        node, address, cluster = argv[2], argv[argv.index("--temporal") + 1], argv[argv.index("--cluster") + 1]
        bare = {**os.environ, "PATH": "/usr/local/bin:/usr/bin:/bin"}
        sent = await asyncio.to_thread(subprocess.run, report_cmd, shell=True, cwd="/", env=bare,
                                       capture_output=True, text=True, timeout=60)
        assert sent.returncode == 0, sent.stderr
        client = await Client.connect(address, data_converter=pydantic_data_converter)
        handle = client.get_workflow_handle(remediation_workflow_id(node, cluster), result_type=RemediationResult)
        result = await asyncio.wait_for(handle.result(), 120)
        assert (result.outcome, result.rungs) == ("returned", ["reboot"]), result
        history_cmd = next(cmd for cmd in printed if " history " in cmd)
        shown = await asyncio.to_thread(subprocess.run, history_cmd, shell=True, cwd="/", env=bare,
                                        capture_output=True, text=True, timeout=60)
        assert shown.returncode == 0 and "reboot" in shown.stdout, (shown.stdout, shown.stderr)
        assert (tmp_path / ".gpuheal/dev-server.pid").exists(), "the demo records its dev server"
        await outcomes_of_the_demo(tmp_path, env, node)
        kids = children(proc.pid)
        assert kids, "the demo runs its dev server as a child"
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(proc.wait, 60) == 0
        await asyncio.sleep(1)
        assert not [k for k in kids if alive(k)], "a child outlived the demo"
        assert not (tmp_path / ".gpuheal/dev-server.pid").exists(), "a clean stop leaves no pid file"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_leftover_dev_server_is_stopped_and_named(tmp_path, monkeypatch):
    """A demo killed outright leaves its dev server; the next start stops the one its pid file
    names (only if it is still a dev server) and says so."""
    from workers import demo

    # argv as the SDK starts it: <...>/temporal server start-dev ...
    server = subprocess.Popen(["/bin/bash", "-c", f'exec -a "{tmp_path}/temporal" {sys.executable} '
                               '-c "import time; time.sleep(300)" server start-dev'])
    time.sleep(0.5)
    try:
        monkeypatch.chdir(tmp_path)
        (tmp_path / ".gpuheal").mkdir()
        (tmp_path / ".gpuheal/dev-server.pid").write_text(str(server.pid))
        said = demo.stop_leftover_dev_server()
        assert said and str(server.pid) in said
        assert server.wait(15) is not None
        assert demo.stop_leftover_dev_server() is None, "the pid file is gone once used"
        other = subprocess.Popen(["sleep", "300"])
        (tmp_path / ".gpuheal/dev-server.pid").write_text(str(other.pid))
        assert demo.stop_leftover_dev_server() is None and other.poll() is None, "a reused pid is not ours to kill"
        other.kill()
    finally:
        server.kill()


async def outcomes_of_the_demo(cwd: Path, env: dict, hand_sent: str) -> None:
    """`gpuheal outcomes --json` reads the demo's ledger: every episode with its phases and the pods
    it interrupted, attributed; `gpuheal whatif --from-ledger` replays that export."""
    cli = [sys.executable, "-m", "workers.cli"]
    run = await asyncio.to_thread(subprocess.run, [*cli, "outcomes", "--json", "--since", "1d"], cwd=cwd, env=env,
                                  capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    doc = json.loads(run.stdout)
    episodes = {e["node"]: e for e in doc["episodes_list"]}
    assert {"gpu-node-1", "gpu-node-2", "gpu-node-3", hand_sent} <= set(episodes), sorted(episodes)
    assert all(e["phases_s"] and e["finding"] for e in episodes.values()), episodes
    app, platform = episodes["gpu-node-1"], episodes["gpu-node-2"]  # Xid 13 on infer-b's node; ECC on train-a's
    assert app["attribution"] == "application" and app["out_of_service_h"] == 0
    assert {(p["pod"].split("/")[-1], p["attribution"]) for p in app["pods"]} == {("infer-b-1", "application")}
    assert platform["attribution"] == "platform" and platform["out_of_service_h"] > 0
    assert ("train-a-0", "platform") in {(p["pod"].split("/")[-1], p["attribution"]) for p in platform["pods"]}
    assert {"quarantine", "drain", "reset", "validation"} <= set(platform["phases_s"]), platform["phases_s"]
    assert doc["pod_interruptions"]["application"] >= 1 and doc["pod_interruptions"]["platform"] >= 2
    (cwd / "export.json").write_text(run.stdout)
    replay = await asyncio.to_thread(subprocess.run, [*cli, "whatif", "--from-ledger", "export.json", "--json",
                                                      "--policy", "default", "--policy", "replace-only"],
                                     cwd=cwd, env=env, capture_output=True, text=True, timeout=600)  # a loaded CI machine took over 240 s
    assert replay.returncode == 0, replay.stderr[-2000:]
    default, replace = json.loads(replay.stdout)["policies"]
    assert default["faults"] == replace["faults"] == len(episodes)
    assert replace["replacements"] > default["replacements"]
