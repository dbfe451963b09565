"""Activity names and their request/result models: what workflows import (never implementations)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

from policies.baseline import NodeInventory
from policies.findings import Finding
from policies.load import GpuLoadResult, LoadReport, LoadTestPolicy, SkuReference
from policies.model import Attribution, GuardPolicy, Policy

# Names are stable strings: histories record them, so renaming one breaks replay.
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
GUARD_LIVE_HOLDERS = "guard.live_holders"
GUARD_RUNNING_EPISODES = "guard.running_episodes"
GUARD_RUNNING_HOLDERS = "guard.running_holders"
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


class _Request(BaseModel):
    node: str
    dry_run: bool = Field(default=False, description="Record what would be done; change nothing.")


# --- kube ---------------------------------------------------------------------------------------
class QuarantineRequest(_Request):
    fault_class: str
    reason: str
    taint_key: str = QUARANTINE_TAINT


class QuarantineResult(BaseModel):
    node: str
    changed: bool = Field(description="False when the node was already cordoned and tainted (a retry).")
    cordoned_at: datetime = Field(description="Wall clock when the cordon was verified.")
    dry_run: bool = False


class ReturnToServiceRequest(_Request):
    reason: str
    taint_keys: list[str] = Field(default_factory=lambda: [QUARANTINE_TAINT])


class ReturnToServiceResult(BaseModel):
    node: str
    changed: bool
    left_cordoned: bool = Field(default=False, description="Someone else had cordoned it before gpuheal: it stays so.")
    dry_run: bool = False


class NodeCheckRequest(_Request):
    boot_id: str | None = Field(default=None, description="The boot the report came from: a Node marked replaced "
                                "refuses reports from the replaced host's boot, or from any boot but the kubelet's now.")


class NodeCheckResult(BaseModel):
    exists: bool
    ours: bool = Field(description="The node matches the controller's GPU node selector (or there is none).")
    reason: str = ""
    quarantined: str | None = Field(default=None, description="The value of gpuheal's quarantine taint (the fault "
                                    "class) when the node carries it: an earlier episode left it for a person.")


UNAFFECTED = "unaffected"  # the attribution mark of a pod whose GPUs did not fail


class AttributePodsRequest(_Request):
    attribution: Attribution
    fault: str
    gpus: list[int] = Field(default_factory=list, description="The GPUs that failed; empty: the fault is node-wide.")
    pod_gpus: dict[str, list[int]] | None = Field(
        default=None, description="'uid:<pod uid>' -> GPUs its processes use (the node's view); None: unknown.")
    episode: str


class AttributePodsResult(BaseModel):
    pods: list[str] = Field(default_factory=list, description="namespace/name of each pod marked with the attribution.")
    unaffected: list[str] = Field(default_factory=list, description="Pods whose GPUs did not fail, marked `unaffected`.")


class DrainRequest(_Request):
    episode: str
    checkpoint_grace_s: float
    deadline_s: float
    timeout_action: Literal["escalate", "wait", "force"] = "escalate"
    allow_force: bool = False
    pod_grace_seconds: int = 30


class DrainResult(BaseModel):
    evicted: list[str] = Field(default_factory=list)
    forced: list[str] = Field(default_factory=list)
    remaining: list[str] = Field(default_factory=list, description="Pods still there at the deadline (escalate).")
    lingering: list[str] = Field(default_factory=list,
                                 description="Evicted pods still present after their grace period ran out.")
    pdb_blocked: int = Field(default=0, description="Eviction attempts answered 429 by a PodDisruptionBudget.")
    timed_out: bool = False
    dry_run: bool = False


class EventRequest(_Request):
    reason: str
    message: str
    type: Literal["Normal", "Warning"] = "Normal"


# --- cloud --------------------------------------------------------------------------------------
class RebootRequest(_Request):
    idempotency_key: str = Field(description="One reboot per key, however often the activity is retried.")
    ownership_tag: str = "gpuheal.io/managed=true"
    boot_wait_s: float = Field(default=0.0, description="How long a machine may take to boot (the reboot rung's "
                               "return_timeout): a reboot that may have gone out is not sent again sooner.")


class RebootResult(BaseModel):
    instance_id: str
    rebooted: bool = Field(description="False when this key's reboot had already been sent.")
    from_boot: str | None = Field(default=None, description="The kubelet's boot id the reboot was asked from.")
    dry_run: bool = False


class ReplaceRequest(_Request):
    idempotency_key: str
    mode: Literal["auto", "ec2", "karpenter"] = "auto"
    ownership_tag: str = "gpuheal.io/managed=true"


# Set on the Node once its instance's replacement is under way: the old host may run (and its agent
# report) for a while after the terminate, and those reports must start nothing (issue 22, 14).
REPLACED_ANNOTATION = "gpuheal.io/replaced-by"
REPLACED_BOOT_ANNOTATION = "gpuheal.io/replaced-boot"  # the kubelet's boot id of the host replaced


class ReplaceResult(BaseModel):
    instance_id: str = Field(description="What was replaced: an EC2 instance id, or a Cluster API Machine's namespace/name.")
    action: Literal["asg", "ec2", "karpenter", "machine_deleted", "already_terminated", "dry_run"]
    lifecycle_state: str | None = Field(default=None, description="The Auto Scaling lifecycle state after the "
                                        "terminate (Terminating:Wait while a lifecycle hook holds the instance).")
    marked: bool = Field(default=False, description="The Node carries REPLACED_ANNOTATION (verified).")


# --- node-local ---------------------------------------------------------------------------------
class GpuProcess(BaseModel):
    pid: int
    gpu_index: int
    pod: str | None = Field(default=None, description="namespace/name from the process's cgroup, when in a pod.")
    used_memory_bytes: int | None = None
    gpu_instance_id: int | None = Field(default=None, description="MIG GPU instance (None: MIG off).")
    compute_instance_id: int | None = None
    start_ticks: int | None = Field(default=None, description="/proc/<pid>/stat starttime: a reused pid differs.")


class MigTarget(BaseModel):
    """An implicated MIG instance: only its processes are stopped on a GPU in MIG mode."""

    gpu_index: int
    gpu_instance_id: int
    compute_instance_id: int | None = Field(default=None, description="None: every compute instance of the GPU instance.")


class KillRequest(_Request):
    gpus: list[int] = Field(default_factory=list, description="The implicated GPUs. Empty: none (see all_gpus).")
    all_gpus: bool = Field(default=False, description="Every GPU's processes (a drained node before a whole-node reset).")
    mig: list[MigTarget] = Field(default_factory=list,
                                 description="On a GPU in MIG mode only these instances' processes; none named: nothing there.")
    grace_s: float = 10.0


class KillResult(BaseModel):
    killed: list[GpuProcess] = Field(default_factory=list)
    dry_run: bool = False
    spared: list[str] = Field(default_factory=list, description="What was left alone, and why (MIG, a reused pid).")


class ResetRequest(_Request):
    gpus: list[int] = Field(default_factory=list, description="Empty: every GPU.")


class ResetResult(BaseModel):
    reset: list[int] = Field(default_factory=list)
    dry_run: bool = False


class ValidateRequest(_Request):
    dcgm_level: int = 2
    dcgm_required: bool = False
    expected_gpus: int | None = None
    tier: str | None = Field(default=None, description="Load-test tier (quick, repair, admission); None: status "
                                                       "probes only (a node still in service, or an old history).")
    load: LoadTestPolicy | None = None
    references: dict[str, SkuReference] = Field(default_factory=dict, description="Per-SKU fleet medians to judge against.")
    gpus: list[int] = Field(default_factory=list, description="GPUs to load-test; empty: all.")


class ValidationResult(BaseModel):
    passed: bool
    findings: list[Finding] = Field(default_factory=list)
    checks: list[str] = Field(default_factory=list, description="What ran: nvml, kmsg, nics, dcgm-r2 ...")
    load: LoadReport | None = Field(default=None, description="The load test's figures, per GPU.")


class LoadFiguresRecord(BaseModel):
    """One validation's figures for the ledger, per node and GPU serial."""

    node: str
    episode: str
    tier: str
    at: datetime
    gpus: list[GpuLoadResult]


