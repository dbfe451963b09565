"""What the safety world records: one Effect per thing done, asked or heard, in order, and which
kinds change a node or destroy something (what the invariants check)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import api as c

# What an episode does to a node (attribute_pods marks its pods; the rest change the node).
SIDE_EFFECTS = {c.KUBE_QUARANTINE, c.KUBE_RETURN_TO_SERVICE, c.KUBE_ATTRIBUTE_PODS, c.KUBE_DRAIN, c.CLOUD_REBOOT,
                c.CLOUD_REPLACE, c.NODE_KILL, c.NODE_RESET, c.LEDGER_DENYLIST}
DESTRUCTIVE = {c.KUBE_DRAIN, c.NODE_KILL, c.NODE_RESET, c.CLOUD_REBOOT, c.CLOUD_REPLACE, c.LEDGER_DENYLIST}


@dataclass
class Effect:
    """One thing done (or asked, or heard) in the world, in the order it happened."""

    n: int
    kind: str
    node: str
    wf: str = ""  # the workflow that asked (empty: the schedule itself)
    dry: bool = False
    detail: dict[str, Any] = field(default_factory=dict)

    def __str__(self) -> str:
        extra = " ".join(f"{k}={v}" for k, v in self.detail.items())
        return f"#{self.n} {self.kind} {self.node}{' (dry run)' if self.dry else ''} by {self.wf or '-'} {extra}".rstrip()
