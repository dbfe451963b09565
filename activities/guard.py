"""Temporal-side effects for the fleet guard: signal-with-start it, and check lease holders exist."""

from __future__ import annotations

from temporalio import activity
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.service import RPCError, RPCStatusCode

from activities import contracts as c

# Activities never import workflows: the guard is named by its registered name and id scheme.
GUARD_WORKFLOW = "FleetGuard"


class GuardActivities:
    def __init__(self, client: Client):
        self.client = client

    @activity.defn(name=c.GUARD_SIGNAL)
    async def signal_guard(self, req: c.GuardSignalRequest) -> None:
        # USE_EXISTING makes this idempotent: a retry signals the running guard again, and the
        # guard's handlers dedupe by holder.
        await self.client.start_workflow(
            GUARD_WORKFLOW,
            {"cluster": req.cluster, "policy": req.guard.model_dump(mode="json")},
            id=f"fleet-guard/{req.cluster}",
            task_queue=req.task_queue,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            start_signal=req.signal,
            start_signal_args=[req.payload],
            static_summary=f"Disruption budget and storm breaker for cluster {req.cluster}",
        )

    @activity.defn(name=c.GUARD_LIVE_HOLDERS)
    async def live_holders(self, req: c.LiveHoldersRequest) -> c.LiveHoldersResult:
        running = []
        for holder in req.holders:
            try:
                desc = await self.client.get_workflow_handle(holder).describe()
            except RPCError as err:
                if err.status == RPCStatusCode.NOT_FOUND:
                    continue
                raise
            if desc.status == WorkflowExecutionStatus.RUNNING:
                running.append(holder)
        return c.LiveHoldersResult(running=running)
