"""NodeRemediation's wire: its input (with the state continue-as-new carries), status, result, and
the search attributes it sets. Kept out of the workflow module so the sandbox passes them through
instead of re-creating every pydantic class for each workflow run (~40 ms of CPU a cold task)."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from pydantic import BaseModel, Field
from temporalio.common import SearchAttributeKey

from api.names import DEFAULT_TASK_QUEUE
from policies.classify import Triage
from policies.findings import HealthReport
from policies.model import Policy
from policies.terms import Generation, Rung

SA_NODE = SearchAttributeKey.for_keyword("GpuNode")
SA_FAULT = SearchAttributeKey.for_keyword("FaultClass")
SA_STAGE = SearchAttributeKey.for_keyword("RemediationStage")
SA_OUTCOME = SearchAttributeKey.for_keyword("Outcome")
SA_UUIDS = SearchAttributeKey.for_keyword_list("GpuUuids")
SA_ATTRIBUTION = SearchAttributeKey.for_keyword("Attribution")
SEARCH_ATTRIBUTES = (SA_NODE, SA_FAULT, SA_STAGE, SA_OUTCOME, SA_UUIDS, SA_ATTRIBUTION)


class Stage(StrEnum):
    TRIAGE = "triage"
    LADDER = "ladder"
    RETURN = "return_to_service"
    PROBATION = "probation"
    DONE = "done"


class Outcome(StrEnum):
    HEALTHY = "healthy"
    RETURNED = "returned"
    REPLACED = "replaced"
    QUARANTINED = "quarantined"
    AWAITING_APPROVAL = "awaiting_approval"
    DENIED_ADMISSION = "denied_admission"
    DRY_RUN = "dry_run"  # the policy's dry run: what would have been done is in the actions
    REJECTED = "rejected"  # the report named a node that does not exist or is not ours: nothing done
    FAILED = "failed"  # the cordon did not take: nothing disruptive done, the node needs a person
    OBSERVED = "observed"  # the node's profile is in observe mode: the triage is recorded, nothing done


class GuardAnswer(StrEnum):
    """Where an episode stands with the fleet guard's quarantine admission."""

    NOT_ASKED = ""
    ASKED = "asked"
    ADMITTED = "admitted"
    DEFERRED = "deferred"  # no room under max_unhealthy yet: the fault waits uncordoned


class ActionRecord(BaseModel):
    at: datetime
    step: str
    summary: str
    ok: bool
    detail: str = ""


class RejectedReport(BaseModel):
    at: datetime
    reason: str
    excerpt: str = Field(default="", description="The start of what was sent, for the operator.")


