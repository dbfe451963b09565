"""Reports fuzzed with hypothesis (wrong types, huge findings lists, unknown kinds, foreign node,
stale sequence, replayed old boot): every one is rejected with its reason, no workflow task ever
fails, and the episode goes on to its normal end."""

from __future__ import annotations

import asyncio

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from temporalio.api.enums.v1 import EventType

from api.episode import RemediationResult
from policies.findings import MAX_FINDINGS, HealthReport
from policies.loader import default_policy
from tests.workflows.fake_node import FakeNode
from tests.workflows.fakes import FakeFleet, xid
from workflows.node_remediation import NodeRemediation

json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
                           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                           max_leaves=12)


def valid(name: str, /, **over) -> dict:
    doc = {"node": name, "boot_id": "boot-1", "seq": 10, "source": "agent",
           "findings": [{"kind": "xid", "xid": 79, "gpu_index": 2, "message": "Xid 79"}]}
    return {**doc, **over}


def malformed(doc) -> bool:
    try:
        HealthReport.model_validate(doc)
    except ValidationError:
        return True
    return False


def bad_reports(node: str):
    field = st.sampled_from(["node", "boot_id", "seq", "source", "findings", "gpus", "detected_at"])
    return st.one_of(
        json_values.filter(lambda v: not isinstance(v, dict)),  # not a report at all
        st.tuples(field, json_values).map(lambda kv: valid(node, **{kv[0]: kv[1]})).filter(malformed),  # a wrong type
        st.text(min_size=1, max_size=12).filter(lambda k: k not in {"xid", "ecc_dbe"}).map(
            lambda kind: valid(node, findings=[{"kind": f"zz-{kind}"}])),  # unknown finding kind
        st.integers(MAX_FINDINGS + 1, MAX_FINDINGS + 300).map(
            lambda n: valid(node, findings=[{"kind": "xid", "xid": 13, "gpu_index": 0}] * n)),  # huge list
        st.text(min_size=1, max_size=30).filter(lambda n: n != node).map(lambda other: valid(node, node=other)),
        st.integers(0, 10).map(lambda seq: valid(node, seq=seq, findings=[])),  # stale sequence (10 seen)
        st.integers(0, 1000).map(lambda seq: valid(node, boot_id=f"boot-{node}-0", seq=seq)),  # an earlier boot
        st.dictionaries(st.text(min_size=1, max_size=10).filter(lambda k: k not in valid(node)), json_values,
                        min_size=1, max_size=3).map(lambda extra: {**valid(node), **extra, "findings": [
                            {"kind": "xid", "xid": 79, "gpu_index": 2, "unknown_field": 1}]}),
    )


def draw(node: str, n: int) -> list:
    out = []

    @settings(max_examples=n, database=None, deadline=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(bad_reports(node))
    def collect(report):
        out.append(report)

    collect()
    return out


async def test_fuzzed_reports_are_rejected_never_fail_a_task(dev_env, uniq):
    policy = default_policy().scaled(0.001)
    policy.ladder.reboot.requires_approval = True
    policy.ladder.reboot.approval_timeout = policy.ladder.reboot.approval_timeout * 1000
    fleet = FakeFleet(client=dev_env.client, task_queue=f"fuzz-{uniq}", policy=policy, cluster=f"fuzz-{uniq}")
    node = fleet.add(FakeNode(f"fuzz-{uniq}", [xid(79)], cured_by="reboot"))
    payloads = draw(node.name, 45)
    async with fleet.workers():
        handle = await fleet.report(node.name)
        for _ in range(200):
            if (await handle.query(NodeRemediation.status)).awaiting_approval:
                break
            await asyncio.sleep(0.05)
        # A report from another boot (boot-1). Since the sender-cannot-steer fix only the reboot the
        # episode asked for retires a boot, so replays of the first boot's genuine reports are no
        # longer rejected as stale: they count once, as duplicates of what was heard.
        await fleet.send_raw(node.name, valid(node.name))
        before = (await handle.query(NodeRemediation.status)).duplicates
        for p in payloads:
            await fleet.send_raw(node.name, p)
        st = await handle.query(NodeRemediation.status)
        # A few draws are well-formed reports of the node's own current boot: taken, or counted as
        # duplicates; every other one is rejected with its reason.
        assert st.rejected_total >= len(payloads) - 8, (st.rejected_total, st.duplicates - before, len(payloads))
        assert all(r.reason for r in st.rejected)
        reasons = " | ".join(r.reason for r in st.rejected)
        for expected in ("malformed report", "sent to", "stale sequence"):
            assert expected in reasons, expected
        await handle.execute_update(NodeRemediation.approve, "reboot")
        result = await dev_env.client.get_workflow_handle(handle.id, result_type=RemediationResult).result()
    assert result.outcome == "returned"
    events = [e async for e in handle.fetch_history_events()]
    assert not [e for e in events if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED]
