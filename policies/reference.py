"""The policy reference in the README, generated from the policy model's field docs (cannot drift)."""

from __future__ import annotations

import json
from datetime import timedelta

from pydantic import BaseModel

from policies.durations import format_duration
from policies.model import Policy
from policies.profile_model import NodeProfile

START, END = "<!-- policy-reference:start -->", "<!-- policy-reference:end -->"
_SKIP = {"xids", "xid_catalog_version", "xid_overrides", "generation_overrides", "triage", "profiles"}


def _show(value) -> str:
    if isinstance(value, timedelta):
        return format_duration(value)
    if isinstance(value, BaseModel):
        return "(section)"
    return json.dumps(value, default=str)


def _rows(model: BaseModel, prefix: str = "") -> list[str]:
    rows = []
    for name, info in type(model).model_fields.items():
        if not prefix and name in _SKIP:
            continue
        value = getattr(model, name)
        key = f"{prefix}{name}"
        rows.append(f"| `{key}` | {_show(value)} | {(info.description or '').replace('|', '/')} |")
        if isinstance(value, BaseModel):
            rows += _rows(value, key + ".")
    return rows


def _profile_rows(cls: type[BaseModel], prefix: str) -> list[str]:
    """A profile's keys from the model's classes (a profile's sections default to null, so walk the types)."""
    rows = []
    for name, info in cls.model_fields.items():
        key = f"{prefix}{name}"
        sub = None if getattr(info.annotation, "__origin__", None) is dict else next(
            (a for a in (info.annotation, *getattr(info.annotation, "__args__", ()))
             if isinstance(a, type) and issubclass(a, BaseModel)), None)
        default = ("(section)" if sub is not None else "(required)" if info.is_required()
                   else _show(info.get_default(call_default_factory=True)))
        rows.append(f"| `{key}` | {default} | {(info.description or '').replace('|', '/')} |")
        if sub is not None and name != "ladder":
            rows += _profile_rows(sub, key + ".")
    return rows


def _shipped_rows() -> list[str]:
    from policies.loader import default_policy

    rows = ["", "Shipped profiles (`policies/profiles.yaml`, each figure's source in the file):", "",
            "| profile | selected by | GPUs | adapters | PCIe |", "|---|---|---|---|---|"]
    for name, p in default_policy().profiles.items():
        m = p.match
        by = "; ".join(filter(None, [", ".join(m.node_groups), ", ".join(m.instance_types), ", ".join(m.gpu_products)]))
        by += "".join(f" with {k}={v}" for k, v in m.labels.items())
        net = "none" if p.network.kind == "none" else f"{p.network.ports} x {p.network.rate_gbps:g} Gb/s {p.network.kind.value}"
        rows.append(f"| `{name}` | {by} | {p.gpus} {p.generation.value} | {net} | Gen{p.pcie.generation} x{p.pcie.width} |")
    return rows


def policy_reference() -> str:
    head = ["| key | default | meaning |", "|---|---|---|"]
    tail = ["", "Also: `xid_overrides` and `generation_overrides` (partial catalog entries by Xid code), and "
            "`triage.action_rungs` / `finding_rungs` / `recovery_rungs` / `app_repeat_threshold` (see "
            "`policies/model.py`). The Xid catalog itself is pinned in `policies/xid_catalog.yaml`."]
    profiles = ["", "`profiles.NAME` (what a healthy node of one kind has; `ladder` takes the keys of the "
                "policy's `ladder`, each optional):", "", *head,
                *_profile_rows(NodeProfile, "profiles.NAME."), *_shipped_rows()]
    return "\n".join([START, *head, *_rows(Policy()), *profiles, *tail, END])
