"""Requests and results of the node-local activities the agent serves (activities/node.py,
activities/node_profile.py): kill, reset, validate, inventory, boot id."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field

from api.common import NodeRequest
from policies.baseline import NodeInventory
from policies.findings import Finding
from policies.load import GpuLoadResult, LoadReport, LoadTestPolicy, SkuReference


# --- node-local ---------------------------------------------------------------------------------
class GpuProcess(BaseModel):
    pid: int
    gpu_index: int
    pod: str | None = Field(default=None, description="namespace/name from the process's cgroup, when in a pod.")
    used_memory_bytes: int | None = None
    gpu_instance_id: int | None = Field(default=None, description="MIG GPU instance (None: MIG off).")
    compute_instance_id: int | None = None
    start_ticks: int | None = Field(default=None, description="/proc/<pid>/stat starttime: a reused pid differs.")


class MigTarget(BaseModel):
    """An implicated MIG instance: only its processes are stopped on a GPU in MIG mode."""

    gpu_index: int
    gpu_instance_id: int
    compute_instance_id: int | None = Field(default=None, description="None: every compute instance of the GPU instance.")


class KillRequest(NodeRequest):
    gpus: list[int] = Field(default_factory=list, description="The implicated GPUs. Empty: none (see all_gpus).")
    all_gpus: bool = Field(default=False, description="Every GPU's processes (a drained node before a whole-node reset).")
    mig: list[MigTarget] = Field(default_factory=list,
                                 description="On a GPU in MIG mode only these instances' processes; none named: nothing there.")
    grace_s: float = 10.0


class KillResult(BaseModel):
    killed: list[GpuProcess] = Field(default_factory=list)
    dry_run: bool = False
    spared: list[str] = Field(default_factory=list, description="What was left alone, and why (MIG, a reused pid).")


class ResetRequest(NodeRequest):
    gpus: list[int] = Field(default_factory=list, description="Empty: every GPU.")


class ResetResult(BaseModel):
    reset: list[int] = Field(default_factory=list)
    dry_run: bool = False


class ValidateRequest(NodeRequest):
    dcgm_level: int = 2
    dcgm_required: bool = False
    expected_gpus: int | None = None
    tier: str | None = Field(default=None, description="Load-test tier (quick, repair, admission); None: status "
                                                       "probes only (a node still in service, or an old history).")
    load: LoadTestPolicy | None = None
    references: dict[str, SkuReference] = Field(default_factory=dict, description="Per-SKU fleet medians to judge against.")
    gpus: list[int] = Field(default_factory=list, description="GPUs to load-test; empty: all.")


class ValidationResult(BaseModel):
    passed: bool
    findings: list[Finding] = Field(default_factory=list)
    checks: list[str] = Field(default_factory=list, description="What ran: nvml, kmsg, nics, dcgm-r2 ...")
    load: LoadReport | None = Field(default=None, description="The load test's figures, per GPU.")


class LoadFiguresRecord(BaseModel):
    """One validation's figures for the ledger, per node and GPU serial."""

    node: str
    episode: str
    tier: str
    at: datetime
    gpus: list[GpuLoadResult]


class BaselineRequest(BaseModel):
    skus: list[str] = Field(default_factory=list, description="Empty: every SKU measured.")


class BaselineResult(BaseModel):
    references: dict[str, SkuReference] = Field(default_factory=dict)


class BootIdRequest(NodeRequest):
    pass


class GpuPodsRequest(NodeRequest):
    pass


class GpuPodsResult(BaseModel):
    pod_gpus: dict[str, list[int]] = Field(default_factory=dict,
                                           description="'uid:<pod uid>' -> the GPUs its processes run on.")


class HardwareIdsRequest(NodeRequest):
    pass


class HardwareIdsResult(BaseModel):
    """The node's own GPU ids, read by its agent (NVML): what admission checks, never a sender's claim."""

    hardware_ids: list[str] = Field(default_factory=list, description="GPU UUIDs and serials, sorted.")
    gpus: int = 0


class ExpectationsRequest(BaseModel):
    node: str
    observed: NodeInventory | None = Field(
        default=None, description="What the agent's first healthy cycle saw: recorded as the node's baseline "
                                  "(learned, not validated) when it has none yet.")
    boot_id: str = ""


class RecordBaselineRequest(NodeRequest):
    inventory: NodeInventory
    validated: bool = True
    boot_id: str = ""


class InventoryRequest(NodeRequest):
    pass


class InventoryResult(BaseModel):
    inventory: NodeInventory | None = Field(default=None, description="None: a probe could not read what is there.")
    findings: list[Finding] = Field(default_factory=list, description="Faults seen while taking it: nothing is recorded then.")
