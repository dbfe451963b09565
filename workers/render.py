"""How a command's result is shown: a table by default (kubectl's habit), `-o wide` with more
columns, `-o json` (a list is a JSON array, an object an object) and `-o yaml` the same document.

Tables are drawn with rich, the one way the CLI draws a table: plain and borderless like kubectl's,
colour only on a terminal, never cut to a width when piped.
"""

from __future__ import annotations

import io
import json
import sys

import yaml
from rich.console import Console
from rich.table import Table

from api.names import node_in_workflow_id

OUTPUTS = ("table", "wide", "json", "yaml")
MACHINE = {"format": "json"}  # what --json prints in this process: set once by the CLI's main from -o


def document(doc, output: str) -> str:
    """The machine-readable forms: JSON or YAML of the same document."""
    if output == "yaml":
        return yaml.safe_dump(json.loads(json.dumps(doc, default=str)), sort_keys=False).rstrip("\n")
    return json.dumps(doc, indent=1, default=str)


def table(columns: list[str], rows: list[list]) -> str:
    """A kubectl-style table: upper-case headers, no borders, two spaces between columns."""
    tty = sys.stdout.isatty()
    # Never cut to the terminal width (kubectl lets a long row wrap instead).
    console = Console(file=io.StringIO(), force_terminal=tty, no_color=not tty, width=10_000,
                      highlight=False)
    t = Table(*[c.upper() for c in columns], box=None, pad_edge=False, padding=(0, 2, 0, 0),
              header_style="bold" if tty else "", show_edge=False)
    for row in rows:
        t.add_row(*["<none>" if v is None else str(v) for v in row])
    with console.capture() as cap:
        console.print(t)
    return "\n".join(line.rstrip() for line in cap.get().splitlines())


def _when(at: str | None) -> str:
    return (at or "")[:19].replace("T", " ")


def _steps(steps: list[dict], wide: bool) -> str:
    cols = ["at", "step", "ok", "summary"] + (["detail"] if wide else [])
    rows = [[_when(s["at"]), s["step"], {True: "yes", False: "NO", None: "-"}[s["ok"]], s["summary"]]
            + ([s.get("detail")] if wide else []) for s in steps]
    return table(cols, rows) if rows else "  (no steps yet)"


def _episodes(doc: list[dict], wide: bool) -> str:
    if not doc:
        return "No remediation episodes are running."
    cols = ["node", "stage", "fault", "next-rung", "paused", "approval"] + (["note"] if wide else [])
    rows = [[r["node"], r["stage"] or "?", r["fault_class"], r["next_rung"], _yes(r["paused"]), r["awaiting_approval"]]
            + ([r.get("unreachable")] if wide else []) for r in doc]
    out = table(cols, rows)
    unreachable = [r for r in doc if r.get("unreachable")]
    if unreachable and not wide:
        out += f"\n{len(unreachable)} episode(s) did not answer (-o wide says why)"
    return out


def _yes(v) -> str | None:
    return None if v is None else ("yes" if v else "no")


def _episode(doc: dict, wide: bool) -> str:
    triage = doc.get("triage") or {}
    fields = [("Node", doc["node"]), ("Cluster", doc.get("cluster")), ("Stage", doc["stage"]),
              ("Fault", triage.get("fault_class")), ("Attribution", triage.get("attribution")),
              ("Next rung", doc.get("next_rung")), ("Rungs tried", ", ".join(doc.get("rungs_tried") or []) or None),
              ("Outcome", doc.get("outcome")), ("Reason", doc.get("outcome_reason")), ("Waiting", doc.get("waiting")),
              ("Lease", "held" if doc.get("lease_held") else ("requested" if doc.get("lease_requested") else "none")),
              ("Paused", f"yes: {doc.get('pause_reason')}" if doc.get("paused") else "no"),
              ("Approval", doc.get("awaiting_approval")), ("Validations", doc.get("validations")),
              ("Policy", f"{doc.get('policy_name')} ({(doc.get('policy_sha256') or '')[:12]})"),
              ("Rejected reports", doc.get("rejected_total"))]
    head = "\n".join(f"{k + ':':<18}{'<none>' if v in (None, '') else v}" for k, v in fields)
    return f"{head}\nSteps:\n{_steps(doc.get('actions') or [], wide)}"


