"""Node profiles: what a healthy node of one kind has (policies/profiles.py selects them and
applies their overrides)."""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import Field, field_validator, model_validator

from policies.durations import Duration
from policies.findings import FindingKind
from policies.load import SkuFloors
from policies.terms import Generation, Rung, Strict


class NicKind(StrEnum):
    INFINIBAND = "infiniband"
    EFA = "efa"
    ROCE = "roce"
    NONE = "none"


class NetworkProfile(Strict):
    kind: NicKind = Field(description="The RDMA adapters a healthy node has: infiniband, efa, roce, or none.")
    ports: int = Field(default=0, ge=0, le=256, description="Ports of that kind that must be up (ACTIVE, LinkUp).")
    rate_gbps: float = Field(default=0, ge=0, le=10000, description="Rate each counted port has at least (Gb/s, sysfs `rate`).")

    @model_validator(mode="after")
    def _consistent(self) -> NetworkProfile:
        if self.kind is NicKind.NONE and self.ports:
            raise ValueError("kind none expects no ports: set ports to 0 or name the adapters' kind")
        if self.kind is not NicKind.NONE and (self.ports == 0 or self.rate_gbps <= 0):
            raise ValueError(f"kind {self.kind.value} needs ports and rate_gbps above 0 (kind none: no adapters)")
        return self


class PcieProfile(Strict):
    generation: int | None = Field(default=None, ge=1, le=7, description="PCIe generation each GPU's link reaches.")
    width: int | None = Field(default=None, description="PCIe lanes each GPU's link has (x16: 16).")

    @field_validator("width")
    @classmethod
    def _lanes(cls, v: int | None) -> int | None:
        if v is not None and v not in (1, 2, 4, 8, 16, 32):
            raise ValueError("must be one of 1, 2, 4, 8, 16, 32")
        return v


class ProfileMatch(Strict):
    node_groups: list[str] = Field(default_factory=list, description="Values of a node-group label (`node_group_labels`).")
    instance_types: list[str] = Field(default_factory=list, description="Values of `node.kubernetes.io/instance-type`.")
    gpu_products: list[str] = Field(default_factory=list,
                                    description="Values of `nvidia.com/gpu.product` (set by GPU feature discovery).")
    labels: dict[str, str] = Field(default_factory=dict, description="Other labels that must all be equal, e.g. "
                                                                       "`nvidia.com/gpu.count: \"1\"`.")


class RungOverride(Strict):
    """Partial RungPolicy: only the fields given replace the policy's."""

    action_timeout: Duration | None = None
    retries: int | None = Field(default=None, ge=1, le=20)
    return_timeout: Duration | None = None
    requires_approval: bool | None = None
    approval_timeout: Duration | None = None


class LadderOverride(Strict):
    kill: RungOverride | None = None
    reset: RungOverride | None = None
    reboot: RungOverride | None = None
    replace: RungOverride | None = None


class NodeProfile(Strict):
    """What a healthy node of one kind has. Unset figures are not guessed: what the node had when
    it was admitted (its learned baseline) is held against it instead."""

    description: str = Field(default="", description="What kind of node this is.")
    sources: list[str] = Field(default_factory=list, description="Where each figure comes from.")
    match: ProfileMatch = Field(default_factory=ProfileMatch, description="Which nodes get it: a node group, instance "
                                 "type or GPU product listed (the most specific wins), every `labels` entry holding.")
    gpus: int | None = Field(default=None, ge=0, le=64, description="GPUs NVML must see; null: not declared.")
    generation: Generation | None = Field(default=None, description="GPU generation (the Xid catalog's column).")
    network: NetworkProfile | None = Field(default=None, description="RDMA adapters; null: not declared.")
    pcie: PcieProfile | None = Field(default=None, description="Each GPU's PCIe link; null: not declared.")
    ladder: LadderOverride = Field(default_factory=LadderOverride, description="Per-rung changes on these nodes.")
    finding_rungs: dict[FindingKind, Rung] = Field(default_factory=dict,
                                                   description="Starting rung per finding kind on these nodes.")
    load_floors: dict[str, SkuFloors] = Field(
        default_factory=dict, description="Load-test floors per GPU product on these nodes (over `validation.load.floors`), "
                                          "judged in every validation tier.")
    mode: Literal["act", "dry_run", "observe"] = Field(
        default="act", description="act; dry_run: record what would be done; observe: detect and record only, never cordon.")
