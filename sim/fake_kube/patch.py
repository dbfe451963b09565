"""The three patch types the API server accepts: strategic merge (with the real list strategies), JSON merge, JSON patch."""

from __future__ import annotations

import copy

from sim.fake_kube.errors import ApiError

# Strategic merge strategies of the fields served, from the `patchStrategy`/`patchMergeKey` struct
# tags in k8s.io/api/core/v1/types.go and k8s.io/apimachinery/pkg/apis/meta/v1/types.go:
#   NodeStatus.Conditions   patchStrategy:"merge" patchMergeKey:"type"
#   NodeStatus.Addresses    patchStrategy:"merge" patchMergeKey:"type"
#   PodSpec.Containers, .Volumes, Container.Env   patchStrategy:"merge" patchMergeKey:"name"
#   ObjectMeta.OwnerReferences   patchStrategy:"merge" patchMergeKey:"uid"
#   ObjectMeta.Finalizers   patchStrategy:"merge" (a list of strings: union)
#   NodeSpec.Taints         no patch strategy: atomic, a patch's list replaces the node's whole list
#   ObjectMeta.Labels/Annotations: maps, merged key by key; NodeSpec.Unschedulable: a scalar
MERGE_KEYS = {"conditions": ("type",), "containers": ("name",), "addresses": ("type",),
              "ownerReferences": ("uid",), "volumes": ("name",), "env": ("name",)}
MERGE_PRIMITIVES = {"finalizers"}


# --- patches -------------------------------------------------------------------------------------
def strategic_merge(target, patch, key: str | None = None):
    """Strategic merge as the API server does for built-in types: keyed lists merge, null deletes."""
    if isinstance(patch, dict) and isinstance(target, dict):
        out = dict(target)
        for k, v in patch.items():
            if k.startswith("$"):
                continue
            if v is None:
                out.pop(k, None)
            elif k in out:
                out[k] = strategic_merge(out[k], v, k)
            else:
                out[k] = _strip_directives(v)
        return out
    if isinstance(patch, list) and isinstance(target, list) and key in MERGE_PRIMITIVES:
        return [*target, *(x for x in patch if x not in target)]
    if isinstance(patch, list) and isinstance(target, list) and key in MERGE_KEYS:
        keys = MERGE_KEYS[key]
        out = list(target)
        for item in patch:
            if not isinstance(item, dict):
                continue
            ident = tuple(item.get(k) for k in keys)
            idx = next((i for i, t in enumerate(out) if isinstance(t, dict) and tuple(t.get(k) for k in keys) == ident), None)
            if item.get("$patch") == "delete":
                if idx is not None:
                    out.pop(idx)
            elif idx is None:
                out.append(_strip_directives(item))
            else:
                out[idx] = strategic_merge(out[idx], item)
        return out
    return _strip_directives(patch)


def _strip_directives(v):
    if isinstance(v, dict):
        return {k: _strip_directives(x) for k, x in v.items() if not k.startswith("$")}
    if isinstance(v, list):
        return [_strip_directives(x) for x in v]
    return v


def json_merge(target, patch):
    """RFC 7386: lists replace, null deletes."""
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = json_merge(out.get(k), v)
    return out


def json_patch(target, ops: list):
    """RFC 6902 (add, remove, replace, test)."""
    doc = copy.deepcopy(target)
    for op in ops:
        parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        parent = doc
        for p in parts[:-1]:
            parent = parent[int(p)] if isinstance(parent, list) else parent.setdefault(p, {})
        last = parts[-1] if parts else None
        kind = op["op"]
        if kind == "test":
            cur = parent[int(last)] if isinstance(parent, list) else parent.get(last)
            if cur != op["value"]:
                raise ApiError(422, "Invalid", f"json patch test failed at {op['path']}")
        elif kind == "remove":
            if isinstance(parent, list):
                parent.pop(int(last))
            elif last in parent:
                del parent[last]
            else:
                raise ApiError(422, "Invalid", f"json patch remove: {op['path']} does not exist")
        elif kind in ("add", "replace"):
            if isinstance(parent, list):
                if last == "-":
                    parent.append(op["value"])
                elif kind == "add":
                    parent.insert(int(last), op["value"])
                else:
                    parent[int(last)] = op["value"]
            else:
                parent[last] = op["value"]
        else:
            raise ApiError(422, "Invalid", f"json patch op {kind!r} not supported")
    return doc