def _history(doc: list[dict], wide: bool) -> str:
    parts = []
    for e in doc:
        rungs = ",".join(e.get("rungs") or []) or "-"
        parts.append(f"Episode {e['run_id']}  started {_when(e['started'])}  {e['status'].lower()}  "
                     f"outcome {e.get('outcome') or '-'}  rungs {rungs}\n  {e.get('reason') or ''}".rstrip()
                     + "\n" + _steps(e.get("steps") or [], wide))
    return "\n\n".join(parts)


def _guard(doc: dict, wide: bool) -> str:
    head = [f"Cluster:          {doc['cluster']}",
            f"Budget:           {doc.get('budget')} lease(s) now, limit {doc['limit']}, {len(doc['holders'])} held",
            f"Unhealthy:        {len(doc['unhealthy'])} of at most {doc.get('max_unhealthy')} (fleet {doc['fleet_size']})"
            + (f": {_some(doc['unhealthy'], wide)}" if doc["unhealthy"] else ""),
            f"Gate:             {doc.get('gate') or '<none>'}",
            f"Paused:           {'yes: ' + doc['pause_reason'] if doc['paused'] else 'no'}",
            f"Storm breaker:    {'OPEN: ' + doc['breaker_reason'] if doc['breaker_open'] else 'closed'}"
            + (f" (opened {_when(doc['breaker_opened_at'])})" if doc["breaker_open"] and doc.get("breaker_opened_at") else "")
            + f"; {doc.get('trips', 0)} trip(s)",
            f"Granted:          {doc.get('grants', 0)} lease(s) since this guard started"]
    if doc.get("alarm"):
        head.append(f"Alarm:            {doc['alarm']}")
    if room := doc.get("room_reserved"):
        head.append(f"Reserved ahead:   {sum(room.values())} quarantine slot(s), counted as unhealthy: "
                    + ", ".join(f"{n} for {c}" for c, n in sorted(room.items())))
    holders = table(["node", "since", "canary"] + (["holder"] if wide else []),
                    [[h["node"], _when(h["since"]), _yes(h.get("canary"))] + ([h["holder"]] if wide else [])
                     for h in doc["holders"]]) if doc["holders"] else "  (none)"
    waiting = table(["node", "since", "reason"] + (["holder"] if wide else []),
                    [[w["node"], _when(w["since"]), w.get("reason")] + ([w["holder"]] if wide else [])
                     for w in doc.get("waiting") or []]) if doc.get("waiting") else "  (none)"
    return "\n".join(head) + f"\nHolders:\n{holders}\nWaiting:\n{waiting}"


def _some(names: list[str], wide: bool, shown: int = 8) -> str:
    """A list in one line: all of it with -o wide, else the first few and how many more."""
    names = [node_in_workflow_id(n, "remediate") or n for n in names]
    if wide or len(names) <= shown:
        return ", ".join(names)
    return ", ".join(names[:shown]) + f" and {len(names) - shown} more"


def _fields(doc: dict, wide: bool) -> str:
    return "\n".join(f"{k}: {v}" for k, v in doc.items())


# command -> how its result reads as a table
VIEWS = {"status": lambda d, w: _episodes(d, w) if isinstance(d, list) else _episode(d, w), "history": _history,
         "guard": _guard, "pause": _guard, "resume": _guard, "approve": _episode, "replace": _episode}


def human(command: str, doc, wide: bool = False) -> str:
    """The table view of one command's result; any command without a view prints its fields."""
    return VIEWS.get(command, _fields)(doc, wide)
