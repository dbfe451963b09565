"""Named contexts for the command line (kubectl's habit): where Temporal is, which namespace, cluster
and task queue, kept in one file so that a command needs no connection flags.

The file is `$GPUHEAL_CONFIG`, else `~/.config/gpuheal/config.yaml`:

    current-context: demo
    contexts:
      demo: {temporal: 127.0.0.1:7233, namespace: default, cluster: default, task-queue: gpuheal}

A flag given on the command line always wins; then `--context NAME` (or the current context); then
TEMPORAL_* and the Temporal CLI's profile file for the connection; then the built-in defaults.
"""

from __future__ import annotations

import os
from pathlib import Path

import yaml

# context key -> the argparse dest it fills
KEYS = {"temporal": "temporal", "namespace": "namespace", "cluster": "cluster", "task-queue": "task_queue"}
EMBEDDED = {"demo", "simulate"}  # these start their own servers unless told --temporal


class ConfigError(Exception):
    """The config file or a context in it is wrong: one line naming which."""


def config_path() -> Path:
    return Path(os.environ.get("GPUHEAL_CONFIG") or Path.home() / ".config/gpuheal/config.yaml")


def load() -> dict:
    path = config_path()
    try:
        doc = yaml.safe_load(path.read_text()) or {}
    except FileNotFoundError:
        return {"contexts": {}}
    except (OSError, yaml.YAMLError) as err:
        raise ConfigError(f"{path}: {err}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("contexts", {}), dict):
        raise ConfigError(f"{path}: expected a mapping with `contexts:` (name -> settings)")
    for name, ctx in doc.get("contexts", {}).items():
        unknown = set(ctx or {}) - set(KEYS)
        if unknown:
            raise ConfigError(f"{path}: context {name!r}: unknown key(s) {', '.join(sorted(unknown))} "
                              f"(known: {', '.join(KEYS)})")
    doc.setdefault("contexts", {})
    return doc


def save(doc: dict) -> Path:
    path = config_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def set_context(name: str, settings: dict, use: bool = False) -> Path:
    doc = load()
    doc["contexts"][name] = {**(doc["contexts"].get(name) or {}), **{k: v for k, v in settings.items() if v}}
    if use or not doc.get("current-context"):
        doc["current-context"] = name
    return save(doc)


def apply(args, argv: list[str]) -> None:
    """Fill the flags the user did not give from the chosen context."""
    name = getattr(args, "context", None)
    doc = load()
    name = name or doc.get("current-context")
    if not name:
        return
    ctx = doc["contexts"].get(name)
    if ctx is None:
        if getattr(args, "context", None):
            raise ConfigError(f"no context {name!r} in {config_path()} (gpuheal config get-contexts)")
        return
    for key, dest in KEYS.items():
        if key not in ctx or not hasattr(args, dest) or _given(dest, argv):
            continue
        if dest == "temporal" and args.command in EMBEDDED:
            continue
        setattr(args, dest, ctx[key])


def _given(dest: str, argv: list[str]) -> bool:
    flag = "--" + dest.replace("_", "-")
    return any(a == flag or a.startswith(flag + "=") for a in argv)