class BaselineRequest(BaseModel):
    skus: list[str] = Field(default_factory=list, description="Empty: every SKU measured.")


class BaselineResult(BaseModel):
    references: dict[str, SkuReference] = Field(default_factory=dict)


class BootIdRequest(_Request):
    pass


class GpuPodsRequest(_Request):
    pass


class GpuPodsResult(BaseModel):
    pod_gpus: dict[str, list[int]] = Field(default_factory=dict,
                                           description="'uid:<pod uid>' -> the GPUs its processes run on.")


class HardwareIdsRequest(_Request):
    pass


class HardwareIdsResult(BaseModel):
    """The node's own GPU ids, read by its agent (NVML): what admission checks, never a sender's claim."""

    hardware_ids: list[str] = Field(default_factory=list, description="GPU UUIDs and serials, sorted.")
    gpus: int = 0


# --- ledger -------------------------------------------------------------------------------------
class InterruptedPod(BaseModel):
    pod: str = Field(description="namespace/name")
    attribution: Attribution = Field(description="platform: the node failed it; application: its own fault.")
    how: str = Field(default="marked", description="marked (the fault's pods) or evicted (by the drain).")


# The phase for the time between a return to service and a recurrence: not time out of service.
IN_SERVICE = "in service"


class RemediationRecord(BaseModel):
    node: str
    episode: str = Field(description="workflow id / first run id: the record's idempotency key.")
    hardware_ids: list[str]
    fault_class: str | None
    attribution: Attribution | None
    rungs: list[str]
    outcome: str
    started_at: datetime
    ended_at: datetime
    boards: list[str] = Field(default_factory=list, description="Ids of the hardware a probe implicated (a GPU's "
                              "UUID and serial, or the instance): repeat offenders are counted per board by these.")
    # The outcome ledger (issue 26); absent from records written before it.
    detected_at: datetime | None = Field(default=None, description="The detector's clock at the first report.")
    returned_at: datetime | None = Field(default=None, description="Back in service (verified uncordon), if it was.")
    out_of_service_s: float | None = Field(
        default=None, description="From detection to back in service (or the episode's end); 0: never cordoned.")
    phases: dict[str, float] = Field(default_factory=dict, description="Seconds per phase (workflows/outcome.py).")
    pods: list[InterruptedPod] = Field(default_factory=list, description="Pods the episode interrupted.")
    finding: Finding | None = Field(default=None, description="The finding that set the first rung (what-if replays it).")
    validations: dict[str, int] = Field(default_factory=dict, description="Validation runs: passed and failed.")
    agent_missing: bool = Field(default=False, description="A node-local step found no agent on the node.")
    sku: str | None = Field(default=None, description="The node's GPU generation (hopper, ...).")
    profile: str | None = Field(default=None, description="The node's profile (policies/profiles.py), if one applied.")


