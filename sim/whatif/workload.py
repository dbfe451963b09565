"""The workload model of a what-if run (README "Jobs in the what-if"): which jobs run on the fleet,
how they checkpoint and restart, and the spare nodes they may swap in.

Placement is fixed by the model alone: each job stream takes the next `nodes` slots, the spares
the slots after them, so every policy of a run sees the same jobs on the same nodes.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator

from policies.durations import Duration
from sim.whatif.faultmodel import FaultModelError, load_yaml_model

BUILTIN_WORKLOADS = Path(__file__).resolve().parents[1] / "workloads"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class JobSpec(_Strict):
    name: str
    count: int = Field(default=1, ge=1, description="Gangs of this job, each running one job after another.")
    nodes: int = Field(ge=1, description="Gang size: nodes one job needs at once.")
    length: Duration = Field(description="Training time one job needs (its work), without faults.")
    checkpoint_interval: Duration | None = Field(
        default=None, description="Running time between checkpoints; none: a fault loses the whole job.")
    checkpoint_cost: Duration = Field(default=timedelta(0), description="The job's pause to write one checkpoint.")
    restart_cost: Duration = Field(default=timedelta(minutes=5), description="From the gang whole again to training.")
    elastic: bool = Field(default=False, description="Trains on with the nodes it has while one is out (no wait).")
    max_restarts: int | None = Field(
        default=None, ge=0, description="Platform interruptions a job survives; one more fails it (none: no limit).")
    max_wait: Duration | None = Field(
        default=None, description="A non-elastic job waiting longer than this for its gang fails (none: waits).")

    @model_validator(mode="after")
    def _checkpoint_cost_fits(self) -> JobSpec:
        if self.checkpoint_interval is not None and self.checkpoint_interval.total_seconds() <= 0:
            raise ValueError("checkpoint_interval must be longer than 0 (leave it out for no checkpoints)")
        if self.length.total_seconds() <= 0:
            raise ValueError("length must be longer than 0")
        return self

    @property
    def efficiency(self) -> float:
        """Share of running time that trains (the rest writes checkpoints)."""
        if self.checkpoint_interval is None:
            return 1.0
        i = self.checkpoint_interval.total_seconds()
        return i / (i + self.checkpoint_cost.total_seconds())


class WorkloadModel(_Strict):
    name: str
    jobs: list[JobSpec] = Field(min_length=1)
    spare_nodes: int = Field(default=0, ge=0, description="Idle nodes a non-elastic job swaps in for a failed one.")

    @property
    def nodes_needed(self) -> int:
        return sum(j.count * j.nodes for j in self.jobs) + self.spare_nodes


class WorkloadError(FaultModelError):
    pass


def load_workload(path: str | Path) -> WorkloadModel:
    """A workload file, or the name of a shipped one (sim/workloads/NAME.yaml)."""
    return load_yaml_model(path, BUILTIN_WORKLOADS, WorkloadModel, WorkloadError)
