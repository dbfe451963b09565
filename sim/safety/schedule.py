"""A safety schedule: from one seed, a small cluster, its policy, its faults and a list of steps
(agent deaths, operator commands, spoofed reports, failing calls ...) at virtual times.

Everything here is drawn from `random.Random(seed)` alone: a seed names one schedule exactly."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from datetime import timedelta

from pydantic import BaseModel

from policies.loader import default_policy
from policies.model import Policy

GPUS = 4
# A fault as the node's own agent reports it: (label, finding fields, lowest rung that cures it).
FAULTS = [
    ("xid13", {"kind": "xid", "xid": 13}, "kill"),  # an application fault on one GPU
    ("xid13-unmapped", {"kind": "xid", "xid": 13, "pci": "0000:ff:00"}, "kill"),  # bus id maps to no GPU
    ("ecc_dbe", {"kind": "ecc_dbe"}, "reset"),
    ("xid48", {"kind": "xid", "xid": 48}, "reset"),
    ("xid79", {"kind": "xid", "xid": 79}, "reboot"),
    ("xid54", {"kind": "xid", "xid": 54}, "none"),  # starts at replace
    ("row_remap_failure", {"kind": "row_remap_failure"}, "none"),
    ("nic_ports_down", {"kind": "nic_ports_down"}, "reboot"),
]
ONE_SHOT = {"xid"}  # kernel-log events: the agent gives each record an id and re-sends it while held

STEP_KINDS = [
    "resend", "agent_stop", "agent_start", "reboot_lost", "kube_fail", "cloud_fail", "slow",
    "pause", "resume", "approve", "skip", "cancel", "force", "spoof_foreign", "spoof_cluster", "spoof_id",
    "spoof_seq", "spoof_boot", "spoof_hw", "spoof_nested", "spoof_history", "spoof_admission", "condition",
    "condition_clear", "late_grant", "dup_guard", "fault_again", "join", "probe",
]
# How often each kind is drawn (the rest 1): the common ones carry most schedules.
WEIGHTS = {"resend": 4, "agent_stop": 2, "agent_start": 2, "approve": 2, "probe": 2, "fault_again": 2}


def driver_id(seed: int) -> str:
    return f"safety-driver/{seed}"


@dataclass
class NodeSpec:
    name: str
    fault: str | None = None  # a FAULTS label
    gpu: int = 0
    cured_by: str = "reboot"
    at_s: float = 0.0
    mig: bool = False
    reboot_returns: bool = True
    cordoned_by_other: bool = False


@dataclass
class Step:
    at_s: float
    kind: str
    node: str = ""
    arg: str = ""

    def __str__(self) -> str:
        return f"{self.at_s:9.1f}s {self.kind} {self.node} {self.arg}".rstrip()


@dataclass
class Schedule:
    seed: int
    cluster: str
    task_queue: str
    policy: Policy
    nodes: list[NodeSpec]
    foreign: list[str]  # exist, but are not GPU nodes of this cluster
    ghost: str  # does not exist at all
    joiner: str  # a new node that joins during the run
    steps: list[Step] = field(default_factory=list)
    history_limit: int | None = None
    end_s: float = 0.0
    room_ahead: bool = False  # the controller keeps quarantine room its guard reserved ahead (RoomPool)

    def describe(self) -> str:
        p = self.policy
        lines = [f"schedule {self.seed}: cluster {self.cluster}, dry_run={p.dry_run}, "
                 f"max_disruptive={p.guard.max_disruptive}, max_unhealthy={p.guard.max_unhealthy}, "
                 f"approval(reboot={p.ladder.reboot.requires_approval}, replace={p.ladder.replace.requires_approval}), "
                 f"history_limit={self.history_limit}, room_ahead={self.room_ahead}"]
        for n in self.nodes:
            lines.append(f"  {n.name}: {n.fault or 'healthy'} gpu {n.gpu} at {n.at_s:.1f}s cured_by {n.cured_by}"
                         f"{' mig' if n.mig else ''}{'' if n.reboot_returns else ' reboot-never-returns'}"
                         f"{' cordoned-by-someone-else' if n.cordoned_by_other else ''}")
        lines += [f"  {s}" for s in self.steps]
        return "\n".join(lines)


def jitter(model: BaseModel, rng: random.Random) -> None:
    """Every duration moved off the round values by odd milliseconds and up to 5% of itself: the
    time-skipping server wedges a workflow whose timer fires within a millisecond of a signal
    landing (see sim/whatif/clock.off_grid), and round durations started at one frozen instant
    meet exactly. Under a second of spread, two workflows' re-check timers still met that closely
    in about one schedule of 60 (a guard's task never answered: seeds 228, 266, 283)."""
    for name in type(model).model_fields:
        value = getattr(model, name)
        if isinstance(value, timedelta):
            odd = rng.randrange(7, 997)
            # The spread comes from a generator seeded by `rng`'s state, not drawn from it: every
            # seed still names the schedule it did.
            own = random.Random(f"{rng.getstate()[1][:4]}/{name}/{odd}")
            spread = own.randrange(0, int(value.total_seconds() * 50) + 1)  # up to 5%, in milliseconds
            setattr(model, name, value + timedelta(milliseconds=odd + spread))
        elif isinstance(value, BaseModel):
            jitter(value, rng)


def schedule_policy(rng: random.Random) -> Policy:
    policy = default_policy()
    policy.dry_run = rng.random() < 0.2
    policy.guard.max_disruptive = rng.choice([1, 1, 2])
    policy.guard.max_unhealthy = rng.choice([1, 2, "50%"])
    policy.ladder.replace.requires_approval = rng.random() < 0.35
    policy.ladder.reboot.requires_approval = rng.random() < 0.1
    policy.ladder.replace.approval_timeout = timedelta(hours=rng.choice([1, 2]))
    policy.validation.soak = timedelta(minutes=rng.choice([1, 10]))
    policy.probation = timedelta(minutes=rng.choice([10, 30]))
    policy.repeat_offender.threshold = rng.choice([2, 3])
    # Seconds, not minutes: a node-local activity waiting on a stopped agent's queue holds the
    # time-skipping server's clock (it then runs at wall pace) for every schedule on the server
    # until its schedule-to-start timeout fires. Not drawn, so every seed names the schedule it did.
    policy.validation.agent_timeout = timedelta(seconds=5)
    jitter(policy, rng)
    return policy


def make_schedule(seed: int, steps: int = 10, span_s: float = 2 * 3600.0) -> Schedule:
    rng = random.Random(seed)
    pre = f"s{seed}"
    policy = schedule_policy(rng)
    nodes = []
    for i in range(3):
        label, _, cure = rng.choice(FAULTS)
        nodes.append(NodeSpec(
            name=f"{pre}-g{i}", fault=None if rng.random() < 0.1 else label, gpu=rng.randrange(GPUS),
            cured_by=rng.choice([cure, cure, cure, "reboot", "none"]) if cure != "none" else "none",
            at_s=round(rng.uniform(0, 600) if i else 1.0, 3), mig=rng.random() < 0.3,
            reboot_returns=rng.random() < 0.85, cordoned_by_other=rng.random() < 0.1))
    sched = Schedule(seed=seed, cluster=f"safety-{seed}", task_queue=f"safety-{seed}", policy=policy, nodes=nodes,
                     foreign=[f"{pre}-cpu"], ghost=f"{pre}-ghost", joiner=f"{pre}-new",
                     history_limit=rng.choice([None, None, 60]))
    # Drawn apart from the schedule's own draws, so every seed still names the schedule it did.
    sched.room_ahead = random.Random(f"{seed}/room-ahead").random() < 0.5
    policy.guard.room_ahead = 16 if sched.room_ahead else 0
    sched.steps += [Step(at_s=n.at_s, kind="fault", node=n.name) for n in nodes if n.fault]
    kinds = [k for k in STEP_KINDS for _ in range(WEIGHTS.get(k, 1))]
    for _ in range(steps):
        kind = rng.choice(kinds)
        node = rng.choice(nodes).name
        arg = ""
        if kind == "skip":
            arg = rng.choice(["reset", "reboot", "replace"])
        elif kind == "kube_fail":
            arg = rng.choice(["kube.quarantine", "kube.drain", "kube.return_to_service", "kube.check_node"])
        elif kind == "cloud_fail":
            arg = rng.choice(["cloud.reboot", "cloud.replace", "cloud.boot_id"])
        # Off any grid: a signal and a timer at one instant trip the time-skipping server.
        sched.steps.append(Step(at_s=round(rng.uniform(2, span_s), 3), kind=kind, node=node, arg=arg))
    sched.steps.sort(key=lambda s: s.at_s)
    sched.end_s = span_s + 3 * 3600.0 + 0.517  # room for the slowest ladder (approval, reboot, probation)
    return sched
