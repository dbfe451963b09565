"""The safety invariants (issue 22), checked over one schedule's recorded side effects and its
final observation. Each returns the violations it found as (invariant, what happened)."""

from __future__ import annotations

import api as c
from policies.classify import classify
from policies.findings import NODE_HARDWARE_KINDS, Finding
from policies.guard_policy import resolve_limit
from policies.terms import Rung
from sim.safety.effects import DESTRUCTIVE, SIDE_EFFECTS, Effect
from sim.safety.sim_node import SimNode
from sim.safety.world import SafetyWorld

Violation = tuple[str, str]
RUNGS = {c.NODE_KILL: Rung.KILL, c.NODE_RESET: Rung.RESET, c.CLOUD_REBOOT: Rung.REBOOT}


def _platform(w: SafetyWorld, f: Finding) -> bool:
    return classify([f], "hopper", w.policy).attribution == "platform"


def implicated_ids(w: SafetyWorld, n: SimNode) -> set[str]:
    """What the node's own agent named as faulty hardware: the GPU of a platform finding, the
    instance for a node-wide hardware finding."""
    gpus = {g.index: g for g in n.ids()}
    ids: set[str] = set()
    for f in n.genuine:
        if not _platform(w, f):
            continue
        if f.gpu_index is not None and f.gpu_index in gpus:
            ids |= {gpus[f.gpu_index].uuid, gpus[f.gpu_index].serial}
        elif f.kind in NODE_HARDWARE_KINDS:
            ids.add(f"h-{n.name}")
    return ids


def implicated_gpus(w: SafetyWorld, n: SimNode) -> set[int]:
    """GPUs the agent's findings name; every GPU for a node-wide platform fault (the agent's, or a
    node condition a watcher reported: the node is drained before such a reset)."""
    gpus = {f.gpu_index for f in n.genuine if f.gpu_index is not None}
    if any(f.gpu_index is None and _platform(w, f) for f in [*n.genuine, *n.watched]):
        gpus = set(range(n.gpus))
    return gpus


def _by_episode(e: Effect) -> bool:
    return e.wf.startswith("remediate/") or e.wf.startswith("admit/")


def check_dry_run(w: SafetyWorld) -> list[Violation]:
    out = []
    for e in w.log:
        if not _by_episode(e):
            continue
        if w.policy.dry_run and e.kind in DESTRUCTIVE and not e.dry:
            out.append(("dry-run", f"{e} under a dry-run policy"))
        elif e.kind in SIDE_EFFECTS - {c.LEDGER_DENYLIST} and e.dry != w.policy.dry_run:
            out.append(("policy-chosen", f"{e}: dry_run={e.dry} but the controller's policy says {w.policy.dry_run}"))
    return out


def check_denylist(w: SafetyWorld) -> list[Violation]:
    out = []
    for e in w.log:
        if e.kind != c.LEDGER_DENYLIST:
            continue
        n = w.nodes.get(e.node)
        extra = set(e.detail.get("ids", [])) - (implicated_ids(w, n) if n else set())
        if extra:
            out.append(("denylist", f"{e}: {sorted(extra)} not named by {e.node}'s own agent as faulty hardware"))
    return out


