"""FleetGuard's wire: the lease and quarantine messages episodes and admissions send it, the
activities it calls, and its input, state and status (workflows/fleet_guard.py)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field

from api.names import DEFAULT_TASK_QUEUE
from policies.guard_policy import GuardPolicy

MAX_RELEASED_KEPT = 1000
MAX_NEWS_KEPT = 20000  # nodes whose latest news time is kept (a 10,000-node fleet twice over)


class GuardSignalRequest(BaseModel):
    """Signal-with-start to `fleet-guard/<cluster>`: the guard is started on first need."""

    cluster: str
    guard: GuardPolicy = Field(default_factory=GuardPolicy, description="The guard's limits, if it must be started.")
    task_queue: str = DEFAULT_TASK_QUEUE
    signal: str
    payload: dict[str, Any]


class LiveHoldersRequest(BaseModel):
    holders: list[str]


class LiveHoldersResult(BaseModel):
    running: list[str]


class RunningEpisodesRequest(BaseModel):
    cluster: str


class EpisodeSeen(BaseModel):
    """What a running episode's status says of its place in the guard's books."""

    holder: str
    node: str
    lease_held: bool = False
    lease_requested: bool = False
    quarantined: bool = False


class RunningEpisodesResult(BaseModel):
    known: bool = Field(description="False: this server cannot list workflows (no visibility): nothing learnt.")
    episodes: list[EpisodeSeen] = Field(default_factory=list)


class LeaseRequest(BaseModel):
    cluster: str
    holder: str = Field(description="Workflow id of the requester; the grant is signalled to it.")
    node: str
    request_id: str = Field(default="", description="Which of the holder's requests this is: its grant echoes it.")


class LeaseGrant(BaseModel):
    holder: str
    granted_at: datetime
    request_id: str = Field(default="", description="The request granted: a late grant of an earlier one is refused.")


class LeaseRelease(BaseModel):
    holder: str
    node: str = ""
    outcome: str | None = Field(default=None, description="How the episode ended, or 'validated' at return to service.")
    sent_at: datetime | None = Field(default=None, description="The sender's workflow clock (see FaultNotice).")


class FaultNotice(BaseModel):
    """A node entered quarantine (counts toward the storm breaker and the unhealthy limit), or asks
    to (`admission`): the guard answers on HOLDER_SIGNAL_QUARANTINE, at once or once there is room."""

    node: str
    holder: str
    fault_class: str | None = None
    healthy: bool = Field(default=False, description="True: the node left quarantine (returned or replaced).")
    admission: bool = Field(default=False, description="Asks before cordoning: admitted, or deferred with a reason.")
    sent_at: datetime | None = Field(default=None, description="The sender's workflow clock: a healthy notice older "
                                     "than the guard's latest news of the node is stale (a duplicate, or late).")
    room_token: str = Field(default="", description="The node was cordoned in room the guard had reserved ahead "
                            "(this token): counted at once, with no answer.")
    before_cordon: bool = Field(default=False, description="With `room_token`: told with the slot, before the cordon. "
                                "Counted only in a slot the guard still holds; else not taken (no echo in "
                                "`RoomGrant.took`), and the episode asks for room instead.")


class QuarantineAnswer(BaseModel):
    admitted: bool
    reason: str = ""


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


class RoomToken(BaseModel):
    """One quarantine slot reserved ahead for a controller: counted against max_unhealthy from the
    moment it is reserved until the episode that takes it reports its node, or it expires."""

    controller: str
    expires: datetime


class RoomRequest(BaseModel):
    """A controller's room pool to its guard: reserve up to `want` more slots, renew the unused ones it
    keeps, give back `returned`. A slot handed out is not renewed: its episode's notice arrives well
    within the ttl, and one whose notice never comes (a retried workflow task took another) lapses."""

    controller: str
    want: int = Field(default=0, ge=0)
    keep: list[str] = Field(default_factory=list)
    returned: list[str] = Field(default_factory=list)
    told: list[FaultNotice] = Field(default_factory=list, description="Episodes' notices that they cordoned in "
                                    "this controller's slots (room_token set), batched: taken before any reserving, "
                                    "as the fault signal takes them, so the slots they free count at once.")


class RoomGrant(BaseModel):
    new: list[str] = Field(default_factory=list, description="Slots reserved by this request.")
    held: list[str] = Field(default_factory=list, description="The unused slots this controller keeps, renewed, and "
                            "the new ones; one it kept and is not here lapsed or is unknown to this guard.")
    expires: datetime | None = Field(default=None, description="On the guard's clock; the pool hands a slot out "
                                     "only while at least half the ttl is left, for the episode's notice to arrive.")
    ttl_s: float = 0.0
    took: list[str] = Field(default_factory=list, description="The room tokens of the `told` notices the guard took: "
                            "one not echoed (a guard on a build that knows no `told`) is signalled by its episode.")


class TakeRoomRequest(BaseModel):
    cluster: str
    now: datetime = Field(description="The episode's workflow clock: the guard's clock, on the same server.")
    notice: FaultNotice | None = Field(default=None, description="The episode's slot notice, its token left empty: "
                                       "told to the guard with the slot, before the answer. A slot whose notice the "
                                       "guard did not take is not handed out (it lapses there; the episode asks).")


class GuardLivenessRequest(BaseModel):
    cluster: str
    stale_after: float = Field(default=60.0, description="Seconds since a worker last polled the guard's task "
                               "queue after which no worker is taken to serve it.")


class GuardLiveness(BaseModel):
    """Whether a guard that has not answered in time is stuck (the episode cordons anyway) or only
    slow (it waits: the guard will answer, and max_unhealthy holds)."""

    stuck: bool
    why: str = Field(description="What was seen: the guard's status, its workflow task, its task queue's workers.")


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
    relearn_error: str = ""  # why the running episodes are not known yet (no lease meanwhile)
    news_at: dict[str, datetime] = Field(default_factory=dict, description="node and sender -> the sender's time of the "
                                         f"guard's latest message about it (the newest {MAX_NEWS_KEPT} nodes).")
    released: dict[str, str] = Field(default_factory=dict, description="holder -> the request id of the lease it "
                                     f"gave back last (the newest {MAX_RELEASED_KEPT}): that request again is stale.")
    room: dict[str, RoomToken] = Field(default_factory=dict, description="Quarantine slots reserved ahead for "
                                       "controllers, by token: counted as quarantined until taken or expired.")


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
    breaker_opened_at: datetime | None = Field(default=None, description="When the storm breaker last opened.")
    grants: int = Field(default=0, description="Leases granted by this guard's runs so far.")
    policy: GuardPolicy | None = None
    policy_changes: list[str] = Field(default_factory=list)
    room_reserved: dict[str, int] = Field(default_factory=dict, description="Quarantine slots reserved ahead, by "
                                          "controller (counted against max_unhealthy).")
