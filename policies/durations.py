"""Human durations ("90s", "10m", "1h30m", "7d") as a pydantic field type."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Annotated, Any

from pydantic import BeforeValidator, PlainSerializer

_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")


def parse_duration(value: Any) -> timedelta:
    """Parse "10m"-style text (or plain seconds) into a timedelta; raise ValueError otherwise."""
    if isinstance(value, timedelta):
        return value
    if isinstance(value, bool):
        raise ValueError("must be a duration like 10m")
    if isinstance(value, int | float):
        if value < 0:
            raise ValueError("must not be negative")
        return timedelta(seconds=value)
    if isinstance(value, str):
        text = value.strip().lower()
        pos, total = 0, 0.0
        for match in _PART.finditer(text):
            if match.start() != pos:
                break
            total += float(match.group(1)) * _UNITS[match.group(2)]
            pos = match.end()
        if text and pos == len(text):
            return timedelta(seconds=total)
    raise ValueError("must be a duration like 10m")


def format_duration(value: timedelta) -> str:
    """The inverse of parse_duration, shortest form ("1h30m", "250ms")."""
    total_ms = round(value.total_seconds() * 1000)
    if total_ms == 0:
        return "0s"
    out = []
    for unit, size in (("d", 86400000), ("h", 3600000), ("m", 60000), ("s", 1000), ("ms", 1)):
        count, total_ms = divmod(total_ms, size)
        if count:
            out.append(f"{count}{unit}")
    return "".join(out)


# Serialised back to the same text form, so a resolved policy reads like the file it came from
# and round-trips through workflow inputs.
Duration = Annotated[timedelta, BeforeValidator(parse_duration), PlainSerializer(format_duration, return_type=str)]
