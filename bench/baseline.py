"""The storm benchmark's baseline: a bare workflow, signal-with-start plus one activity that cordons
the node through the same API client. What any Temporal-based remediator pays at minimum. Like
for like with gpuheal: the cordon is a local activity in both (gpuheal's since patch
`local-cluster-calls`), so the ratio measures gpuheal's own work, not a different call path."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from temporalio import activity, workflow


@workflow.defn(name="StormBaseline")
class StormBaseline:
    def __init__(self) -> None:
        self.node: str | None = None

    @workflow.signal(name="report")
    def report(self, node: str) -> None:
        self.node = node

    @workflow.run
    async def run(self) -> None:
        await workflow.wait_condition(lambda: self.node is not None)
        await workflow.execute_local_activity("baseline.cordon", self.node, start_to_close_timeout=timedelta(seconds=30))


class BaselineActivities:
    def __init__(self, core) -> None:
        self.core = core

    @activity.defn(name="baseline.cordon")
    async def cordon(self, node: str) -> None:
        await asyncio.to_thread(self.core.patch_node, node, {"spec": {"unschedulable": True}})
