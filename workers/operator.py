"""Operator commands over Temporal: status, history, pause/resume, approve, replace, manual reports."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta

from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import Client, RPCTimeoutOrCancelledError, WorkflowExecutionStatus, WorkflowHandle
from temporalio.service import RPCError, RPCStatusCode

import api as c
from api.episode import SA_FAULT, SA_NODE, SA_STAGE, RemediationStatus
from api.guard import GateRelease, GuardStatus
from api.names import (
    guard_workflow_id,
    legacy_remediation_workflow_id,
    node_in_workflow_id,
    remediation_workflow_id,
)
from policies.findings import Finding, HealthReport
from workers.episode_history import closed_episode
from workers.reporting import episode_id, send_report


class OperatorError(Exception):
    """A one-line reason the command could not do what was asked."""


# A query or update needs a worker to answer: with none polling, Temporal waits for one forever.
ANSWER_DEADLINE = timedelta(seconds=10)


async def ask(client: Client, handle: WorkflowHandle, call: Callable[[timedelta], Awaitable]):
    """A query or update within ANSWER_DEADLINE; past it, a one-line reason naming what is missing."""
    try:
        return await call(ANSWER_DEADLINE)
    except RPCTimeoutOrCancelledError:
        pass
    except RPCError as err:
        if err.status not in (RPCStatusCode.CANCELLED, RPCStatusCode.DEADLINE_EXCEEDED):
            raise
    raise OperatorError(await _why_no_answer(client, handle))


async def _why_no_answer(client: Client, handle: WorkflowHandle) -> str:
    queue = (await handle.describe()).task_queue
    resp = await client.workflow_service.describe_task_queue(DescribeTaskQueueRequest(
        namespace=client.namespace, task_queue=TaskQueue(name=queue),
        task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW))
    if not resp.pollers:
        return (f"no controller polls task queue {queue!r}, so {handle.id} cannot answer: "
                f"start `gpuheal controller --task-queue {queue}`")
    return f"{handle.id} did not answer within {ANSWER_DEADLINE.total_seconds():.0f} s ({len(resp.pollers)} pollers on {queue!r})"


async def query_status(client: Client, handle: WorkflowHandle):
    return await ask(client, handle, lambda t: handle.query(c.STATUS_QUERY, result_type=RemediationStatus,
                                                                    rpc_timeout=t))


async def _running(client: Client, node: str, cluster: str):
    handle = client.get_workflow_handle(await episode_id(client, node, cluster))
    try:
        desc = await handle.describe()
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            raise OperatorError(f"no remediation has ever run for node {node!r} in cluster {cluster!r} "
                                "(--cluster names another)") from None
        raise
    return handle, desc.status == WorkflowExecutionStatus.RUNNING


async def node_status(client: Client, node: str, cluster: str) -> RemediationStatus:
    handle, _ = await _running(client, node, cluster)
    st = await query_status(client, handle)
    if st.lease_requested and not st.lease_held and st.stage.value != "done":
        # Which gate holds the lease back is the guard's to say.
        try:
            guard = await guard_status(client, st.cluster)
            why = next((w.reason for w in guard.waiting if w.holder == handle.id), "not in the guard's line (re-sent soon)")
            st.waiting = f"{st.waiting}: {why}"
        except (OperatorError, RPCError):
            st.waiting = f"{st.waiting}: the fleet guard does not answer"
    return st


async def fleet_status(client: Client) -> list[dict]:
    """Every running episode, from the visibility store; each answers a query for what it waits on,
    and one that cannot is one row marked unreachable, with why, instead of a failed listing."""
    out = []
    async for w in client.list_workflows(f'WorkflowType = "{c.EPISODE_WORKFLOW}" AND ExecutionStatus = "Running"'):
        sa = w.typed_search_attributes
        row = {"node": sa.get(SA_NODE) or node_in_workflow_id(w.id, "remediate"), "stage": sa.get(SA_STAGE),
               "next_rung": None, "fault_class": sa.get(SA_FAULT), "paused": None, "awaiting_approval": None}
        try:
            st = await query_status(client, client.get_workflow_handle(w.id, run_id=w.run_id))
        except OperatorError as err:
            out.append({**row, "unreachable": str(err)})
            continue
        out.append({**row, "node": st.node, "stage": st.stage.value,
                    "next_rung": st.next_rung.value if st.next_rung else None,
                    "fault_class": st.triage.fault_class if st.triage else None, "paused": st.paused,
                    "awaiting_approval": st.awaiting_approval.value if st.awaiting_approval else None})
    return sorted(out, key=lambda r: r["node"])


async def history(client: Client, node: str, cluster: str) -> list[dict]:
    """Every episode of a node, oldest first, each step with its time and result (episodes from
    before ids carried the cluster included). A running episode answers a query; a closed one is read
    from its event history (no worker needed); one that cannot answer is one row saying why, not a
    failed listing."""
    episodes = []
    ids = (remediation_workflow_id(node, cluster), legacy_remediation_workflow_id(node))
    async for w in client.list_workflows(" OR ".join(f'WorkflowId = "{i}"' for i in ids)):
        handle = client.get_workflow_handle(w.id, run_id=w.run_id)
        row = {"run_id": w.run_id, "started": w.start_time.isoformat(), "status": w.status.name}
        if w.status != WorkflowExecutionStatus.RUNNING:
            episodes.append({**row, **await closed_episode(client, handle)})
            continue
        try:
            st = await query_status(client, handle)
        except OperatorError as err:
            episodes.append({**row, "outcome": None, "reason": f"unreachable: {err}", "rungs": [], "steps": []})
            continue
        episodes.append({**row, "outcome": st.outcome.value if st.outcome else None, "reason": st.outcome_reason,
                         "rungs": [r.value for r in st.rungs_tried],
                         "steps": [{"at": a.at.isoformat(), "step": a.step, "summary": a.summary, "ok": a.ok,
                                    "detail": a.detail} for a in st.actions]})
    if not episodes:
        raise OperatorError(f"no remediation has ever run for node {node!r} in cluster {cluster!r} "
                            "(--cluster names another)")
    return sorted(episodes, key=lambda e: e["started"])


async def update_episode(client: Client, node: str, cluster: str, update: str, *args) -> RemediationStatus:
    if update not in c.EPISODE_UPDATES:
        raise OperatorError(f"an episode has no update {update!r} (it has {', '.join(c.EPISODE_UPDATES)})")
    handle, running = await _running(client, node, cluster)
    if not running:
        raise OperatorError(f"node {node!r} has no open remediation episode")
    # Who asked goes last: the episode records it in its history and in `status`.
    return await ask(client, handle, lambda t: handle.execute_update(
        update, args=[*args, client.identity], result_type=RemediationStatus, rpc_timeout=t))


async def guard_status(client: Client, cluster: str):
    handle = client.get_workflow_handle(guard_workflow_id(cluster))
    try:
        return await ask(client, handle, lambda t: handle.query(c.STATUS_QUERY, result_type=GuardStatus,
                                                                        rpc_timeout=t))
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            raise OperatorError(f"no fleet guard runs for cluster {cluster!r}") from None
        raise


async def lift_gates(client: Client, cluster: str, leases: int, span: timedelta | None):
    """`resume --force`: resume, then lift every gate for some leases or a time, recorded with who asked."""
    await guard_update(client, cluster, "resume")
    until = datetime.now(UTC) + span if span else None
    lift = GateRelease(leases=0 if span else max(1, leases), until=until, by=client.identity)
    return await guard_update(client, cluster, "release_gate", lift)


async def guard_update(client: Client, cluster: str, update: str, *args) -> GuardStatus:
    if update not in c.GUARD_UPDATES:
        raise OperatorError(f"the fleet guard has no update {update!r} (it has {', '.join(c.GUARD_UPDATES)})")
    handle = client.get_workflow_handle(guard_workflow_id(cluster))
    try:
        return await ask(client, handle, lambda t: handle.execute_update(update, args=list(args), result_type=GuardStatus,
                                                                         rpc_timeout=t))
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            raise OperatorError(f"no fleet guard runs for cluster {cluster!r}") from None
        raise


async def manual_report(client: Client, node: str, xid: int, gpu: int, cluster: str = "default",
                        task_queue: str = c.DEFAULT_TASK_QUEUE):
    """A person's report: its own sequence, on the node's current boot so the agent's stay valid."""
    boot = "manual"
    try:
        handle, running = await _running(client, node, cluster)
        if running:  # a closed episode (ended, or terminated by hand) has no boot to keep in step with
            boot = (await query_status(client, handle)).boot_id or boot
    except (OperatorError, RPCError):
        pass
    report = HealthReport(node=node, boot_id=boot, seq=time.time_ns() // 1000, source="manual",
                          detected_at=datetime.now(UTC),
                          findings=[Finding(kind="xid", xid=xid, gpu_index=gpu, message=f"reported by an operator: Xid {xid}")])
    return await send_report(client, report, node=node, cluster=cluster, task_queue=task_queue)


