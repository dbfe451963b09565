"""Activity names and their request/result models: what workflows import (never implementations)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

from policies.findings import Finding
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
GUARD_SIGNAL = "guard.signal"
GUARD_LIVE_HOLDERS = "guard.live_holders"
GUARD_RUNNING_EPISODES = "guard.running_episodes"
GUARD_RUNNING_HOLDERS = "guard.running_holders"
POLICY_CURRENT = "policy.current"

DEFAULT_TASK_QUEUE = "gpuheal"  # the controller's queue: workflows and cluster-side activities

QUARANTINE_TAINT = "gpuheal.io/quarantine"
UNVALIDATED_TAINT = "gpuheal.io/unvalidated"
CONDITION_TYPE = "GpuHealthy"


def node_task_queue(node: str) -> str:
    """The agent on each node serves node-local activities on its own queue."""
    return f"node/{node}"


# Workflow types and ids, named once (activities never import workflows: they start, list and
# signal these by name).
EPISODE_WORKFLOW = "NodeRemediation"
GUARD_WORKFLOW = "FleetGuard"
ADMISSION_WORKFLOW = "NodeAdmission"


def remediation_workflow_id(node: str) -> str:
    """One episode per unhealthy spell of a node; the next spell reuses the id."""
    return f"remediate/{node}"


def guard_workflow_id(cluster: str) -> str:
    return f"fleet-guard/{cluster}"


def admission_workflow_id(node: str) -> str:
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
    pass


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


class RebootResult(BaseModel):
    instance_id: str
    rebooted: bool = Field(description="False when this key's reboot had already been sent.")
    from_boot: str | None = Field(default=None, description="The kubelet's boot id the reboot was asked from.")
    dry_run: bool = False


class ReplaceRequest(_Request):
    idempotency_key: str
    mode: Literal["auto", "ec2", "karpenter"] = "auto"
    ownership_tag: str = "gpuheal.io/managed=true"


class ReplaceResult(BaseModel):
    instance_id: str
    action: Literal["asg", "ec2", "karpenter", "already_terminated", "dry_run"]


# --- node-local ---------------------------------------------------------------------------------
class GpuProcess(BaseModel):
    pid: int
    gpu_index: int
    pod: str | None = Field(default=None, description="namespace/name from the process's cgroup, when in a pod.")
    used_memory_bytes: int | None = None


class KillRequest(_Request):
    gpus: list[int] = Field(default_factory=list, description="Empty: every GPU.")
    grace_s: float = 10.0


class KillResult(BaseModel):
    killed: list[GpuProcess] = Field(default_factory=list)
    dry_run: bool = False


class ResetRequest(_Request):
    gpus: list[int] = Field(default_factory=list, description="Empty: every GPU.")


class ResetResult(BaseModel):
    reset: list[int] = Field(default_factory=list)
    dry_run: bool = False


class ValidateRequest(_Request):
    dcgm_level: int = 2
    dcgm_required: bool = False
    expected_gpus: int | None = None


class ValidationResult(BaseModel):
    passed: bool
    findings: list[Finding] = Field(default_factory=list)
    checks: list[str] = Field(default_factory=list, description="What ran: nvml, kmsg, nics, dcgm-r2 ...")


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


class CountRecentRequest(BaseModel):
    hardware_ids: list[str]
    window_s: float
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
