"""The policy reference in the README, generated from the policy model's field docs (cannot drift)."""

from __future__ import annotations

import json
from datetime import timedelta

from pydantic import BaseModel

from policies.durations import format_duration
from policies.model import Policy

START, END = "<!-- policy-reference:start -->", "<!-- policy-reference:end -->"
_SKIP = {"xids", "xid_catalog_version", "xid_overrides", "generation_overrides", "triage"}


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


def policy_reference() -> str:
    head = ["| key | default | meaning |", "|---|---|---|"]
    tail = ["", "Also: `xid_overrides` and `generation_overrides` (partial catalog entries by Xid code), and "
            "`triage.action_rungs` / `finding_rungs` / `recovery_rungs` / `app_repeat_threshold` (see "
            "`policies/model.py`). The Xid catalog itself is pinned in `policies/xid_catalog.yaml`."]
    return "\n".join([START, *head, *_rows(Policy()), *tail, END])
