"""Requests and results of the cluster-side activities: the Kubernetes API (activities/kube.py)
and the cloud provider (activities/cloud.py, activities/providers/)."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

from api.common import NodeRequest
from api.names import QUARANTINE_TAINT
from policies.terms import Attribution


# --- kube ---------------------------------------------------------------------------------------
class QuarantineRequest(NodeRequest):
    fault_class: str
    reason: str
    taint_key: str = QUARANTINE_TAINT


class QuarantineResult(BaseModel):
    node: str
    changed: bool = Field(description="False when the node was already cordoned and tainted (a retry).")
    cordoned_at: datetime = Field(description="Wall clock when the cordon was verified.")
    dry_run: bool = False


class ReturnToServiceRequest(NodeRequest):
    reason: str
    taint_keys: list[str] = Field(default_factory=lambda: [QUARANTINE_TAINT])


class ReturnToServiceResult(BaseModel):
    node: str
    changed: bool
    left_cordoned: bool = Field(default=False, description="Someone else had cordoned it before gpuheal: it stays so.")
    dry_run: bool = False


class NodeCheckRequest(NodeRequest):
    boot_id: str | None = Field(default=None, description="The boot the report came from: a Node marked replaced "
                                "refuses reports from the replaced host's boot, or from any boot but the kubelet's now.")


class NodeCheckResult(BaseModel):
    exists: bool
    ours: bool = Field(description="The node matches the controller's GPU node selector (or there is none).")
    reason: str = ""
    quarantined: str | None = Field(default=None, description="The value of gpuheal's quarantine taint (the fault "
                                    "class) when the node carries it: an earlier episode left it for a person.")


UNAFFECTED = "unaffected"  # the attribution mark of a pod whose GPUs did not fail


class AttributePodsRequest(NodeRequest):
    attribution: Attribution
    fault: str
    gpus: list[int] = Field(default_factory=list, description="The GPUs that failed; empty: the fault is node-wide.")
    pod_gpus: dict[str, list[int]] | None = Field(
        default=None, description="'uid:<pod uid>' -> GPUs its processes use (the node's view); None: unknown.")
    episode: str


class AttributePodsResult(BaseModel):
    pods: list[str] = Field(default_factory=list, description="namespace/name of each pod marked with the attribution.")
    unaffected: list[str] = Field(default_factory=list, description="Pods whose GPUs did not fail, marked `unaffected`.")


class DrainRequest(NodeRequest):
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


class EventRequest(NodeRequest):
    reason: str
    message: str
    type: Literal["Normal", "Warning"] = "Normal"


# --- cloud --------------------------------------------------------------------------------------
class RebootRequest(NodeRequest):
    idempotency_key: str = Field(description="One reboot per key, however often the activity is retried.")
    ownership_tag: str = "gpuheal.io/managed=true"
    boot_wait_s: float = Field(default=0.0, description="How long a machine may take to boot (the reboot rung's "
                               "return_timeout): a reboot that may have gone out is not sent again sooner.")


class RebootResult(BaseModel):
    instance_id: str
    rebooted: bool = Field(description="False when this key's reboot had already been sent.")
    from_boot: str | None = Field(default=None, description="The kubelet's boot id the reboot was asked from.")
    dry_run: bool = False


class ReplaceRequest(NodeRequest):
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
