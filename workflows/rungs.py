"""The ladder's rungs as an episode acts them (kill, reset, reboot, replace), and the validation
that says whether one cured the node."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    import api as c
    from api.episode import Outcome
    from policies.model import RungPolicy
    from policies.terms import Rung
    from workflows.calls import agent_gone, call_or_none, cause
    from workflows.lease import GuardClient
    from workflows.validation import COULD_NOT_RUN, AgentMissing, validate_once, validate_twice


class RungActions(GuardClient):
    async def _act(self, rung: Rung) -> bool:
        """The rung's action and its wait; False when it failed or the node did not come back."""
        rp = self.policy.ladder.for_rung(rung)
        summary = f"{rung.value} {self.node} ({self._fault_label()})"
        key = f"{workflow.info().workflow_id}/{self.s.run_ids[0]}/{rung.value}/{self.s.attempts[rung.value]}"
        actions = {Rung.KILL: self._kill, Rung.RESET: self._reset, Rung.REBOOT: self._reboot,
                   Rung.REPLACE: self._replace}
        try:
            return await actions[rung](summary, key, rp)
        except ActivityError as err:
            if agent_gone(err):
                self.s.agent_missing = True
                self._record(rung.value, summary, False, f"agent_missing: no agent polled "
                             f"{self._node_queue()} within {self.policy.validation.agent_timeout}")
                return False
            self._record(rung.value, summary, False, cause(err))
            self._action_failed = cause(err)
            return False

    def _failed_action_stops(self, rung: Rung) -> str:
        """Why a rung whose action, or whose validation, could not be done ends the ladder ('' to
        climb on): replace and the denylist are for hardware a rung tried and could not cure, never
        for a call that failed (a cloud API refusing a reboot says nothing about the GPU). A failed
        reset still climbs to reboot: a GPU that will not reset is the GPU's own answer, and a
        reboot is undone by booting."""
        why, self._action_failed = self._action_failed, ""
        if not why or rung.above() is not Rung.REPLACE:
            return ""
        return (f"{rung.value} could not be done ({why}): no evidence about the hardware, so nothing is "
                "replaced or denylisted: it stays quarantined for a person")

    def _agent_missing_stops(self, rung: Rung) -> str:
        """Why a missing agent ends the ladder after `rung` ('' where a reboot may still bring it back):
        an agent that is gone says nothing about the hardware, so it is never evidence to climb on."""
        gone = f"agent_missing: no agent on {self.node} ran the work after {rung.value}"
        if rung is Rung.KILL:
            return (f"{gone}; an application fault is no reason to reboot the machine: "
                    "it stays cordoned for a person")
        if rung.rank >= Rung.REBOOT.rank:
            return (f"{gone}, though it rebooted; no evidence about the hardware, so nothing is replaced "
                    "or denylisted: it stays quarantined for a person")
        return ""

    async def _kill(self, summary: str, key: str, rp: RungPolicy) -> bool:
        result = await self._stop_gpu_processes(summary, rp, whole_node=False)
        return await self._settle(Rung.KILL, summary, rp, "; ".join(result.spared[:3]))

    async def _reset(self, summary: str, key: str, rp: RungPolicy) -> bool:
        if (unconfirmed := self._gpus_unconfirmed()) and not self._gpus():
            # Not a whole-node reset either: the fault names GPUs, just not by the node's own probes.
            why = (f"GPU {', '.join(map(str, unconfirmed))} named only by a report not from {self.node}'s own agent: "
                   "nothing reset, no tenant signalled")
            self._record(Rung.RESET.value, summary, False, why)
            self._action_failed = why
            return False
        await self._stop_gpu_processes(f"stop GPU processes on {self.node} before reset", rp, whole_node=True)
        await self._node_activity(c.NODE_RESET, c.ResetRequest(node=self.node, gpus=self._gpus(), dry_run=self.policy.dry_run),
                                  c.ResetResult, summary, rp)
        return await self._settle(Rung.RESET, summary, rp)

    async def _stop_gpu_processes(self, summary: str, rp: RungPolicy, whole_node: bool) -> c.KillResult:
        """The implicated GPUs' processes (MIG: the implicated instances'); every GPU's only on a
        drained node before a whole-node reset (no GPU named never means every GPU)."""
        gpus = self._gpus()
        every = not gpus and whole_node
        mig = [m for m in self._mig_targets() if m.gpu_index in gpus]
        return await self._node_activity(c.NODE_KILL, c.KillRequest(node=self.node, gpus=gpus, all_gpus=every, mig=mig,
                                                                    dry_run=self.policy.dry_run),
                                         c.KillResult, summary, rp)

    def _mig_targets(self) -> list[c.MigTarget]:
        """The MIG instances the acted-on findings name (NVML's Xid events carry them)."""
        t = self.s.triage
        found = {(v.finding.gpu_index, v.finding.gpu_instance_id, v.finding.compute_instance_id)
                 for v in (t.verdicts if t else []) if v.rung is not None and v.finding.gpu_index is not None
                 and v.finding.gpu_instance_id is not None}
        return [c.MigTarget(gpu_index=g, gpu_instance_id=gi, compute_instance_id=ci) for g, gi, ci in sorted(
            found, key=lambda x: (x[0], x[1], -1 if x[2] is None else x[2]))]

    async def _settle(self, rung: Rung, summary: str, rp: RungPolicy, note: str = "") -> bool:
        self._record(rung.value, summary, True, "; ".join(x for x in (note, self._take_drain_note()) if x))
        await workflow.sleep(max(rp.return_timeout, timedelta(milliseconds=1)),
                             summary=f"let {self.node} settle after {rung.value}")
        return True

    async def _replace(self, summary: str, key: str, rp: RungPolicy) -> bool:
        done = await self._cloud(c.CLOUD_REPLACE, c.ReplaceRequest(
            node=self.node, idempotency_key=key, mode=self.policy.replacement,
            ownership_tag=self.policy.ownership_tag, dry_run=self.policy.dry_run), c.ReplaceResult, summary, rp)
        # Only once the replacement is under way: a failed one leaves the node quarantined for a
        # person with its hardware not (yet) refused anywhere else.
        await self._denylist()
        hook = f"Auto Scaling lifecycle {done.lifecycle_state}" if done.lifecycle_state else ""
        self._record(Rung.REPLACE.value, summary, True, "; ".join(x for x in (hook, self._take_drain_note()) if x))
        return True

    async def _reboot(self, summary: str, key: str, rp: RungPolicy) -> bool:
        """Reboot through the cloud API; back when the agent reports from a new boot. If it never
        does, the kubelet's boot id tells a machine that rebooted (its agent is what is missing)
        from one that did not come back."""
        before, agent_before = self.s.boot_id, self.s.agent_boot_id
        agent_seq = self.s.seq_by_boot.get(f"agent:{agent_before}")  # the agent's last report from the old boot
        dry = self.policy.dry_run
        sent = await self._cloud(c.CLOUD_REBOOT, c.RebootRequest(node=self.node, idempotency_key=key, dry_run=dry,
                                                                 ownership_tag=self.policy.ownership_tag,
                                                                 boot_wait_s=rp.return_timeout.total_seconds()),
                                 c.RebootResult, summary, rp)
        kubelet_before = sent.from_boot
        self._record(Rung.REBOOT.value, summary, True,
                     "; ".join(x for x in ("reboot sent; waiting for a report from a new boot", self._take_drain_note()) if x))
        # Only the node's own agent from a new boot says it is back (a condition watcher's report
        # carries the kubelet's new boot id before any agent runs): validation needs the agent.
        old_boots = {before, agent_before, kubelet_before} - {None}
        back = lambda: self.s.agent_boot_id is not None and self.s.agent_boot_id not in old_boots  # noqa: E731
        try:
            await workflow.wait_condition(lambda: back() or self._steered(),
                                          timeout=rp.return_timeout,
                                          timeout_summary=f"wait for {self.node} to come back from reboot")
        except TimeoutError:
            self._record(Rung.REBOOT.value, f"{self.node} back from reboot", False,
                         f"no report from a new boot within {rp.return_timeout}")
            if not dry:
                after = await self._kubelet_boot_id()
                # A condition watcher's report of the kubelet's new boot proves the reboot too.
                seen = self.s.boot_id if self.s.boot_id not in {before, agent_before, kubelet_before} else None
                after = after or seen
                if self._reboot_in_doubt(after, kubelet_before, agent_before, agent_seq):
                    return False
                if self.s.agent_missing or (after and after != kubelet_before):
                    came_back = (f"the machine rebooted (kubelet boot id {kubelet_before} -> {after})"
                                 if after and after != kubelet_before else "the machine shows no new boot either")
                    self._finish(Outcome.QUARANTINED, f"agent_missing: {came_back} but no agent reported from "
                                 f"{self.node}; no evidence about the hardware, so it stays quarantined for a person")
            return False
        if not back():
            return False  # steered away while waiting
        self.s.agent_missing = False
        self._record(Rung.REBOOT.value, f"{self.node} back from reboot", True, f"boot id {self.s.boot_id}")
        return True

    def _reboot_in_doubt(self, after: str | None, kubelet_before: str | None, agent_before: str | None,
                         agent_seq: int | None) -> bool:
        """After a reboot wait with no agent from a new boot: True (the episode ends quarantined for a
        person, with why) unless the machine provably rebooted and did not come back healthy. Only
        then is climbing on evidence; an unknown boot or a reboot not taken never is."""
        if after is None:
            why = (f"{self.node}'s boot id cannot be read (no agent from a new boot, the kubelet's unreadable): "
                   "whether it rebooted is unknown; no evidence about the hardware, so nothing is replaced or "
                   "denylisted: it stays quarantined for a person")
        elif after == kubelet_before and (self.s.seq_by_boot.get(f"agent:{agent_before}") or 0) > (agent_seq or 0):
            why = (f"reboot not taken: {self.node} still runs boot {after} and its agent reports on from it; "
                   "the machine never went down, so that is no evidence for a replacement: it stays "
                   "quarantined for a person")
        else:
            return False
        self._finish(Outcome.QUARANTINED, why)
        return True

    async def _kubelet_boot_id(self) -> str | None:
        summary = f"read {self.node}'s boot id without its agent"
        return await call_or_none(lambda why: self._record("boot_id", summary, False, why),
                                  c.CLOUD_BOOT_ID, c.BootIdRequest(node=self.node), str, summary=summary,
                                  timeout=timedelta(minutes=1), attempts=3)

    async def _denylist(self) -> None:
        """Only hardware a probe on the node implicated goes on the denylist, never every id a report listed."""
        ids = self.s.implicated
        if self.policy.dry_run:
            # The denylist is permanent (it refuses or terminates the hardware at admission): a dry run only says it.
            return self._record("denylist", f"would denylist hardware of {self.node}", True,
                                f"dry run: {', '.join(ids) or 'nothing implicated'}")
        if not ids:
            return self._record("denylist", f"denylist hardware of {self.node}", True,
                                "no probe implicated any hardware: nothing denylisted")
        await self._ledger(c.LEDGER_DENYLIST, c.DenylistRequest(
            hardware_ids=ids, node=self.node, reason=f"replaced: {self._fault_label()}"),
            c.DenylistResult, f"denylist hardware of {self.node}")

    def _take_drain_note(self) -> str:
        """What the rung's record says of pods the drain left (timed out and escalated): the rung
        itself stopped them. Said once, by the rung that went ahead."""
        left, self.s.drain_left = self.s.drain_left, []
        return f"went ahead over {len(left)} pods the drain left ({', '.join(left[:3])})" if left else ""

    async def _validated(self) -> bool:
        try:
            if not self.s.quarantined:
                # Kill-only (application) episodes never took the node out: one validation suffices.
                ok = await validate_once(self.node, self.policy.validation, self.inp.expected_gpus, "after kill",
                                         self._record, self.policy.dry_run, strict_agent=True, queue=self._node_queue())
                self.s.validations += int(ok)
                return ok
            passed = await validate_twice(self.node, self.policy.validation, self.inp.expected_gpus, self._record,
                                          self.policy.dry_run, strict_agent=True, tiers=("quick", "repair"),
                                          queue=self._node_queue())
        except AgentMissing:
            self.s.agent_missing = True
            return False
        self.s.validations += passed
        last = next((a for a in reversed(self.s.actions) if a.step == "validate"), None)
        if passed < 2 and last is not None and last.detail.startswith(COULD_NOT_RUN):
            # A validation that could not run found nothing wrong with the node either.
            self._action_failed = f"validation {last.detail}"
        return passed == 2
