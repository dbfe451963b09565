"""Every `workflow.patched` id, the workflows that branch on it, and when it may be deprecated.

A patch's life (Temporal's patching API): (1) `if workflow.patched(id): new else: old`, deployed;
(2) once no run that started before (1) is open, `workflow.deprecate_patch(id)` and only the new
branch; (3) once no run that started before (2) is open, the call goes too. A run that continues as
new is a new run: it takes every patch then. tests/workflows/test_patch_register.py fails when an id
is branched on without an entry here.

BASELINE: the 55 patch ids of the first passes were squashed into it before 1.0 (the old branches
deleted, tests/histories/ re-recorded from it). A run started on a build before it does not replay
on it: upgrading across the baseline is the README's "Upgrading across the baseline"."""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType

BASELINE = "2026-12-07"
EPISODE = "NodeRemediation"
ADMISSION = "NodeAdmission"
GUARD = "FleetGuard"

# What must be true of the open runs of each workflow before a patch on it is deprecated.
RETIRE_WHEN = MappingProxyType({
    EPISODE: "no remediate/ run started before the deploy is open (`gpuheal status`; an episode ends or "
             "continues as new at its history_limit, and may be cancelled to take the new rules at once)",
    ADMISSION: "no admit/ run started before the deploy is open (an admission lasts at most its "
               "approval_timeout plus validation)",
    GUARD: "every fleet-guard/ run started since the deploy (`temporal workflow describe`: its start "
           "time); the controller's `upgrade` update at its start has a guard continue as new",
})


@dataclass(frozen=True)
class Patch:
    id: str
    workflows: tuple[str, ...]
    since: str  # the issue or pass that brought it

    def retire_when(self) -> str:
        return "; and ".join(RETIRE_WHEN[w] for w in self.workflows)


# Empty at the baseline; each change to workflow logic since adds its entry here.
PATCHES: MappingProxyType[str, Patch] = MappingProxyType({p.id: p for p in (
    Patch("room-beside-admissions", (GUARD,), "issue 25: storm ratio (a pool's room not taken back while "
          "the room beside it admits every request waiting)"),
    Patch("policy-with-node-check", (EPISODE,), "issue 25: storm ratio (the node checked in the policy's local "
          "activity, from one read of the Node)"),
    Patch("slot-told-when-taken", (EPISODE,), "issue 25: storm ratio (a reserved slot handed out with its notice "
          "told to the guard, in the same local activity)"),
)})
