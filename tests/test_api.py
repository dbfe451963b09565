"""The typed wire (api/) names what the workflows define: a client that starts, signals, queries or
updates a workflow by an api name reaches a handler that exists."""

from __future__ import annotations

import typing

from temporalio import workflow

import api as c
from workflows.fleet_guard import FleetGuard
from workflows.node_admission import NodeAdmission
from workflows.node_profile import NodeProfileLookup
from workflows.node_remediation import NodeRemediation


def defn(cls) -> workflow._Definition:
    return workflow._Definition.must_from_class(cls)


def test_workflow_types_are_the_api_names():
    assert defn(NodeRemediation).name == c.EPISODE_WORKFLOW
    assert defn(FleetGuard).name == c.GUARD_WORKFLOW
    assert defn(NodeAdmission).name == c.ADMISSION_WORKFLOW
    assert defn(NodeProfileLookup).name == c.PROFILE_WORKFLOW


def test_handlers_clients_call_by_name_exist():
    episode, guard, admission = defn(NodeRemediation), defn(FleetGuard), defn(NodeAdmission)
    assert c.EPISODE_SIGNAL_REPORT in episode.signals
    assert c.STATUS_QUERY in episode.queries and c.STATUS_QUERY in guard.queries
    assert set(c.EPISODE_UPDATES) <= set(episode.updates), set(c.EPISODE_UPDATES) - set(episode.updates)
    assert set(c.GUARD_UPDATES) <= set(guard.updates), set(c.GUARD_UPDATES) - set(guard.updates)
    assert {c.GUARD_SIGNAL_FAULT, c.GUARD_SIGNAL_REQUEST, c.GUARD_SIGNAL_RELEASE} <= set(guard.signals)
    for holder in (episode, admission):
        assert c.HOLDER_SIGNAL_GRANTED in holder.signals
    assert c.HOLDER_SIGNAL_QUARANTINE in episode.signals


def test_inputs_and_results_are_the_api_models():
    def hints(cls):
        return typing.get_type_hints(defn(cls).run_fn)

    assert hints(NodeRemediation) == {"inp": c.RemediationInput, "return": c.RemediationResult}
    assert hints(FleetGuard)["inp"] is c.GuardInput
    assert hints(NodeAdmission) == {"inp": c.AdmissionInput, "return": c.AdmissionResult}
    assert defn(FleetGuard).updates["release_gate"].arg_types == [c.GateRelease]


def test_an_unknown_update_is_refused_before_any_call():
    import asyncio

    import pytest

    from workers import operator as op

    with pytest.raises(op.OperatorError, match="no update 'reboot'"):
        asyncio.run(op.guard_update(None, "default", "reboot"))
    with pytest.raises(op.OperatorError, match="no update 'drain'"):
        asyncio.run(op.update_episode(None, "n1", "default", "drain"))
