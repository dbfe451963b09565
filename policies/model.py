"""The remediation policy: typed knobs with their defaults and meaning documented at the field."""

from __future__ import annotations

from datetime import timedelta
from typing import Literal

from pydantic import BaseModel, Field

from policies.durations import Duration
from policies.findings import FindingKind, RecoveryAction
from policies.guard_policy import GuardPolicy
from policies.load import LoadTestPolicy
from policies.profile_model import NodeProfile
from policies.terms import Attribution, Generation, Rung, Strict, XidAction


class XidRule(Strict):
    name: str = Field(description="NVIDIA's short meaning of the code.")
    action: XidAction = Field(description="NVIDIA's immediate action.")
    cause: Attribution = Field(description="Who is likely at fault.")
    fault_class: str = Field(description="Family of the fault, used in taints, search attributes and reports.")
    fatal: bool = Field(default=False, description="Report at once, without waiting for hysteresis.")
    generations: list[Generation] = Field(description="Generations where NVIDIA lists the code.")


class XidOverride(Strict):
    """Partial XidRule: only the fields given replace the catalog's."""

    name: str | None = None
    action: XidAction | None = None
    cause: Attribution | None = None
    fault_class: str | None = None
    fatal: bool | None = None


class RungPolicy(Strict):
    action_timeout: Duration = Field(description="Start-to-close timeout of the rung's action activity.")
    retries: int = Field(ge=1, le=20, description="Attempts of the action activity before the rung counts as failed.")
    return_timeout: Duration = Field(
        description="How long to wait after the action for the node to settle or come back (a reboot's new boot)."
    )
    requires_approval: bool = Field(default=False, description="Wait for an operator's `approve` before acting.")
    approval_timeout: Duration = Field(
        default=timedelta(hours=24),
        description="How long to wait for approval; then the episode ends as `awaiting_approval`, node quarantined.",
    )


class LadderPolicy(Strict):
    kill: RungPolicy = Field(
        default=RungPolicy(action_timeout=timedelta(minutes=2), retries=3, return_timeout=timedelta(seconds=30)),
        description="Kill the GPU processes of the job (application faults).",
    )
    reset: RungPolicy = Field(
        default=RungPolicy(action_timeout=timedelta(minutes=5), retries=2, return_timeout=timedelta(minutes=2)),
        description="Drain, then `nvidia-smi -r` the faulty GPUs.",
    )
    reboot: RungPolicy = Field(
        default=RungPolicy(action_timeout=timedelta(minutes=5), retries=3, return_timeout=timedelta(minutes=15)),
        description="Reboot the instance; it counts as back when the agent reports from a new boot id.",
    )
    replace: RungPolicy = Field(
        default=RungPolicy(action_timeout=timedelta(minutes=10), retries=5, return_timeout=timedelta(minutes=30)),
        description="Terminate and replace the instance; its hardware ids go on the denylist.",
    )

    def for_rung(self, rung: Rung) -> RungPolicy:
        return getattr(self, Rung(rung).value)


class ValidationPolicy(Strict):
    soak: Duration = Field(default=timedelta(minutes=10), description="Wait between the two validations that must both pass.")
    timeout: Duration = Field(default=timedelta(minutes=20), description="Start-to-close timeout of one validation run.")
    dcgm_level: int = Field(default=2, ge=1, le=4, description="`dcgmi diag -r` level when DCGM is installed.")
    dcgm_required: bool = Field(default=False, description="Fail validation when `dcgmi` is missing (fail closed).")
    agent_timeout: Duration = Field(
        default=timedelta(minutes=2),
        description="Schedule-to-start timeout of node-local activities: longer means the agent is gone.",
    )
    load: LoadTestPolicy = Field(
        default_factory=LoadTestPolicy,
        description="The load-test battery validations run on a drained node: tiers, tolerances, per-SKU floors.",
    )


