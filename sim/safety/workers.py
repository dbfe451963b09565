"""The safety world's workers: the controller's and each agent's, which a schedule stops and starts."""

from __future__ import annotations

import asyncio
import contextlib

from temporalio.worker import UnsandboxedWorkflowRunner, Worker

import api as c
from activities.room_pool import RoomPool
from workflows.fleet_guard import FleetGuard
from workflows.node_admission import NodeAdmission
from workflows.node_remediation import NodeRemediation

WORKFLOWS = [NodeRemediation, FleetGuard, NodeAdmission]


class WorkerSwitches:
    """Mixed into SafetyWorld, which holds the client, the nodes and the activities."""

    def _worker(self, queue: str, controller: bool) -> tuple[Worker, asyncio.Task]:
        w = Worker(self.client, task_queue=queue, workflows=WORKFLOWS if controller else [],
                   activities=self.activities(), workflow_runner=UnsandboxedWorkflowRunner(),
                   max_concurrent_activity_task_polls=2 if controller else 1,
                   max_concurrent_workflow_task_polls=2)
        return w, asyncio.create_task(w.run())

    def start_controller(self) -> None:
        if self.controller is None:
            if self.sched.room_ahead and self.policy.guard.room_ahead:  # lives and dies with the controller
                self.room = RoomPool(self.client, identity=f"controller-{self.sched.seed}-{self.room_pools}", retry_s=0.2)
                self.room_pools += 1
            self.controller = self._worker(self.task_queue, True)

    def start_agent(self, name: str) -> None:
        n = self.nodes[name]
        n.agent = True
        if name not in self.agents:
            self.agents[name] = self._worker(c.node_task_queue(name, self.cluster), False)

    async def stop_controller(self) -> None:
        w, self.controller = self.controller, None
        room, self.room = self.room, None
        if room is not None:
            self.room_taken += room.handed_out
            await room.close()  # while its worker still serves the guard's updates
        if w is not None:
            await _stop(w)

    async def stop_agent(self, name: str) -> None:
        self.nodes[name].agent = False
        w = self.agents.pop(name, None)
        if w is not None:
            await _stop(w)

    async def stop_all(self) -> None:
        for name in list(self.agents):
            await self.stop_agent(name)
        await self.stop_controller()


async def _stop(w: tuple[Worker, asyncio.Task]) -> None:
    worker, task = w
    with contextlib.suppress(Exception):
        await worker.shutdown()
    with contextlib.suppress(BaseException):
        await task
