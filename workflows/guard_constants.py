"""FleetGuard's patch ids, the bounds its state keeps, and the outcomes that prove or fail a canary
(its wire and state models are in api/guard.py)."""

from __future__ import annotations

# workflow.patched id: canary trickle, quarantine admission, reconciliation, policy updates.
PATCH_GUARD_NEVER_WEDGED = "guard-never-wedged"
# workflow.patched id: an idle guard sleeps for idle_recheck, not holder_check_interval.
PATCH_GUARD_IDLE_RECHECK = "guard-idle-recheck"
# workflow.patched id: the holder check is one paged listing, run beside the loop (grants and
# admissions go on meanwhile), heartbeating, with a bounded retry (issue 22: 10).
PATCH_GUARD_PAGED_CHECK = "guard-paged-holder-check"
# workflow.patched id: a re-grant held back while the guard learns its holders waits for the learning
# to end instead of waking the loop at once (a loop that spun inside one workflow task: a wedge).
PATCH_GUARD_REGRANT_WAITS = "guard-regrant-waits"
# workflow.patched id: the re-check timer is left to fire, not cancelled and restarted on every
# message (a message is a wake, not a new deadline). A refused CancelTimer for a timer that fired
# during the task wedges the time-skipping test server (temporalio/sdk-java#3088), and two events
# per message were spent on it.
PATCH_GUARD_STEADY_RECHECK = "guard-steady-recheck"
# workflow.patched id: a request whose id names a lease already given back is stale (a duplicate or
# late delivery): ignored, so no lease is granted to an episode that neither holds nor wants one
# (safety simulation, seed 385: a phantom holder kept the budget of one while its episode waited
# for approval).
PATCH_GUARD_STALE_REQUESTS = "guard-stale-requests"
# workflow.patched id: quarantine room for a node the books list without its episode (a taint seen
# at the last reconcile) counts the other nodes, instead of being given at once: a lifted node's
# next fault went over max_unhealthy (safety soak, seed 791).
PATCH_GUARD_ROOM_COUNTS_OTHERS = "guard-room-counts-others"
# workflow.patched id: a fault notice older than the guard's latest news of its node is stale and
# ignored, and a node whose holder is gone when the guard answers it stays counted (holder unknown)
# until the reconcile sees its taint: a duplicate of an ended episode's admission request, answered,
# dropped a node it had left quarantined from the count, and another was admitted over max_unhealthy
# (safety soak, seed 1723).
PATCH_GUARD_ORDERED_NEWS = "guard-stale-news"
# workflow.patched id: no continue-as-new while the holder check runs beside the loop: its activity,
# scheduled in the same task, was abandoned with its result (whatif at 10,000 nodes: the test
# server's clock then stood still, the guard continuing as new every few hundred events).
PATCH_GUARD_CHECK_BEFORE_NEW_RUN = "guard-check-before-new-run"
# workflow.patched id: one pass's grants are signalled together, not one awaited signal (one
# workflow task) each: a storm's first pass of hundreds of grants held every quarantine answer back
# for as many tasks, past the episodes' admission_timeout (guard storm, 2,000 of 10,000 nodes).
PATCH_GUARD_GRANTS_TOGETHER = "guard-grants-together"
# workflow.patched id: a guard run started before guard-never-wedged continues as new when the
# controller asks (the `upgrade` update, sent at controller start), so it meets the new behaviour
# (issue 22: 11).
PATCH_GUARD_UPGRADE = "guard-upgrade"
# workflow.patched id: a controller's pool holds at most half the room others do not hold: a greedy
# pool deferred other controllers' cordons until its next renewal (issue 25, red-team review).
PATCH_GUARD_ROOM_HALF = "guard-room-half"
OLD_BEHAVIOUR = ("this guard run started before guard-never-wedged: it answers no quarantine requests (each "
                 "cordon waits admission_timeout) until it continues as new; a controller's start asks it to")
MAX_DEFERRED_KEPT = 1000
# Outcomes an episode reports when it ends or gives its lease back: these prove a canary.
CANARY_PROVEN = frozenset({"validated", "returned", "replaced"})
CANARY_FAILED = frozenset({"quarantined", "failed", "awaiting_approval"})
# Endings after which the node is not quarantined by gpuheal any more.
LEFT_QUARANTINE = frozenset({"validated", "returned", "replaced", "healthy", "rejected", "dry_run"})


