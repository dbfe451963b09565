"""The guard's gates as a list: the first that holds is the reason, and a new gate is one entry."""

from __future__ import annotations

import pytest

from api.guard import GuardInput, GuardState
from policies.guard_policy import GuardPolicy
from workflows import guard_gates
from workflows.guard_gates import GATES, Gate, GuardGates


def guard(**state) -> GuardGates:
    g = GuardGates()
    g.inp, g.policy = GuardInput(cluster="c"), GuardPolicy(max_unhealthy=2)
    g.s = GuardState(fleet_size=10, **state)
    return g


def test_no_gate_holds_on_a_calm_fleet():
    assert guard(unhealthy={"a": "h"})._gate() is None


def test_each_gate_says_why():
    assert guard(breaker_open=True, breaker_reason="storm: 11 faults")._gate() == "storm: 11 faults"
    three = {n: "h" for n in "abc"}
    assert guard(unhealthy=three)._gate() == "3 nodes unhealthy, above max_unhealthy 2"


def test_the_first_gate_that_holds_is_the_reason():
    assert [g.name for g in GATES] == ["storm breaker", "max_unhealthy"]
    both = guard(breaker_open=True, breaker_reason="storm", unhealthy={n: "h" for n in "abc"})
    assert both._gate() == "storm"


def test_a_new_gate_is_one_entry(monkeypatch: pytest.MonkeyPatch):
    paused_racks = Gate("rack maintenance", lambda g: "rack r7 in maintenance")
    monkeypatch.setattr(guard_gates, "GATES", (*GATES, paused_racks))
    assert guard()._gate() == "rack r7 in maintenance"
