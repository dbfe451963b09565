"""Temporal-side effects for the fleet guard: signal-with-start it, check lease holders exist, and
hand out the quarantine room it reserved ahead for this controller."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from temporalio import activity
from temporalio.api.enums.v1 import TaskQueueKind, TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.service import RPCError, RPCStatusCode

import api as c
from activities.room_pool import RoomPool

SIGNAL_TRIES = 3
SIGNAL_RETRY_S = 0.2


class GuardActivities:
    def __init__(self, client: Client, room: RoomPool | None = None):
        self.client = client
        self.room = room  # None: no room reserved ahead, every cordon asks the guard

    @activity.defn(name=c.GUARD_TAKE_ROOM)
    async def take_room(self, req: c.TakeRoomRequest) -> str:
        """A local activity: a slot the guard reserved for this controller, or "" (ask the guard).
        With the episode's notice, the slot is handed out only once the guard took the notice, in
        the pool's next ask: the episode needs no second local activity to tell it."""
        token = await self.room.take(req.cluster, req.now) if self.room is not None else ""
        if token and req.notice is not None:
            told = req.notice.model_copy(update={"room_token": token, "before_cordon": True})
            if not await self.room.tell(req.cluster, told):
                # Not taken, or no echo in time: the slot lapses at the guard (or, taken late, is
                # this node's there, which the episode's own request then finds admitted).
                return ""
        return token

    @activity.defn(name=c.GUARD_SIGNAL)
    async def signal_guard(self, req: c.GuardSignalRequest) -> None:
        # A slot notice goes in the room pool's next ask, many in one update, when the pool can
        # bring it; the signal below when not. Either way the guard takes it the same way.
        if self.room is not None and req.signal == c.GUARD_SIGNAL_FAULT and req.payload.get("room_token"):
            if await self.room.tell(req.cluster, c.FaultNotice.model_validate(req.payload)):
                return
        # USE_EXISTING makes this idempotent: a retry signals the running guard again, and the
        # guard's handlers dedupe by holder.
        for attempt in range(1, SIGNAL_TRIES + 1):
            try:
                await self.client.start_workflow(
                    c.GUARD_WORKFLOW,
                    {"cluster": req.cluster, "policy": req.guard.model_dump(mode="json")},
                    id=c.guard_workflow_id(req.cluster),
                    task_queue=req.task_queue,
                    id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
                    start_signal=req.signal,
                    start_signal_args=[req.payload],
                    static_summary=f"Disruption budget and storm breaker for cluster {req.cluster}",
                )
                return
            except RPCError as err:
                # The time-skipping server answers NOT_FOUND "Completed workflow" to a guard caught
                # between runs (continuing as new); a moment later the new run takes it. Anything
                # else, or a NOT_FOUND that lasts, fails the activity for its own retry.
                if err.status != RPCStatusCode.NOT_FOUND or attempt == SIGNAL_TRIES:
                    raise
                await asyncio.sleep(SIGNAL_RETRY_S * attempt)

    @activity.defn(name=c.GUARD_LIVENESS)
    async def liveness(self, req: c.GuardLivenessRequest) -> c.GuardLiveness:
        """Stuck or slow, for an episode the guard did not answer in time: stuck when it does not
        run, its workflow task fails, or no worker polls its task queue; else slow (it runs, and a
        worker takes its tasks). A server that cannot list pollers (the time-skipping one) is
        taken at its word on the rest."""
        try:
            desc = await self.client.get_workflow_handle(c.guard_workflow_id(req.cluster)).describe(
                rpc_timeout=timedelta(seconds=10))
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND:
                return c.GuardLiveness(stuck=True, why="no fleet guard runs")
            raise
        task = desc.raw_description.pending_workflow_task if desc.raw_description.HasField("pending_workflow_task") else None
        pollers = await self._last_poll(desc.task_queue)
        return guard_liveness(desc.status, task.attempt if task else 0, desc.task_queue, pollers,
                              datetime.now(UTC), timedelta(seconds=req.stale_after))

    async def _last_poll(self, queue: str) -> datetime | None | bool:
        """When a worker last polled `queue` for workflow tasks: None if none has lately, False if
        the server cannot say."""
        try:
            resp = await self.client.workflow_service.describe_task_queue(DescribeTaskQueueRequest(
                namespace=self.client.namespace, task_queue=TaskQueue(name=queue, kind=TaskQueueKind.TASK_QUEUE_KIND_NORMAL),
                task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW), timeout=timedelta(seconds=10))
        except RPCError as err:
            if err.status == RPCStatusCode.UNIMPLEMENTED:
                return False
            raise
        seen = [p.last_access_time.ToDatetime(tzinfo=UTC) for p in resp.pollers if p.HasField("last_access_time")]
        return max(seen, default=None)

    @activity.defn(name=c.GUARD_RUNNING_HOLDERS)
    async def running_holders(self, req: c.LiveHoldersRequest) -> c.LiveHoldersResult:
        """Which of the ids run now: one paged visibility listing of the running episodes and
        admissions, heartbeating each page; an id the listing lacks (visibility lags a start by a
        moment) is confirmed by a describe, many at once. Servers without visibility get the
        describes alone."""
        wanted, running, listed = set(req.holders), set(), 0
        query = (f'ExecutionStatus = "Running" AND (WorkflowType = "{c.EPISODE_WORKFLOW}" '
                 f'OR WorkflowType = "{c.ADMISSION_WORKFLOW}")')
        try:
            async for w in self.client.list_workflows(query, page_size=1000):
                listed += 1
                if w.id in wanted:
                    running.add(w.id)
                if listed % 500 == 0:
                    activity.heartbeat(f"listed {listed} running workflows")
        except RPCError as err:
            if err.status != RPCStatusCode.UNIMPLEMENTED:  # the time-skipping test server has no visibility
                raise
        missing = sorted(wanted - running)
        gate, done = asyncio.Semaphore(32), 0

        async def confirm(holder: str) -> None:
            nonlocal done
            async with gate:
                if await self._runs(holder):
                    running.add(holder)
                done += 1
                if done % 100 == 0:
                    activity.heartbeat(f"confirmed {done} of {len(missing)}")

        await asyncio.gather(*(confirm(h) for h in missing))
        return c.LiveHoldersResult(running=sorted(running))

    async def _runs(self, holder: str) -> bool:
        try:
            desc = await self.client.get_workflow_handle(holder).describe(rpc_timeout=timedelta(seconds=10))
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND:
                return False
            raise
        return desc.status == WorkflowExecutionStatus.RUNNING

    @activity.defn(name=c.GUARD_RUNNING_EPISODES)
    async def running_episodes(self, req: c.RunningEpisodesRequest) -> c.RunningEpisodesResult:
        """Running NodeRemediation episodes of one cluster, from visibility and each one's status.

        An id that names another cluster is skipped unasked; the rest are queried many at once,
        so one episode whose worker is gone costs its query timeout once, not once per episode."""
        listed = []
        try:
            async for w in self.client.list_workflows(f'WorkflowType = "{c.EPISODE_WORKFLOW}" AND ExecutionStatus = "Running"'):
                if c.cluster_in_workflow_id(w.id, "remediate") not in (None, req.cluster):
                    continue
                listed.append((w.id, w.run_id))
        except RPCError as err:
            if err.status == RPCStatusCode.UNIMPLEMENTED:  # the time-skipping test server has no visibility
                return c.RunningEpisodesResult(known=False)
            raise
        gate = asyncio.Semaphore(32)

        async def status(wid: str, run_id: str | None) -> c.EpisodeSeen | None:
            async with gate:
                try:
                    st = await self.client.get_workflow_handle(wid, run_id=run_id).query(
                        "status", rpc_timeout=timedelta(seconds=10))
                except Exception:  # noqa: BLE001 - RPC or query failure: one episode, never the listing
                    return None  # it cannot answer now; its re-sent lease request heals the books
            if st.get("cluster", "default") != req.cluster:
                return None  # a legacy id: only its status names the cluster
            return c.EpisodeSeen(holder=wid, node=st["node"], lease_held=bool(st.get("lease_held")),
                                 lease_requested=bool(st.get("lease_requested")),
                                 quarantined=bool(st.get("quarantined")))

        seen = await asyncio.gather(*(status(wid, run) for wid, run in listed))
        return c.RunningEpisodesResult(known=True, episodes=[e for e in seen if e is not None])


def guard_liveness(status: WorkflowExecutionStatus | None, task_attempt: int, queue: str,
                   last_poll: datetime | None | bool, now: datetime, stale_after: timedelta) -> c.GuardLiveness:
    """The rule, apart from the RPCs. A task on its second attempt or later has failed (a bug, a
    non-determinism, a worker without the guard): retried, it fails again until someone deploys."""
    if status != WorkflowExecutionStatus.RUNNING:
        return c.GuardLiveness(stuck=True, why=f"the fleet guard is {status.name.lower() if status else 'unknown'}")
    if task_attempt >= 2:
        return c.GuardLiveness(stuck=True, why=f"the fleet guard's workflow task fails (attempt {task_attempt})")
    if last_poll is None or (last_poll is not False and now - last_poll > stale_after):
        return c.GuardLiveness(stuck=True, why=f"no worker polls the fleet guard's task queue {queue}")
    return c.GuardLiveness(stuck=False, why="the fleet guard runs and a worker takes its tasks")
