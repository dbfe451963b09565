"""The fleet guard's books kept true: quarantine admitted while there is room, the fleet
counted, and holders, waiters and unhealthy nodes reconciled with the running episodes and the
nodes' taints; a guard started afresh learns its holders back before it grants anything."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta

from temporalio import workflow
from temporalio.exceptions import FailureError

with workflow.unsafe.imports_passed_through():
    import api as c
    from api.guard import (
        MAX_NEWS_KEPT,
        FaultNotice,
        Lease,
        LeaseRequest,
        QuarantineAnswer,
        RoomGrant,
        RoomRequest,
        Waiting,
    )
    from api.names import HOLDER_SIGNAL_QUARANTINE
    from workflows import guard_room
    from workflows.calls import call_or_none
    from workflows.guard_constants import MAX_DEFERRED_KEPT, PATCH_ROOM_BESIDE_ADMISSIONS
    from workflows.guard_gates import GuardGates


class GuardBooks(GuardGates):
    _asking_in: list | None = None  # the admissions list `_asking` holds the holders of
    _asking: set[str]
    _relearning: object
    _answers: list
    _holder_check: asyncio.Task | None

    def _learning(self) -> bool:
        return self._relearning is not None and not self._relearning.done()


    def _drop_holder(self, holder: str) -> None:
        self.s.holders = [h for h in self.s.holders if h.holder != holder]
        self.s.waiters = [w for w in self.s.waiters if w.holder != holder]
        self.s.waiting_since.pop(holder, None)
        self._wake = True

    def _news(self, node: str, holder: str, sent_at: datetime | None) -> bool:
        """Notes the latest news time of the node from this sender; False when this message is older
        (stale). Only one sender's times are compared: two workflows' clocks need not agree."""
        if sent_at is None or not node:
            return True
        key = f"{node}\n{holder}"
        last = self.s.news_at.get(key)
        if last is not None and sent_at < last:
            return False
        self.s.news_at.pop(key, None)  # re-inserted: the newest last, the oldest dropped first
        self.s.news_at[key] = sent_at
        while len(self.s.news_at) > MAX_NEWS_KEPT:  # not a copy of 20,000 keys per notice
            del self.s.news_at[next(iter(self.s.news_at))]
        return True

    def _queue_admission(self, notice: FaultNotice) -> None:
        """Each holder waits in the queue once. A set beside the list, not a scan of it: a storm's
        thousands of notices arrive in one activation, and a scan per notice took the guard past
        the SDK's deadlock timeout (guard storm, 2,000 of 10,000). Rebuilt whenever the list is a new one."""
        if self._asking_in is not self.s.admissions:
            self._asking_in, self._asking = self.s.admissions, {a.holder for a in self.s.admissions}
        if notice.holder not in self._asking:
            self._asking.add(notice.holder)
            self.s.admissions.append(notice)

    def _stale(self, req: LeaseRequest) -> bool:
        """A request for a lease its holder already gave back (a duplicate, or delivered late)."""
        return bool(req.request_id) and self.s.released.get(req.holder) == req.request_id

    # --- quarantine admission -------------------------------------------------------------------
    async def _admit(self) -> None:
        """Deferred faults first (oldest first), then new ones: admitted while at most max_unhealthy
        nodes are quarantined, else deferred, each told once."""
        now, new = workflow.now(), self.s.admissions
        self.s.admissions = []
        guard_room.lapse(self.s, now)
        # Sets, not scans: under a storm of thousands one pass must stay well inside a workflow task.
        deferred = {d.holder for d in self.s.deferred}
        for n in new:
            if self.s.unhealthy.get(n.node) != n.holder and n.holder not in deferred:
                self.s.fault_times.append(now)  # counts toward the storm, admitted or not
        still: list[Waiting] = []
        kept: set[str] = set()
        for w in [*self.s.deferred, *(Waiting(holder=n.holder, node=n.node, since=now) for n in new)]:
            if w.holder in kept:
                continue
            if self._room_for(w.node, w.holder):
                self.s.unhealthy[w.node] = w.holder
                self._answers.append((w.holder, QuarantineAnswer(admitted=True)))
                continue
            if not w.reason:
                w = w.model_copy(update={"reason": f"quarantine deferred: {len(self.s.unhealthy)} nodes quarantined, "
                                                   f"max_unhealthy {self.policy.max_unhealthy}"})
                self._answers.append((w.holder, QuarantineAnswer(admitted=False, reason=w.reason)))
            still.append(w)
            kept.add(w.holder)
        self.s.deferred = still[:MAX_DEFERRED_KEPT]

    def _room_for(self, node: str, holder: str) -> bool:
        limit = self._max_unhealthy()
        if not self.policy.defer_quarantine or limit is None:
            return True
        taken = len(self.s.unhealthy) + len(self.s.room)  # slots reserved ahead are taken (guard_room.py)
        # Its own episode asking again is in already. Any other entry for the node (a taint seen at
        # the last reconcile, maybe lifted since) gives no free room: the others must leave some
        # (given at once, a lifted node's next fault went over max_unhealthy: safety soak, seed 791).
        return self.s.unhealthy.get(node) == holder or taken - (node in self.s.unhealthy) < limit

    def _reserve_room(self, req: RoomRequest) -> RoomGrant:
        reclaim = self._room_wanted_elsewhere()
        self._wake = self._wake or reclaim  # room taken back goes to the faults waiting for it
        return guard_room.reserve(self.s, req, self.policy, workflow.now(), self._free_room(),
                                  lambda: workflow.uuid4().hex, reclaim, half=True)

    def _room_wanted_elsewhere(self) -> bool:
        """Reserved room a controller keeps unused is taken back: faults wait for room, the guard is
        learning its holders back, room_ahead is 0, or a lowered limit leaves the books over it."""
        limit = self._max_unhealthy() if self.policy.defer_quarantine else None
        over = limit is not None and len(self.s.unhealthy) + len(self.s.room) > limit
        waiting = bool(self.s.deferred or self.s.admissions)
        if workflow.patched(PATCH_ROOM_BESIDE_ADMISSIONS) and not self.s.deferred and self.s.admissions:
            # Requests not yet answered want room only when the room left beside what this pool may
            # take (half of it) would not admit them all: in a storm some ask the guard while the
            # pool tops up, and taking the pool's room back then starved the pool and sent every
            # later cordon to the guard (issue 25's storm ratio).
            free = self._free_room()
            waiting = free is not None and len(self.s.admissions) > free - free // 2
        return self._learning() or waiting or self.policy.room_ahead == 0 or over

    def _free_room(self) -> int | None:
        """How many slots may be reserved ahead now (None: no max_unhealthy applies; none while the
        fleet's size is unknown). Asked only when the room is not wanted elsewhere
        (`_room_wanted_elsewhere`: learning, faults waiting), which reserves nothing."""
        if not self.policy.defer_quarantine:
            return None
        limit = self._max_unhealthy()
        return 0 if limit is None else max(0, limit - len(self.s.unhealthy) - len(self.s.room))

    async def _answer(self) -> None:
        """One pass's answers go out together: awaited one by one, each would cost the guard a
        workflow task, and under a storm the guard would be every cordon's bottleneck."""
        answers, self._answers = self._answers, []

        async def answer_one(holder: str, answer: QuarantineAnswer) -> None:
            try:
                await workflow.get_external_workflow_handle(holder).signal(HOLDER_SIGNAL_QUARANTINE, answer)
            except FailureError:
                # The holder is gone; its node may still be quarantined (an ending left it for a
                # person): counted, holder unknown, until the reconcile reads the taints.
                self.s.unhealthy = {n: ("" if h == holder else h) for n, h in self.s.unhealthy.items()}
                self.s.deferred = [d for d in self.s.deferred if d.holder != holder]

        await asyncio.gather(*(answer_one(h, a) for h, a in answers))


    # --- the cluster and the episodes, as they are ----------------------------------------------
    async def _count_fleet_if_due(self) -> None:
        """Percent limits need the fleet's size: counted from the cluster, not taken from a constant."""
        now, every = workflow.now(), self.policy.holder_check_interval
        if self.s.last_fleet_count and now - self.s.last_fleet_count < every:
            return
        self.s.last_fleet_count = now
        size = await call_or_none(lambda why: workflow.logger.warning("fleet size unknown (%s): keeping %d",
                                                                     why, self.s.fleet_size),
                                  c.KUBE_FLEET_SIZE, None, int, summary=f"count GPU nodes in {self.inp.cluster}",
                                  timeout=timedelta(seconds=30), attempts=3)
        if size is not None:
            self.s.fleet_size = size


    def _check_holders_if_due(self) -> None:
        """Holders, waiters and quarantined nodes whose episode is gone must not count forever: a
        node stays unhealthy only while its episode runs or it still carries gpuheal's taint. The
        check runs beside the loop: grants and admissions go on meanwhile."""
        now, p = workflow.now(), self.policy
        if not (self.s.holders or self.s.unhealthy or self.s.waiters or self.s.deferred):
            return
        if self.s.last_holder_check and now - self.s.last_holder_check < p.holder_check_interval:
            return
        if self._holder_check is not None and not self._holder_check.done():
            return  # the last one still runs beside the loop
        self.s.last_holder_check = now
        ids = {h.holder for h in self.s.holders} | {w.holder for w in self.s.waiters}
        ids |= {h for h in self.s.unhealthy.values() if h} | {d.holder for d in self.s.deferred}
        self._holder_check = asyncio.create_task(self._check_beside(ids))

    async def _check_beside(self, ids: set[str]) -> None:
        """The holder check beside the loop: one paged listing (heartbeating), a bounded retry; a
        check that fails keeps the books as they are until the next interval."""
        live = await call_or_none(lambda why: workflow.logger.warning("guard %s: holder check failed (%s): books kept",
                                                                     self.inp.cluster, why),
                                  c.GUARD_RUNNING_HOLDERS, c.LiveHoldersRequest(holders=sorted(ids)), c.LiveHoldersResult,
                                  summary=f"check {len(ids)} lease holders still run", timeout=timedelta(minutes=10),
                                  heartbeat=timedelta(seconds=30), attempts=5, max_interval=timedelta(seconds=30))
        if live is not None:
            await self._reconcile(ids, live.running)
        self._wake = True

    async def _reconcile(self, ids: set[str], running: list[str]) -> None:
        # Only what was checked can be gone: holders learnt back, requests and faults that arrived
        # while the activity ran were not asked about.
        gone = ids - set(running)
        for h in [h.holder for h in self.s.holders if h.holder in gone]:
            self._drop_holder(h)
        for w in [w.holder for w in self.s.waiters if w.holder in gone]:
            self._drop_holder(w)
        self.s.deferred = [d for d in self.s.deferred if d.holder not in gone]
        listed = await call_or_none(lambda why: None, c.KUBE_QUARANTINED_NODES, None, list[str],
                                    summary=f"list quarantined nodes in {self.inp.cluster}",
                                    timeout=timedelta(seconds=30), attempts=3)
        if listed is None:
            return  # the API cannot say: keep what is known rather than forget a quarantined node
        tainted = set(listed)
        kept = {n: h for n, h in self.s.unhealthy.items() if (h and h not in gone) or n in tainted}
        self.s.unhealthy = kept | {n: "" for n in sorted(tainted) if n not in kept}
        self._wake = True

    async def _relearn(self) -> None:
        """A guard started afresh (terminated and started again) learns the episodes that hold a
        lease, wait for one, or keep a node quarantined, before it grants anything. Holders unknown
        means no lease at all (one could exceed the budget): it asks again every
        holder_check_interval, the reason shows in `gpuheal guard`, and `resume --force` still works."""
        def unknown(why: str) -> None:
            self.s.relearn_error = why[:300]
            workflow.logger.warning("guard %s: running episodes unknown, no lease yet: %s", self.inp.cluster, why)
            self._wake = True

        while (found := await call_or_none(
                unknown, c.GUARD_RUNNING_EPISODES, c.RunningEpisodesRequest(cluster=self.inp.cluster),
                c.RunningEpisodesResult, summary="learn running episodes back", timeout=timedelta(minutes=2),
                attempts=3)) is None:
            await workflow.sleep(self.policy.holder_check_interval, summary="ask for running episodes again")
        self.s.relearn_error = ""
        now = workflow.now()
        for e in found.episodes:
            if e.lease_held and not any(h.holder == e.holder for h in self.s.holders):
                self.s.holders.append(Lease(holder=e.holder, node=e.node, since=now))
            elif e.lease_requested and not any(w.holder == e.holder for w in self.s.waiters):
                self.s.waiters.append(LeaseRequest(cluster=self.inp.cluster, holder=e.holder, node=e.node))
                self.s.waiting_since[e.holder] = now
            if e.quarantined:
                self.s.unhealthy.setdefault(e.node, e.holder)
        self._wake = True
