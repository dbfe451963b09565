"""`gpuheal demo`: the built-in scenario on this machine, its progress on the console and every
server's log in .gpuheal/logs/; with --keep the whole fleet stays up as a playground."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from pathlib import Path

from sim.fleet import SimulatedFleet
from workers import telemetry

STATE = Path(".gpuheal")
LOGS = STATE / "logs"


@contextlib.contextmanager
def logs_to_file(path: Path):
    """Servers' and libraries' output (moto's access log, the dev server, SDK warnings, expected
    activity failures) goes to the log file; the console keeps stdout for progress and results."""
    path.parent.mkdir(parents=True, exist_ok=True)
    log = path.open("a")
    handler = logging.StreamHandler(log)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.addFilter(telemetry.ExpectedFailureOneLine())
    logging.basicConfig(level=logging.INFO, handlers=[handler], force=True)
    # Child processes (the dev server's banner and log) and native code write to fds 1 and 2:
    # both go to the log, and the console gets its own descriptor as sys.stdout.
    saved_out, saved_err = os.dup(1), os.dup(2)
    sys.stdout.flush()
    console, real_stdout = os.fdopen(os.dup(saved_out), "w", buffering=1), sys.stdout
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    sys.stdout = console
    try:
        yield
    finally:
        console.flush()
        sys.stderr.flush()
        sys.stdout = real_stdout
        os.dup2(saved_out, 1)
        os.dup2(saved_err, 2)
        for fd in (saved_out, saved_err):
            os.close(fd)
        console.close()
        log.close()


def fresh_ledger() -> Path:
    """The demo's controller records into .gpuheal/ledger.db (`gpuheal outcomes` reads it there);
    a previous demo's ledger is kept beside it, so its hardware ids make no repeat offenders now."""
    path = STATE / "ledger.db"
    if path.exists():
        for suffix in ("", "-wal", "-shm"):
            old = Path(f"{path}{suffix}")
            if old.exists():
                old.replace(STATE / f"ledger.previous.db{suffix}")
    return path


def playground_commands(fleet: SimulatedFleet, address: str, namespace: str) -> list[str]:
    """Ready-to-paste commands against the running fleet."""
    healthy = [h for h in fleet.hosts.values() if not h.injected] or list(fleet.hosts.values())
    node = healthy[-1].name
    conn = f"--temporal {address} --namespace {namespace}"
    return [
        f"gpuheal report {node} --xid 79 --gpu 1 {conn} --cluster {fleet.cluster} --task-queue {fleet.task_queue}",
        f"kubectl --kubeconfig {STATE / 'kubeconfig'} get nodes -w",
        f"gpuheal status {conn} --cluster {fleet.cluster}",
        f"gpuheal status {node} {conn}",
        f"gpuheal history {node} {conn}",
        "gpuheal outcomes --since 1d",
        f"gpuheal pause --reason 'try it' {conn} --cluster {fleet.cluster}",
        f"gpuheal resume {conn} --cluster {fleet.cluster}",
    ]


async def keep_playing(fleet: SimulatedFleet, address: str, namespace: str) -> None:
    """--keep: the fleet (hosts, agents, controller, fake API server, moto) keeps running; a report
    sent by hand gets the scenario's policy, which is the fleet's controller's."""
    (STATE / "kubeconfig").write_text(Path(fleet.kubeconfig).read_text())
    print("\n--keep: the whole fleet stays up; Ctrl-C (or SIGTERM) stops everything. Try:", flush=True)
    for cmd in playground_commands(fleet, address, namespace):
        print(f"  {cmd}", flush=True)
    await fleet.serve()


def end_with_signals() -> None:
    """SIGINT and SIGTERM cancel the demo's task, so every child it started ends with it."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, task.cancel)