def check_replace(w: SafetyWorld) -> list[Violation]:
    out = []
    threshold = w.policy.repeat_offender.threshold
    for i, e in enumerate(w.log):
        if e.kind != c.CLOUD_REPLACE or e.dry:
            continue
        n = w.nodes.get(e.node)
        if e.wf.startswith("admit/"):
            if n is None or n.admitted or not set(n.report().hardware_ids()) & set(w.denylist):
                out.append(("replace", f"{e}: admission replaced a node whose own hardware is not denylisted"))
            continue
        start = max((j for j in range(i) if w.log[j].kind == "ended" and w.log[j].node == e.node), default=-1) + 1
        episode = [x for x in w.log[start:i] if x.node == e.node]
        approved = any(x.kind == "operator" and x.detail.get("done") and (
            (x.detail["cmd"] == "approve" and x.detail.get("awaiting") == "replace")
            or (x.detail["cmd"] == "skip_to" and x.detail["args"][:1] == ["replace"])) for x in episode)
        starts_there = n is not None and any(
            classify([f], "hopper", w.policy).start_rung is Rung.REPLACE for f in n.genuine)
        repeat = sum(x.kind == "ended" and x.node == e.node for x in w.log[:i]) + 1 >= threshold
        if approved or starts_there or repeat:
            continue
        rungs = [x for x in episode if x.kind in RUNGS and not x.dry]
        last = rungs[-1] if rungs else None
        failed = last is not None and (
            any(x.kind == "validate" and not x.detail["passed"] for x in episode if x.n > last.n)
            # the agent reporting the fault again after the rung (a recurrence in probation)
            or any(x.kind == "report" and x.detail.get("source") == "agent" and x.detail.get("findings")
                   for x in episode if x.n > last.n)
            or (last.kind == c.CLOUD_REBOOT and not last.detail.get("returns", True)))
        if w.policy.ladder.replace.requires_approval:
            out.append(("replace", f"{e}: replace requires approval and no operator approved it"))
        elif not failed:
            tried = ",".join(RUNGS[x.kind].value for x in rungs) or "none"
            out.append(("replace", f"{e}: no lower rung failed validation first (rungs acted: {tried})"))
    return out


def check_limits(w: SafetyWorld) -> list[Violation]:
    out = []
    size = len(w.sched.nodes)
    max_dis = resolve_limit(w.policy.guard.max_disruptive, size)
    max_unh = resolve_limit(w.policy.guard.max_unhealthy, size)
    disrupted: set[str] = set()
    quarantined: set[str] = set()
    forced = False
    for e in w.log:
        if e.kind == "force":
            forced = True
        holder_of = c.node_in_workflow_id(e.detail.get("holder", ""), "remediate")
        if e.kind in (c.KUBE_RETURN_TO_SERVICE, "ended") or (e.kind == "guard.release" and holder_of == e.node):
            disrupted.discard(e.node)
        if e.kind == c.KUBE_RETURN_TO_SERVICE and not e.dry or e.kind == "ended" and e.detail["outcome"] == "replaced":
            quarantined.discard(e.node)
        if e.dry or not e.wf.startswith("remediate/"):
            continue
        if e.kind in (c.KUBE_DRAIN, c.NODE_RESET, c.CLOUD_REBOOT, c.CLOUD_REPLACE) and e.node not in disrupted:
            disrupted.add(e.node)
            if len(disrupted) > max_dis and not forced:
                out.append(("max_disruptive", f"{e}: {sorted(disrupted)} disrupted at once (max {max_dis})"))
        if e.kind == c.KUBE_QUARANTINE and e.detail.get("taint") == c.QUARANTINE_TAINT and e.node not in quarantined:
            quarantined.add(e.node)
            if len(quarantined) > max_unh and not forced:
                out.append(("max_unhealthy", f"{e}: {sorted(quarantined)} quarantined at once (max {max_unh})"))
    return out


def implicated_processes(w: SafetyWorld, n: SimNode) -> set[tuple[int, int | None]]:
    """(GPU, MIG instance) of the processes the agent's findings implicate: a finding naming a MIG
    instance implicates only that instance's processes."""
    gpus = implicated_gpus(w, n)
    if gpus == set(range(n.gpus)) and any(f.gpu_index is None and _platform(w, f) for f in [*n.genuine, *n.watched]):
        return set(n.processes())  # a node-wide fault on a drained node: a whole-node reset stops them all
    named = {(f.gpu_index, getattr(f, "gpu_instance_id", None)) for f in n.genuine if f.gpu_index is not None}
    return {(g, gi) for g, gi in n.processes() if g in gpus and (
        gi is None or (g, None) in named or (g, gi) in named or not any(x[0] == g for x in named))}


