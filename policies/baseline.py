"""What a node has (its inventory), what it had when admitted (its baseline), and what the
controller tells its agent to expect (profile and baseline together)."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from policies.profile_model import NicKind, NodeProfile

# The node annotation the controller keeps a node's baseline in (`kubectl get node -o yaml` shows it).
BASELINE_ANNOTATION = "gpuheal.io/baseline"


class NicInventory(BaseModel):
    model_config = ConfigDict(extra="forbid")

    kind: NicKind
    ports_up: int = Field(ge=0, description="Ports of this kind up (ACTIVE, LinkUp).")
    rate_gbps: float = Field(ge=0, description="The slowest up port's rate (Gb/s).")


class NodeInventory(BaseModel):
    """What the node has now, as its probes read it."""

    model_config = ConfigDict(extra="forbid")

    gpus: int = Field(ge=0)
    nics: list[NicInventory] = Field(default_factory=list)
    pcie_generation: int | None = Field(default=None, description="Lowest PCIe generation a GPU's link can reach.")
    pcie_width: int | None = Field(default=None, description="Narrowest GPU link (lanes).")

    def summary(self) -> str:
        nics = ", ".join(f"{n.ports_up}x{n.rate_gbps:g} Gb/s {n.kind.value}" for n in self.nics) or "no RDMA ports"
        pcie = f"PCIe Gen{self.pcie_generation} x{self.pcie_width}" if self.pcie_width else "PCIe unknown"
        return f"{self.gpus} GPUs, {nics}, {pcie}"


class NodeBaseline(NodeInventory):
    """What the node had when it first passed validation: fewer or slower links later is a finding."""

    learned_at: datetime
    validated: bool = Field(description="True: recorded at admission after two validations; False: learned from "
                                        "the first healthy probe cycle of a node that ran before gpuheal.")
    boot_id: str = Field(default="", max_length=64)

    def origin(self) -> str:
        when = self.learned_at.strftime("%Y-%m-%d %H:%M")
        return f"at admission {when}" if self.validated else f"learned (not validated) {when}"


class NodeExpectations(BaseModel):
    """What the controller tells a node's agent: its profile (and why), and its baseline."""

    node: str = ""
    profile_name: str | None = None
    reason: str = ""
    profile: NodeProfile | None = None
    baseline: NodeBaseline | None = None
    recorded: str = Field(default="", description="What this lookup recorded (a learned baseline), if anything.")
