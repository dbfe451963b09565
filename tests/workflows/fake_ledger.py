"""The test fleet's ledger stand-ins, kept in memory: records, repeat counts, the denylist,
admissions, load figures, and the controller's policy."""

from __future__ import annotations

from temporalio import activity

import api as c
from activities.policy import PolicyActivities


class FakeLedger:
    """Mixed into FakeFleet, which holds the records, the denylist and the admitted hardware."""

    @activity.defn(name=c.LEDGER_RECORD)
    async def record(self, rec: c.RemediationRecord) -> None:
        if self.record_hold is not None:  # the episode is closing: tests send reports meanwhile
            self.record_started.set()
            await self.record_hold.wait()
        if all(r.episode != rec.episode for r in self.records):
            self.records.append(rec)

    @activity.defn(name=c.LEDGER_COUNT_RECENT)
    async def count_recent(self, req: c.CountRecentRequest) -> int:
        ids = set(req.hardware_ids)
        return sum(1 for r in self.records
                   if ids & set(r.boards if req.by_board else r.hardware_ids) and r.episode != req.exclude_episode)

    @activity.defn(name=c.LEDGER_CHECK_DENIED)
    async def check_denied(self, req: c.CheckDeniedRequest) -> c.CheckDeniedResult:
        return c.CheckDeniedResult(denied={i: self.denylist[i] for i in req.hardware_ids if i in self.denylist})

    @activity.defn(name=c.LEDGER_DENYLIST)
    async def denylist_add(self, req: c.DenylistRequest) -> c.DenylistResult:
        added = [i for i in req.hardware_ids if i not in self.denylist]
        self.denylist.update({i: req.reason for i in added})
        return c.DenylistResult(added=added)

    @activity.defn(name=c.LEDGER_LAST_STARTED)
    async def last_started(self, req: c.LastStartedRequest) -> c.LastStartedResult:
        starts = [r.started_at for r in self.records if r.node == req.node and r.episode != req.exclude_episode]
        return c.LastStartedResult(started_at=max(starts, default=None))

    @activity.defn(name=c.LEDGER_ADMIT)
    async def admit(self, req: c.AdmitRequest) -> None:
        self.admitted_hw.setdefault(req.node, set()).update(req.hardware_ids)

    @activity.defn(name=c.LEDGER_ADMITTED)
    async def admitted(self, req: c.AdmittedRequest) -> c.AdmittedResult:
        return c.AdmittedResult(hardware_ids=sorted(self.admitted_hw.get(req.node, set())))

    @activity.defn(name=c.LEDGER_BASELINE)
    async def baseline(self, req: c.BaselineRequest) -> c.BaselineResult:
        return c.BaselineResult()

    @activity.defn(name=c.LEDGER_LOAD_FIGURES)
    async def load_figures(self, rec: c.LoadFiguresRecord) -> None:
        self.figures = [*getattr(self, "figures", []), rec]

    @activity.defn(name=c.POLICY_CURRENT)
    async def current_policy(self, req: c.PolicyRequest) -> c.PolicySnapshot:
        """The controller's policy: whatever the test set on the fleet, read at each episode's start."""
        policy = self.policy
        if self.history_limit is not None:  # the limit is the controller's policy's, never a sender's
            policy = policy.model_copy(update={"history_limit": self.history_limit})
        return PolicyActivities(policy, "test", self.cluster).snapshot
