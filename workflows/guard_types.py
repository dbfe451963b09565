"""FleetGuard's wire and state models, signal names and ids (kept out of the workflow module, as
remediation_types.py is, so the sandbox passes them through)."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field

from policies.model import GuardPolicy
from workflows.lease import FaultNotice, LeaseRequest

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
# workflow.patched id: a guard run started before guard-never-wedged continues as new when the
# controller asks (the `upgrade` update, sent at controller start), so it meets the new behaviour
# (issue 22: 11).
PATCH_GUARD_UPGRADE = "guard-upgrade"
OLD_BEHAVIOUR = ("this guard run started before guard-never-wedged: it answers no quarantine requests (each "
                 "cordon waits admission_timeout) until it continues as new; a controller's start asks it to")
MAX_DEFERRED_KEPT = 1000
MAX_RELEASED_KEPT = 1000
MAX_NEWS_KEPT = 20000  # nodes whose latest news time is kept (a 10,000-node fleet twice over)
# Outcomes an episode reports when it ends or gives its lease back: these prove a canary.
CANARY_PROVEN = frozenset({"validated", "returned", "replaced"})
CANARY_FAILED = frozenset({"quarantined", "failed", "awaiting_approval"})
# Endings after which the node is not quarantined by gpuheal any more.
LEFT_QUARANTINE = frozenset({"validated", "returned", "replaced", "healthy", "rejected", "dry_run"})


class Lease(BaseModel):
    holder: str
    node: str
    since: datetime
    canary: bool = False
    request_id: str = Field(default="", description="The request it answers (the newest, when asked again).")


class Waiting(BaseModel):
    holder: str
    node: str
    since: datetime
    reason: str = ""


class GateRelease(BaseModel):
    """An operator lifts the guard's gates: for `leases` grants, or until `until`."""

    leases: int = Field(default=0, ge=0)
    until: datetime | None = None
    by: str = ""


class GuardState(BaseModel):
    holders: list[Lease] = Field(default_factory=list)
    waiters: list[LeaseRequest] = Field(default_factory=list, description="First come, first served.")
    waiting_since: dict[str, datetime] = Field(default_factory=dict, description="holder -> when it asked")
    unhealthy: dict[str, str] = Field(default_factory=dict, description="node -> holder workflow id")
    deferred: list[Waiting] = Field(default_factory=list, description="Faults waiting uncordoned for room under max_unhealthy.")
    admissions: list[FaultNotice] = Field(default_factory=list, description="Quarantine requests not yet answered.")
    fault_times: list[datetime] = Field(default_factory=list, description="New faults within the storm window.")
    breaker_open: bool = False
    breaker_reason: str = ""
    breaker_opened_at: datetime | None = None
    calm_since: datetime | None = None
    paused: bool = False
    pause_reason: str = ""
    max_seen_holders: int = 0
    grants: int = 0
    fleet_size: int = 0
    last_holder_check: datetime | None = None
    last_fleet_count: datetime | None = None
    trips: int = Field(default=0, description="How often the storm breaker has opened.")
    pending_storm_event: str | None = None
    canary_budget: int = Field(default=0, description="0: normal budget; else leases allowed while recovering.")
    canary_history: list[str] = Field(default_factory=list, description="'proven'/'failed' per canary, newest last (32).")
    alarm: str = Field(default="", description="Why the last canary failed; cleared when one is proven.")
    pending_alarm_event: str | None = None
    forced: GateRelease | None = None
    policy_changes: list[str] = Field(default_factory=list, description="Who changed the guard's policy, and when (10).")
    relearned: bool = False
    relearn_error: str = ""  # why the running episodes are not known yet (no lease meanwhile)
    news_at: dict[str, datetime] = Field(default_factory=dict, description="node and sender -> the sender's time of the "
                                         f"guard's latest message about it (the newest {MAX_NEWS_KEPT} nodes).")
    released: dict[str, str] = Field(default_factory=dict, description="holder -> the request id of the lease it "
                                     f"gave back last (the newest {MAX_RELEASED_KEPT}): that request again is stale.")


class GuardInput(BaseModel):
    cluster: str
    policy: GuardPolicy = Field(default_factory=GuardPolicy)
    fleet_size: int = Field(default=0, ge=0, description="Known fleet size; 0 until the first kube count.")
    state: GuardState | None = None


class GuardStatus(BaseModel):
    cluster: str
    limit: int
    holders: list[Lease]
    waiters: list[str]
    unhealthy: list[str]
    breaker_open: bool
    breaker_reason: str
    paused: bool
    pause_reason: str
    recent_faults: int
    max_seen_holders: int
    fleet_size: int
    trips: int
    budget: int = Field(default=0, description="Leases allowed now: the limit, the canary trickle, or 0 when paused.")
    max_unhealthy: int = 0
    gate: str | None = Field(default=None, description="Why new leases are held back (or trickle), if they are.")
    canary_budget: int = 0
    canary_history: list[str] = Field(default_factory=list)
    alarm: str = ""
    waiting: list[Waiting] = Field(default_factory=list)
    deferred: list[Waiting] = Field(default_factory=list)
    forced: GateRelease | None = None
    policy: GuardPolicy | None = None
    policy_changes: list[str] = Field(default_factory=list)
    behaviour: str = Field(default="", description="Why this run keeps older behaviour, if it does.")
