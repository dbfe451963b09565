"""Jobs on the what-if fleet: the workload's gangs meet the nodes' outages, in time order, and
what the users feel comes out (job success, ETTR, goodput lost by cause and phase).

The outages come from a policy's run (each node slot's time out of service, sim/whatif/engine.py)
or from the fast job-level model (sim/whatif/analytic.py). The rules, per job:
- a member node going down stops the job: it hangs until the fault is detected (`detect`), loses
  the work since its last checkpoint (all of it without checkpoints: the job fails), then
- a non-elastic job swaps in a spare that is up, or waits for its node (failing past `max_wait`);
  an elastic one trains on with the nodes it has (the node rejoins at a checkpoint, free);
- it restarts (`restart_cost`); a platform interruption past `max_restarts` fails the job.
A finished or failed job is followed by the next one on the same gang.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

from pydantic import BaseModel, Field

from sim.whatif.workload import JobSpec, WorkloadModel

WAIT = "waiting for the node"


@dataclass(frozen=True)
class Outage:
    slot: int
    start_s: float
    end_s: float  # math.inf: not back within the run
    cause: str
    attribution: str = "platform"
    phases: tuple[tuple[str, float], ...] = ()  # the repair's seconds per remediation phase, when known


class JobOutcome(BaseModel):
    workload: str
    jobs_ended: int = Field(description="Jobs that finished or failed within the run.")
    jobs_completed: int
    jobs_failed_platform: int
    jobs_failed_application: int
    job_success_rate: float | None = Field(description="Ended jobs that did not fail for a platform cause.")
    ettr: float | None = Field(description="Effective training time ratio: training kept / gang time held.")
    interruptions: int
    interruptions_by_attribution: dict[str, int]
    interruptions_by_cause: dict[str, int]
    interruptions_per_1000_node_days: float
    goodput_lost_node_h: float
    goodput_lost_by_cause: dict[str, float]
    goodput_lost_by_phase: dict[str, float]


@dataclass
class _Gang:
    spec: JobSpec
    members: list[int]
    index: int
    state: str = "run"  # run, restart (until `until`), wait (for its nodes)
    until: float = 0.0
    stopped_at: float = 0.0
    outage: Outage | None = None  # what stopped it
    work: float = 0.0  # training done by the current job, in full-gang seconds
    restarts: int = 0
    wait_deadline: float = math.inf


@dataclass
class _Books:
    ended: int = 0
    completed: int = 0
    failed: Counter = field(default_factory=Counter)
    kept: float = 0.0  # node-seconds of training kept (finished jobs' and the running jobs' work)
    held: float = 0.0  # node-seconds the gangs held
    interruptions: Counter = field(default_factory=Counter)
    by_cause: Counter = field(default_factory=Counter)
    lost_cause: Counter = field(default_factory=Counter)  # node-seconds
    lost_phase: Counter = field(default_factory=Counter)

    def lose(self, node_s: float, cause: str, phase: str) -> None:
        if node_s > 0:
            self.lost_cause[cause] += node_s
            self.lost_phase[phase] += node_s


class JobRun:
    def __init__(self, workload: WorkloadModel, nodes: int, days: float, detect_s: float):
        if workload.nodes_needed > nodes:
            raise ValueError(f"workload {workload.name} needs {workload.nodes_needed} nodes (its gangs and "
                             f"spare_nodes), the fleet has {nodes}")
        self.w, self.end, self.detect = workload, days * 86400.0, detect_s
        self.gangs: list[_Gang] = []
        self.owner: dict[int, int] = {}  # slot -> gang index; -1: a spare
        self.down: dict[int, Outage] = {}
        self.books = _Books()
        nxt = 0
        for spec in workload.jobs:
            for _ in range(spec.count):
                members = list(range(nxt, nxt + spec.nodes))
                nxt += spec.nodes
                self.owner.update({s: len(self.gangs) for s in members})
                self.gangs.append(_Gang(spec, members, len(self.gangs)))
        self.spares = set(range(nxt, nxt + workload.spare_nodes))
        self.owner.update({s: -1 for s in self.spares})

    # --- time passing ---------------------------------------------------------------------------
    def _up(self, g: _Gang) -> int:
        return g.spec.nodes - sum(1 for m in self.down if self.owner.get(m) == g.index)

    def _rate(self, g: _Gang) -> float:
        if g.state != "run":
            return 0.0
        return g.spec.efficiency * (self._up(g) / g.spec.nodes if g.spec.elastic else 1.0)

    def _timer(self, g: _Gang) -> float:
        if g.state == "restart":
            return g.until
        if g.state == "wait":
            return g.wait_deadline
        rate = self._rate(g)
        return g.stopped_at if rate <= 0 else g.stopped_at + (g.spec.length.total_seconds() - g.work) / rate

    def _advance(self, g: _Gang, t0: float, t1: float) -> None:
        dt, n = t1 - t0, g.spec.nodes
        if dt <= 0:
            return
        self.books.held += dt * n
        if g.state == "run":
            rate = self._rate(g)
            g.work += rate * dt
            self.books.lose((1 - g.spec.efficiency) * dt * n, "checkpointing", "checkpointing")
            missing = n - self._up(g)
            if missing and g.spec.elastic:
                for m in g.members:
                    if m in self.down:
                        self.books.lose(g.spec.efficiency * dt, self.down[m].cause, "elastic, node out")
            g.stopped_at = t1  # `run` keeps the time of its last step here
            return
        o = g.outage
        detect_end = g.stopped_at + self.detect
        in_detect = max(0.0, min(t1, detect_end) - t0)
        self.books.lose(in_detect * n, o.cause, "detect")
        rest = (dt - in_detect) * n
        if g.state == "restart":
            self.books.lose(rest, o.cause, "restart")
        elif o.phases and rest > 0:
            total = sum(s for _, s in o.phases) or 1.0
            for phase, s in o.phases:
                self.books.lose(rest * s / total, o.cause, f"{WAIT}: {phase}")
        else:
            self.books.lose(rest, o.cause, WAIT)

    # --- events ---------------------------------------------------------------------------------
    def _new_job(self, g: _Gang, failed: str | None) -> None:
        self.books.ended += 1
        if failed:
            self.books.failed[failed] += 1
        else:
            self.books.completed += 1
            self.books.kept += g.work * g.spec.nodes
        g.work, g.restarts = 0.0, 0

    def _interrupt(self, g: _Gang, t: float, o: Outage) -> None:
        b, spec = self.books, g.spec
        b.interruptions[o.attribution] += 1
        b.by_cause[o.cause] += 1
        interval = spec.checkpoint_interval.total_seconds() if spec.checkpoint_interval else None
        rolled = g.work if interval is None else g.work - math.floor(g.work / interval) * interval
        b.lose(rolled * spec.nodes, o.cause, "rework since the last checkpoint")
        g.work -= rolled
        if o.attribution == "platform":
            g.restarts += 1
        if interval is None:
            self._new_job(g, o.attribution)
        elif o.attribution == "platform" and spec.max_restarts is not None and g.restarts > spec.max_restarts:
            self._new_job(g, "platform")
        g.outage, g.stopped_at = o, t
        self._regroup(g, t)

    def _regroup(self, g: _Gang, t: float) -> None:
        """Swap spares in for members that are out (non-elastic), then restart or wait."""
        if not g.spec.elastic:
            for i in [i for i, m in enumerate(g.members) if m in self.down]:
                spare = next((s for s in sorted(self.spares) if s not in self.down), None)
                if spare is None:
                    break
                m = g.members[i]
                g.members[i] = spare
                self.owner[spare], self.owner[m] = self.owner[m], -1
                self.spares.discard(spare)
                self.spares.add(m)
        if g.spec.elastic or self._up(g) == g.spec.nodes:
            g.state, g.until = "restart", max(t, g.stopped_at + self.detect) + g.spec.restart_cost.total_seconds()
        else:
            g.state = "wait"
            g.wait_deadline = t + g.spec.max_wait.total_seconds() if g.spec.max_wait else math.inf

    def _fire_timer(self, g: _Gang, t: float) -> None:
        if g.state == "restart":
            g.state, g.stopped_at = "run", t
        elif g.state == "wait":  # waited past max_wait: the job fails; the next one waits without a limit
            self._new_job(g, "platform")
            g.wait_deadline = math.inf
        elif g.work >= g.spec.length.total_seconds() - 1e-6:
            g.work = g.spec.length.total_seconds()
            self._new_job(g, None)
            g.stopped_at = t

    def node_down(self, t: float, o: Outage) -> None:
        self.down[o.slot] = o
        i = self.owner.get(o.slot)
        if i is not None and i >= 0 and self.gangs[i].state != "wait":
            self._interrupt(self.gangs[i], t, o)

    def node_up(self, t: float, slot: int) -> None:
        self.down.pop(slot, None)
        for g in self.gangs:
            if g.state == "wait" and (slot in g.members or self.owner.get(slot) == -1):
                self._regroup(g, t)

    def run(self, outages: list[Outage]) -> JobOutcome:
        events = sorted([(o.start_s, 1, o.slot, o) for o in outages if o.start_s < self.end]
                        + [(o.end_s, 0, o.slot, None) for o in outages if o.end_s < self.end],
                        key=lambda e: (e[0], e[1], e[2]))
        t, k = 0.0, 0
        while True:
            t_next = min([events[k][0] if k < len(events) else self.end, self.end,
                          *(self._timer(g) for g in self.gangs)])
            t_next = max(t_next, t)
            for g in self.gangs:
                self._advance(g, t, t_next)
            t = t_next
            if t >= self.end:
                break
            for g in self.gangs:
                if self._timer(g) <= t:
                    self._fire_timer(g, t)
            while k < len(events) and events[k][0] <= t:
                _, is_down, slot, o = events[k]
                k += 1
                if is_down:
                    self.node_down(t, o)
                else:
                    self.node_up(t, slot)
        return self._outcome(outages)

    def _outcome(self, outages: list[Outage]) -> JobOutcome:
        b = self.books
        kept = b.kept + sum(g.work * g.spec.nodes for g in self.gangs)
        gang_s = sum(g.spec.nodes * self.end for g in self.gangs)
        node_days = gang_s / 86400.0
        n_int = sum(b.interruptions.values())
        hours = lambda c: {k: round(v / 3600.0, 3) for k, v in sorted(c.items())}  # noqa: E731
        return JobOutcome(
            workload=self.w.name, jobs_ended=b.ended, jobs_completed=b.completed,
            jobs_failed_platform=b.failed["platform"], jobs_failed_application=b.failed["application"],
            job_success_rate=round(1 - b.failed["platform"] / b.ended, 5) if b.ended else None,
            ettr=round(kept / b.held, 5) if b.held else None,
            interruptions=n_int, interruptions_by_attribution=dict(sorted(b.interruptions.items())),
            interruptions_by_cause=dict(sorted(b.by_cause.items())),
            interruptions_per_1000_node_days=round(n_int / node_days * 1000, 3) if node_days else 0.0,
            goodput_lost_node_h=round(sum(b.lost_cause.values()) / 3600.0, 3),
            goodput_lost_by_cause=hours(b.lost_cause), goodput_lost_by_phase=hours(b.lost_phase))


def simulate_jobs(workload: WorkloadModel, outages: list[Outage], nodes: int, days: float,
                  detect_s: float) -> JobOutcome:
    return JobRun(workload, nodes, days, detect_s).run(outages)
