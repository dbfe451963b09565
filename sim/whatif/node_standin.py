"""The what-if's node-local stand-ins (kill, reset, validate, inventory), served on each node's
queue as its agent would: a rung cures the faults it cures and costs its modelled time."""

from __future__ import annotations

from temporalio import activity

import api as c
from policies.findings import Finding
from policies.terms import Rung


class NodeStandIns:
    """Mixed into WhatIfFleet, whose nodes, model and bookkeeping they use."""

    @activity.defn(name=c.NODE_KILL)
    async def kill(self, req: c.KillRequest) -> c.KillResult:
        n, now = self._node(req), await self.now()
        if self._slot(n).has_job and not n.drained:
            self.jobs_interrupted += 1
        self._debt(n, self.model.durations.kill.total_seconds())
        cured = self._cure(n, Rung.KILL)
        await self._changed(n)
        await self._recur_later(n, cured, now)
        return c.KillResult()

    @activity.defn(name=c.NODE_RESET)
    async def reset(self, req: c.ResetRequest) -> c.ResetResult:
        n, now = self._node(req), await self.now()
        self._debt(n, self.model.durations.reset.total_seconds())
        cured = self._cure(n, Rung.RESET)
        await self._changed(n)
        await self._recur_later(n, cured, now)
        return c.ResetResult(reset=req.gpus)

    @activity.defn(name=c.NODE_GPU_PODS)
    async def gpu_pods(self, req: c.GpuPodsRequest) -> c.GpuPodsResult:
        return c.GpuPodsResult(pod_gpus={})

    @activity.defn(name=c.NODE_INVENTORY)
    async def inventory(self, req: c.InventoryRequest) -> c.InventoryResult:
        """The what-if models no hardware inventory: admission records no baseline (it says so)."""
        return c.InventoryResult(inventory=None)

    @activity.defn(name=c.NODE_HARDWARE_IDS)
    async def hardware_ids(self, req: c.HardwareIdsRequest) -> c.HardwareIdsResult:
        """What the node's own NVML says: admission checks these, never a sender's claim."""
        gpus = self._node(req).ids()
        return c.HardwareIdsResult(hardware_ids=sorted({g.uuid for g in gpus} | {g.serial for g in gpus if g.serial}),
                                   gpus=len(gpus))

    @activity.defn(name=c.NODE_VALIDATE)
    async def validate(self, req: c.ValidateRequest) -> c.ValidationResult:
        n = self._node(req)
        self._debt(n, self.model.durations.validation.total_seconds())
        faulty = [Finding(kind=f.finding.kind, xid=f.finding.xid)
                  for d in n.active.values() for f in [self.model.classes[d.fault_class]]]
        return c.ValidationResult(passed=not n.active, findings=faulty, checks=["whatif"])
