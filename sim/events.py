"""A scenario's `events:` (sim/scenario.Event) done to the simulated fleet, and the side effects
each node saw, for `gpuheal simulate --json`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from datetime import UTC, datetime

from policies.findings import Finding, HealthReport
from workers.reporting import send_report

log = logging.getLogger("gpuheal.sim")
OPERATOR = "scenario-operator"


async def apply_event(fleet, ev) -> None:
    """One event, now. An operator command the episode refuses (nothing to approve, say) is logged
    and the scenario goes on, as a person would read the refusal and carry on."""
    host = fleet.hosts.get(ev.node) if ev.node else None
    if ev.kind == "agent_stop":
        await host.stop_agent()
    elif ev.kind == "agent_start" and host.agent_down:
        host.agent_down = False
        host.agent = host.new_agent()
        host.worker = fleet.new_node_worker(host)
        _run(fleet, host.worker)
    elif ev.kind == "controller_restart" and getattr(fleet, "controller", None) is not None:
        await fleet.controller.shutdown()
        fleet.controller = fleet.new_controller()
        _run(fleet, fleet.controller)
    elif ev.kind == "report":
        await _report(fleet, host, ev.source, [_finding(host, ev)] if ev.fault else [], ev.boot_id)
    elif ev.kind in ("condition_set", "condition_clear"):
        found = [] if ev.kind == "condition_clear" else [
            Finding(kind="node_condition", message=f"node condition {ev.condition}=False")]
        await _report(fleet, host, "watcher", found, None)
    elif ev.kind == "operator":
        name = {"skip": "skip_to"}.get(ev.command, ev.command)
        args = {"pause": ["scenario: pause"], "cancel": ["scenario: cancel"], "skip_to": [ev.rung]}.get(name, [])
        try:
            await fleet.temporal.get_workflow_handle(fleet.episode_id(ev.node)).execute_update(
                name, args=[*args, OPERATOR])
        except Exception as err:  # noqa: BLE001 - refused: said, and the scenario goes on
            log.info("%s %s refused: %s", ev.command, ev.node, err)


def _run(fleet, worker) -> None:
    fleet.restarted = [*getattr(fleet, "restarted", []), worker]
    asyncio.get_running_loop().create_task(worker.run())


def _finding(host, ev) -> Finding:
    gpu = host.nv.gpus[ev.gpu]
    return Finding(kind=ev.fault, xid=ev.xid, gpu_index=ev.gpu, uuid=gpu.uuid, pci=gpu.pci,
                   message=f"{ev.fault} reported by {ev.source}")


async def _report(fleet, host, source: str, findings: list[Finding], boot_id: str | None) -> None:
    host.injected = True  # the node's row and settling count its episode
    fleet.event_seq = getattr(fleet, "event_seq", 10**12) + 1
    report = HealthReport(node=host.name, boot_id=boot_id or f"{host.name}-boot-{host.boots}", seq=fleet.event_seq,
                          source=source, detected_at=datetime.now(UTC), findings=findings)
    await send_report(fleet.temporal, report, node=host.name, generation=fleet.scenario.fleet.generation,
                      cluster=fleet.cluster, task_queue=fleet.task_queue)


def side_effects(fleet, node: str) -> dict:
    """What was done to the node: drains (pods evicted), processes killed with their GPU, GPU
    resets, reboots, terminations and denylist entries added."""
    host = fleet.hosts[node]
    evicted = sorted({f"{e.namespace}/{e.pod}" for e in fleet.kube.evictions if e.node == node and e.allowed})
    denied: dict[str, str] = {}
    ledger = getattr(fleet, "ledger", None)
    if ledger is not None:
        ids = [g.uuid for g in host.nv.gpus] + [g.serial for g in host.nv.gpus if getattr(g, "serial", None)]
        with contextlib.suppress(Exception):
            denied = ledger.denied(ids)
    return {"drained": evicted, "killed": list(host.killed), "resets": list(host.resets), "reboots": host.boots - 1,
            "terminated": host.replaced, "denylisted": sorted(denied)}
