"""Health findings and the health report: the one format every detector sends to a node's workflow."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field


class FindingKind(StrEnum):
    XID = "xid"
    ECC_DBE = "ecc_dbe"
    ROW_REMAP_FAILURE = "row_remap_failure"
    ROW_REMAP_PENDING = "row_remap_pending"
    RETIRED_PAGES_PENDING = "retired_pages_pending"
    GPU_LOST = "gpu_lost"
    GPU_COUNT_MISMATCH = "gpu_count_mismatch"
    PCIE_DEGRADED = "pcie_degraded"
    NVLINK_DOWN = "nvlink_down"
    NIC_PORTS_DOWN = "nic_ports_down"
    THERMAL = "thermal"
    PROBE_BROKEN = "probe_broken"
    RECOVERY_ACTION = "recovery_action"
    NODE_CONDITION = "node_condition"
    # Found only under load (health/load/): a status query never shows them.
    SILENT_DATA_CORRUPTION = "silent_data_corruption"
    MEMORY_PATTERN = "memory_pattern"
    DEGRADED = "degraded"
    CLOCK_SLOWDOWN = "clock_slowdown"
    LOAD_TEST_FAILED = "load_test_failed"
    SUSPECT = "suspect"


class RecoveryAction(StrEnum):
    """NVML_GPU_RECOVERY_ACTION_* (Xid 154 and NVML field 230), by name."""

    NONE = "NONE"
    GPU_RESET = "GPU_RESET"
    NODE_REBOOT = "NODE_REBOOT"
    DRAIN_P2P = "DRAIN_P2P"
    DRAIN_AND_RESET = "DRAIN_AND_RESET"
    RECOVER_IMEX_DOMAIN = "RECOVER_IMEX_DOMAIN"
    BUS_RESET = "BUS_RESET"
    SYSTEM_REBOOT = "SYSTEM_REBOOT"


# NVML's numeric values, in order (gpu-faults.md section 1).
RECOVERY_ACTION_BY_CODE = dict(enumerate(RecoveryAction))


class Finding(BaseModel):
    """One fault a probe found. GPU fields are null for node-wide findings (NICs, probes)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: FindingKind
    xid: int | None = Field(default=None, ge=0, le=100000)
    gpu_index: int | None = Field(default=None, ge=0, le=1023)
    uuid: str | None = Field(default=None, max_length=128)
    serial: str | None = Field(default=None, max_length=128)
    pci: str | None = Field(default=None, max_length=64)
    gpu_instance_id: int | None = Field(default=None, ge=0, le=0xFFFFFFFE,
                                        description="MIG GPU instance the event names (NVML event data); None: no MIG instance.")
    compute_instance_id: int | None = Field(default=None, ge=0, le=0xFFFFFFFE,
                                            description="MIG compute instance the event names; None: every one of the GPU instance.")
    recovery_action: RecoveryAction | None = None
    fatal: bool | None = Field(default=None, description="From NVLink5 subcodes (Fatal/Nonfatal) or the probe.")
    message: str = Field(default="", max_length=2000)
    event_id: str | None = Field(
        default=None, max_length=128,
        description="Identity of the one-shot event (kernel-log record, NVML event) behind the finding: a re-send "
                    "of a held event carries the same id. None: a condition, probed afresh each poll.")

    def label(self) -> str:
        """Short human text: "Xid 79 on GPU 2"."""
        what = f"Xid {self.xid}" if self.xid is not None else self.kind.value
        if self.kind is FindingKind.RECOVERY_ACTION and self.recovery_action:
            what = f"recovery action {self.recovery_action.value}"
        return f"{what} on GPU {self.gpu_index}" if self.gpu_index is not None else what


class GpuIds(BaseModel):
    """A GPU's immutable hardware ids, what the denylist keys on."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    index: int = Field(ge=0, le=1023)
    uuid: str = Field(min_length=1, max_length=128)
    serial: str | None = Field(default=None, max_length=128)
    pci: str | None = Field(default=None, max_length=64)


MAX_FINDINGS = 512
# Node-wide findings that point at the machine itself (not at a probe, a condition or a GPU).
NODE_HARDWARE_KINDS = {FindingKind.NIC_PORTS_DOWN, FindingKind.PCIE_DEGRADED, FindingKind.GPU_COUNT_MISMATCH}


class HealthReport(BaseModel):
    """What a detector signals to `remediate/<cluster>/<node>`. No findings means the node is healthy."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    node: str = Field(min_length=1, max_length=253)
    boot_id: str = Field(min_length=1, max_length=64)
    seq: int = Field(ge=0, description="Monotonic per boot id: a lower one than seen is stale.")
    source: str = Field(default="agent", max_length=64, description="agent, watcher, manual, ...")
    agent_version: str = Field(default="", max_length=64)
    detected_at: datetime | None = Field(default=None, description="Wall clock of the detector.")
    instance_host_id: str | None = Field(default=None, max_length=128)
    gpus: list[GpuIds] = Field(default_factory=list, max_length=1024)
    findings: list[Finding] = Field(default_factory=list, max_length=MAX_FINDINGS)

    @property
    def healthy(self) -> bool:
        return not self.findings

    def hardware_ids(self) -> list[str]:
        """Every immutable id in the report (GPU UUIDs and serials, the instance host id), sorted."""
        ids = {g.uuid for g in self.gpus} | {g.serial for g in self.gpus if g.serial}
        ids |= {f.uuid for f in self.findings if f.uuid} | {f.serial for f in self.findings if f.serial}
        if self.instance_host_id:
            ids.add(self.instance_host_id)
        return sorted(ids)

    def implicated_ids(self, findings: list[Finding]) -> list[str]:
        """The immutable ids of the hardware these findings name: the GPU of a GPU finding (uuid and
        serial), the instance for a node-wide hardware finding. What a replacement may denylist."""
        by_index = {g.index: g for g in self.gpus}
        by_uuid = {g.uuid: g for g in self.gpus}
        ids: set[str] = set()
        for f in findings:
            gpu = by_uuid.get(f.uuid) if f.uuid else None
            gpu = gpu or (by_index.get(f.gpu_index) if f.gpu_index is not None else None)
            if gpu is not None:
                ids |= {gpu.uuid, *([gpu.serial] if gpu.serial else [])}
            elif f.uuid or f.serial:
                ids |= {i for i in (f.uuid, f.serial) if i}
            elif f.kind in NODE_HARDWARE_KINDS and self.instance_host_id:
                ids.add(self.instance_host_id)
        return sorted(ids)

    def fingerprint(self) -> tuple:
        """What a duplicate shares: same findings regardless of order."""
        return tuple(sorted(f.model_dump_json() for f in self.findings))


CONDITION_EVENT = "condition/"


def condition_event_id(condition_type: str, since: datetime | None) -> str | None:
    """A node condition's event id: its type and lastTransitionTime, the same from every watcher
    replica and every re-send, so the episode counts it once. None: no transition time to name it by."""
    if since is None:
        return None
    return f"{CONDITION_EVENT}{condition_type[:60]}/{since.isoformat()}"


def condition_since(event_id: str | None) -> datetime | None:
    """When the condition behind a condition event id was set; None for any other finding."""
    if not event_id or not event_id.startswith(CONDITION_EVENT):
        return None
    try:
        return datetime.fromisoformat(event_id.rsplit("/", 1)[1])
    except ValueError:
        return None