async def suspect_report(client: Client, node: str, why: str, min_interval: timedelta, cluster: str = "default",
                         task_queue: str = c.DEFAULT_TASK_QUEUE):
    """A node suspected, not failed (a slow rank, NCCL timeouts, a person's hunch): the episode drains
    it and load-tests it before any remedy. Refused when the node's last episode ended less than
    `min_interval` ago: one flaky job must not keep a node out of service."""
    boot = "manual"
    try:
        handle, running = await _running(client, node, cluster)
        if running:
            boot = (await query_status(client, handle)).boot_id or boot
        else:
            closed = (await handle.describe()).close_time
            if closed is not None and datetime.now(UTC) - closed < min_interval:
                ago = int((datetime.now(UTC) - closed).total_seconds() // 60)
                raise OperatorError(f"{node} was checked {ago} min ago (its last episode ended {closed:%H:%M:%S} "
                                    f"UTC); suspect reports are limited to one per {min_interval} per node")
    except RPCError:
        pass
    except OperatorError as err:
        if "no remediation has ever run" not in str(err):
            raise
    report = HealthReport(node=node, boot_id=boot, seq=time.time_ns() // 1000, source="manual",
                          detected_at=datetime.now(UTC),
                          findings=[Finding(kind="suspect", message=f"suspect: {why}"[:2000])])
    return await send_report(client, report, node=node, cluster=cluster, task_queue=task_queue)
