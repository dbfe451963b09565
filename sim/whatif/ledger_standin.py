"""The what-if's ledger: sim/memory_ledger.py on the virtual clock, kept in memory for the report."""

from __future__ import annotations

from datetime import datetime, timedelta

import api as c
from sim.memory_ledger import MemoryLedger


class LedgerStandIns(MemoryLedger):
    """Mixed into WhatIfFleet, which holds the records, the denylist and the admitted hardware."""

    async def _counted_since(self, window_s: float) -> datetime | None:
        return self.at(await self.now()) - timedelta(seconds=window_s)

    def _recorded(self, rec: c.RemediationRecord) -> None:
        self.open_episodes.discard(rec.node)
        # The episode's last step: its node's agent is not needed until the node's next report,
        # and a thousand idle pollers slowed every virtual day (10,000 nodes: 7 s a day at first,
        # 35 s by day 29).
        self._retire_worker(rec.node)

    def _denylisted(self, node: str, added: list[str]) -> None:
        self.denylisted_nodes.add(node)
