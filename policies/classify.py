"""Triage: probe findings -> fault class, attribution, severity and the starting rung."""

from __future__ import annotations

from collections import Counter
from typing import Literal

from pydantic import BaseModel, Field

from policies.findings import Finding, FindingKind
from policies.model import Policy
from policies.terms import Attribution, Generation, Rung

Severity = Literal["info", "warning", "fatal"]
_SEVERITY_ORDER = {"info": 0, "warning": 1, "fatal": 2}


class Verdict(BaseModel):
    """How one finding is judged."""

    finding: Finding
    fault_class: str
    attribution: Attribution
    severity: Severity
    rung: Rung | None = Field(description="None: no action needed for this finding.")
    reason: str


class Triage(BaseModel):
    """The decision for a whole report."""

    fault_class: str | None = None
    attribution: Attribution | None = None
    severity: Severity = "info"
    start_rung: Rung | None = None
    gpus: list[int] = Field(default_factory=list, description="Faulty GPU indices; empty: node-wide or unknown.")
    reason: str = ""
    verdicts: list[Verdict] = Field(default_factory=list)

    @property
    def actionable(self) -> bool:
        return self.start_rung is not None


def judge(finding: Finding, generation: Generation, policy: Policy, repeats: int = 1) -> Verdict:
    """One finding's verdict. Unknown codes fail closed: platform fault, remediate from reset."""
    t = policy.triage
    generation = Generation(generation)
    if finding.kind is FindingKind.XID:
        rule = policy.xid_rule(finding.xid, generation) if finding.xid is not None else None
        if rule is None:
            return Verdict(
                finding=finding, fault_class="unknown_xid", attribution="platform", severity="fatal",
                rung=Rung.RESET, reason=f"Xid {finding.xid} is not in the catalog for {generation.value}: fail closed",
            )
        rung = t.action_rungs.get(rule.action)
        attribution, severity = rule.cause, "fatal" if rule.fatal else "warning"
        reason = f"Xid {finding.xid} ({rule.name}): NVIDIA says {rule.action.value}"
        if 144 <= finding.xid <= 150 and finding.fatal is not True:
            # NVLink5: only a Fatal subcode needs drain and reset; Nonfatal is counted, not acted on.
            rung, severity, reason = None, "warning", reason + "; subcode Nonfatal"
        if attribution == "application" and repeats >= t.app_repeat_threshold:
            # WORKFLOW_XID_13/31: repeats on the same GPU point at the hardware.
            attribution, rung, severity = "platform", Rung.RESET, "fatal"
            reason += f"; repeated {repeats} times on one GPU: hardware suspected"
        if rung is None and not (144 <= finding.xid <= 150):
            severity = "info"
        return Verdict(finding=finding, fault_class=rule.fault_class, attribution=attribution,
                       severity=severity, rung=rung, reason=reason)
    if finding.kind is FindingKind.RECOVERY_ACTION:
        action = finding.recovery_action
        rung = t.recovery_rungs.get(action) if action is not None else Rung.RESET
        return Verdict(
            finding=finding, fault_class="recovery_action", attribution="platform",
            severity="fatal" if rung else "info", rung=rung,
            reason=f"driver asks for recovery action {action.value if action else 'unknown'}",
        )
    rung = t.finding_rungs.get(finding.kind, Rung.RESET)
    return Verdict(
        finding=finding, fault_class=finding.kind.value, attribution="platform",
        severity="fatal" if finding.kind is not FindingKind.ROW_REMAP_PENDING else "warning",
        rung=rung, reason=f"{finding.label()}: {finding.message}".rstrip(": "),
    )


def classify(findings: list[Finding], generation: Generation, policy: Policy) -> Triage:
    """Combine the verdicts: the highest rung wins; application only when every acted-on finding is."""
    repeats = Counter((f.xid, f.gpu_index) for f in findings if f.kind is FindingKind.XID)
    verdicts = [judge(f, generation, policy, repeats[(f.xid, f.gpu_index)]) for f in findings]
    acted = [v for v in verdicts if v.rung is not None]
    if not acted:
        return Triage(verdicts=verdicts, reason="no finding needs action" if verdicts else "healthy",
                      severity=max((v.severity for v in verdicts), key=_SEVERITY_ORDER.get, default="info"))
    top = max(acted, key=lambda v: (v.rung.rank, _SEVERITY_ORDER[v.severity]))
    platform = [v for v in acted if v.attribution == "platform"]
    attribution: Attribution = "platform" if platform else "application"
    if attribution == "platform" and top.attribution == "application":
        top = max(platform, key=lambda v: (v.rung.rank, _SEVERITY_ORDER[v.severity]))
    start = top.rung
    if attribution == "platform" and start is Rung.KILL:
        # A platform fault whose NVIDIA action is "restart the app" (Xid 8, 32, 94) still takes the
        # node out of service: the job is killed as part of the drain, the GPU is reset.
        start = Rung.RESET
    gpus = sorted({v.finding.gpu_index for v in acted if v.finding.gpu_index is not None})
    return Triage(
        fault_class=top.fault_class, attribution=attribution,
        severity=max((v.severity for v in acted), key=_SEVERITY_ORDER.get),
        start_rung=start, gpus=gpus, reason=top.reason, verdicts=verdicts,
    )