class DrainPolicy(Strict):
    checkpoint_grace: Duration = Field(
        default=timedelta(minutes=2),
        description="Notice given to pods (annotation + event) before evictions, so elastic jobs can checkpoint.",
    )
    deadline: Duration = Field(default=timedelta(minutes=15), description="Give up retrying PDB-blocked evictions after this.")
    timeout_action: Literal["escalate", "wait", "force"] = Field(
        default="escalate",
        description="At the deadline: escalate (carry on with the rung, pods left), wait (keep trying), force (delete).",
    )
    allow_force: bool = Field(default=False, description="Whether `force` may delete pods despite their budget.")
    pod_grace_seconds: int = Field(default=30, ge=0, description="Termination grace given to evicted pods.")
    heartbeat_timeout: Duration = Field(
        default=timedelta(seconds=60),
        description="A drain silent this long (its controller died) is started again on another controller.")


class RepeatOffenderPolicy(Strict):
    threshold: int = Field(default=3, ge=1, description="Remediations per hardware id within `window` that mark it a repeat offender.")
    window: Duration = Field(default=timedelta(days=7), description="Look-back window for repeat offenders.")


def _default_action_rungs() -> dict[XidAction, Rung | None]:
    return {
        XidAction.RESTART_APP: Rung.KILL,
        XidAction.RESET_GPU: Rung.RESET,
        XidAction.RESTART_BM: Rung.REBOOT,
        XidAction.RESTART_VM: Rung.REBOOT,
        XidAction.CHECK_MECHANICALS: Rung.REPLACE,
        # Unknown remedy: fail closed, start at reset.
        XidAction.CONTACT_SUPPORT: Rung.RESET,
        XidAction.IGNORE: None,
    }


def _default_finding_rungs() -> dict[FindingKind, Rung]:
    return {
        FindingKind.ECC_DBE: Rung.RESET,
        # A reset activates pending remaps; a failed remap that a reset cannot clear climbs on.
        FindingKind.ROW_REMAP_FAILURE: Rung.RESET,
        FindingKind.ROW_REMAP_PENDING: Rung.RESET,
        FindingKind.RETIRED_PAGES_PENDING: Rung.RESET,
        FindingKind.GPU_LOST: Rung.REBOOT,
        FindingKind.GPU_COUNT_MISMATCH: Rung.REBOOT,
        FindingKind.PCIE_DEGRADED: Rung.REBOOT,
        FindingKind.NVLINK_DOWN: Rung.RESET,
        FindingKind.NIC_PORTS_DOWN: Rung.REBOOT,
        FindingKind.THERMAL: Rung.RESET,
        FindingKind.PROBE_BROKEN: Rung.RESET,
        FindingKind.NODE_CONDITION: Rung.RESET,
    }


def _default_recovery_rungs() -> dict[RecoveryAction, Rung | None]:
    return {
        RecoveryAction.NONE: None,
        RecoveryAction.GPU_RESET: Rung.RESET,
        RecoveryAction.DRAIN_P2P: Rung.RESET,
        RecoveryAction.DRAIN_AND_RESET: Rung.RESET,
        RecoveryAction.BUS_RESET: Rung.REBOOT,
        RecoveryAction.NODE_REBOOT: Rung.REBOOT,
        RecoveryAction.SYSTEM_REBOOT: Rung.REBOOT,
        RecoveryAction.RECOVER_IMEX_DOMAIN: Rung.REBOOT,
    }


class TriagePolicy(Strict):
    action_rungs: dict[XidAction, Rung | None] = Field(
        default_factory=_default_action_rungs, description="Starting rung for each NVIDIA immediate action (null: no action)."
    )
    finding_rungs: dict[FindingKind, Rung] = Field(
        default_factory=_default_finding_rungs, description="Starting rung for each non-Xid finding kind."
    )
    recovery_rungs: dict[RecoveryAction, Rung | None] = Field(
        default_factory=_default_recovery_rungs, description="Starting rung for each Xid 154 / NVML recovery action."
    )
    app_repeat_threshold: int = Field(
        default=3, ge=2, description="The same application Xid this often on one GPU points at the hardware (WORKFLOW_XID_13/31)."
    )


