"""Requests and results of the ledger: episodes, the denylist, admissions (activities/ledger.py)."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field

from policies.findings import Finding
from policies.terms import Attribution


# --- ledger -------------------------------------------------------------------------------------
class InterruptedPod(BaseModel):
    pod: str = Field(description="namespace/name")
    attribution: Attribution = Field(description="platform: the node failed it; application: its own fault.")
    how: str = Field(default="marked", description="marked (the fault's pods) or evicted (by the drain).")


# The phase for the time between a return to service and a recurrence: not time out of service.
IN_SERVICE = "in service"


class RemediationRecord(BaseModel):
    node: str
    episode: str = Field(description="workflow id / first run id: the record's idempotency key.")
    hardware_ids: list[str]
    fault_class: str | None
    attribution: Attribution | None
    rungs: list[str]
    outcome: str
    started_at: datetime
    ended_at: datetime
    boards: list[str] = Field(default_factory=list, description="Ids of the hardware a probe implicated (a GPU's "
                              "UUID and serial, or the instance): repeat offenders are counted per board by these.")
    # The outcome ledger (issue 26); absent from records written before it.
    detected_at: datetime | None = Field(default=None, description="The detector's clock at the first report.")
    returned_at: datetime | None = Field(default=None, description="Back in service (verified uncordon), if it was.")
    out_of_service_s: float | None = Field(
        default=None, description="From detection to back in service (or the episode's end); 0: never cordoned.")
    phases: dict[str, float] = Field(default_factory=dict, description="Seconds per phase (workflows/outcome.py).")
    pods: list[InterruptedPod] = Field(default_factory=list, description="Pods the episode interrupted.")
    finding: Finding | None = Field(default=None, description="The finding that set the first rung (what-if replays it).")
    validations: dict[str, int] = Field(default_factory=dict, description="Validation runs: passed and failed.")
    agent_missing: bool = Field(default=False, description="A node-local step found no agent on the node.")
    sku: str | None = Field(default=None, description="The node's GPU generation (hopper, ...).")
    profile: str | None = Field(default=None, description="The node's profile (policies/profiles.py), if one applied.")


class CountRecentRequest(BaseModel):
    hardware_ids: list[str]
    window_s: float
    by_board: bool = Field(default=False, description="Count episodes that implicated these ids (their `boards`), "
                           "not every episode of a node that listed them.")
    exclude_episode: str | None = None


class DenylistRequest(BaseModel):
    hardware_ids: list[str]
    node: str
    reason: str


class DenylistResult(BaseModel):
    added: list[str] = Field(default_factory=list, description="Ids newly denied (others were already).")


class CheckDeniedRequest(BaseModel):
    hardware_ids: list[str]


class CheckDeniedResult(BaseModel):
    denied: dict[str, str] = Field(default_factory=dict, description="id -> reason it was denied.")


class AdmitRequest(BaseModel):
    """A node admitted with this hardware: a later admission of the same node and hardware is a re-start."""

    node: str
    hardware_ids: list[str]


class AdmittedRequest(BaseModel):
    node: str


class LastStartedRequest(BaseModel):
    node: str
    exclude_episode: str | None = None


class LastStartedResult(BaseModel):
    started_at: datetime | None = Field(default=None, description="When the node's latest recorded episode started.")


class AdmittedResult(BaseModel):
    hardware_ids: list[str] = Field(default_factory=list, description="Hardware the node was admitted with before.")
