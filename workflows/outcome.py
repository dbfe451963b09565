"""What an episode cost, for the outcome ledger: its time per phase and the pods it interrupted.

Read from the episode's own record of steps (`RemediationState.actions`): each step's time since
the one before it goes to that step's phase, from the detector's report to the node's return to
service (or the episode's end, when it never returned). Pure functions of the state: deterministic.
"""

from __future__ import annotations

from datetime import datetime
from types import MappingProxyType

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    import api as c
    from api.episode import RemediationState

MAX_PODS_KEPT = 200
IN_SERVICE = c.IN_SERVICE  # between a return to service and a recurrence: not time out of service

PHASE_OF_STEP = MappingProxyType({
    "policy": "quarantine", "triage": "quarantine", c.KUBE_CHECK_NODE: "quarantine", c.KUBE_QUARANTINE: "quarantine",
    c.KUBE_ATTRIBUTE_PODS: "quarantine", "attribution": "quarantine", c.KUBE_EVENT: "quarantine",
    "quarantine": "waiting for the guard", "lease": "waiting for a lease", "approval": "waiting for approval",
    "operator": "waiting for an operator", c.KUBE_DRAIN: "drain", "drain": "drain",
    "kill": "kill", "reset": "reset", "reboot": "reboot", "boot_id": "reboot", "replace": "replace",
    "denylist": "replace", "validate": "validation", c.KUBE_RETURN_TO_SERVICE: "return to service",
})


def phases(s: RemediationState, start: datetime, end: datetime) -> dict[str, float]:
    """Seconds per phase between `start` and `end`: `detect` up to the episode's start, then each
    recorded step's time since the step before (a wait ends with the step it waited for), except
    the time after a return to service until the next step (a recurrence): IN_SERVICE."""
    out: dict[str, float] = {}

    def add(phase: str, a: datetime, b: datetime) -> None:
        a, b = max(a, start), min(b, end)
        if b > a:
            out[phase] = round(out.get(phase, 0.0) + (b - a).total_seconds(), 3)

    began = s.started_at or start
    add("detect", start, began)
    last, back = began, False
    for a in sorted(s.actions, key=lambda a: a.at):
        add(IN_SERVICE if back else PHASE_OF_STEP.get(a.step, "other"), last, a.at)
        last = max(last, a.at)
        back = a.step == c.KUBE_RETURN_TO_SERVICE and a.ok
    add("other", last, end)
    return out


def returned_at(s: RemediationState) -> datetime | None:
    """When the node went back into service (a verified uncordon), if it did."""
    back = [a.at for a in s.actions if a.step == c.KUBE_RETURN_TO_SERVICE and a.ok]
    return back[-1] if back else None


def interrupted_pods(s: RemediationState) -> list[c.InterruptedPod]:
    """The pods the fault's attribution was marked on, and any other pod the drain evicted (the
    remediation interrupted those: platform)."""
    attribution = (s.triage.attribution if s.triage else None) or "platform"
    pods = [c.InterruptedPod(pod=p, attribution=attribution, how="marked") for p in s.pods_marked]
    marked = set(s.pods_marked)
    pods += [c.InterruptedPod(pod=p, attribution="platform", how="evicted") for p in s.pods_evicted if p not in marked]
    return pods[:MAX_PODS_KEPT]


def outcome_fields(s: RemediationState, generation: str, now: datetime) -> dict:
    """The outcome ledger's fields of an episode's RemediationRecord."""
    detected = s.first_report.detected_at if s.first_report else None
    detected = detected if detected is not None and detected.tzinfo is not None else None  # a naive clock says nothing
    start = min(detected, s.started_at) if detected and s.started_at else (s.started_at or now)
    back = returned_at(s)
    quarantined = any(a.step == c.KUBE_QUARANTINE and a.ok for a in s.actions)
    end = back or now
    spent = phases(s, start, end)
    out = (end - start).total_seconds() - spent.get(IN_SERVICE, 0.0)
    return {
        "detected_at": detected, "returned_at": back,
        "out_of_service_s": round(out, 3) if quarantined else 0.0, "phases": spent, "pods": interrupted_pods(s), "sku": generation,
        "profile": s.profile or None, "finding": first_finding(s),
        "validations": {"passed": sum(1 for a in s.actions if a.step == "validate" and a.ok),
                        "failed": sum(1 for a in s.actions if a.step == "validate" and not a.ok)},
        "agent_missing": s.agent_missing or any("agent_missing" in a.detail for a in s.actions),
    }


def first_finding(s: RemediationState):
    """The acted-on finding with the highest rung: what a what-if replay sends again."""
    acted = [v for v in (s.triage.verdicts if s.triage else []) if v.rung is not None]
    if not acted:
        return None
    f = max(acted, key=lambda v: v.rung.rank).finding
    return f.model_copy(update={"message": f.message[:200]})
