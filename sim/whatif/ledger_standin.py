"""The what-if's ledger stand-ins: episode records, repeat counts, the denylist and admissions,
kept in memory for the report."""

from __future__ import annotations

from datetime import timedelta

from temporalio import activity

import api as c
from activities.guard import GuardActivities


class LedgerStandIns:
    """Mixed into WhatIfFleet, which holds the records, the denylist and the admitted hardware."""

    @activity.defn(name=c.LEDGER_RECORD)
    async def record(self, rec: c.RemediationRecord) -> None:
        if all(r.episode != rec.episode for r in self.records):
            self.records.append(rec)
            self.open_episodes.discard(rec.node)
            # The episode's last step: its node's agent is not needed until the node's next report,
            # and a thousand idle pollers slowed every virtual day (10,000 nodes: 7 s a day at first,
            # 35 s by day 29).
            self._retire_worker(rec.node)

    @activity.defn(name=c.LEDGER_COUNT_RECENT)
    async def count_recent(self, req: c.CountRecentRequest) -> int:
        ids, since = set(req.hardware_ids), self.at(await self.now()) - timedelta(seconds=req.window_s)
        return sum(1 for r in self.records
                   if ids & set(r.boards if req.by_board else r.hardware_ids) and r.episode != req.exclude_episode
                   and r.ended_at >= since)

    @activity.defn(name=c.LEDGER_CHECK_DENIED)
    async def check_denied(self, req: c.CheckDeniedRequest) -> c.CheckDeniedResult:
        return c.CheckDeniedResult(denied={i: self.denylist[i] for i in req.hardware_ids if i in self.denylist})

    @activity.defn(name=c.LEDGER_ADMIT)
    async def admit(self, req: c.AdmitRequest) -> None:
        self.admitted_hw.setdefault(req.node, set()).update(req.hardware_ids)

    @activity.defn(name=c.LEDGER_ADMITTED)
    async def admitted(self, req: c.AdmittedRequest) -> c.AdmittedResult:
        return c.AdmittedResult(hardware_ids=sorted(self.admitted_hw.get(req.node, set())))

    @activity.defn(name=c.LEDGER_LAST_STARTED)
    async def last_started(self, req: c.LastStartedRequest) -> c.LastStartedResult:
        starts = [r.started_at for r in self.records if r.node == req.node and r.episode != req.exclude_episode]
        return c.LastStartedResult(started_at=max(starts, default=None))

    @activity.defn(name=c.LEDGER_LOAD_FIGURES)
    async def load_figures(self, rec: c.LoadFiguresRecord) -> None:
        """The what-if models no load figures (its validation returns none): nothing to keep."""

    @activity.defn(name=c.GUARD_RUNNING_HOLDERS)
    async def running_holders(self, req: c.LiveHoldersRequest) -> c.LiveHoldersResult:
        """The holders that run, by a describe each (the time-skipping server has no visibility)."""
        return await GuardActivities(self.client).live_holders(req)

    @activity.defn(name=c.LEDGER_BASELINE)
    async def sku_baseline(self, req: c.BaselineRequest) -> c.BaselineResult:
        """No load figures in the what-if: a load test is judged against the shipped floors."""
        return c.BaselineResult()

    @activity.defn(name=c.LEDGER_DENYLIST)
    async def denylist_add(self, req: c.DenylistRequest) -> c.DenylistResult:
        added = [i for i in req.hardware_ids if i not in self.denylist]
        self.denylist.update({i: req.reason for i in added})
        if added:
            self.denylisted_nodes.add(req.node)
        return c.DenylistResult(added=added)
