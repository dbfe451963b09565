"""FleetGuard, id `fleet-guard/<cluster>`: the disruption budget and storm breaker for one cluster."""

from __future__ import annotations

from datetime import datetime, timedelta

from pydantic import BaseModel, Field
from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, FailureError

from workflows import metrics

with workflow.unsafe.imports_passed_through():
    from activities import contracts as c
    from policies.model import GuardPolicy, resolve_limit

GUARD_SIGNAL_FAULT = "fault"
GUARD_SIGNAL_REQUEST = "request"
GUARD_SIGNAL_RELEASE = "release"
HOLDER_SIGNAL_GRANTED = "lease_granted"


def guard_workflow_id(cluster: str) -> str:
    return f"fleet-guard/{cluster}"


class FaultNotice(BaseModel):
    """A node entered quarantine (counts toward the storm breaker and the unhealthy limit)."""

    node: str
    holder: str
    fault_class: str | None = None
    healthy: bool = Field(default=False, description="True: the node left quarantine (returned or replaced).")


class LeaseRelease(BaseModel):
    holder: str


class LeaseGrant(BaseModel):
    holder: str
    granted_at: datetime


class Lease(BaseModel):
    holder: str
    node: str
    since: datetime


class GuardState(BaseModel):
    holders: list[Lease] = Field(default_factory=list)
    waiters: list[c.LeaseRequest] = Field(default_factory=list, description="First come, first served.")
    unhealthy: dict[str, str] = Field(default_factory=dict, description="node -> holder workflow id")
    fault_times: list[datetime] = Field(default_factory=list, description="New faults within the storm window.")
    breaker_open: bool = False
    breaker_reason: str = ""
    breaker_opened_at: datetime | None = None
    calm_since: datetime | None = None
    paused: bool = False
    pause_reason: str = ""
    max_seen_holders: int = 0
    grants: int = 0
    fleet_size: int = 0
    last_holder_check: datetime | None = None
    last_fleet_count: datetime | None = None
    trips: int = Field(default=0, description="How often the storm breaker has opened.")
    pending_storm_event: str | None = None


class GuardInput(BaseModel):
    cluster: str
    policy: GuardPolicy = Field(default_factory=GuardPolicy)
    fleet_size: int = Field(default=0, ge=0, description="Known fleet size; 0 until the first kube count.")
    state: GuardState | None = None


class GuardStatus(BaseModel):
    cluster: str
    limit: int
    holders: list[Lease]
    waiters: list[str]
    unhealthy: list[str]
    breaker_open: bool
    breaker_reason: str
    paused: bool
    pause_reason: str
    recent_faults: int
    max_seen_holders: int
    fleet_size: int
    trips: int


