"""Names that histories and the API server record: activity names, task queues, workflow types
and ids, taints, and the signals between workflows. Stable strings: renaming one breaks replay."""

from __future__ import annotations

KUBE_QUARANTINE = "kube.quarantine"
KUBE_RETURN_TO_SERVICE = "kube.return_to_service"
KUBE_ATTRIBUTE_PODS = "kube.attribute_pods"
KUBE_DRAIN = "kube.drain"
KUBE_EVENT = "kube.event"
KUBE_FLEET_SIZE = "kube.fleet_size"
KUBE_CHECK_NODE = "kube.check_node"
KUBE_QUARANTINED_NODES = "kube.quarantined_nodes"
CLOUD_REBOOT = "cloud.reboot"
CLOUD_REPLACE = "cloud.replace"
CLOUD_BOOT_ID = "cloud.boot_id"
NODE_KILL = "node.kill_gpu_processes"
NODE_RESET = "node.reset_gpu"
NODE_VALIDATE = "node.validate"
NODE_GPU_PODS = "node.gpu_pods"
NODE_HARDWARE_IDS = "node.hardware_ids"
LEDGER_RECORD = "ledger.record"
LEDGER_COUNT_RECENT = "ledger.count_recent"
LEDGER_DENYLIST = "ledger.denylist"
LEDGER_CHECK_DENIED = "ledger.check_denied"
LEDGER_ADMIT = "ledger.admit"
LEDGER_ADMITTED = "ledger.admitted"
LEDGER_LAST_STARTED = "ledger.last_started"
LEDGER_LOAD_FIGURES = "ledger.load_figures"
LEDGER_BASELINE = "ledger.baseline"
GUARD_SIGNAL = "guard.signal"
GUARD_RUNNING_EPISODES = "guard.running_episodes"
GUARD_RUNNING_HOLDERS = "guard.running_holders"
GUARD_TAKE_ROOM = "guard.take_room"  # local: a quarantine slot the guard reserved ahead for this controller
GUARD_LIVENESS = "guard.liveness"  # is a guard that has not answered stuck, or only slow
POLICY_CURRENT = "policy.current"

DEFAULT_TASK_QUEUE = "gpuheal"  # the controller's queue: workflows and cluster-side activities

QUARANTINE_TAINT = "gpuheal.io/quarantine"
UNVALIDATED_TAINT = "gpuheal.io/unvalidated"
CONDITION_TYPE = "GpuHealthy"


def node_task_queue(node: str, cluster: str) -> str:
    """The agent on each node serves node-local activities on its own queue, named with its cluster
    so two fleets with a node of one name on one namespace never take each other's resets."""
    return _scoped("node", cluster, node)


def legacy_node_task_queue(node: str) -> str:
    """The queue before it carried the cluster: episodes started then schedule on it, so agents
    serve it too (agent_queue_of says which a workflow schedules on)."""
    return f"node/{node}"


# Workflow types and ids, named once (activities never import workflows: they start, list and
# signal these by name).
EPISODE_WORKFLOW = "NodeRemediation"
GUARD_WORKFLOW = "FleetGuard"
ADMISSION_WORKFLOW = "NodeAdmission"


def _scoped(kind: str, cluster: str, node: str) -> str:
    # The cluster keeps two fleets with a node of one name apart on one Temporal namespace.
    if not cluster or "/" in cluster or not node or "/" in node:
        raise ValueError(f"cluster {cluster!r} and node {node!r}: each must be non-empty, without '/'")
    return f"{kind}/{cluster}/{node}"


def remediation_workflow_id(node: str, cluster: str) -> str:
    """One episode per unhealthy spell of a node; the next spell reuses the id."""
    return _scoped("remediate", cluster, node)


def legacy_remediation_workflow_id(node: str) -> str:
    """The id before it carried the cluster: episodes started then run on under it (the upgrade path
    is workers/reporting.episode_id)."""
    return f"remediate/{node}"


def _id_parts(workflow_id: str, kind: str) -> list[str] | None:
    """`kind/<cluster>/<node>` or the legacy `kind/<node>`, every part non-empty; None for anything else."""
    parts = workflow_id.split("/")
    if parts[0] != kind or len(parts) not in (2, 3) or not all(parts):
        return None
    return parts[1:]


def node_in_workflow_id(workflow_id: str, kind: str) -> str | None:
    """The node that `kind/<cluster>/<node>` (or the legacy `kind/<node>`) names; None for any other id."""
    parts = _id_parts(workflow_id, kind)
    return parts[-1] if parts else None


def cluster_in_workflow_id(workflow_id: str, kind: str) -> str | None:
    """The cluster `kind/<cluster>/<node>` names; None for a legacy `kind/<node>` or any other id."""
    parts = _id_parts(workflow_id, kind)
    return parts[0] if parts and len(parts) == 2 else None


def agent_queue_of(workflow_id: str, kind: str, node: str) -> str:
    """The agent queue for a workflow's node-local steps. An id with the cluster was started by an
    agent that serves `node/<cluster>/<node>` (and the old queue too); one without it by an agent
    from before, which serves only `node/<node>`, where every recorded history scheduled (so the
    choice needs no workflow.patched: it follows from the id)."""
    cluster = cluster_in_workflow_id(workflow_id, kind)
    return node_task_queue(node, cluster) if cluster else legacy_node_task_queue(node)


def guard_workflow_id(cluster: str) -> str:
    return f"fleet-guard/{cluster}"


def admission_workflow_id(node: str, cluster: str) -> str:
    return _scoped("admit", cluster, node)


def legacy_admission_workflow_id(node: str) -> str:
    return f"admit/{node}"


PROFILE_EXPECTATIONS = "profile.expectations"
PROFILE_RECORD_BASELINE = "profile.record_baseline"
NODE_INVENTORY = "node.inventory"
PROFILE_WORKFLOW = "NodeProfile"


def profile_workflow_id(node: str, cluster: str) -> str:
    return _scoped("profile", cluster, node)


# Signals between the episode (or admission) and its cluster's FleetGuard.
GUARD_SIGNAL_FAULT = "fault"
GUARD_SIGNAL_REQUEST = "request"
GUARD_SIGNAL_RELEASE = "release"
HOLDER_SIGNAL_GRANTED = "lease_granted"
HOLDER_SIGNAL_QUARANTINE = "quarantine_answer"

# Handlers a client calls by name (tests/test_api.py checks each against the workflow's definition).
EPISODE_SIGNAL_REPORT = "report"
STATUS_QUERY = "status"  # NodeRemediation's and FleetGuard's
EPISODE_UPDATES = ("pause", "resume", "approve", "skip_to", "cancel", "lift")
GUARD_UPDATE_RESERVE_ROOM = "reserve_room"  # a controller's room pool: reserve, renew, give back
GUARD_UPDATES = ("pause", "resume", "release_gate", "set_policy", "upgrade", GUARD_UPDATE_RESERVE_ROOM)
