"""Loading policy files and the pinned Xid catalog, with errors that name the bad key."""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from policies.model import Policy, XidRule
from policies.profile_model import NodeProfile
from policies.profiles import merge_mappings, merge_profiles, shipped_profiles


class PolicyError(ValueError):
    """A policy file that cannot be used; `problems` lists "key.path: why" lines."""

    def __init__(self, source: str, problems: list[str]):
        self.source = source
        self.problems = problems
        super().__init__(f"{source}: " + "; ".join(problems))


def describe_validation_error(err: ValidationError, prefix: str = "") -> list[str]:
    """pydantic errors as "key.path: why" lines."""
    lines = []
    for e in err.errors():
        path = ".".join(str(p) for p in (*([prefix] if prefix else []), *e["loc"]))
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown key"
        elif e["type"] == "missing":
            msg = "required key is missing"
        lines.append(f"{path or '(top level)'}: {msg}")
    return lines


def load_catalog() -> tuple[str, dict[int, XidRule]]:
    """The pinned Xid catalog shipped in policies/xid_catalog.yaml."""
    text = resources.files("policies").joinpath("xid_catalog.yaml").read_text()
    data = yaml.safe_load(text)
    return data["version"], {int(code): XidRule.model_validate(rule) for code, rule in data["xids"].items()}


def policy_from_mapping(data: Any, source: str = "policy") -> Policy:
    """Validate a parsed policy document and fill in the pinned catalog."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise PolicyError(source, ["(top level): must be a mapping of keys"])
    for key in ("xids", "xid_catalog_version"):
        if key in data:
            raise PolicyError(source, [f"{key}: the catalog is pinned; change entries with xid_overrides"])
    data = {**data, "profiles": merge_profiles(shipped_profiles(), data.get("profiles", {}))}
    try:
        policy = Policy.model_validate(merge_mappings(Policy().model_dump(mode="json", exclude={"xids", "profiles"}), data))
    except ValidationError as err:
        raise PolicyError(source, describe_validation_error(err)) from None
    version, xids = load_catalog()
    unknown = [f"xid_overrides.{c}: no such Xid in the catalog" for c in policy.xid_overrides if c not in xids]
    for gen, overrides in policy.generation_overrides.items():
        unknown += [f"generation_overrides.{gen.value}.{c}: no such Xid in the catalog" for c in overrides if c not in xids]
    if unknown:
        raise PolicyError(source, unknown)
    return policy.model_copy(update={"xids": xids, "xid_catalog_version": version})


def policy_yaml(policy: Policy) -> str:
    """A policy as a file `load_policy` gives back equal (the pinned catalog left out): how a
    resolved policy, e.g. a scenario's scaled one, becomes a controller's --policy."""
    data = policy.model_dump(mode="json", exclude={"xids", "xid_catalog_version"})
    data["profiles"] |= {name: None for name in shipped_profiles() if name not in policy.profiles}  # removed stays removed
    return yaml.safe_dump(data, sort_keys=False)


def default_policy() -> Policy:
    return policy_from_mapping({}, "default")


def load_policy(path: str | Path) -> Policy:
    """Load a YAML policy file; "default" gives the built-in policy."""
    if str(path) == "default":
        return default_policy()
    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text())
    except OSError as err:
        raise PolicyError(str(p), [f"(file): cannot read: {err.strerror}"]) from None
    except yaml.YAMLError as err:
        raise PolicyError(str(p), [f"(file): not valid YAML: {err}"]) from None
    return policy_from_mapping(data, str(p))


def resolve_profile(policy: Policy, name_or_file: str) -> tuple[str, NodeProfile]:
    """`--profile NAME|FILE` outside a cluster: a profile of the policy by name, or a YAML file
    holding one profile (validated, keys named on error)."""
    if name_or_file in policy.profiles:
        return name_or_file, policy.profiles[name_or_file]
    path = Path(name_or_file)
    if not path.exists():
        raise PolicyError(name_or_file, [f"(profile): no profile of that name ({', '.join(policy.profiles)}) "
                                         "and no such file"])
    try:
        data = yaml.safe_load(path.read_text())
        return path.stem, NodeProfile.model_validate(data or {})
    except yaml.YAMLError as err:
        raise PolicyError(str(path), [f"(file): not valid YAML: {err}"]) from None
    except ValueError as err:
        raise PolicyError(str(path), describe_validation_error(err)) from None
