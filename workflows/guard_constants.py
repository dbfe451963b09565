"""The bounds FleetGuard's state keeps, and the outcomes that prove or fail a canary
(its wire and state models are in api/guard.py)."""

from __future__ import annotations

MAX_DEFERRED_KEPT = 1000
# Patch ids (workflows/patch_register.py has when each may be deprecated).
PATCH_ROOM_BESIDE_ADMISSIONS = "room-beside-admissions"  # a pool keeps its room while requests it leaves room for wait
# Outcomes an episode reports when it ends or gives its lease back: these prove a canary.
CANARY_PROVEN = frozenset({"validated", "returned", "replaced"})
CANARY_FAILED = frozenset({"quarantined", "failed", "awaiting_approval"})
# Endings after which the node is not quarantined by gpuheal any more.
LEFT_QUARANTINE = frozenset({"validated", "returned", "replaced", "healthy", "rejected", "dry_run"})


