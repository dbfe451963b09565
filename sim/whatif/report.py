"""What a what-if run prints: the table, the progress bar, and the plot (matplotlib)."""

from __future__ import annotations

import sys

from sim.whatif.engine import PolicyOutcome

ROWS = [
    ("availability", lambda o: f"{o.availability * 100:.3f}%"),
    ("node-hours lost", lambda o: f"{o.node_hours_lost:,.1f}"),
    ("episodes", lambda o: ", ".join(f"{k} {v}" for k, v in o.episodes.items()) or "none"),
    ("kills / resets / reboots / replacements", lambda o: f"{o.kills} / {o.resets} / {o.reboots} / {o.replacements}"),
    ("nodes denylisted", lambda o: str(o.denylisted_nodes)),
    ("jobs interrupted", lambda o: str(o.jobs_interrupted)),
    ("p95 time to return", lambda o: "-" if o.p95_return_h is None else f"{o.p95_return_h:.2f} h"),
    ("faults (dropped)", lambda o: f"{o.faults} ({o.faults_dropped})"),
    ("wall clock", lambda o: f"{o.wall_s:.0f} s"),
]


def outcome_table(outcomes: list[PolicyOutcome], markdown: bool = False) -> str:
    head = ["", *(o.policy for o in outcomes)]
    rows = [[name, *(f(o) for o in outcomes)] for name, f in ROWS]
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        return "\n".join([*lines, *("| " + " | ".join(r) + " |" for r in rows)])
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    fmt = lambda r: "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()  # noqa: E731
    return "\n".join([fmt(head), "  ".join("-" * w for w in widths), *(fmt(r) for r in rows)])


class ProgressBar:
    """One bar per policy on a terminal, redrawn in place; nothing when piped."""

    def __init__(self, policies: list[str], out=None):
        self.out = out or sys.stderr
        self.policies = policies
        self.tty = self.out.isatty()
        self.drawn = False

    def __call__(self, fractions: list[float]) -> None:
        if not self.tty:
            return
        lines = []
        for name, f in zip(self.policies, fractions, strict=True):
            n = int(f * 30)
            lines.append(f"\x1b[2K  {name[:24]:<24} [{'#' * n}{'.' * (30 - n)}] {f * 100:5.1f}%\n")
        up = f"\x1b[{len(lines)}F" if self.drawn else ""
        self.out.write(up + "".join(lines))
        self.out.flush()
        self.drawn = True


def plot(outcomes: list[PolicyOutcome], path: str) -> None:
    """Availability over time (daily mean of the hourly figure) and node-hours lost by cause."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.5))
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
    fig.suptitle(f"gpuheal whatif: {outcomes[0].nodes} nodes, {outcomes[0].days:g} days")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
