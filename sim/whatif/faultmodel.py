"""The fault model of a what-if run (README "Fleet what-if"), and the faults it draws for a fleet.

The draws depend on the model, the fleet and the seed only, never on the policy: every policy of
one run meets the same faults at the same times (common random numbers make the comparison fair).
"""

from __future__ import annotations

import math
import random
from datetime import timedelta
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from policies.durations import Duration
from policies.findings import FindingKind
from policies.loader import describe_validation_error
from policies.terms import Rung

BUILTIN_MODELS = Path(__file__).resolve().parents[1] / "faultmodels"
NODE_WIDE = {FindingKind.NIC_PORTS_DOWN}  # findings that name no GPU


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FaultFinding(_Strict):
    kind: FindingKind = Field(description="What the health agent reports for this class.")
    xid: int | None = Field(default=None, ge=0, description="The Xid, for kind xid.")

    @model_validator(mode="after")
    def _xid_given(self) -> FaultFinding:
        if (self.kind is FindingKind.XID) != (self.xid is not None):
            raise ValueError("an xid is given exactly when kind is xid")
        return self


class Recurrence(_Strict):
    probability: float = Field(default=0.0, ge=0, le=1, description="Chance the fault comes back after a cure short of replacement.")
    window: Duration = Field(default=timedelta(days=7), description="It comes back uniformly within this long after the node returns.")


class FaultClass(_Strict):
    rate: float = Field(gt=0, description="Faults per 1,000 node-days.")
    finding: FaultFinding
    cured_by: dict[Rung, float] = Field(description="Probability that each rung is the lowest that cures it (sums to 1).")
    recurrence: Recurrence = Field(default_factory=Recurrence)

    @model_validator(mode="after")
    def _sums_to_one(self) -> FaultClass:
        total = sum(self.cured_by.values())
        if not self.cured_by or abs(total - 1.0) > 1e-6 or any(p < 0 for p in self.cured_by.values()):
            raise ValueError(f"cured_by: probabilities must be at least 0 and sum to 1 (they sum to {total:g})")
        return self


GRID_S = 10.0  # the what-if fleet's clock reads this grid (fleet.WhatIfFleet.now); model times are on it


def _on_grid(d: timedelta) -> timedelta:
    """Whole multiples of GRID_S."""
    return timedelta(seconds=round(d.total_seconds() / GRID_S) * GRID_S)


class Durations(_Strict):
    """How long each action takes in the fleet. The test server holds its clock while an activity
    runs, so kill, reset and validation are added to the node's time out of service; a reboot and a
    replacement take their time in the workflows' own clock (the report from a new boot, the new node)."""

    detect: Duration = Field(default=timedelta(minutes=1), description="From the fault to the agent's report.")
    kill: Duration = Field(default=timedelta(seconds=30), description="Stopping a node's GPU processes.")
    reset: Duration = Field(default=timedelta(minutes=2), description="One GPU reset.")
    reboot: Duration = Field(default=timedelta(minutes=10), description="From the reboot call to the agent's first report.")
    replacement: Duration = Field(default=timedelta(hours=4), description="From terminate until a new node is Ready.")
    validation: Duration = Field(default=timedelta(minutes=5), description="One validation run (DCGM diag).")

    @field_validator("*")
    @classmethod
    def _grid(cls, d: timedelta) -> timedelta:
        return _on_grid(d)


class FaultModel(_Strict):
    name: str
    utilization: float = Field(default=1.0, ge=0, le=1, description="Share of nodes running a job at any time.")
    durations: Durations = Field(default_factory=Durations)
    classes: dict[str, FaultClass] = Field(min_length=1, description="Fault classes by name.")


class FaultModelError(ValueError):
    def __init__(self, source: str, problems: list[str]):
        self.source, self.problems = source, problems
        super().__init__(f"{source}: " + "; ".join(problems))


