"""The fleet guard's limits: disruption budget, storm breaker, max_unhealthy, canaries."""

from __future__ import annotations

from datetime import timedelta

from pydantic import Field, field_validator

from policies.durations import Duration
from policies.terms import Strict


class GuardPolicy(Strict):
    max_disruptive: int | str = Field(
        default=2, description="Nodes in disruptive remediation at once: a count, or a percentage of the fleet like '10%'."
    )
    max_unhealthy: int | str = Field(
        default="50%", description="Quarantined nodes beyond which new disruptive leases wait (count or percentage)."
    )
    storm_faults: int = Field(default=10, ge=1, description="More new faults than this within `storm_window` trips the breaker.")
    storm_window: Duration = Field(default=timedelta(minutes=10), description="Window over which new faults are counted.")
    storm_cooldown: Duration = Field(
        default=timedelta(minutes=15), description="The breaker closes once the fault rate stays below threshold this long."
    )
    holder_check_interval: Duration = Field(
        default=timedelta(minutes=5),
        description="How often lease holders, waiters and quarantined nodes are reconciled with running episodes and the nodes' taints.",
    )
    idle_recheck: Duration = Field(
        default=timedelta(hours=1),
        description="How often an idle guard (no lease, waiter, unhealthy node, recent fault or open breaker) wakes to count the fleet; any message wakes it at once.",
    )
    canary: bool = Field(
        default=True,
        description="Past max_unhealthy or with the storm breaker open, leases trickle one at a time (canaries) instead of stopping; each canary validated back doubles the trickle up to max_disruptive, a failed one keeps it at one and raises the alarm.",
    )
    defer_quarantine: bool = Field(
        default=True,
        description="A new fault that would put more than max_unhealthy nodes in quarantine waits uncordoned, recorded with the reason, until there is room: a detector bug must not cordon the whole fleet.",
    )
    room_ahead: int = Field(
        default=0, ge=0,
        description="Quarantine slots the guard reserves ahead for each controller process while there is room under max_unhealthy: a cordon in a reserved slot needs no round trip to the guard (counted from the moment it is reserved). 0 (the default until it is proven on real fleets): every cordon asks the guard first. A pool is granted at most half the room other pools do not hold, so other cordons find room while a pool has plenty.",
    )
    room_ttl: Duration = Field(
        default=timedelta(minutes=10),
        description="A reserved slot lapses this long after its controller last renewed it (a controller that died gives its room back); a controller hands a slot out only while half of this is left.",
    )
    admission_timeout: Duration = Field(
        default=timedelta(seconds=30),
        description="How long an episode waits for the guard's answer before it looks at the guard: one that runs with a worker taking its tasks is slow and waited for, up to 20 times this; one seen stuck twice in a row (not running, its task failing, no worker) does not stop the cordon.",
    )

    @field_validator("max_disruptive", "max_unhealthy")
    @classmethod
    def _count_or_percent(cls, v: int | str) -> int | str:
        if isinstance(v, int):
            if v < 0:
                raise ValueError("must not be negative")
            return v
        text = v.strip()
        if text.endswith("%") and text[:-1].isdigit() and 0 <= int(text[:-1]) <= 100:
            return text
        raise ValueError("must be a count like 3 or a percentage like '10%'")


def resolve_limit(limit: int | str, fleet_size: int) -> int:
    """A count or percentage of the fleet as a count (at least 1, so remediation never deadlocks)."""
    if isinstance(limit, int):
        return max(1, limit)
    return max(1, int(fleet_size * int(limit[:-1]) / 100))