def check_kill(w: SafetyWorld) -> list[Violation]:
    out = []
    for e in w.log:
        if e.kind != c.NODE_KILL or e.dry:
            continue
        n = w.nodes[e.node]
        ok = implicated_processes(w, n)
        bad = [tuple(p) for p in e.detail.get("signalled", []) if tuple(p) not in ok]
        if bad:
            out.append(("kill", f"{e}: signalled processes on (GPU, MIG instance) {sorted(set(bad))}, "
                                f"implicated only {sorted(ok)}"))
    return out


def check_scope(w: SafetyWorld) -> list[Violation]:
    out = []
    ours = {s.name for s in w.sched.nodes} | {w.sched.joiner}
    for e in w.log:
        if e.kind in SIDE_EFFECTS and e.node not in ours and _by_episode(e):
            out.append(("not-ours", f"{e}: {e.node} is not a GPU node of cluster {w.cluster}"))
        if e.kind in SIDE_EFFECTS and e.wf.startswith("remediate/") and e.wf != c.remediation_workflow_id(e.node, w.cluster):
            out.append(("sender-chose", f"{e}: episode {e.wf} acted on {e.node}"))
        if e.kind.startswith("guard.") and e.detail.get("cluster") != w.cluster:
            out.append(("sender-chose", f"{e}: an episode of cluster {w.cluster} used guard {e.detail.get('cluster')}"))
    return out


def check_holds(w: SafetyWorld) -> list[Violation]:
    """A quarantined ending holds until a person acts; a replaced node is never touched again."""
    out = []
    held: dict[str, Effect] = {}
    for e in w.log:
        if e.kind == "operator" and e.detail.get("done"):
            held.pop(e.node, None)
        ending = held.get(e.node)
        if ending is not None and _by_episode(e) and not e.dry and (
                e.kind in DESTRUCTIVE or (ending.detail["outcome"] == "replaced" and e.kind in SIDE_EFFECTS)):
            out.append(("hold", f"{e} after {e.node}'s episode ended {ending.detail['outcome']} ({ending})"))
            held.pop(e.node)
        if e.kind == "ended" and e.detail["outcome"] in ("quarantined", "failed", "replaced"):
            held[e.node] = e
    return out


def check_endings(w: SafetyWorld) -> list[Violation]:
    out = []
    for obs in (e for e in w.log if e.kind in ("probe", "final")):
        rows, guard = obs.detail["episodes"], obs.detail["guard"]
        for holder in guard.get("holders", []):
            row = rows.get(c.node_in_workflow_id(holder, "remediate") or holder)
            if row is None or row["status"] != "RUNNING":
                out.append(("lease", f"{obs.kind} #{obs.n}: {holder} holds a lease but its episode has ended"))
            elif row.get("awaiting"):
                out.append(("lease", f"{obs.kind} #{obs.n}: {holder} holds a lease while waiting for approval to "
                                     f"{row['awaiting']}"))
        if obs.kind != "final":
            continue
        for node, row in rows.items():
            if row["status"] == "RUNNING" and not row.get("waiting") and "query_error" not in row:
                out.append(("ending", f"{node}: episode still running at stage {row.get('stage')} with no reason "
                                      "it waits (wedged)"))
            elif row["status"] == "RUNNING" and "query_error" in row:
                out.append(("ending", f"{node}: episode running and cannot answer: {row['query_error']}"))
            elif row["status"] not in ("RUNNING", "COMPLETED"):
                out.append(("ending", f"{node}: episode {row['status']}"))
            elif row.get("outcome") in ("quarantined", "failed") and not row.get("reason"):
                out.append(("ending", f"{node}: ended {row['outcome']} with no reason"))
    for n in w.nodes.values():
        if n.cordoned_by_other and not n.cordoned:
            out.append(("cordon", f"{n.name}: the cordon someone else set was removed"))
    return out


CHECKS = [check_dry_run, check_denylist, check_replace, check_limits, check_kill, check_scope, check_holds,
          check_endings]


def violations(w: SafetyWorld) -> list[Violation]:
    return [v for check in CHECKS for v in check(w)]
