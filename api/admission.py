"""NodeAdmission's wire: what the agent starts it with, and what it ends with."""

from __future__ import annotations

from pydantic import BaseModel, Field

from api.episode import ActionRecord, Outcome
from policies.model import Policy


class AdmissionInput(BaseModel):
    """The agent starts admission: the policy is the controller's (histories from before carry one here),
    and the hardware ids are read from the node by its own agent (a start's are ignored since admission-trusted)."""

    node: str
    policy: Policy | None = None
    hardware_ids: list[str] = Field(default_factory=list,
                                    description="What the starter claims: ignored, the node's agent says.")
    expected_gpus: int | None = None


class AdmissionResult(BaseModel):
    node: str
    outcome: Outcome
    reason: str
    validations: int
    actions: list[ActionRecord]