class CountRecentRequest(BaseModel):
    hardware_ids: list[str]
    window_s: float
    by_board: bool = Field(default=False, description="Count episodes that implicated these ids (their `boards`), "
                           "not every episode of a node that listed them.")
    exclude_episode: str | None = None


class DenylistRequest(BaseModel):
    hardware_ids: list[str]
    node: str
    reason: str


class DenylistResult(BaseModel):
    added: list[str] = Field(default_factory=list, description="Ids newly denied (others were already).")


class CheckDeniedRequest(BaseModel):
    hardware_ids: list[str]


class CheckDeniedResult(BaseModel):
    denied: dict[str, str] = Field(default_factory=dict, description="id -> reason it was denied.")


class AdmitRequest(BaseModel):
    """A node admitted with this hardware: a later admission of the same node and hardware is a re-start."""

    node: str
    hardware_ids: list[str]


class AdmittedRequest(BaseModel):
    node: str


class LastStartedRequest(BaseModel):
    node: str
    exclude_episode: str | None = None


class LastStartedResult(BaseModel):
    started_at: datetime | None = Field(default=None, description="When the node's latest recorded episode started.")


class AdmittedResult(BaseModel):
    hardware_ids: list[str] = Field(default_factory=list, description="Hardware the node was admitted with before.")


# --- fleet guard --------------------------------------------------------------------------------
class GuardSignalRequest(BaseModel):
    """Signal-with-start to `fleet-guard/<cluster>`: the guard is started on first need."""

    cluster: str
    guard: GuardPolicy = Field(default_factory=GuardPolicy, description="The guard's limits, if it must be started.")
    task_queue: str = DEFAULT_TASK_QUEUE
    signal: str
    payload: dict[str, Any]


class LiveHoldersRequest(BaseModel):
    holders: list[str]


class LiveHoldersResult(BaseModel):
    running: list[str]


class RunningEpisodesRequest(BaseModel):
    cluster: str


class EpisodeSeen(BaseModel):
    """What a running episode's status says of its place in the guard's books."""

    holder: str
    node: str
    lease_held: bool = False
    lease_requested: bool = False
    quarantined: bool = False


class RunningEpisodesResult(BaseModel):
    known: bool = Field(description="False: this server cannot list workflows (no visibility): nothing learnt.")
    episodes: list[EpisodeSeen] = Field(default_factory=list)


# --- policy -------------------------------------------------------------------------------------
class PolicyRequest(BaseModel):
    node: str = Field(default="", description="Who asks (for the controller's log); the answer is the same for all.")


class PolicySnapshot(BaseModel):
    """The controller's policy as an episode took it: recorded in the history, named in status."""

    name: str
    sha256: str = Field(description="Hash of the policy's canonical JSON: two controllers with one file agree.")
    source: str = Field(default="", description="Where the controller loaded it from (a path, or 'default').")
    policy: Policy
    cluster: str | None = Field(default=None, description="The controller's cluster: an episode's guard and budget "
                                "(None: a controller from before says nothing, the start input's stands).")
    profile: str | None = Field(default=None, description="The node's profile, when one applies (its overrides are in `policy`).")
    profile_reason: str = Field(default="", description="Why the node gets that profile (or none).")


# --- node profiles and baselines (activities/node_profile.py) -------------------------------------
PROFILE_EXPECTATIONS = "profile.expectations"
PROFILE_RECORD_BASELINE = "profile.record_baseline"
NODE_INVENTORY = "node.inventory"
PROFILE_WORKFLOW = "NodeProfile"


def profile_workflow_id(node: str, cluster: str) -> str:
    return _scoped("profile", cluster, node)


class ExpectationsRequest(BaseModel):
    node: str
    observed: NodeInventory | None = Field(
        default=None, description="What the agent's first healthy cycle saw: recorded as the node's baseline "
                                  "(learned, not validated) when it has none yet.")
    boot_id: str = ""


class RecordBaselineRequest(_Request):
    inventory: NodeInventory
    validated: bool = True
    boot_id: str = ""


class InventoryRequest(_Request):
    pass


class InventoryResult(BaseModel):
    inventory: NodeInventory | None = Field(default=None, description="None: a probe could not read what is there.")
    findings: list[Finding] = Field(default_factory=list, description="Faults seen while taking it: nothing is recorded then.")
