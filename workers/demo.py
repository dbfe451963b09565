"""`gpuheal demo`: the built-in scenario on this machine, its progress on the console and every
server's log in .gpuheal/logs/; with --keep the whole fleet stays up as a playground."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from sim.fleet import SimulatedFleet
from workers import telemetry

STATE = Path(".gpuheal")
LOGS = STATE / "logs"
DEV_SERVER_PID = STATE / "dev-server.pid"


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


def children(pid: int) -> list[int]:
    """Processes whose parent is `pid` (Linux /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def _is_dev_server(pid: int) -> bool:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return b"start-dev" in argv and any(a.endswith(b"temporal") for a in argv)


def stop_leftover_dev_server() -> str | None:
    """A demo killed outright (SIGKILL, a closed terminal) leaves its dev server holding :8233: stop
    the one our own pid file names, if it is still a dev server, and say so."""
    try:
        pid = int(DEV_SERVER_PID.read_text())
    except (OSError, ValueError):
        return None
    DEV_SERVER_PID.unlink(missing_ok=True)
    if not _is_dev_server(pid):
        return None
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    while _is_dev_server(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if _is_dev_server(pid):
        os.kill(pid, signal.SIGKILL)
    return f"gpuheal demo: stopped the dev server an earlier demo left running (pid {pid})"


@contextlib.asynccontextmanager
async def dev_server_watched():
    """Record the dev server this process started, and keep a watchdog that stops it if this
    process dies without shutting it down (SIGKILL gives no chance to clean up)."""
    servers = [pid for pid in children(os.getpid()) if _is_dev_server(pid)]
    if not servers:
        yield
        return
    STATE.mkdir(parents=True, exist_ok=True)
    DEV_SERVER_PID.write_text(str(servers[0]))
    watchdog = subprocess.Popen(
        ["/bin/sh", "-c", f"while kill -0 {os.getpid()} 2>/dev/null; do sleep 1; done; kill {servers[0]} 2>/dev/null"],
        start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield
    finally:
        watchdog.kill()
        watchdog.wait()
        DEV_SERVER_PID.unlink(missing_ok=True)


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
    """Ready-to-paste commands against the running fleet: absolute paths, so they work from any
    shell without activating the venv."""
    healthy = [h for h in fleet.hosts.values() if not h.injected] or list(fleet.hosts.values())
    node = healthy[-1].name
    local = Path(sys.executable).parent / "gpuheal"
    gpuheal = str(local) if local.exists() else "gpuheal"
    conn = f"--temporal {address} --namespace {namespace}"
    return [
        f"{gpuheal} report {node} --xid 79 --gpu 1 {conn} --cluster {fleet.cluster} --task-queue {fleet.task_queue}",
        f"kubectl --kubeconfig {(STATE / 'kubeconfig').resolve()} get nodes -w",
        f"{gpuheal} status {conn} --cluster {fleet.cluster}",
        f"{gpuheal} status {node} {conn} --cluster {fleet.cluster}",
        f"{gpuheal} history {node} {conn} --cluster {fleet.cluster}",
        f"{gpuheal} outcomes --since 1d --ledger {(STATE / 'ledger.db').resolve()}",
        f"{gpuheal} pause --reason 'try it' {conn} --cluster {fleet.cluster}",
        f"{gpuheal} resume {conn} --cluster {fleet.cluster}",
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
