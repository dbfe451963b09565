"""What a what-if run prints: the table, the progress bar, and the plot (matplotlib)."""

from __future__ import annotations

import sys

from sim.whatif.summary import PolicyOutcome

ROWS = [
    ("availability", lambda o: f"{o.availability * 100:.3f}%"),
    ("node-hours lost", lambda o: f"{o.node_hours_lost:,.1f}"),
    ("episodes", lambda o: ", ".join(f"{k} {v}" for k, v in o.episodes.items()) or "none"),
    ("kills / resets / reboots / replacements", lambda o: f"{o.kills} / {o.resets} / {o.reboots} / {o.replacements}"),
    ("nodes denylisted", lambda o: str(o.denylisted_nodes)),
    ("jobs interrupted", lambda o: str(o.jobs_interrupted)),
    ("p95 time to return", lambda o: "-" if o.p95_return_h is None else f"{o.p95_return_h:.2f} h"),
    ("mean time to repair", lambda o: "-" if o.mttr_h is None else f"{o.mttr_h:.2f} h"),
    ("repaired nodes failing again (7 d / 30 d)", lambda o: f"{o.failed_again_7d} / {o.failed_again_30d}"),
    ("faults (dropped)", lambda o: f"{o.faults} ({o.faults_dropped})"),
    ("most quarantined at once (max_unhealthy)",
     lambda o: f"{o.peak_quarantined} ({'-' if o.max_unhealthy is None else o.max_unhealthy})"),
    ("storm breaker trips", lambda o: str(o.guard_trips)),
    ("nodes out at the end", lambda o: str(o.down_at_end)),
    ("wall clock", lambda o: f"{o.wall_s:.0f} s"),
]


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x * 100:.2f}%"


def _top(d: dict[str, float], n: int = 3) -> str:
    return ", ".join(f"{k} {v:,.0f}" for k, v in sorted(d.items(), key=lambda kv: -kv[1])[:n]) or "none"


JOB_ROWS = [
    ("job success", lambda j: f"{_pct(j.job_success_rate)} ({j.jobs_ended - j.jobs_failed_platform}/{j.jobs_ended})"),
    ("ETTR", lambda j: _pct(j.ettr)),
    ("job interruptions (platform / application)", lambda j: " / ".join(
        str(j.interruptions_by_attribution.get(a, 0)) for a in ("platform", "application"))),
    ("interruptions per 1,000 node-days", lambda j: f"{j.interruptions_per_1000_node_days:.2f}"),
    ("goodput lost, node-hours", lambda j: f"{j.goodput_lost_node_h:,.1f}"),
    ("goodput lost, top causes", lambda j: _top(j.goodput_lost_by_cause)),
    ("goodput lost, top phases", lambda j: _top(j.goodput_lost_by_phase)),
]


def outcome_table(outcomes: list[PolicyOutcome], markdown: bool = False) -> str:
    head = ["", *(o.policy for o in outcomes)]
    rows = [[name, *(f(o) for o in outcomes)] for name, f in ROWS]
    for i in range(min((len(o.jobs) for o in outcomes), default=0)):
        tag = f" ({outcomes[0].jobs[i].workload})" if len(outcomes[0].jobs) > 1 else ""
        rows += [[name + tag, *(f(o.jobs[i]) for o in outcomes)] for name, f in JOB_ROWS]
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        return "\n".join([*lines, *("| " + " | ".join(r) + " |" for r in rows)])
    from workers.render import table

    return table(head, rows)


class ProgressBar:
    """One bar per policy on a terminal (rich), redrawn in place; nothing when piped."""

    def __init__(self, policies: list[str], out=None):
        self.out = out or sys.stderr
        self.policies = policies
        self.tty = self.out.isatty()
        self.bars = None

    def __call__(self, fractions: list[float]) -> None:
        if not self.tty:
            return
        if self.bars is None:
            from rich.console import Console
            from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn

            self.bars = Progress(TextColumn("  {task.description:<24}"), BarColumn(), TaskProgressColumn(),
                                 console=Console(file=self.out), auto_refresh=False)
            self.tasks = [self.bars.add_task(name[:24], total=1.0) for name in self.policies]
            self.bars.start()
        for task, f in zip(self.tasks, fractions, strict=True):
            self.bars.update(task, completed=f)
        self.bars.refresh()

    def close(self) -> None:
        if self.bars is not None:
            self.bars.stop()
            self.bars = None


def plot(outcomes: list[PolicyOutcome], path: str) -> None:
    """Availability over time (daily mean of the hourly figure) and node-hours lost by cause."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    jobs = all(o.jobs for o in outcomes)
    fig, axes = plt.subplots(1, 3 if jobs else 2, figsize=(19 if jobs else 13, 4.5))
    ax1, ax2 = axes[0], axes[1]
    for o in outcomes:
        hours = o.availability_by_hour
        days = [sum(hours[i:i + 24]) / len(hours[i:i + 24]) * 100 for i in range(0, len(hours), 24)]
        ax1.plot([d + 1 for d in range(len(days))], days, marker=".", label=o.policy)
    ax1.set(title="Availability, daily", xlabel="day", ylabel="node-hours in service (%)")
    ax1.legend()
    causes = sorted({c for o in outcomes for c in o.lost_by_cause})
    bottom = [0.0] * len(outcomes)
    names = [o.policy for o in outcomes]
    for cause in causes:
        vals = [o.lost_by_cause.get(cause, 0.0) for o in outcomes]
        ax2.bar(names, vals, bottom=bottom, label=cause)
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    ax2.set(title="Node-hours lost, by cause", ylabel="node-hours")
    ax2.legend(fontsize="small")
    if jobs:
        job_panel(axes[2], outcomes)
    fig.suptitle(f"gpuheal whatif: {outcomes[0].nodes} nodes, {outcomes[0].days:g} days")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def job_panel(ax, outcomes: list[PolicyOutcome]) -> None:
    """Job success and ETTR per policy, a pair of bars for each workload."""
    workloads = [j.workload for j in outcomes[0].jobs]
    bars = [(w, what, key) for w in workloads for what, key in (("success", "job_success_rate"), ("ETTR", "ettr"))]
    width = 0.8 / len(bars)
    values = []
    for k, (w, what, key) in enumerate(bars):
        ys = [(getattr(next(j for j in o.jobs if j.workload == w), key) or 0) * 100 for o in outcomes]
        xs = [i - 0.4 + width * (k + 0.5) for i in range(len(outcomes))]
        ax.bar(xs, ys, width=width, label=f"{what}, {w}" if len(workloads) > 1 else what,
               hatch="//" if what == "ETTR" else None)
        for x, y in zip(xs, ys, strict=True):
            ax.text(x, y, f"{y:.1f}", ha="center", va="bottom", fontsize="x-small")
        values += ys
    ax.set_xticks(range(len(outcomes)), [o.policy for o in outcomes], fontsize="small")
    ax.set(title="Jobs: success and ETTR", ylabel="%", ylim=(max(0, min(values) - 5), 101))
    ax.legend(fontsize="x-small", loc="lower right")
