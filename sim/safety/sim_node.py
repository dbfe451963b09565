"""A node of the safety world: the test fleet's node plus its tenants per GPU (and MIG instance),
its fault, and who else touched it."""

from __future__ import annotations

from dataclasses import dataclass, field

from policies.findings import Finding, HealthReport
from sim.safety.schedule import FAULTS, ONE_SHOT
from tests.workflows.fake_node import FakeNode


@dataclass
class SimNode(FakeNode):
    ours: bool = True
    mig: bool = False
    fault: str | None = None
    gpu: int = 0
    event: int = 0
    genuine: list[Finding] = field(default_factory=list)  # every finding this node's own agent reported
    watched: list[Finding] = field(default_factory=list)  # what the condition watchers reported (node-wide)
    cordoned_by_other: bool = False
    tainted: bool = False  # gpuheal's quarantine taint: what kube.check_node and the guard's reconcile look for
    replaced: bool = False
    admitted: bool = True

    def processes(self) -> list[tuple[int, int | None]]:
        """(GPU, MIG instance) of each process on the node: two tenants per GPU under MIG."""
        return [(g, gi) for g in range(self.gpus) for gi in ((0, 1) if self.mig else (None,))]

    def fault_findings(self) -> list[Finding]:
        label, fields, _ = next(f for f in FAULTS if f[0] == self.fault)
        ids = self.ids()[self.gpu]
        gpu_wide = fields["kind"] != "nic_ports_down" and "pci" not in fields
        extra = {"gpu_index": self.gpu, "uuid": ids.uuid, "serial": ids.serial} if gpu_wide else {}
        if gpu_wide and self.mig and fields["kind"] == "xid":
            extra["gpu_instance_id"] = 1  # NVML's Xid event names the MIG instance it hit
        if fields["kind"] in ONE_SHOT:
            extra["event_id"] = f"{self.name}/boot-{self.boot}/{self.event}"
        return [Finding(**fields, **extra, message=label)]

    def report(self, healthy: bool | None = None) -> HealthReport:
        r = super().report(healthy)
        return r.model_copy(update={"instance_host_id": f"h-{self.name}"})
