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
from workflows.node_remediation import NodeRemediation, remediation_workflow_id

STATE = Path(".gpuheal")
LOGS = STATE / "logs"


class Progress:
    """Each faulty node's stage. On a terminal the table redraws in place; piped, one line per change."""

    def __init__(self, out=None):
        self.out = out or sys.stdout
        self.tty = self.out.isatty()
        self.rows: dict[str, str] = {}
        self.drawn = 0
        self.shown = 0.0

    async def __call__(self, fleet: SimulatedFleet) -> None:
        now = asyncio.get_running_loop().time()
        if now - self.shown < 1.0:
            return
        self.shown = now
        rows = {}
        for host in fleet.hosts.values():
            if not host.injected:
                continue
            try:
                st = await fleet.temporal.get_workflow_handle(remediation_workflow_id(host.name)).query(
                    NodeRemediation.status)
                rung = st.next_rung.value if st.next_rung else "-"
                last = st.actions[-1].summary[:60] if st.actions else ""
                rows[host.name] = (f"{st.stage.value:<18} rung {rung:<8} {(st.outcome.value if st.outcome else ''):<12} "
                                   f"{last}")
            except Exception:  # noqa: BLE001 - the episode has not started yet
                rows[host.name] = "fault injected, report on its way"
        if self.tty:
            self._redraw(rows)
        else:
            for node, row in rows.items():
                if self.rows.get(node) != row:
                    print(f"  {node:<12} {row}", file=self.out, flush=True)
        self.rows = rows

    def _redraw(self, rows: dict[str, str]) -> None:
        lines = ["-- live --", *(f"  {n:<12} {r}" for n, r in rows.items())]
        up = f"\x1b[{self.drawn}F" if self.drawn else ""
        self.out.write(up + "".join(f"\x1b[2K{line}\n" for line in lines))
        self.out.flush()
        self.drawn = len(lines)


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
