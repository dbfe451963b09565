"""What every part of a NodeRemediation episode shares: its state, its record of steps (the
history and `status` show it), and how it calls activities."""

from __future__ import annotations

from datetime import timedelta

from pydantic import BaseModel
from temporalio import workflow

from workflows import metrics

with workflow.unsafe.imports_passed_through():
    import api as c
    from api.episode import (
        SA_NODE,
        SA_OUTCOME,
        SA_STAGE,
        ActionRecord,
        Outcome,
        RemediationInput,
        RemediationResult,
        RemediationState,
        Stage,
    )
    from policies.model import Policy, RungPolicy
    from workflows.calls import call, call_or_none
    from workflows.episode_constants import MAX_ACTIONS_KEPT, MAX_RUN_IDS_KEPT


def node_of(workflow_id: str, fallback: str) -> str:
    """The node an episode's id names: `remediate/<cluster>/<node>` (or, started before ids carried
    the cluster, `remediate/<node>`: the same node, so old histories replay unchanged)."""
    return c.node_in_workflow_id(workflow_id, "remediate") or fallback


class Episode:
    """The base of NodeRemediation's parts (lease.py, remediation_steps.py, node_remediation.py)."""

    inp: RemediationInput
    policy: Policy
    node: str
    s: RemediationState

    # --- activities: each kind states its failure rule once (workflows/calls.py) ---------------
    async def _kube(self, name: str, req: BaseModel, result_type: type, summary: str,
                    start_to_close: timedelta = timedelta(minutes=1), heartbeat: timedelta | None = None):
        """Cluster activities retry transient API errors; a failure is recorded and answers None,
        and the step decides (a node not verifiably cordoned gets nothing disruptive)."""
        result = await call_or_none(lambda why: self._record(name, summary, False, why), name, req, result_type,
                                    **self._cluster(summary, start_to_close, heartbeat),
                                    attempts=10, max_interval=timedelta(seconds=30))
        if result is not None:
            self._record(name, summary, True)
        return result

    async def _ledger(self, name: str, req: BaseModel, result_type: type | None, summary: str,
                      max_interval: timedelta = timedelta(seconds=30)):
        """The ledger and the guard's signal-with-start are retried until they work: the books
        must not miss an episode."""
        return await call(name, req, result_type, **self._cluster(summary, timedelta(seconds=30)),
                          max_interval=max_interval)

    def _cluster(self, summary: str, timeout: timedelta, heartbeat: timedelta | None = None) -> dict:
        """A controller-side activity: local where it is short (no heartbeat), else a regular one.
        Short cluster calls (cordon, pod marks, events, ledger, guard signals) run as local activities:
        one marker event each instead of three events and a workflow task, and no task-queue round
        trip before the cordon."""
        return {"summary": summary, "timeout": timeout, "heartbeat": heartbeat, "local": heartbeat is None}

    async def _cloud(self, name: str, req: BaseModel, result_type: type, summary: str, rp: RungPolicy):
        """The rung's cloud call: a failure raises, and the rung records it and climbs on."""
        return await call(name, req, result_type, summary=summary, timeout=rp.action_timeout, attempts=rp.retries)

    async def _node_activity(self, name: str, req: BaseModel, result_type: type, summary: str, rp: RungPolicy):
        """Node-local work: raises, and a dead agent is caught by schedule_to_start (`agent_gone`)."""
        return await call(name, req, result_type, summary=summary, timeout=rp.action_timeout, attempts=rp.retries,
                          task_queue=self._node_queue(), schedule_to_start=self.policy.validation.agent_timeout)

    def _node_queue(self) -> str:
        return c.agent_queue_of(workflow.info().workflow_id, "remediate", self.node)

    # --- the record -----------------------------------------------------------------------------
    def _begin_run(self) -> None:
        info = workflow.info()
        if info.run_id not in self.s.run_ids:
            self.s.run_ids.append(info.run_id)
            if len(self.s.run_ids) > MAX_RUN_IDS_KEPT:
                # The first run id names the episode (idempotency keys, the ledger): it stays.
                self.s.run_ids = [self.s.run_ids[0], *self.s.run_ids[-(MAX_RUN_IDS_KEPT - 1):]]
        if self.s.started_at is None:
            self.s.started_at = workflow.now()
            if workflow.info().typed_search_attributes.get(SA_NODE) is None:
                self._upsert(SA_NODE.value_set(self.node), SA_STAGE.value_set(self.s.stage.value))

    def _record(self, step: str, summary: str, ok: bool, detail: str = "") -> None:
        summary, detail = summary[:300], detail[:1000]
        self.s.actions.append(ActionRecord(at=workflow.now(), step=step, summary=summary, ok=ok, detail=detail))
        if len(self.s.actions) > MAX_ACTIONS_KEPT:
            self.s.actions = self.s.actions[-MAX_ACTIONS_KEPT:]  # the whole list is in the history
        self._set_details()

    def _set_stage(self, stage: Stage, *also) -> None:
        self.s.stage = stage
        self._upsert(SA_STAGE.value_set(stage.value), *also)
        self._set_details()

    def _finish(self, outcome: Outcome, reason: str, *also) -> None:
        self.s.outcome, self.s.outcome_reason = outcome, reason
        last = self.s.rungs_tried[-1].value if self.s.rungs_tried else "none"
        metrics.remediation_finished(self.inp.cluster, outcome.value, last,
                                     (self.s.triage.fault_class if self.s.triage else None) or "none")
        self._set_stage(Stage.DONE, SA_OUTCOME.value_set(outcome.value), *also)

    def _upsert(self, *updates) -> None:
        workflow.upsert_search_attributes(list(updates))

    def _steered(self) -> bool:
        """An operator redirected the episode (skip or cancel) while it waited: re-plan first."""
        return self.s.skip_to is not None or self.s.cancel_reason is not None

    def _episode(self) -> str:
        return f"{workflow.info().workflow_id}/{self.s.run_ids[0]}"

    def _gpus(self) -> list[int]:
        """The GPUs kill and reset target: of the fault's, only the ones the node's own agent named (a
        report from anyone else naming a GPU must not signal that GPU's tenants)."""
        gpus = self.s.triage.gpus if self.s.triage else []
        return [g for g in gpus if g in self.s.agent_gpus]

    def _gpus_unconfirmed(self) -> list[int]:
        """The fault's GPUs that no report from the node's own agent named (nothing may target them)."""
        gpus = self.s.triage.gpus if self.s.triage else []
        return [g for g in gpus if g not in self._gpus()]

    def _fault_label(self) -> str:
        t = self.s.triage
        if t is None or not t.verdicts:
            return "no fault"
        acted = [v.finding.label() for v in t.verdicts if v.rung is not None][:3]
        return ", ".join(acted) or t.fault_class or "fault"

    def _set_details(self, waiting: str = "") -> None:
        s = self.s
        lines = [f"## {self.node}: {s.stage.value}" + (f" ({s.outcome.value})" if s.outcome else "")]
        if s.triage and s.triage.fault_class:
            lines.append(f"**Fault**: {s.triage.fault_class}, {s.triage.attribution}: {s.triage.reason}")
        if s.stage is Stage.LADDER and s.next_rung:
            lines.append(f"**Next rung**: {s.next_rung.value}; tried: {', '.join(r.value for r in s.rungs_tried) or '-'}")
        if s.policy_sha256:
            lines.append(f"**Policy**: {s.policy_name} ({s.policy_sha256[:12]})")
        if s.paused:
            lines.append(f"**Paused**: {s.pause_reason}")
        if s.awaiting_approval:
            lines.append(f"**Awaiting approval** to {s.awaiting_approval.value} (update `approve`)")
        if waiting:
            lines.append(f"**Waiting**: {waiting}")
        lines += [f"- {a.at:%H:%M:%S} {'ok' if a.ok else 'FAILED'} {a.summary}" + (f": {a.detail}" if a.detail else "")
                  for a in s.actions[-8:]]
        workflow.set_current_details("\n".join(lines))

    def _result(self) -> RemediationResult:
        t = self.s.triage
        return RemediationResult(
            node=self.node, outcome=self.s.outcome, reason=self.s.outcome_reason,
            fault_class=t.fault_class if t else None, attribution=t.attribution if t else None,
            rungs=self.s.rungs_tried, validations=self.s.validations,
            detect_to_cordon_ms=self.s.detect_to_cordon_ms, run_ids=self.s.run_ids, late_reports=self.s.late_reports,
        )
