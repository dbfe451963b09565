"""Every `workflow.patched` id, the workflows that branch on it, and when it may be deprecated.

A patch's life (Temporal's patching API): (1) `if workflow.patched(id): new else: old`, deployed;
(2) once no run that started before (1) is open, `workflow.deprecate_patch(id)` and only the new
branch; (3) once no run that started before (2) is open, the call goes too. A run that continues as
new is a new run: it takes every patch then. tests/workflows/test_patch_register.py fails when an id
is branched on without an entry here."""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType

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
           "time); a guard continues as new when its history asks, or when terminated the next "
           "message starts it afresh and it learns its holders back",
})


@dataclass(frozen=True)
class Patch:
    id: str
    workflows: tuple[str, ...]
    since: str  # the issue or pass that brought it

    def retire_when(self) -> str:
        return "; and ".join(RETIRE_WHEN[w] for w in self.workflows)


PATCHES = MappingProxyType({p.id: p for p in (
    Patch("local-cluster-calls", (EPISODE,), "local activities for cluster calls"),
    Patch("do-no-harm", (EPISODE,), "do no harm, first pass"),
    Patch("bounded-state", (EPISODE,), "bounded state"),
    Patch("guard-admission", (EPISODE,), "guard never wedged"),
    Patch("trusted-intake", (EPISODE,), "issue 22: 7, 9, 15d"),
    Patch("episode-identity", (EPISODE,), "issue 22: 9"),
    Patch("quarantine-hold", (EPISODE,), "issue 22: 8"),
    Patch("sticky-conditions", (EPISODE,), "issue 22: 7"),
    Patch("late-reports", (EPISODE,), "issue 22: 15c"),
    Patch("dry-run-no-denylist", (EPISODE,), "issue 22: 1"),
    Patch("agent-missing-at-reboot", (EPISODE,), "issue 22: 2"),
    Patch("agent-boot-ends-reboot", (EPISODE,), "issue 22: 2"),
    Patch("kill-implicated-only", (EPISODE,), "issue 22: 4"),
    Patch("app-fault-agent-missing", (EPISODE,), "issue 22: 5"),
    Patch("approval-without-lease", (EPISODE,), "issue 22: 6"),
    Patch("lease-request-ids", (EPISODE,), "issue 22: 12"),
    Patch("replace-then-denylist", (EPISODE,), "issue 22: 13"),
    # Decided, never branched on: kept so histories that carry its marker still match.
    Patch("replaced-node-done", (EPISODE,), "issue 22: 14"),
    Patch("approve-names-rung", (EPISODE,), "issue 22: 15a"),
    Patch("repeat-offender-per-board", (EPISODE,), "issue 22: 15b"),
    Patch("node-profiles", (EPISODE, ADMISSION), "node profiles"),
    Patch("lease-request-backoff", (EPISODE,), "lease request backoff"),
    Patch("check-node-report-boot", (EPISODE,), "issue 22, red team: 14"),
    Patch("pause-before-drain", (EPISODE,), "issue 22, red team"),
    Patch("reboot-doubt-left-for-a-person", (EPISODE,), "issue 22, red team: 2/13"),
    Patch("first-report-deadline", (EPISODE,), "issue 22, red team"),
    Patch("grant-needs-request-id", (EPISODE,), "issue 22, red team"),
    Patch("failed-action-no-replace", (EPISODE,), "issue 22, red team"),
    Patch("replace-on-agent-recurrence", (EPISODE,), "issue 22, red team"),
    Patch("implicate-platform-findings-only", (EPISODE,), "issue 22, red team"),
    Patch("commit-before-close", (EPISODE,), "issue 22, safety simulation seed 35"),
    Patch("target-agent-gpus-only", (EPISODE,), "issue 22, safety soak seed 1211"),
    Patch("hold-when-unchecked", (EPISODE,), "issue 22, safety soak seeds 1460, 1562"),
    Patch("controller-policy", (EPISODE, ADMISSION), "the controller's policy"),
    Patch("outcome-ledger", (EPISODE,), "issue 26"),
    Patch("suspect-load-test", (EPISODE,), "validation under load"),
    Patch("validation-under-load", (EPISODE, ADMISSION), "validation under load"),
    Patch("counted-before-cordon", (EPISODE,), "issue 25, guard storm at 10,000 nodes"),
    Patch("room-ahead", (EPISODE,), "issue 25, fast path under the guard"),
    Patch("slow-guard-waits", (EPISODE,), "issue 25, guard storm at 10,000 nodes"),
    Patch("admission-trusted", (ADMISSION,), "issue 22: 3"),
    Patch("admission-not-beside-episode", (ADMISSION,), "issue 22"),
    Patch("admission-recheck-after-episode", (ADMISSION,), "issue 22, safety soak seed 669"),
    Patch("guard-never-wedged", (GUARD,), "guard never wedged"),
    Patch("guard-idle-recheck", (GUARD,), "guard idle re-check"),
    Patch("guard-paged-holder-check", (GUARD,), "issue 22: 10"),
    Patch("guard-regrant-waits", (GUARD,), "issue 22, safety simulation"),
    Patch("guard-steady-recheck", (GUARD,), "issue 22, safety simulation (sdk-java#3088)"),
    Patch("guard-stale-requests", (GUARD,), "issue 22, safety soak seed 385"),
    Patch("guard-room-counts-others", (GUARD,), "issue 22, safety soak seed 791"),
    Patch("guard-stale-news", (GUARD,), "issue 22, safety soak seed 1723"),
    Patch("guard-check-before-new-run", (GUARD,), "issue 25, whatif at 10,000 nodes"),
    Patch("guard-grants-together", (GUARD,), "issue 25, guard storm at 10,000 nodes"),
    Patch("guard-upgrade", (GUARD,), "issue 22: 11"),
    Patch("guard-room-half", (GUARD,), "issue 25, red-team review of room reserved ahead"),
)})
