"""Suspect nodes: a report that says "suspect, not failed" (a job's slow rank, NCCL timeouts, a
person's `gpuheal report NODE --suspect WHY`). The episode takes a lease and drains as for any
disruptive rung, then load-tests the node before any remedy: a pass returns it to service with its
figures recorded, a failure names the GPUs and the ladder climbs from its first rung."""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    import api as c
    from api.episode import SA_FAULT, Outcome
    from policies.findings import Finding, FindingKind
    from workflows.validation import validate_once

SUSPECT_TIER = "repair"


class SuspectCheck:
    """Mixed into NodeRemediation (uses its state, records, lease and kube calls)."""

    def _suspect_pending(self) -> bool:
        t = self.s.triage
        return (not self.policy.dry_run and not self.s.rungs_tried
                and not self.s.suspect_tested and t is not None and t.fault_class == FindingKind.SUSPECT.value)

    async def _suspect_cleared(self) -> bool:
        """The load test on the drained node; True when it passed and the node went back to service."""
        self.s.suspect_tested = True
        found: list[Finding] = []
        ok = await validate_once(self.node, self.policy.validation, self.inp.expected_gpus,
                                 f"suspect: {SUSPECT_TIER} load test before any remedy", self._record,
                                 self.policy.dry_run, True, SUSPECT_TIER, found, queue=self._node_queue())
        if not ok:
            # The GPUs the load test named are what a replacement may denylist.
            named = {i for f in found for i in (f.uuid, f.serial) if i}
            self.s.implicated = sorted(set(self.s.implicated) | named)
            kinds = sorted({f.kind.value for f in found}) or ["load_test_failed"]
            self.s.triage.fault_class = kinds[0]
            self._upsert(SA_FAULT.value_set(kinds[0]))
            self._record("suspect", f"suspicion of {self.node} confirmed", False,
                         f"{', '.join(kinds)} on {', '.join(sorted({str(f.gpu_index) for f in found if f.gpu_index is not None})) or 'the node'}: "
                         f"climbing the ladder from {self.s.next_rung.value}")
            return False
        self.s.validations += 1
        done = await self._kube(c.KUBE_RETURN_TO_SERVICE,
                                c.ReturnToServiceRequest(node=self.node, reason="suspect: passed the load test"),
                                c.ReturnToServiceResult, f"uncordon {self.node}: passed the load test")
        if done is None:
            await self._release_lease("quarantined")
            self._finish(Outcome.QUARANTINED, "passed the load test, but the uncordon failed: the node stays "
                                              "cordoned for a person")
            return True
        self.s.quarantined = self.s.drained = False
        await self._release_lease("validated")
        await self._tell_guard(healthy=True)
        self._finish(Outcome.HEALTHY, "suspect: passed the load test under drain; back in service, figures recorded")
        return True
