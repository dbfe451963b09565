"""`gpuheal whatif --from-ledger FILE`: the faults production recorded, replayed against candidate
policies. FILE is `gpuheal outcomes --json`'s document (its `episodes_list`).

Each recorded episode is one fault at its start, on its node, with the finding that set its first
rung. What cured it is what production saw: the rung that returned the node, `replace` for a
replaced one, and `replace` too where nobody knows (an episode that ended quarantined, failed or
waiting): a candidate policy cannot cure on a cheaper rung than the one production proved.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from datetime import datetime
from pathlib import Path

from policies.findings import Finding
from policies.terms import Rung
from sim.whatif.faultmodel import NODE_WIDE, Durations, FaultClass, FaultDraw, FaultFinding, FaultModel


class LedgerReplayError(ValueError):
    pass


def _cured_by(ep: dict) -> Rung:
    if ep.get("outcome") == "returned" and ep.get("rungs"):
        return Rung(ep["rungs"][-1])
    return Rung.REPLACE


def _class_name(f: Finding) -> str:
    return f"xid_{f.xid}" if f.xid is not None else f.kind.value


def load_ledger_faults(path: str | Path, durations: Durations | None = None,
                       min_nodes: int = 1) -> tuple[FaultModel, list[FaultDraw], int, float, list[str]]:
    """The model (classes from the findings seen), the faults, the fleet size, the days, and notes."""
    try:
        doc = json.loads(Path(path).read_text())
        episodes = doc["episodes_list"]
    except OSError as err:
        raise LedgerReplayError(f"{path}: cannot read: {err.strerror}") from None
    except (ValueError, KeyError, TypeError):
        raise LedgerReplayError(f"{path}: not a `gpuheal outcomes --json` export (no episodes_list)") from None
    usable = [e for e in episodes if e.get("finding")]
    notes = [f"{len(episodes) - len(usable)} episodes recorded no finding (written before the outcome ledger): "
             "left out"] if len(usable) < len(episodes) else []
    if not usable:
        raise LedgerReplayError(f"{path}: no episode with a recorded finding to replay")
    starts = [datetime.fromisoformat(e["started_at"]) for e in usable]
    t0 = min(starts)
    nodes = sorted({e["node"] for e in usable})
    classes: dict[str, Counter] = {}
    findings: dict[str, Finding] = {}
    faults = []
    for e, at in sorted(zip(usable, starts, strict=True), key=lambda p: p[1]):
        f = Finding.model_validate(e["finding"])
        name = _class_name(f)
        findings[name] = f
        cured = _cured_by(e)
        classes.setdefault(name, Counter())[cured] += 1
        faults.append(FaultDraw(id=len(faults), at_s=float(int((at - t0).total_seconds()) // 60 * 60),
                                slot=nodes.index(e["node"]), fault_class=name,
                                gpu=0 if f.kind in NODE_WIDE or f.gpu_index is None else f.gpu_index, cured_by=cured))
    days = max(1.0, math.ceil((max(starts) - t0).total_seconds() / 86400.0 + 1))
    fleet = max(min_nodes, len(nodes))
    model = FaultModel(name=f"ledger:{Path(path).name}", durations=durations or Durations(), classes={
        name: FaultClass(rate=max(1e-6, sum(cures.values()) / (fleet * days) * 1000),
                         finding=FaultFinding(kind=findings[name].kind, xid=findings[name].xid),
                         cured_by={r: n / sum(cures.values()) for r, n in cures.items()})
        for name, cures in sorted(classes.items())})
    return model, faults, fleet, days, notes
