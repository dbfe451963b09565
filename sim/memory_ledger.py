"""The ledger's activities over in-memory books, with the real names: one stand-in for the test
fleet, the safety world and the what-if (the real ledger, activities/ledger.py, has its own tests
against SQLite and DynamoDB). Its host holds `records`, `denylist` and `admitted_hw`; the hooks
below are where a host differs (its clock, what follows a record or a denylist entry)."""

from __future__ import annotations

from datetime import datetime

from temporalio import activity

import api as c


class MemoryLedger:
    """Mixed into a stand-in fleet."""

    records: list[c.RemediationRecord]
    denylist: dict[str, str]
    admitted_hw: dict[str, set[str]]  # node -> the hardware it was admitted with

    # --- hooks -------------------------------------------------------------------------------------
    async def _counted_since(self, window_s: float) -> datetime | None:
        """Where a repeat count's window starts on the host's clock; None: every record counts."""
        return None

    async def _before_record(self, rec: c.RemediationRecord) -> None:
        """Runs before a record is kept (a test holds an episode in its close here)."""

    def _recorded(self, rec: c.RemediationRecord) -> None:
        """Runs once a new record is kept."""

    def _denylisted(self, node: str, added: list[str]) -> None:
        """Runs once hardware of `node` is denylisted."""

    # --- the ledger --------------------------------------------------------------------------------
    @activity.defn(name=c.LEDGER_RECORD)
    async def record(self, rec: c.RemediationRecord) -> None:
        await self._before_record(rec)
        if all(r.episode != rec.episode for r in self.records):  # idempotent under retry, as the real one
            self.records.append(rec)
            self._recorded(rec)

    @activity.defn(name=c.LEDGER_COUNT_RECENT)
    async def count_recent(self, req: c.CountRecentRequest) -> int:
        ids, since = set(req.hardware_ids), await self._counted_since(req.window_s)
        return sum(1 for r in self.records
                   if ids & set(r.boards if req.by_board else r.hardware_ids) and r.episode != req.exclude_episode
                   and (since is None or r.ended_at >= since))

    @activity.defn(name=c.LEDGER_CHECK_DENIED)
    async def check_denied(self, req: c.CheckDeniedRequest) -> c.CheckDeniedResult:
        return c.CheckDeniedResult(denied={i: self.denylist[i] for i in req.hardware_ids if i in self.denylist})

    @activity.defn(name=c.LEDGER_DENYLIST)
    async def denylist_add(self, req: c.DenylistRequest) -> c.DenylistResult:
        added = [i for i in req.hardware_ids if i not in self.denylist]
        self.denylist.update({i: req.reason for i in added})
        if added:
            self._denylisted(req.node, added)
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
        """No SKU medians kept: a load test is judged against the shipped floors."""
        return c.BaselineResult()

    @activity.defn(name=c.LEDGER_LOAD_FIGURES)
    async def load_figures(self, rec: c.LoadFiguresRecord) -> None:
        self.figures = [*getattr(self, "figures", []), rec]

    def ledger_activities(self) -> list:
        return [self.record, self.count_recent, self.check_denied, self.denylist_add, self.last_started,
                self.admit, self.admitted, self.baseline, self.load_figures]
