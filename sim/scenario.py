"""The scenario format (DESIGN.md section 8): a simulated fleet and the faults injected into it."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from policies.durations import Duration
from policies.loader import PolicyError, describe_validation_error, load_policy
from policies.model import Policy
from policies.terms import Generation

FaultKind = Literal["xid", "ecc_dbe", "row_remap_failure", "gpu_lost", "pcie_degraded", "nvlink_down",
                    "nic_ports_down", "thermal", "nvml_missing",
                    # seen only under load (sim/load_device.py); `suspect` on the fault says who notices
                    "corrupt_under_load", "hbm_cells", "slow_gpu", "hw_slowdown_under_load", "xid_under_load",
                    "none"]  # none: no fault at all (a healthy node someone suspects)
Cure = Literal["kill", "reset", "reboot", "replace", "none"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Job(_Strict):
    name: str
    nodes: list[str] = Field(min_length=1)
    min_available: int | str = 1
    reschedule: Duration = Field(default=timedelta(minutes=5),
                                 description="How long an evicted pod's replacement takes to be Ready on another node.")


class Fleet(_Strict):
    nodes: int = Field(default=8, ge=1, le=2000)
    gpus_per_node: int = Field(default=8, ge=1, le=64)
    generation: Generation = Generation.HOPPER
    jobs: list[Job] = Field(default_factory=list)

    def names(self) -> list[str]:
        return [f"gpu-node-{i}" for i in range(self.nodes)]


class Fault(_Strict):
    node: str
    at: Duration = Field(default=timedelta(0))
    kind: FaultKind
    xid: int | None = None
    gpu: int = Field(default=0, ge=0)
    cured_by: Cure = "reboot"
    recurs: int = Field(default=0, ge=0, le=10)
    suspect: str | None = Field(default=None, max_length=500, description=(
        "Who noticed and why (a job's slow rank, loss spikes): a suspect report sent with the fault, as "
        "`gpuheal report NODE --suspect WHY` does. Faults seen only under load need one to be found."))

    @model_validator(mode="after")
    def _xid_given(self) -> Fault:
        if self.kind == "xid" and self.xid is None:
            raise ValueError("kind xid needs an xid")
        if self.kind == "none" and self.suspect is None:
            raise ValueError("kind none needs a suspect report (nothing else would happen)")
        return self


EventKind = Literal["agent_stop", "agent_start", "report", "operator", "condition_set", "condition_clear",
                    "controller_restart"]
Command = Literal["pause", "resume", "approve", "skip", "cancel"]


class Event(_Strict):
    """Something besides the faults, at a scenario time: the agent stops or starts again, another
    sender reports (`source`, optional fault), an operator acts, a node condition is set or
    cleared (what the condition watcher reports), the controller restarts."""

    at: Duration = Field(default=timedelta(0))
    kind: EventKind
    node: str | None = None
    command: Command | None = None
    rung: Literal["kill", "reset", "reboot", "replace"] | None = Field(default=None, description="For skip.")
    source: str = Field(default="manual", description="For report: who sends it (manual, watcher, ...).")
    boot_id: str | None = Field(default=None, description="For report: the boot id it claims (default: the node's own).")
    fault: FaultKind | None = Field(default=None, description="For report: the fault it claims; none: healthy.")
    xid: int | None = None
    gpu: int = Field(default=0, ge=0)
    condition: str = Field(default="GpuDriverReady", description="For condition_set/clear: the condition's type.")

    @model_validator(mode="after")
    def _complete(self) -> Event:
        if self.kind != "controller_restart" and self.node is None:
            raise ValueError(f"{self.kind} needs a node")
        if self.kind == "operator" and self.command is None:
            raise ValueError("operator needs a command (pause, resume, approve, skip, cancel)")
        if self.command == "skip" and self.rung is None:
            raise ValueError("skip needs a rung")
        if self.fault == "xid" and self.xid is None:
            raise ValueError("fault xid needs an xid")
        return self


DEFAULT_DEADLINE = timedelta(days=7)


class Scenario(_Strict):
    name: str
    time_scale: float = Field(default=1.0, gt=0, le=1.0)
    policy: str = "default"
    budget: int | None = Field(default=None, ge=1)
    deadline: Duration | None = Field(
        default=None, description="Scenario time after which simulate stops and prints what still waits "
                                  "(default: a week of scenario time, and never under 600 s of wall clock).")
    fleet: Fleet = Field(default_factory=Fleet)
    faults: list[Fault] = Field(default_factory=list)
    events: list[Event] = Field(default_factory=list)

    def deadline_s(self) -> float:
        """The wall-clock seconds simulate gives the scenario to settle."""
        if self.deadline is not None:
            return self.deadline.total_seconds() * self.time_scale
        return max(600.0, DEFAULT_DEADLINE.total_seconds() * self.time_scale)

    @model_validator(mode="after")
    def _known_nodes(self) -> Scenario:
        names = set(self.fleet.names())
        for i, f in enumerate(self.faults):
            if f.node not in names:
                raise ValueError(f"faults.{i}.node: unknown node {f.node!r} (fleet has gpu-node-0 .. "
                                 f"gpu-node-{self.fleet.nodes - 1})")
            if f.gpu >= self.fleet.gpus_per_node:
                raise ValueError(f"faults.{i}.gpu: {f.gpu} but nodes have {self.fleet.gpus_per_node} GPUs")
        for i, e in enumerate(self.events):
            if e.node is not None and e.node not in names:
                raise ValueError(f"events.{i}.node: unknown node {e.node!r}")
        for i, j in enumerate(self.fleet.jobs):
            for n in j.nodes:
                if n not in names:
                    raise ValueError(f"fleet.jobs.{i}.nodes: unknown node {n!r}")
        return self


BUILTIN_SCENARIOS = Path(__file__).resolve().parent / "scenarios"


class ScenarioError(ValueError):
    def __init__(self, source: str, problems: list[str]):
        self.source, self.problems = source, problems
        super().__init__(f"{source}: " + "; ".join(problems))


def load_scenario(path: str | Path | None = None, text: str | None = None) -> tuple[Scenario, Policy]:
    """The scenario and its resolved policy (scaled by time_scale, budget applied)."""
    source = str(path) if path else "scenario"
    try:
        data = yaml.safe_load(text if text is not None else Path(path).read_text())
    except OSError as err:
        raise ScenarioError(source, [f"(file): cannot read: {err.strerror}"]) from None
    except yaml.YAMLError as err:
        raise ScenarioError(source, [f"(file): not valid YAML: {err}"]) from None
    try:
        scenario = Scenario.model_validate(data)
    except ValidationError as err:
        raise ScenarioError(source, describe_validation_error(err)) from None
    policy_path = scenario.policy
    if policy_path != "default" and path is not None:
        policy_path = str((Path(path).parent / policy_path).resolve())
    try:
        policy = load_policy(policy_path)
    except PolicyError as err:
        raise ScenarioError(source, [f"policy: {p}" for p in err.problems]) from None
    policy = policy.scaled(scenario.time_scale)
    if scenario.budget is not None:
        policy.guard.max_disruptive = scenario.budget
    return scenario, policy
