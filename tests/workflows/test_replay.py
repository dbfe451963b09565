"""Recorded histories (tests/histories/, `make histories`) replay against the current workflow code."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer
from temporalio.workflow import NondeterminismError

from tests.workflows.changed_workflows import NodeRemediationChangedPatched, NodeRemediationChangedUnpatched
from workflows.fleet_guard import FleetGuard
from workflows.node_admission import NodeAdmission
from workflows.node_remediation import NodeRemediation

# The recordings of the current code, plus those made before each patch (subfolders before-<id>).
ROOT = Path(__file__).resolve().parent.parent / "histories"
GUARD = ROOT / "guard"  # FleetGuard's own recordings
ADMISSION = ROOT / "admission"  # NodeAdmission's
HISTORIES = sorted(p for p in ROOT.rglob("*.json") if GUARD not in p.parents and ADMISSION not in p.parents)
ADMISSION_PATHS = {"admitted", "denied_replaced", "after_episode"}
GUARD_PATHS = {"canary_failed", "quarantine_deferred"}
REQUIRED_PATHS = {"kill_only", "reset", "reboot", "replace", "probation_recurrence", "approval"}
# Paths recorded beside the ladder's required ones.
DO_NO_HARM_PATHS = {"agent_missing", "cordon_failed", "uncordon_failed", "drain_failed", "rejected",
                    "quarantine_deferred"}


def recorded_id(doc: dict, prefix: str, field: str) -> str:
    """The workflow id the history was recorded under (its start input names the node or cluster):
    code may key on it, as a lease request id does, so the replay runs under the same id."""
    import base64

    for event in doc["events"]:  # a grant names its holder: the id itself, whichever form it had
        signal = event.get("workflowExecutionSignaledEventAttributes") or {}
        for p in (signal.get("input") or {}).get("payloads") or []:
            holder = json.loads(base64.b64decode(p.get("data", "")) or "{}")
            if isinstance(holder, dict) and str(holder.get("holder", "")).startswith(f"{prefix}/"):
                return holder["holder"]
    start = doc["events"][0]["workflowExecutionStartedEventAttributes"]
    payload = (start.get("input") or {}).get("payloads") or [{}]
    value = json.loads(base64.b64decode(payload[0].get("data", "")) or "{}").get(field) if payload[0] else None
    return f"{prefix}/{value}" if value else f"{prefix}/unknown"


def load(path: Path) -> WorkflowHistory:
    doc = json.loads(path.read_text())
    return WorkflowHistory.from_json(recorded_id(doc, "remediate", "node"), doc)


def test_every_required_path_is_recorded():
    assert REQUIRED_PATHS | DO_NO_HARM_PATHS <= {p.stem for p in HISTORIES if p.parent == ROOT}
    assert GUARD_PATHS <= {p.stem for p in GUARD.glob("*.json")}
    assert ADMISSION_PATHS <= {p.stem for p in ADMISSION.glob("*.json")}
    for before in (d for d in GUARD.iterdir() if d.is_dir()):
        assert GUARD_PATHS <= {p.stem for p in before.glob("*.json")}, f"guard/{before.name}: a path is missing"
    for before in (d for d in ROOT.iterdir() if d.is_dir() and d not in (GUARD, ADMISSION)):
        assert REQUIRED_PATHS <= {p.stem for p in before.glob("*.json")}, f"{before.name}: a path is missing"


@pytest.mark.parametrize("path", HISTORIES, ids=lambda p: str(p.relative_to(ROOT).with_suffix("")))
async def test_history_replays(path: Path):
    replayer = Replayer(workflows=[NodeRemediation, FleetGuard], data_converter=pydantic_data_converter)
    await replayer.replay_workflow(load(path))


# FleetGuard's and NodeAdmission's recordings: (folder, id prefix, the start input's field, workflow).
OTHERS = [(GUARD, "fleet-guard", "cluster", FleetGuard), (ADMISSION, "admit", "node", NodeAdmission)]


@pytest.mark.parametrize(("path", "prefix", "field", "wf"), [
    pytest.param(p, prefix, field, wf, id=str(p.relative_to(ROOT).with_suffix("")))
    for folder, prefix, field, wf in OTHERS for p in sorted(folder.rglob("*.json"))])
async def test_guard_and_admission_histories_replay(path: Path, prefix: str, field: str, wf):
    doc = json.loads(path.read_text())
    history = WorkflowHistory.from_json(recorded_id(doc, prefix, field), doc)
    await Replayer(workflows=[wf], data_converter=pydantic_data_converter).replay_workflow(history)


@pytest.mark.parametrize("path", HISTORIES, ids=lambda p: str(p.relative_to(ROOT).with_suffix("")))
async def test_unpatched_change_is_caught(path: Path):
    replayer = Replayer(workflows=[NodeRemediationChangedUnpatched], data_converter=pydantic_data_converter)
    with pytest.raises(NondeterminismError):
        await replayer.replay_workflow(load(path))


@pytest.mark.parametrize("path", HISTORIES, ids=lambda p: str(p.relative_to(ROOT).with_suffix("")))
async def test_patched_change_replays(path: Path):
    replayer = Replayer(workflows=[NodeRemediationChangedPatched], data_converter=pydantic_data_converter)
    await replayer.replay_workflow(load(path))
