"""A node of the test fleet (its GPUs, its fault, what cures it, whether it comes back), and what
its agent serves on node/<cluster>/<node>."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from datetime import UTC, datetime

from temporalio import activity

import api as c
from policies.findings import Finding, GpuIds, HealthReport
from policies.terms import Rung


@dataclass
class FakeNode:
    name: str
    findings: list[Finding]
    cured_by: str = "reboot"  # the lowest rung that clears the fault, or "none"
    reboot_returns: bool = True
    recurs: int = 0  # faults coming back after return to service
    gpus: int = 8
    faulty: bool = True
    boot: int = 0
    seq: int = 0
    cordoned: bool = False
    calls: list[str] = field(default_factory=list)
    hold: asyncio.Event | None = None  # drain waits on it when set (tests steer timing)
    pdb_stuck: bool = False  # the drain times out with the job's pod still there (escalate)
    agent: bool = True  # False: nobody polls node/<cluster>/<node> and no report comes from a new boot
    # After a reboot that returns: "agent" reports from the new boot and serves; "once" reports once
    # from it, then is gone; "watcher": only a condition watcher reports the kubelet's new boot id.
    after_reboot: str = "agent"
    lifecycle_hook: bool = False  # replace: a termination hook holds the instance (Terminating:Wait)
    replaced_boot: int | None = None  # the boot whose host was replaced (the Node's replaced annotation)
    exists: bool = True  # False: the API server has no such node
    fail: set[str] = field(default_factory=set)  # activity names that fail for good (NoEffect) on this node
    pod_gpus: dict[str, list[int]] = field(default_factory=dict)  # what node.gpu_pods answers
    requests: dict[str, list] = field(default_factory=dict)  # activity name -> requests seen

    def ids(self) -> list[GpuIds]:
        return [GpuIds(index=i, uuid=f"GPU-{self.name}-{i}", serial=f"SN-{self.name}-{i // 2}") for i in range(self.gpus)]

    def report(self, healthy: bool | None = None) -> HealthReport:
        self.seq += 1
        healthy = (not self.faulty) if healthy is None else healthy
        return HealthReport(node=self.name, boot_id=f"boot-{self.name}-{self.boot}", seq=self.seq,
                            gpus=self.ids(), findings=[] if healthy else self.findings,
                            detected_at=datetime.now(UTC))

    def apply(self, rung: str) -> None:
        if self.faulty and Rung.cures(rung, self.cured_by):
            self.faulty = False


class FakeAgentActivities:
    """Mixed into FakeFleet, whose nodes they act on."""

    @activity.defn(name=c.NODE_KILL)
    async def kill(self, req: c.KillRequest) -> c.KillResult:
        n = self._node(req)
        n.apply("kill")
        return c.KillResult()

    @activity.defn(name=c.NODE_RESET)
    async def reset(self, req: c.ResetRequest) -> c.ResetResult:
        n = self._node(req)
        await asyncio.sleep(self.act_delay)
        n.apply("reset")
        return c.ResetResult(reset=req.gpus)

    @activity.defn(name=c.NODE_GPU_PODS)
    async def gpu_pods(self, req: c.GpuPodsRequest) -> c.GpuPodsResult:
        return c.GpuPodsResult(pod_gpus=self._node(req).pod_gpus)

    @activity.defn(name=c.NODE_HARDWARE_IDS)
    async def hardware_ids(self, req: c.HardwareIdsRequest) -> c.HardwareIdsResult:
        """What NVML on the node says: its own GPUs' ids, whoever started the admission."""
        n = self._node(req)
        gpus = n.ids()
        return c.HardwareIdsResult(hardware_ids=sorted({g.uuid for g in gpus} | {g.serial for g in gpus if g.serial}),
                                   gpus=len(gpus))

    @activity.defn(name=c.NODE_INVENTORY)
    async def inventory(self, req: c.InventoryRequest) -> c.InventoryResult:
        """The stand-in models no hardware inventory: admission records no baseline (it says so)."""
        return c.InventoryResult(inventory=None)

    @activity.defn(name=c.NODE_VALIDATE)
    async def validate(self, req: c.ValidateRequest) -> c.ValidationResult:
        n = self._node(req)
        return c.ValidationResult(passed=not n.faulty, findings=n.findings if n.faulty else [], checks=["fake"])
