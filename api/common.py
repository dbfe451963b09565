"""The base of every request that acts on one node."""

from __future__ import annotations

from pydantic import BaseModel, Field


class NodeRequest(BaseModel):
    node: str
    dry_run: bool = Field(default=False, description="Record what would be done; change nothing.")