class RemediationState(BaseModel):
    """Everything the episode knows; continue-as-new carries it whole."""

    stage: Stage = Stage.TRIAGE
    outcome: Outcome | None = None
    outcome_reason: str = ""
    started_at: datetime | None = None
    triage: Triage | None = None
    latest: HealthReport | None = None
    first_report: HealthReport | None = None
    boot_id: str | None = None
    agent_boot_id: str | None = Field(default=None, description="The boot the node's own agent last reported from.")
    seq_by_boot: dict[str, int] = Field(default_factory=dict, description="'<source>:<boot id>' -> last sequence")
    retired_boots: list[str] = Field(default_factory=list)
    duplicates: int = 0
    rejected: list[RejectedReport] = Field(default_factory=list)
    rejected_total: int = 0
    next_rung: Rung | None = None
    fixed_by: Rung | None = None
    rungs_tried: list[Rung] = Field(default_factory=list)
    attempts: dict[str, int] = Field(default_factory=dict)
    actions: list[ActionRecord] = Field(default_factory=list)
    quarantined: bool = False
    drained: bool = False
    lease_requested: bool = False
    lease_held: bool = False
    lease_requests: int = Field(default=0, description="Lease requests made: each new one gets the next id.")
    lease_request_id: str = Field(default="", description="The outstanding request's id (its grant must echo it).")
    stray_grants: int = Field(default=0, description="Grants ignored: not for the request outstanding (late, duplicate).")
    guard_notified: bool = False
    validations: int = 0
    detect_to_cordon_ms: int | None = None
    returned_at: datetime | None = None
    recurrence: HealthReport | None = None
    paused: bool = False
    pause_reason: str = ""
    cancel_reason: str | None = None
    awaiting_approval: Rung | None = None
    approved: list[Rung] = Field(default_factory=list)
    skip_to: Rung | None = None
    hardware_ids: list[str] = Field(default_factory=list)
    implicated: list[str] = Field(default_factory=list, description="Hardware ids a probe on the node named: the denylist's only source.")
    agent_gpus: list[int] = Field(default_factory=list, description="GPUs the node's own agent named in a finding "
                                  "acted on: the only GPUs kill and reset may target.")
    seen_events: list[str] = Field(default_factory=list, description="Event ids already heard (re-sends are no recurrence).")
    agent_missing: bool = Field(default=False, description="A node-local step found no agent polling node/<cluster>/<node>.")
    drain_left: list[str] = Field(default_factory=list, description="Pods the drain could not move (timed out, escalated).")
    run_ids: list[str] = Field(default_factory=list)
    policy_name: str = Field(default="", description="The controller's policy this episode acts on ('' before controller-policy).")
    policy_sha256: str = ""
    admission: GuardAnswer = Field(default=GuardAnswer.NOT_ASKED, description="The guard's answer on quarantine.")
    admission_reason: str = ""
    room_token: str = Field(default="", description="The slot the guard reserved ahead that this cordon took (no round trip).")
    held: str = Field(default="", description="Why the node is held for a person (an earlier episode left it quarantined).")
    held_unchecked: int = Field(default=0, description="Checks of the node the API server did not answer while held "
                                                       "(hold-when-unchecked): the re-check timer doubles with each.")
    held_report: str = Field(default="", description="The report (sender/boot/seq) an unchecked hold began on: if the "
                                                     "API answers with no newer one, it is old news, left for a person.")
    stale_report: str = Field(default="", description="Why the report acted on is too old to act on (set once the API "
                                                      "answers after an unchecked hold and no newer report came).")
    lifted_by: str | None = Field(default=None, description="Who lifted the hold (the `lift` update's caller).")
    lift_reason: str = ""
    late_reports: int = 0
    suspect_tested: bool = Field(default=False, description="A suspect node's load test before the ladder has run.")
    pods_marked: list[str] = Field(default_factory=list, description="Pods the fault's attribution was marked on.")
    pods_evicted: list[str] = Field(default_factory=list, description="Pods the drain evicted.")
    profile: str = Field(default="", description="The node's profile the controller applied ('' for none).")


class RemediationInput(BaseModel):
    """What starts an episode: senders give node, cluster and generation. The rest is the workflow's
    own (carried through continue-as-new); in a first run it is ignored and the policy is the
    controller's (see workflows/controller_policy.py). Histories from before carry a policy here."""

    node: str
    cluster: str = "default"
    generation: Generation = Generation.HOPPER
    policy: Policy | None = None
    expected_gpus: int | None = Field(default=None, description="Unset: the agent's own --expected-gpus decides.")
    guard_task_queue: str = Field(default=DEFAULT_TASK_QUEUE, description="Where the guard runs if it must be started.")
    history_limit: int | None = Field(
        default=None, description="Continue as new past this many events (besides the server's suggestion)."
    )
    state: RemediationState | None = None


class RemediationStatus(BaseModel):
    node: str
    stage: Stage
    outcome: Outcome | None
    outcome_reason: str
    triage: Triage | None
    next_rung: Rung | None
    fixed_by: Rung | None
    rungs_tried: list[Rung]
    attempts: dict[str, int]
    actions: list[ActionRecord]
    lease_held: bool
    quarantined: bool
    paused: bool
    pause_reason: str
    awaiting_approval: Rung | None
    cancel_reason: str | None
    rejected: list[RejectedReport]
    rejected_total: int
    duplicates: int
    validations: int
    boot_id: str | None
    run_ids: list[str]
    late_reports: int = Field(default=0, description="Reports that arrived while the episode closed (each in its actions).")
    agent_missing: bool = False
    implicated: list[str] = Field(default_factory=list)
    policy_name: str = ""
    policy_sha256: str = ""
    cluster: str = "default"
    lease_requested: bool = False
    admission: str = ""
    waiting: str = Field(default="", description="What the episode waits on now, in words.")
    held: str = ""


class RemediationResult(BaseModel):
    node: str
    outcome: Outcome
    reason: str
    fault_class: str | None
    attribution: str | None
    rungs: list[Rung]
    validations: int
    detect_to_cordon_ms: int | None
    run_ids: list[str]
    late_reports: int = Field(default=0, description="Reports that arrived while the episode closed (each in its actions).")
