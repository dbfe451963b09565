"""Node profiles: the shipped ones, which one a node gets (and why), and a policy as it applies to it."""

from __future__ import annotations

from importlib import resources
from typing import Any

import yaml
from pydantic import BaseModel

from policies.model import Policy

PROFILE_LABEL = "gpuheal.io/profile"  # names a profile outright
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"  # set by GPU feature discovery


def shipped_profiles() -> dict[str, Any]:
    """policies/profiles.yaml as plain data (each figure with its source)."""
    return yaml.safe_load(resources.files("policies").joinpath("profiles.yaml").read_text())


def merge_profiles(shipped: dict[str, Any], given: Any) -> Any:
    """A file's `profiles:` over the shipped ones: a named shipped profile changes only where the file
    says, null removes it, a new name adds one. Anything else is left for validation to name."""
    if not isinstance(given, dict):
        return given
    out = dict(shipped)
    for name, value in given.items():
        if value is None:
            out.pop(name, None)
        elif isinstance(value, dict) and isinstance(shipped.get(name), dict):
            out[name] = merge_mappings(shipped[name], value)
        else:
            out[name] = value
    return out


def merge_mappings(base: dict, over: dict) -> dict:
    """`over` names only what it changes: nested mappings merge over `base`."""
    out = dict(base)
    for k, v in over.items():
        out[k] = merge_mappings(base[k], v) if isinstance(v, dict) and isinstance(base.get(k), dict) else v
    return out


class Selection(BaseModel):
    """The profile a node gets, and why (what `gpuheal profiles` prints)."""

    node: str = ""
    profile: str | None = None
    reason: str


def select_profile(policy: Policy, labels: dict[str, str], node: str = "") -> Selection:
    """The label gpuheal.io/profile names one outright; else the most specific match: node group, then
    instance type, then GPU product, each with the profile's `match.labels` all holding. Ties go to
    the last declared, so a policy file's own profiles win over shipped ones."""
    labels = labels or {}
    named = labels.get(PROFILE_LABEL)
    if named:
        if named in policy.profiles:
            return Selection(node=node, profile=named, reason=f"label {PROFILE_LABEL}={named}")
        return Selection(node=node, reason=f"label {PROFILE_LABEL}={named} names no profile in the policy: "
                                           "none applied (learned baseline only)")
    groups = {(k, labels[k]) for k in policy.node_group_labels if k in labels}
    best: tuple[int, int, str, str] | None = None
    for order, (name, p) in enumerate(policy.profiles.items()):
        m = p.match
        if any(labels.get(k) != v for k, v in m.labels.items()):
            continue
        extra = "".join(f", {k}={v}" for k, v in sorted(m.labels.items()))
        hit = next(((3, f"node group {v} ({k}){extra}") for k, v in sorted(groups) if v in m.node_groups), None)
        if hit is None and labels.get(INSTANCE_TYPE_LABEL) in m.instance_types:
            hit = 2, f"instance type {labels[INSTANCE_TYPE_LABEL]} ({INSTANCE_TYPE_LABEL}){extra}"
        if hit is None and labels.get(GPU_PRODUCT_LABEL) in m.gpu_products:
            hit = 1, f"GPU product {labels[GPU_PRODUCT_LABEL]} ({GPU_PRODUCT_LABEL}){extra}"
        if hit is not None and (best is None or (hit[0], order) >= best[:2]):
            best = (hit[0], order, name, hit[1])
    if best is None:
        return Selection(node=node, reason="no profile matches the node's labels: learned baseline only")
    return Selection(node=node, profile=best[2], reason=best[3])


def for_node(policy: Policy, profile_name: str | None) -> Policy:
    """The policy as it applies to a node of this profile: its ladder and finding-rung overrides, and
    its mode (dry_run records what would be done; observe records the triage and never cordons)."""
    profile = policy.profiles.get(profile_name) if profile_name else None
    if profile is None:
        return policy
    ladder = policy.ladder.model_copy(update={
        rung: getattr(policy.ladder, rung).model_copy(update=override.model_dump(exclude_none=True))
        for rung, override in profile.ladder if override is not None})
    triage = policy.triage.model_copy(update={"finding_rungs": {**policy.triage.finding_rungs, **profile.finding_rungs}})
    load = policy.validation.load
    validation = policy.validation.model_copy(update={"load": load.model_copy(
        update={"floors": {**load.floors, **profile.load_floors}})})
    return policy.model_copy(update={
        "name": f"{policy.name}/{profile_name}", "ladder": ladder, "triage": triage, "validation": validation,
        "dry_run": policy.dry_run or profile.mode == "dry_run", "observe": policy.observe or profile.mode == "observe"})
