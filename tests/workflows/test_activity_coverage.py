"""Every activity a workflow calls is served: by the real workers (controller and node agent), by the
tests' stand-in fleet and by the what-if's. A new activity missing from one of them fails here,
not as a what-if whose replacement nodes are silently never admitted (`node.hardware_ids` was)."""

import ast
import inspect
from datetime import UTC, datetime
from pathlib import Path

import api as c
from activities.cloud import CloudActivities
from activities.guard import GuardActivities
from activities.kube import KubeActivities
from activities.ledger import LedgerActivities
from activities.load_ledger import LoadFigureActivities
from activities.node import NodeActivities
from activities.node_profile import NodeProfileActivities
from policies.loader import default_policy
from sim.whatif.faultmodel import load_fault_model
from sim.whatif.fleet import WhatIfFleet
from tests.workflows.fakes import FakeFleet

ROOT = Path(__file__).resolve().parents[2]
# Served by workers the stand-ins do not model: the agent's profile lookup (agents run it at start).
ONLY_REAL = {c.PROFILE_EXPECTATIONS, c.PROFILE_RECORD_BASELINE}


def called_by_workflows() -> set[str]:
    names = set()
    for path in (ROOT / "workflows").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "c":
                value = getattr(c, node.attr, None)
                if isinstance(value, str) and value in ACTIVITY_NAMES:
                    names.add(value)
    return names


def served_by(*classes) -> set[str]:
    return {getattr(fn, "__temporal_activity_definition").name for cls in classes
            for _, fn in inspect.getmembers(cls, callable) if hasattr(fn, "__temporal_activity_definition")}


REAL = served_by(KubeActivities, CloudActivities, LedgerActivities, GuardActivities, NodeActivities,
                 NodeProfileActivities, LoadFigureActivities)
ACTIVITY_NAMES = REAL | served_by(WhatIfFleet, FakeFleet)


def test_the_real_workers_serve_every_activity_a_workflow_calls():
    assert called_by_workflows() - REAL == set()


def registered(activities: list) -> set[str]:
    return {getattr(fn, "__temporal_activity_definition").name for fn in activities}


def test_the_stand_in_fleets_register_every_activity_a_workflow_calls():
    """What the stand-ins hand their workers, not only what their classes define."""
    wanted = called_by_workflows() - ONLY_REAL
    whatif = WhatIfFleet(client=None, task_queue="q", policy=default_policy(), model=load_fault_model("large-cluster"),
                         faults=[], nodes_count=1,
                         t0=datetime.now(UTC), clock=None)
    assert wanted - registered(whatif.controller_activities() + whatif.node_activities()) == set(), "the what-if fleet"
    fake = FakeFleet(client=None, task_queue="q", policy=default_policy(), cluster="c")
    assert wanted - registered(fake.activities()) == set(), "the tests' fake fleet"
