"""Edited copies of NodeRemediation for the replay tests (its own module: the sandbox re-imports it)."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow

from workflows.node_remediation import NodeRemediation

with workflow.unsafe.imports_passed_through():  # the models the workflow passed through: one copy of each
    from api.episode import RemediationInput, RemediationResult


@workflow.defn(name="NodeRemediation")
class NodeRemediationChangedUnpatched(NodeRemediation):
    """What a careless edit looks like: a new durable step, without workflow.patched."""

    @workflow.run
    async def run(self, inp: RemediationInput) -> RemediationResult:
        return await super().run(inp)

    async def _triage(self) -> None:
        await workflow.sleep(timedelta(seconds=1), summary="a new step nobody patched")
        await super()._triage()


@workflow.defn(name="NodeRemediation")
class NodeRemediationChangedPatched(NodeRemediation):
    """The same edit behind workflow.patched: old histories keep replaying."""

    @workflow.run
    async def run(self, inp: RemediationInput) -> RemediationResult:
        return await super().run(inp)

    async def _triage(self) -> None:
        if workflow.patched("triage-settle"):
            await workflow.sleep(timedelta(seconds=1), summary="a new, patched step")
        await super()._triage()
