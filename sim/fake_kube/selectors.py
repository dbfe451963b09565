"""Label and field selectors, and a PodDisruptionBudget's label selector, as the API server evaluates them."""

from __future__ import annotations

import re

# --- selectors -----------------------------------------------------------------------------------
_SET_EXPR = re.compile(r"^\s*([\w./-]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")


def _split_selector(text: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in text:
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    return [p for p in (*parts, cur) if p.strip()]


def label_matches(labels: dict, selector: str | None) -> bool:
    for term in _split_selector(selector or ""):
        if m := _SET_EXPR.match(term):
            values = {v.strip() for v in m.group(3).split(",")}
            present = labels.get(m.group(1)) in values
            if present != (m.group(2) == "in"):
                return False
        elif "!=" in term:
            k, v = (x.strip() for x in term.split("!=", 1))
            if labels.get(k) == v:
                return False
        elif "=" in term:
            k, v = (x.strip() for x in term.replace("==", "=").split("=", 1))
            if labels.get(k) != v:
                return False
        elif term.strip().startswith("!"):
            if term.strip()[1:] in labels:
                return False
        elif term.strip() not in labels:
            return False
    return True


def _field(obj: dict, path: str):
    cur = obj
    for p in path.split("."):
        cur = cur.get(p) if isinstance(cur, dict) else None
    return cur


def field_matches(obj: dict, selector: str | None) -> bool:
    for term in _split_selector(selector or ""):
        if "!=" in term:
            k, v = term.split("!=", 1)
            if str(_field(obj, k.strip()) or "") == v.strip():
                return False
        else:
            k, v = term.replace("==", "=").split("=", 1)
            if str(_field(obj, k.strip()) or "") != v.strip():
                return False
    return True


def match_pdb_selector(selector: dict, labels: dict) -> bool:
    for k, v in (selector.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for expr in selector.get("matchExpressions") or []:
        k, op, values = expr["key"], expr["operator"], set(expr.get("values") or [])
        if op == "In" and labels.get(k) not in values:
            return False
        if op == "NotIn" and labels.get(k) in values:
            return False
        if op == "Exists" and k not in labels:
            return False
        if op == "DoesNotExist" and k in labels:
            return False
    return True
