"""The words every policy module shares: the rungs in their one order, GPU generations, NVIDIA's
action words, attribution, and the strict model base (a misspelt key is an error naming it)."""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict


class Rung(StrEnum):
    """The remedies, mildest first. The ladder climbs in this order."""

    KILL = "kill"
    RESET = "reset"
    REBOOT = "reboot"
    REPLACE = "replace"

    @property
    def disruptive(self) -> bool:
        """Disruptive rungs take the node's work away and need a lease from the fleet guard."""
        return self is not Rung.KILL

    @property
    def rank(self) -> int:
        """Place on the ladder, mildest 0: the one order every module compares rungs by."""
        return list(Rung).index(self)

    def above(self) -> Rung | None:
        order = list(Rung)
        return order[self.rank + 1] if self.rank + 1 < len(order) else None

    @staticmethod
    def cures(rung: str, lowest: str) -> bool:
        """Whether `rung` is at or above `lowest`, the lowest rung that clears a fault ("none": no rung does)."""
        return lowest != "none" and Rung(rung).rank >= Rung(lowest).rank


class Generation(StrEnum):
    AMPERE = "ampere"
    HOPPER = "hopper"
    BLACKWELL = "blackwell"


class XidAction(StrEnum):
    """NVIDIA's immediate-action words (gpu-faults.md section 1)."""

    RESTART_APP = "RESTART_APP"
    RESET_GPU = "RESET_GPU"
    RESTART_BM = "RESTART_BM"
    RESTART_VM = "RESTART_VM"
    CHECK_MECHANICALS = "CHECK_MECHANICALS"
    CONTACT_SUPPORT = "CONTACT_SUPPORT"
    IGNORE = "IGNORE"


Attribution = Literal["platform", "application"]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")