@workflow.defn(name="FleetGuard")
class FleetGuard:
    @workflow.init
    def __init__(self, inp: GuardInput) -> None:
        self.inp = inp
        self.s = inp.state or GuardState(fleet_size=inp.fleet_size)
        self._wake = True
        self._regrant: set[str] = set()

    # --- handlers ------------------------------------------------------------------------------
    @workflow.signal(name=GUARD_SIGNAL_REQUEST)
    def request(self, req: c.LeaseRequest) -> None:
        if any(h.holder == req.holder for h in self.s.holders):
            # A holder asking again (after continue-as-new, say) gets its grant again.
            self._regrant.add(req.holder)
        elif not any(w.holder == req.holder for w in self.s.waiters):
            self.s.waiters.append(req)
        self._wake = True

    @workflow.signal(name=GUARD_SIGNAL_RELEASE)
    def release(self, rel: LeaseRelease) -> None:
        self._drop_holder(rel.holder)

    @workflow.signal(name=GUARD_SIGNAL_FAULT)
    def fault(self, notice: FaultNotice) -> None:
        if notice.healthy:
            self.s.unhealthy.pop(notice.node, None)
        else:
            if self.s.unhealthy.get(notice.node) != notice.holder:
                self.s.fault_times.append(workflow.now())
            self.s.unhealthy[notice.node] = notice.holder
        self._wake = True

    @workflow.update
    def pause(self, reason: str = "") -> GuardStatus:
        self.s.paused, self.s.pause_reason = True, reason or "paused by operator"
        return self.status()

    @workflow.update
    def resume(self) -> GuardStatus:
        # An operator resume also closes a tripped breaker: people must be able to end a storm.
        self.s.paused, self.s.pause_reason = False, ""
        if self.s.breaker_open:
            self._close_breaker("closed by operator")
        self._wake = True
        return self.status()

    @workflow.query
    def status(self) -> GuardStatus:
        return GuardStatus(
            cluster=self.inp.cluster, limit=self._limit(), holders=self.s.holders,
            waiters=[w.holder for w in self.s.waiters], unhealthy=sorted(self.s.unhealthy),
            breaker_open=self.s.breaker_open, breaker_reason=self.s.breaker_reason, paused=self.s.paused,
            pause_reason=self.s.pause_reason, recent_faults=len(self.s.fault_times),
            max_seen_holders=self.s.max_seen_holders, fleet_size=self.s.fleet_size, trips=self.s.trips,
        )

    # --- main loop -----------------------------------------------------------------------------
    @workflow.run
    async def run(self, inp: GuardInput) -> None:
        while True:
            self._wake = False
            await self._count_fleet_if_due()
            self._update_breaker()
            await self._announce_storm()
            await self._check_holders_if_due()
            await self._grant()
            metrics.guard_state(inp.cluster, len(self.s.holders), self._limit(), len(self.s.waiters), self.s.breaker_open)
            if workflow.info().is_continue_as_new_suggested():
                await workflow.wait_condition(workflow.all_handlers_finished)
                workflow.continue_as_new(GuardInput(cluster=inp.cluster, policy=inp.policy, state=self.s))
            try:
                await workflow.wait_condition(
                    lambda: self._wake or bool(self._regrant), timeout=self._next_deadline(),
                    timeout_summary="re-check breaker and lease holders",
                )
            except TimeoutError:
                pass

    def _limit(self) -> int:
        return resolve_limit(self.inp.policy.max_disruptive, self.s.fleet_size)

    def _blocked_reason(self) -> str | None:
        if self.s.paused:
            return self.s.pause_reason
        if self.s.breaker_open:
            return self.s.breaker_reason
        # Until the fleet has been counted, a percentage means nothing: only the lease budget holds.
        size = self.s.fleet_size
        if size and len(self.s.unhealthy) > resolve_limit(self.inp.policy.max_unhealthy, size):
            return f"{len(self.s.unhealthy)} nodes unhealthy, above max_unhealthy {self.inp.policy.max_unhealthy}"
        return None

    async def _grant(self) -> None:
        for holder in sorted(self._regrant):
            await self._signal_grant(holder)
        self._regrant.clear()
        while self.s.waiters and len(self.s.holders) < self._limit() and self._blocked_reason() is None:
            req = self.s.waiters.pop(0)
            self.s.holders.append(Lease(holder=req.holder, node=req.node, since=workflow.now()))
            self.s.grants += 1
            self.s.max_seen_holders = max(self.s.max_seen_holders, len(self.s.holders))
            await self._signal_grant(req.holder)
        workflow.set_current_details(self._details())

    async def _signal_grant(self, holder: str) -> None:
        try:
            await workflow.get_external_workflow_handle(holder).signal(
                HOLDER_SIGNAL_GRANTED, LeaseGrant(holder=holder, granted_at=workflow.now())
            )
        except FailureError:
            # The holder is gone (completed or terminated): its slot goes back to the budget.
            self._drop_holder(holder)

    def _drop_holder(self, holder: str) -> None:
        self.s.holders = [h for h in self.s.holders if h.holder != holder]
        self.s.waiters = [w for w in self.s.waiters if w.holder != holder]
        self._wake = True

    def _update_breaker(self) -> None:
        p, now = self.inp.policy, workflow.now()
        self.s.fault_times = [t for t in self.s.fault_times if now - t < p.storm_window]
        storm = len(self.s.fault_times) > p.storm_faults
        if storm:
            self.s.calm_since = None
            if not self.s.breaker_open:
                self.s.breaker_open, self.s.breaker_opened_at = True, now
                self.s.breaker_reason = (
                    f"storm: {len(self.s.fault_times)} new faults within {p.storm_window}, above {p.storm_faults}"
                )
                self.s.trips += 1
                self.s.pending_storm_event = self.s.breaker_reason
                workflow.metric_meter().create_counter(
                    "gpuheal_storm_breaker_trips", "times the storm breaker opened").add(1, {"cluster": self.inp.cluster})
                workflow.logger.warning("storm breaker open: %s", self.s.breaker_reason)
        elif self.s.breaker_open:
            self.s.calm_since = self.s.calm_since or now
            if now - self.s.calm_since >= p.storm_cooldown:
                self._close_breaker(f"fault rate below threshold for {p.storm_cooldown}")

    def _close_breaker(self, why: str) -> None:
        workflow.logger.info("storm breaker closed: %s", why)
        self.s.breaker_open, self.s.breaker_reason, self.s.calm_since = False, "", None

    def _next_deadline(self) -> timedelta:
        p, now = self.inp.policy, workflow.now()
        waits = [p.holder_check_interval]
        if self.s.breaker_open and self.s.calm_since is not None:
            waits.append(p.storm_cooldown - (now - self.s.calm_since))
        if self.s.fault_times:
            waits.append(p.storm_window - (now - self.s.fault_times[0]))
        return max(min(waits), timedelta(seconds=1))

    async def _count_fleet_if_due(self) -> None:
        """Percent limits need the fleet's size: counted from the cluster, not taken from a constant."""
        now, every = workflow.now(), self.inp.policy.holder_check_interval
        if self.s.last_fleet_count and now - self.s.last_fleet_count < every:
            return
        self.s.last_fleet_count = now
        try:
            self.s.fleet_size = await workflow.execute_activity(
                c.KUBE_FLEET_SIZE, result_type=int, start_to_close_timeout=timedelta(seconds=30),
                retry_policy=RetryPolicy(maximum_attempts=3), summary=f"count GPU nodes in {self.inp.cluster}")
        except ActivityError:
            workflow.logger.warning("fleet size unknown: keeping %d", self.s.fleet_size)

    async def _announce_storm(self) -> None:
        """A Warning event people see in `kubectl get events`, once per trip."""
        if self.s.pending_storm_event is None:
            return
        message, self.s.pending_storm_event = self.s.pending_storm_event, None
        node = next(iter(sorted(self.s.unhealthy)), self.inp.cluster)
        try:
            await workflow.execute_activity(
                c.KUBE_EVENT, c.EventRequest(node=node, reason="GpuRemediationStorm", type="Warning",
                                             message=f"disruptive remediation paused in {self.inp.cluster}: {message}"),
                start_to_close_timeout=timedelta(seconds=30), retry_policy=RetryPolicy(maximum_attempts=3),
                summary="warn: storm breaker open")
        except ActivityError:
            workflow.logger.warning("could not emit the storm event")

    async def _check_holders_if_due(self) -> None:
        """A holder that vanished (terminated, timed out) must not keep its slot forever."""
        now, p = workflow.now(), self.inp.policy
        if not self.s.holders:
            return
        if self.s.last_holder_check and now - self.s.last_holder_check < p.holder_check_interval:
            return
        self.s.last_holder_check = now
        ids = sorted({h.holder for h in self.s.holders})
        live = await workflow.execute_activity(
            c.GUARD_LIVE_HOLDERS, c.LiveHoldersRequest(holders=ids), result_type=c.LiveHoldersResult,
            start_to_close_timeout=timedelta(seconds=30), summary=f"check {len(ids)} lease holders still run",
        )
        running = set(live.running)
        for h in [h.holder for h in self.s.holders if h.holder not in running]:
            self._drop_holder(h)

    def _details(self) -> str:
        s = self.s
        lines = [f"**Fleet guard {self.inp.cluster}**: {len(s.holders)}/{self._limit()} disruptive leases held, "
                 f"{len(s.waiters)} waiting, {len(s.unhealthy)} unhealthy"]
        if (why := self._blocked_reason()) is not None:
            lines.append(f"New disruptive leases paused: {why}")
        lines += [f"- {h.node}: since {h.since:%H:%M:%S}" for h in s.holders]
        return "\n".join(lines)
