"""The guard's signal-with-start: a guard caught between runs (NOT_FOUND for a moment) is tried
again within the activity; any other error, or a NOT_FOUND that lasts, fails it."""

from __future__ import annotations

import pytest
from temporalio.service import RPCError, RPCStatusCode

import api as c
from activities.guard import SIGNAL_TRIES, GuardActivities
from policies.guard_policy import GuardPolicy


class ScriptedClient:
    """Answers start_workflow with the scripted errors in turn, then succeeds (records each call)."""

    def __init__(self, errors: list[RPCError]):
        self.errors, self.calls = list(errors), []

    async def start_workflow(self, *args, **kwargs):
        self.calls.append(kwargs)
        if self.errors:
            raise self.errors.pop(0)


def request() -> c.GuardSignalRequest:
    return c.GuardSignalRequest(cluster="c1", guard=GuardPolicy(), task_queue="q", signal=c.GUARD_SIGNAL_FAULT,
                                payload={"node": "n1"})


def not_found() -> RPCError:
    return RPCError("Completed workflow", RPCStatusCode.NOT_FOUND, b"")


async def test_a_guard_between_runs_is_signalled_on_the_next_try(monkeypatch):
    monkeypatch.setattr("activities.guard.SIGNAL_RETRY_S", 0.0)
    client = ScriptedClient([not_found()])
    await GuardActivities(client).signal_guard(request())
    assert len(client.calls) == 2
    assert client.calls[-1]["start_signal"] == c.GUARD_SIGNAL_FAULT
    assert client.calls[-1]["id"] == c.guard_workflow_id("c1")


async def test_a_lasting_not_found_and_other_errors_fail_the_activity(monkeypatch):
    monkeypatch.setattr("activities.guard.SIGNAL_RETRY_S", 0.0)
    lasting = ScriptedClient([not_found() for _ in range(SIGNAL_TRIES)])
    with pytest.raises(RPCError):
        await GuardActivities(lasting).signal_guard(request())
    assert len(lasting.calls) == SIGNAL_TRIES
    denied = ScriptedClient([RPCError("denied", RPCStatusCode.PERMISSION_DENIED, b"")])
    with pytest.raises(RPCError):
        await GuardActivities(denied).signal_guard(request())
    assert len(denied.calls) == 1