class Policy(Strict):
    """Everything a remediation needs to decide; workflows get it resolved, as input."""

    name: str = Field(default="default", description="Shown in status and history.")
    xid_catalog_version: str = Field(default="", description="Version of the pinned Xid catalog (filled at load).")
    xids: dict[int, XidRule] = Field(default_factory=dict, description="The Xid catalog (filled from the pinned data at load).")
    xid_overrides: dict[int, XidOverride] = Field(default_factory=dict, description="Site changes to catalog entries.")
    generation_overrides: dict[Generation, dict[int, XidOverride]] = Field(
        default_factory=dict, description="Per-generation changes to catalog entries (applied after `xid_overrides`)."
    )
    triage: TriagePolicy = Field(default_factory=TriagePolicy, description="How findings map to a starting rung.")
    ladder: LadderPolicy = Field(default_factory=LadderPolicy, description="Per-rung timings, retries and approval.")
    validation: ValidationPolicy = Field(default_factory=ValidationPolicy, description="The double validation before return to service.")
    drain: DrainPolicy = Field(default_factory=DrainPolicy, description="How pods leave a node before a disruptive rung.")
    guard: GuardPolicy = Field(default_factory=GuardPolicy, description="Fleet-wide disruption budget and storm breaker.")
    repeat_offender: RepeatOffenderPolicy = Field(default_factory=RepeatOffenderPolicy, description="When a board goes straight to replace.")
    probation: Duration = Field(
        default=timedelta(minutes=30), description="After return to service, a new fault within this escalates to the rung above."
    )
    pause_releases_lease_after: Duration = Field(
        default=timedelta(hours=1),
        description="An episode paused longer than this gives its disruption lease back (taken again on resume).",
    )
    dry_run: bool = Field(default=False, description="Record what would be done, change nothing.")
    replacement: Literal["auto", "ec2", "karpenter"] = Field(
        default="auto", description="auto: the Auto Scaling group when the instance has one, else EC2 terminate; karpenter: delete the NodeClaim."
    )
    ownership_tag: str = Field(default="gpuheal.io/managed=true", description="Tag an instance must carry before gpuheal touches it.")
    history_limit: int | None = Field(
        default=None, ge=20, description="An episode continues as new past this many history events (besides the "
        "server's suggestion); None: only when the server suggests it. A sender cannot set it.")
    profiles: dict[str, NodeProfile] = Field(
        default_factory=dict,
        description="What a healthy node of each kind has, by profile name (shipped ones in policies/profiles.yaml): a "
                    "file adds profiles, changes a shipped one naming only what it changes, or removes one with null.")
    node_group_labels: list[str] = Field(
        default_factory=lambda: ["eks.amazonaws.com/nodegroup", "karpenter.sh/nodepool", "cloud.google.com/gke-nodepool"],
        description="Node labels whose value is the node's group, for a profile's `match.node_groups`.")
    observe: bool = Field(
        default=False, description="Detect and record only: an episode records its triage and ends, never cordons "
                                   "(set per node by a profile's `mode: observe`).")

    def xid_rule(self, code: int, generation: Generation) -> XidRule | None:
        """The catalog entry for a code on a generation, with overrides; None when unknown there."""
        rule = self.xids.get(code)
        if rule is None or generation not in rule.generations:
            return None
        for override in (self.xid_overrides.get(code), self.generation_overrides.get(generation, {}).get(code)):
            if override is not None:
                rule = rule.model_copy(update=override.model_dump(exclude_none=True))
        return rule

    def scaled(self, factor: float) -> Policy:
        """Every duration multiplied by factor (scenarios run a day's policy in seconds).

        Activity timeouts are not scaled below ACTIVITY_TIMEOUT_FLOOR: they bound real work (an
        API call, a validation run), which does not get faster with the scenario's clock.
        """
        return _scale(self, factor)


ACTIVITY_TIMEOUT_FLOOR = timedelta(seconds=10)
_ACTIVITY_TIMEOUTS = {"action_timeout", "agent_timeout", "timeout", "heartbeat_timeout", "admission_timeout",
                      "time_limit", "room_ttl"}
_SECONDS = {"pod_grace_seconds"}  # durations kept as whole seconds (the Kubernetes API's unit)


def _scale(model: BaseModel, factor: float) -> BaseModel:
    update = {}
    for name in type(model).model_fields:
        value = getattr(model, name)
        if isinstance(value, timedelta):
            update[name] = value * factor
            if name in _ACTIVITY_TIMEOUTS:
                update[name] = max(update[name], min(value, ACTIVITY_TIMEOUT_FLOOR))
        elif name in _SECONDS:
            update[name] = round(value * factor)
        elif isinstance(value, BaseModel):
            update[name] = _scale(value, factor)
    return model.model_copy(update=update)


