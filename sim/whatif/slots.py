"""A what-if node, and the slot it holds in the fleet: the slot's time out of service is what the
what-if counts (a replacement brings a new node to the same slot)."""

from __future__ import annotations

from dataclasses import dataclass, field

from policies.findings import GpuIds
from sim.whatif.faultmodel import FaultDraw

GPUS = 8


@dataclass
class Node:
    name: str
    slot: int
    exists: bool = True
    admitted: bool = True
    cordoned: bool = False
    rebooting: bool = False
    drained: bool = False
    boot: int = 0
    seq: int = 0
    active: dict[int, FaultDraw] = field(default_factory=dict)  # fault id -> the fault, while uncured

    def ids(self) -> list[GpuIds]:
        return [GpuIds(index=i, uuid=f"GPU-{self.name}-{i}", serial=f"SN-{self.name}-{i}") for i in range(GPUS)]

    def down(self) -> bool:
        return not self.exists or not self.admitted or self.cordoned or self.rebooting or bool(self.active)


@dataclass
class Slot:
    index: int
    node: Node
    has_job: bool
    replacements: int = 0
    down_since: float | None = None
    cause: str = ""
    debt: float = 0.0  # activity time (kill, reset, validation) the test server's clock did not run
    intervals: list[tuple[float, float, str]] = field(default_factory=list)

    def update(self, now: float, since: float | None = None) -> None:
        if self.node.down():
            if self.down_since is None:
                if self.intervals and self.intervals[-1][1] > now:  # still paying the last one's debt
                    start, _, self.cause = self.intervals.pop()
                    self.down_since = start
                else:
                    self.down_since, self.debt = (now if since is None else since), 0.0
                    first = min(self.node.active.values(), key=lambda f: f.id, default=None)
                    self.cause = first.fault_class if first else "remediation"
        elif self.down_since is not None:
            self.intervals.append((self.down_since, now + self.debt, self.cause))
            self.down_since, self.debt = None, 0.0