def load_yaml_model(path: str | Path, shipped: Path, cls: type, error: type):
    """A YAML file (or the name of a shipped one under `shipped`) as `cls`; `error(source, problems)`
    names each bad key. The fault model's loader, and the workload's (workload.py)."""
    p = Path(path)
    if not p.exists() and (shipped / f"{path}.yaml").exists():
        p = shipped / f"{path}.yaml"
    try:
        data = yaml.safe_load(p.read_text())
    except OSError as err:
        raise error(str(p), [f"(file): cannot read: {err.strerror}"]) from None
    except yaml.YAMLError as err:
        raise error(str(p), [f"(file): not valid YAML: {err}"]) from None
    try:
        return cls.model_validate(data)
    except ValidationError as err:
        raise error(str(p), describe_validation_error(err)) from None


def load_fault_model(path: str | Path) -> FaultModel:
    """A fault model file, or the name of a shipped one (sim/faultmodels/NAME.yaml)."""
    return load_yaml_model(path, BUILTIN_MODELS, FaultModel, FaultModelError)


class FaultDraw(BaseModel):
    """One fault: when, where, what, what cures it, and whether it comes back."""

    id: int
    at_s: float
    slot: int
    fault_class: str
    gpu: int
    cured_by: Rung
    recurs_after_s: float | None = None  # after the node returns to service, if it comes back


def draw_faults(model: FaultModel, nodes: int, days: float, seed: int, gpus: int = 8) -> list[FaultDraw]:
    """Poisson arrivals per class over the fleet, in time order, at whole minutes."""
    rng = random.Random(seed)
    span = days * 86400.0
    out: list[FaultDraw] = []
    for name in sorted(model.classes):
        fc = model.classes[name]
        per_s = fc.rate / 1000.0 * nodes / 86400.0
        t = rng.expovariate(per_s) if per_s > 0 else math.inf
        rungs = sorted(fc.cured_by, key=lambda r: r.rank)
        while t < span:
            cured_by = rng.choices(rungs, weights=[fc.cured_by[r] for r in rungs])[0]
            recurs = rng.random() < fc.recurrence.probability
            delay = rng.uniform(0, fc.recurrence.window.total_seconds())
            out.append(FaultDraw(id=0, at_s=float(int(t) // 60 * 60), slot=rng.randrange(nodes), fault_class=name,
                                 gpu=rng.randrange(gpus), cured_by=cured_by,
                                 recurs_after_s=float(int(delay) // 60 * 60) if recurs else None))
            t += rng.expovariate(per_s)
    out.sort(key=lambda f: (f.at_s, f.slot, f.fault_class))
    return [f.model_copy(update={"id": i}) for i, f in enumerate(out)]


def mass_failure(model: FaultModel, nodes: int, failing: int, fault_class: str, *, at_s: float = 600.0,
                 seed: int = 0, gpus: int = 8) -> list[FaultDraw]:
    """`failing` distinct nodes struck by one class at one instant (a bad driver or firmware push, a
    cooling loop lost): what the guard's max_unhealthy, storm breaker and canaries are for. Each is
    cured by a rung drawn from the class's `cured_by`; none recurs."""
    if fault_class not in model.classes:
        raise FaultModelError(model.name, [f"classes.{fault_class}: no such class (one of {', '.join(sorted(model.classes))})"])
    if not 0 < failing <= nodes:
        raise ValueError(f"failing must be between 1 and the fleet's {nodes} nodes, not {failing}")
    rng, fc = random.Random(seed), model.classes[fault_class]
    rungs = sorted(fc.cured_by, key=lambda r: r.rank)
    return [FaultDraw(id=i, at_s=float(int(at_s) // 60 * 60), slot=slot, fault_class=fault_class, gpu=rng.randrange(gpus),
                      cured_by=rng.choices(rungs, weights=[fc.cured_by[r] for r in rungs])[0])
            for i, slot in enumerate(sorted(rng.sample(range(nodes), failing)))]
