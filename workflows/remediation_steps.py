"""The steps around the rungs: check the node is ours, cordon, mark the pods, wait for approval,
drain. Each verifies its effect, and the do-no-harm rules say when a failed one ends the episode."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta

from temporalio import workflow

from workflows import metrics

with workflow.unsafe.imports_passed_through():
    import api as c
    from api.episode import GuardAnswer, Outcome, Stage
    from policies.classify import Triage
    from policies.findings import HealthReport, condition_since
    from policies.terms import Rung
    from workflows.calls import call_or_none
    from workflows.episode_constants import CHECK_FRESH, HOLD_RECHECK_FIRST, HOLD_RECHECK_MAX
    from workflows.lease import GuardClient


class RemediationSteps(GuardClient):
    _hold_news: bool = False  # a report came while the node was held
    # (boot id, the node check, when) the policy came with (node_remediation.py), read once here
    _checked: tuple[str | None, c.NodeCheckResult, datetime] | None = None
    async def _node_is_ours(self) -> bool:
        """A report for a node that does not exist, or is not a GPU node of ours, ends here: no lease,
        no cordon, no ledger, no denylist. When the API cannot say, the cordon's own checks decide
        whether it exists; whether an earlier episode left it quarantined is unknown then, so it is held for a person until a new report can be checked."""
        # The report's boot: a late one from the host gpuheal replaced is refused by the Node's mark.
        boot = self.s.latest.boot_id if self.s.latest else None
        summary = f"check {self.node} is a GPU node of this cluster"
        checked, self._checked = self._checked, None
        if checked is not None and checked[0] == boot and workflow.now() - checked[2] <= CHECK_FRESH:
            found = checked[1]  # answered with the policy, for this very report, moments ago
            self._record(c.KUBE_CHECK_NODE, summary, True)
        else:
            found = await self._kube(c.KUBE_CHECK_NODE, c.NodeCheckRequest(node=self.node, boot_id=boot),
                                     c.NodeCheckResult, summary)
        if found is None:
            if not self.s.held_unchecked:
                self.s.held_report = self._report_key()
            self.s.held_unchecked += 1
            self.s.held = (f"could not ask the API server whether {self.node} carries {c.QUARANTINE_TAINT} from an "
                           f"earlier episode: held for a person (asked again in {self._recheck_in()} or on a new "
                           f"report; gpuheal lift {self.node})")
            return True
        if self.s.held_unchecked and self.s.held_report == self._report_key():
            # Released by the re-check timer, on the report the hold began with: hours old, maybe,
            # and the node may have been rebooted or mended meanwhile. No remedy on it: a person's.
            self.s.stale_report = (f"its report could not be checked for {self.s.held_unchecked} tries while the API "
                                   "server did not answer, and no newer report came")
        self.s.held_unchecked, self.s.held_report = 0, ""
        if found is None or (found.exists and found.ours):
            if found is not None:
                self.s.held = (f"{self.node} still carries {c.QUARANTINE_TAINT}={found.quarantined} from an earlier "
                               "episode: held for a person" if found.quarantined else "")
            return True
        self._finish(Outcome.REJECTED, f"rejected: {found.reason}")
        return False

    async def _held_for_a_person(self) -> bool:
        """A node an earlier episode left quarantined stays so whatever is re-sent: reports are
        recorded, nothing is done, until an operator lifts the hold (`gpuheal lift NODE`, recorded
        with who) or someone removes the taint (looked at again on each new report). True: still held."""
        if not self.s.held and self.s.lifted_by is None:
            return False  # (a lift taken while held stands even if a check since found no taint)
        if self.s.lifted_by is None:
            if not any(a.step == "hold" for a in self.s.actions[-3:]):
                self._record("hold", f"{self.node} held for a person", True, self.s.held)
            # Each new report has the triage ask the API server again (the taint may be gone), so a
            # held node costs nothing while nobody writes to it; one the API server could not check
            # is asked again on a timer too (its fault may never be re-sent).
            self._hold_news = False
            try:
                await workflow.wait_condition(lambda: self.s.lifted_by is not None or self.s.cancel_reason is not None
                                              or self._hold_news, timeout=self._recheck_in() if self.s.held_unchecked else None,
                                              timeout_summary=f"ask the API server about {self.node} again")
            except TimeoutError:
                return True  # the triage asks again
            if self.s.lifted_by is None:
                return True  # cancelled (the run loop ends the episode), or news: the triage looks again
        done = await self._kube(c.KUBE_RETURN_TO_SERVICE, c.ReturnToServiceRequest(
            node=self.node, reason=f"hold lifted by {self.s.lifted_by}"), c.ReturnToServiceResult,
            f"uncordon {self.node}: hold lifted by {self.s.lifted_by}")
        self.s.held = ""
        if done is None:
            self._finish(Outcome.QUARANTINED, f"hold lifted by {self.s.lifted_by} ({self.s.lift_reason}), but the "
                         f"uncordon failed ({self.s.actions[-1].detail}): the node stays cordoned for a person")
        else:
            self._finish(Outcome.HEALTHY, f"hold lifted by {self.s.lifted_by} ({self.s.lift_reason}): back in service")
        return True

    def _report_key(self) -> str:
        r = self.s.latest
        return f"{r.source}/{r.boot_id}/{r.seq}" if r else ""

    def _recheck_in(self) -> timedelta:
        """5 min, doubling with each unanswered check, at most 1 h."""
        return min(HOLD_RECHECK_FIRST * 2 ** min(max(self.s.held_unchecked - 1, 0), 8), HOLD_RECHECK_MAX)

    async def _conditions_already_handled(self, report: HealthReport) -> bool:
        """A report of node conditions only, each set before this node's last recorded episode
        started: a sticky condition re-sent (another watcher replica, a restarted one). Nothing is done."""
        since = [condition_since(f.event_id) for f in report.findings]
        if not since or any(t is None for t in since):
            return False
        last = (await self._ledger(c.LEDGER_LAST_STARTED, c.LastStartedRequest(
            node=self.node, exclude_episode=self._episode()), c.LastStartedResult,
            f"when {self.node}'s last episode started")).started_at
        if last is None or max(since) >= last:
            return False
        self._finish(Outcome.HEALTHY, f"only node conditions set before {self.node}'s last episode started "
                     f"({last:%Y-%m-%dT%H:%M:%SZ}): a re-send, not a new fault; nothing done")
        return True

    async def _quarantine(self) -> None:
        if self.s.quarantined:
            return
        if not self.policy.dry_run and not await self._admitted_to_quarantine():
            return
        t = self.s.triage
        cordon = self._kube(
            c.KUBE_QUARANTINE,
            c.QuarantineRequest(node=self.node, fault_class=t.fault_class or "unknown", reason=t.reason,
                                dry_run=self.policy.dry_run),
            c.QuarantineResult, f"cordon and taint {self.node} ({self._fault_label()})",
        )
        # In reserved room the guard is told beside the cordon, not after it: a cordon retried for
        # minutes must not outlast the slot (it would lapse, and the room go to another).
        result = (await asyncio.gather(cordon, self._tell_guard_the_slot()))[0] if self.s.room_token else await cordon
        if result is None:
            return  # not verifiably cordoned: `_cordon_holds` ends the episode before anything disruptive
        self.s.quarantined = True
        detected = self.s.first_report.detected_at if self.s.first_report else None
        if result is not None and detected is not None and self.s.detect_to_cordon_ms is None:
            self.s.detect_to_cordon_ms = max(0, int((result.cordoned_at - detected).total_seconds() * 1000))
            metrics.node_cordoned(self.inp.cluster, t.fault_class or "unknown", self.s.detect_to_cordon_ms)
        if self.s.admission != GuardAnswer.ADMITTED:
            await self._tell_guard(healthy=False)

    def _quarantine_withheld(self) -> bool:
        """The guard held the cordon back and the episode ended (fault cleared) or was cancelled."""
        return self.s.stage is Stage.DONE or (self.s.cancel_reason is not None and not self.s.quarantined)

    def _cordon_holds(self) -> bool:
        """No disruptive step on a node that is not verifiably cordoned: evicted pods would land back on it."""
        if self.s.quarantined:
            return True
        self._finish(Outcome.FAILED, f"cordon of {self.node} did not take effect ({self.s.actions[-1].detail}): "
                     "nothing disruptive done; a person must cordon or fix access")
        return False

    async def _leave_for_a_person(self, reason: str) -> None:
        """The ladder has no evidence to go on: cordoned (safe, no budget) and left for a person, with why."""
        await self._quarantine()
        if self._quarantine_withheld() or not self._cordon_holds():
            return
        self._finish(Outcome.QUARANTINED, reason)

    async def _is_repeat_offender(self) -> bool:
        ro = self.policy.repeat_offender
        # Per board: the hardware a probe implicated, not every id of the node (a fault on each of
        # three GPUs is three boards once each, not one node three times).
        ids = self.s.implicated
        if not ids:
            return False  # no board implicated: nothing to count against
        count = await self._ledger(c.LEDGER_COUNT_RECENT, c.CountRecentRequest(
            hardware_ids=ids, window_s=ro.window.total_seconds(), exclude_episode=self._episode(), by_board=True),
            int, f"count recent remediations of {self.node}'s hardware")
        if count is not None and count + 1 >= ro.threshold:
            self._record("triage", f"repeat offender {self.node}", True,
                         f"{count} earlier remediations of its board "
                         f"({', '.join(ids[:2])}) within {ro.window}: straight to replace")
            return True
        return False

    def _implicate(self, report: HealthReport, t: Triage) -> None:
        """Hardware a probe on the node itself named (the agent's report), for the denylist."""
        if report.source != "agent":
            return
        self.s.agent_gpus = sorted({*self.s.agent_gpus, *t.gpus})
        # Only a platform finding implicates hardware: an application fault's GPU (Xid 13) is where a
        # job failed, not a faulty board, and the denylist is permanent.
        acted = [v.finding for v in t.verdicts if v.rung is not None and v.attribution == "platform"]
        self.s.implicated = sorted({*self.s.implicated, *report.implicated_ids(acted)})

    async def _attribute_pods(self, t: Triage) -> None:
        pod_gpus = await self._pod_gpus() if t.gpus else None
        marked = await self._kube(c.KUBE_ATTRIBUTE_PODS, c.AttributePodsRequest(
            node=self.node, attribution=t.attribution, fault=self._fault_label(), gpus=t.gpus, pod_gpus=pod_gpus,
            episode=self._episode(), dry_run=self.policy.dry_run),
            c.AttributePodsResult, f"mark pods on {self.node}: failure attribution {t.attribution}")
        if marked is not None:  # the outcome ledger's interrupted pods (workflows/outcome.py)
            self.s.pods_marked = sorted({*self.s.pods_marked, *marked.pods})[:200]

    async def _pod_gpus(self) -> dict[str, list[int]] | None:
        """Which pod runs on which GPU, from the node (None when the agent cannot say quickly)."""
        summary = f"which pods use which GPUs on {self.node}"
        result = await call_or_none(
            lambda why: self._record("attribution", summary, False, f"{why}: every pod on the node is marked"),
            c.NODE_GPU_PODS, c.GpuPodsRequest(node=self.node), c.GpuPodsResult, summary=summary,
            timeout=timedelta(seconds=30), attempts=2, task_queue=self._node_queue(),
            schedule_to_start=min(timedelta(seconds=15), self.policy.validation.agent_timeout))
        return result.pod_gpus if result is not None else None

    async def _approved(self, rung: Rung) -> bool:
        rp = self.policy.ladder.for_rung(rung)
        if not rp.requires_approval or rung in self.s.approved:
            return True
        if self.s.lease_held or self.s.lease_requested:
            # A person may take a day: the fleet's budget is not held meanwhile (taken again once approved).
            await self._release_lease()
            self._record("lease", f"gave back {self.node}'s disruption lease", True,
                         f"while {rung.value} waits for approval; taken again once approved")
        self.s.awaiting_approval = rung
        self._set_details()
        try:
            await workflow.wait_condition(lambda: rung in self.s.approved or self._steered(),
                                          timeout=rp.approval_timeout,
                                          timeout_summary=f"wait for approval to {rung.value} {self.node}")
        except TimeoutError:
            return False
        finally:
            self.s.awaiting_approval = None
        if rung not in self.s.approved:
            return False  # steered away (cancel or skip): the caller re-plans
        self._record("approval", f"{rung.value} {self.node} approved", True)
        return True

    async def _drain(self) -> None:
        if self.s.drained:
            return
        d = self.policy.drain
        result = await self._kube(
            c.KUBE_DRAIN,
            c.DrainRequest(node=self.node, episode=self._episode(), checkpoint_grace_s=d.checkpoint_grace.total_seconds(),
                           deadline_s=d.deadline.total_seconds(), timeout_action=d.timeout_action,
                           allow_force=d.allow_force, pod_grace_seconds=d.pod_grace_seconds, dry_run=self.policy.dry_run),
            c.DrainResult, f"drain {self.node} through the Eviction API",
            start_to_close=d.checkpoint_grace + d.deadline + timedelta(minutes=5), heartbeat=d.heartbeat_timeout,
        )
        self.s.drained = result is not None
        if result is not None:
            self.s.pods_evicted = sorted({*self.s.pods_evicted, *result.evicted, *result.forced})[:200]
        if result is None:
            # Pods may still be on the node: no reboot or reset under them.
            return self._finish(Outcome.QUARANTINED, f"drain failed ({self.s.actions[-1].detail}): nothing "
                                "disruptive done; the node stays quarantined for a person")
        left = [*result.remaining, *result.lingering]
        if left:
            self.s.drain_left = left
            self._record("drain", f"drain of {self.node} incomplete", False,
                         f"{len(left)} pods still there ({', '.join(left[:5])}); "
                         f"timeout_action={d.timeout_action}: the rung goes ahead and stops them")
