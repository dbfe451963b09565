"""NodeProfile, id `profile/<cluster>/<node>`: how an agent learns its node's expectations from the controller.

The agent has no Kubernetes credentials; the controller reads the node's labels (its profile) and
its baseline annotation, records a learned baseline for a node that has none, and answers. A short
workflow per lookup: the answer is in its history, and a node's lookups are listed by id."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    import api as c
    from policies.baseline import NodeExpectations
    from workflows.calls import call


@workflow.defn(name=c.PROFILE_WORKFLOW)
class NodeProfileLookup:
    @workflow.run
    async def run(self, req: c.ExpectationsRequest) -> NodeExpectations:
        return await call(c.PROFILE_EXPECTATIONS, req, NodeExpectations, summary=f"expectations of {req.node}",
                          timeout=timedelta(seconds=30), attempts=5, max_interval=timedelta(seconds=10), local=True)
