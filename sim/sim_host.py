"""A simulated host: GPUs behind the simulated NVML, InfiniBand ports in a sysfs tree, a real agent
probing them and serving node-local activities; it reboots when EC2 was asked to (the reboot tags)
and a fault clears when a rung at or above its `cured_by` acts on it."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from temporalio import activity
from temporalio.worker import Worker

import api as c
from activities.node import NodeActivities
from activities.providers.aws import REBOOT_KEY_TAG, REBOOT_STATE_TAG
from policies.findings import Finding
from policies.terms import Rung
from sim.nvml import SimulatedNvml
from sim.scenario import Fault
from sim.sysfs import PORT_UP, write_ib_ports
from workers.agent import Agent
from workers.operator import suspect_report

log = logging.getLogger("gpuheal.sim")
PORT_DOWN = ("1: DOWN", "2: Polling", "400 Gb/sec (4X NDR)")


class SimNodeActivities(NodeActivities):
    """The real node-local activities; the simulated host learns which rung acted on it."""

    def __init__(self, host: SimHost, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.host = host

    @activity.defn(name=c.NODE_KILL)
    async def kill_gpu_processes(self, req: c.KillRequest) -> c.KillResult:
        result = await super().kill_gpu_processes(req)
        if not req.dry_run:
            self.host.killed += [{"pid": p.pid, "gpu": p.gpu_index, "pod": p.pod} for p in result.killed]
            self.host.acted_on("kill")
        return result

    @activity.defn(name=c.NODE_RESET)
    async def reset_gpu(self, req: c.ResetRequest) -> c.ResetResult:
        self.host.calls.append(c.NODE_RESET)
        if not req.dry_run:
            self.host.acted_on("reset")
        result = await super().reset_gpu(req)
        if not req.dry_run:
            self.host.resets.append(result.reset)
        return result

    @activity.defn(name=c.NODE_VALIDATE)
    async def validate(self, req: c.ValidateRequest) -> c.ValidationResult:
        self.host.calls.append(c.NODE_VALIDATE)
        return await super().validate(req)


@dataclass
class SimHost:
    name: str
    fleet: Any  # the SimulatedFleet it belongs to (sim/fleet.py, which imports this module)
    iid: str
    root: Path
    nv: SimulatedNvml
    fault: Fault | None = None
    recurs_left: int = 0
    await_uncordon: bool = False
    boots: int = 1
    seen_reboot_key: str | None = None
    replaced: bool = False
    agent: Agent | None = None
    worker: Worker | None = None  # the agent's node-local worker on node/<cluster>/<node>
    agent_down: bool = False  # the agent was stopped: no probes, no reports, nobody polls node/<cluster>/<node>
    injected: bool = False
    calls: list[str] = field(default_factory=list)  # node-local activities run here, in order
    killed: list[dict] = field(default_factory=list)  # processes the kill activity signalled: pid, gpu, pod
    resets: list[list[int]] = field(default_factory=list)  # GPUs of each reset

    @property
    def sysfs(self) -> Path:
        return self.root / "ib"

    @property
    def proc(self) -> Path:
        return self.root / "proc"

    def new_agent(self) -> Agent:
        (self.proc / "sys/kernel/random/boot_id").write_text(f"{self.name}-boot-{self.boots}\n")
        return Agent(self.fleet.temporal, self.fleet.agent_config(self), self.nv, boot_id=f"{self.name}-boot-{self.boots}")

    def inject(self) -> None:
        f = self.fault
        if f.kind == "xid":
            self.agent.add_events([Finding(kind="xid", xid=f.xid, gpu_index=f.gpu, uuid=self.nv.gpus[f.gpu].uuid,
                                           pci=self.nv.gpus[f.gpu].pci, message=f"simulated Xid {f.xid}")])
        elif f.kind == "nic_ports_down":
            write_ib_ports(self.sysfs, [PORT_UP] * 7 + [PORT_DOWN])
        elif f.kind == "none":
            pass
        else:
            self.nv.inject(f.kind, gpu=f.gpu)
        self.injected = True

    def cure(self) -> None:
        # The probed conditions clear; the agent keeps holding the kernel-log event it saw and
        # re-sends it, as on a real host (only a reboot starts a fresh log).
        self.nv.clear()
        write_ib_ports(self.sysfs, [PORT_UP] * 8)
        if self.recurs_left > 0:
            self.recurs_left -= 1
            self.await_uncordon = True

    async def notice(self) -> None:
        """Someone suspects the node (the fault's `suspect`): the report `gpuheal report --suspect` sends."""
        if self.fault is not None and self.fault.suspect:
            await suspect_report(self.fleet.temporal, self.name, self.fault.suspect, timedelta(0), self.fleet.cluster,
                                 self.fleet.task_queue)

    async def stop_agent(self) -> None:
        """The agent dies (OOM-killed, evicted, crash-looping): its probe loop and its worker stop,
        and a reboot does not bring it back."""
        self.agent_down = True
        if self.worker is not None:
            await self.worker.shutdown()

    def acted_on(self, rung: str) -> None:
        if self.fault is not None and self.injected and Rung.cures(rung, self.fault.cured_by):
            self.cure()

    async def tick(self) -> None:
        """One beat of the host: reboots, recurrences, then the agent's probe cycle."""
        if self.replaced:
            return
        await self._follow_cloud()
        if self.await_uncordon and not self.fleet.kube.get("Node", "", self.name)["spec"].get("unschedulable"):
            self.await_uncordon = False
            self.inject()  # the fault comes back once the node is in service again
            await self.notice()
        if self.agent_down:
            return
        try:
            await self.agent.step()
        except Exception as err:  # noqa: BLE001 - as the real agent's loop: a failed send is retried next poll
            log.info("%s: probe cycle failed (%s), retried next poll", self.name, err)

    async def _follow_cloud(self) -> None:
        found = await asyncio.to_thread(self.fleet.ec2.describe_instances, InstanceIds=[self.iid])
        inst = found["Reservations"][0]["Instances"][0]
        if inst["State"]["Name"] in ("shutting-down", "terminated"):
            self.replaced = True
            return
        tags = {t["Key"]: t["Value"] for t in inst.get("Tags", [])}
        key = tags.get(REBOOT_KEY_TAG)
        if key and key != self.seen_reboot_key and tags.get(REBOOT_STATE_TAG) == "sent":
            self.seen_reboot_key = key
            self.fleet.kube.set_node_ready(self.name, False)
            self.acted_on("reboot")
            self.boots += 1
            self.fleet.kube.set_boot_id(self.name, f"{self.name}-boot-{self.boots}")
            self.fleet.kube.set_node_ready(self.name, True)
            self.agent = self.new_agent()
