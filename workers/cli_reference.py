"""The README's CLI reference, generated from gpuheal's argument parser (cannot drift)."""

from __future__ import annotations

import argparse

START, END = "<!-- cli-reference:start -->", "<!-- cli-reference:end -->"
# Shown once, not on every row: the Temporal connection flags and the logging flags.
COMMON = {"--temporal", "--namespace", "--tls-ca", "--tls-cert", "--tls-key", "--tls-server-name", "--api-key",
          "--metrics", "--tracing", "--log-level", "--log-format", "-h", "--help"}


def _commands(sub: argparse._SubParsersAction, prefix: str):
    helps = {a.dest: a.help for a in sub._choices_actions}
    for name, sp in sub.choices.items():
        nested = [a for a in sp._actions if isinstance(a, argparse._SubParsersAction)]
        if nested:
            yield from _commands(nested[0], f"{prefix}{name} ")
        else:
            yield f"{prefix}{name}", helps.get(name, ""), sp


def _args(sp: argparse.ArgumentParser) -> tuple[str, bool]:
    parts, temporal = [], False
    for a in sp._actions:
        if not a.option_strings:
            if not isinstance(a, argparse._SubParsersAction):
                parts.append(a.metavar or a.dest.upper() if a.nargs != "?" else f"[{a.dest.upper()}]")
            continue
        flag = a.option_strings[-1]
        if flag in COMMON:
            temporal |= flag == "--temporal"
            continue
        if a.nargs == 0:
            parts.append(f"[{flag}]")
        else:
            value = a.metavar or ("{" + ",".join(a.choices) + "}" if a.choices else a.dest.upper())
            parts.append(f"{flag} {value}" if a.required else f"[{flag} {value}]")
    return " ".join(parts), temporal


def cli_reference(parser: argparse.ArgumentParser) -> str:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    rows = ["| command | what it does | talks to Temporal |", "|---|---|---|"]
    for name, help_, sp in _commands(sub, "gpuheal "):
        args, temporal = _args(sp)
        rows.append(f"| `{f'{name} {args}'.strip()}` | {help_} | {'yes' if temporal else ''} |")
    common = ("Every command takes `--log-level LEVEL` and `--log-format {text,json}`. Those that talk to "
              "Temporal also take `--temporal HOST:PORT`, `--namespace`, `--tls-ca`, `--tls-cert`, `--tls-key`, "
              "`--tls-server-name`, `--api-key`, `--metrics prometheus://HOST:PORT` or `otlp://HOST:PORT`, and "
              "`--tracing otlp://HOST:PORT` or `console`; unset ones fall back to `TEMPORAL_ADDRESS`, "
              "`TEMPORAL_NAMESPACE`, `TEMPORAL_API_KEY`, `TEMPORAL_TLS_*` and the Temporal config file.")
    return "\n".join([START, *rows, "", common, END])
