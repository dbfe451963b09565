"""Replaying exported histories against the current workflow code (`gpuheal replay DIR`)."""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from workflows.fleet_guard import FleetGuard
from workflows.node_remediation import NodeRemediation


class ReplayOutcome(BaseModel):
    file: str
    ok: bool
    events: int
    error: str = ""


async def replay_dir(directory: Path) -> list[ReplayOutcome]:
    files = sorted(directory.glob("*.json"))
    if not files:
        raise FileNotFoundError(f"no *.json histories in {directory}")
    replayer = Replayer(workflows=[NodeRemediation, FleetGuard], data_converter=pydantic_data_converter)
    outcomes = []
    for f in files:
        history = WorkflowHistory.from_json(f.stem, json.loads(f.read_text()))
        result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
        err = result.replay_failure
        outcomes.append(ReplayOutcome(file=f.name, ok=err is None, events=len(history.events),
                                      error=f"{type(err).__name__}: {err}" if err else ""))
    return outcomes
