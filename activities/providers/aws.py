"""The AWS provider (boto3: EC2, Auto Scaling, SSM; Karpenter): reboot, replace and the boot id from
the instance, for instances that carry the ownership tag only."""

from __future__ import annotations

import asyncio
import re
import time
from datetime import UTC, datetime, timedelta

from botocore.config import Config
from botocore.exceptions import (
    ClientError,
    ConnectTimeoutError,
    EndpointConnectionError,
    ProxyConnectionError,
)
from kubernetes import client
from kubernetes.client.rest import ApiException
from temporalio import activity

import api as c
from activities.errors import INVALID_REQUEST, NO_EFFECT, NODE_GONE, NOT_OWNED, PERMISSION_DENIED, fail
from activities.kube_client import CLUSTER_CALL_THREADS, call_api
from activities.providers.base import ProviderSettings, kubelet_boot_id, mark_replaced, read_node

_PROVIDER_ID = re.compile(r"^aws:///(?P<zone>[^/]+)/(?P<id>i-[0-9a-f]+)$")
REBOOT_KEY_TAG = "gpuheal.io/reboot-key"
REBOOT_STATE_TAG = "gpuheal.io/reboot-state"
REBOOT_FROM_TAG = "gpuheal.io/reboot-from-boot"  # the kubelet's boot id when the reboot was asked for
REBOOT_AT_TAG = "gpuheal.io/reboot-at"  # when the reboot was asked for (ISO 8601, UTC)
# Auto Scaling lifecycle states of an instance on its way out: a termination lifecycle hook holds it
# in Terminating:Wait (EC2 state still `running`) until the hook completes or times out (default 1 h,
# at most 48 h), then Terminating:Proceed and Terminated. The replacement is under way in each.
TERMINATING_LIFECYCLE = {"Terminating", "Terminating:Wait", "Terminating:Proceed", "Terminated"}
# botocore's errors raised before a request reached the endpoint (a read timeout or a dropped
# connection may come after it did, and are not among them).
NEVER_SENT = (EndpointConnectionError, ConnectTimeoutError, ProxyConnectionError)
_DENIED = {"UnauthorizedOperation", "AccessDenied", "AccessDeniedException", "AuthFailure"}
_GONE_STATES = {"shutting-down", "terminated"}
# One pooled connection per activity thread: botocore's default pool of 10 discards connections
# (with a urllib3 warning each) when more calls than that run at once.
AWS_CLIENT_CONFIG = Config(max_pool_connections=CLUSTER_CALL_THREADS)


def instance_id_from_provider_id(provider_id: str | None) -> str:
    m = _PROVIDER_ID.match(provider_id or "")
    if m is None:
        raise fail(INVALID_REQUEST, f"spec.providerID {provider_id!r} is not aws:///<zone>/<instance-id>")
    return m["id"]


class AwsProvider:
    """Instances found from the Node's spec.providerID (aws:///<zone>/<instance-id>)."""

    name = "aws"
    can_reboot = True

    def __init__(self, ec2, autoscaling, ssm, core: client.CoreV1Api):
        self.ec2, self.autoscaling, self.ssm, self.core = ec2, autoscaling, ssm, core

    @classmethod
    def from_settings(cls, core: client.CoreV1Api, settings: ProviderSettings) -> AwsProvider:
        """boto3 finds region, credentials and endpoints (AWS_ENDPOINT_URL) the standard way."""
        import boto3

        session = settings.boto3_session or boto3.Session()
        return cls(*(session.client(s, config=AWS_CLIENT_CONFIG) for s in ("ec2", "autoscaling", "ssm")), core)

    # --- plumbing ------------------------------------------------------------------------------
    async def _aws(self, what: str, fn, **kwargs):
        """Throttling and 5xx stay retryable; authorization errors do not."""
        try:
            return await asyncio.to_thread(fn, **kwargs)
        except ClientError as err:
            code = err.response.get("Error", {}).get("Code", "")
            if code in _DENIED:
                raise fail(PERMISSION_DENIED, f"{what}: {code}: {err.response['Error'].get('Message', '')}") from None
            raise

    async def _instance_id(self, node: str) -> str:
        return instance_id_from_provider_id((await read_node(self.core, node)).spec.provider_id)

    async def _rebooted_since(self, node: str, from_boot: str | None) -> bool:
        """Whether the kubelet reports a boot id moved on from the one an earlier attempt rebooted
        from. Only that proves the reboot: a node that was hung (NotReady) before it was ever sent
        would otherwise be rebooted by nobody. Waits a while (a third of the attempt's time, at most
        a minute) for the sign, since a reboot takes a moment to show."""
        if not from_boot:
            return False  # nothing to compare with: no proof, so the reboot is sent
        info = activity.info()
        budget = min(60.0, (info.start_to_close_timeout or timedelta(minutes=3)).total_seconds() / 3)
        deadline = time.monotonic() + budget
        while True:
            boot = kubelet_boot_id(await read_node(self.core, node))
            if boot and boot != from_boot:
                return True
            if time.monotonic() >= deadline:
                return False
            activity.heartbeat("waiting for signs of the earlier reboot")
            await asyncio.sleep(min(2.0, budget / 5))

    async def _describe(self, instance_id: str) -> dict | None:
        try:
            out = await self._aws("describe instance", self.ec2.describe_instances, InstanceIds=[instance_id])
        except ClientError as err:
            if err.response["Error"]["Code"] == "InvalidInstanceID.NotFound":
                return None
            raise
        found = [i for r in out["Reservations"] for i in r["Instances"]]
        return found[0] if found else None

    @staticmethod
    def _tags(instance: dict) -> dict[str, str]:
        return {t["Key"]: t["Value"] for t in instance.get("Tags", [])}

    @staticmethod
    def _require_owned(instance: dict, ownership_tag: str) -> None:
        key, _, value = ownership_tag.partition("=")
        if AwsProvider._tags(instance).get(key) != value:
            raise fail(NOT_OWNED, f"instance {instance['InstanceId']} lacks tag {ownership_tag}: gpuheal does not touch it")

    # --- reboot --------------------------------------------------------------------------------
    async def reboot(self, req: c.RebootRequest) -> c.RebootResult:
        n = await read_node(self.core, req.node)
        iid = instance_id_from_provider_id(n.spec.provider_id)
        inst = await self._describe(iid)
        if inst is None or inst["State"]["Name"] in _GONE_STATES:
            raise fail(NODE_GONE, f"instance {iid} of {req.node} is gone")
        self._require_owned(inst, req.ownership_tag)
        tags = self._tags(inst)
        mine = tags.get(REBOOT_KEY_TAG) == req.idempotency_key[:255]
        recorded_from = tags.get(REBOOT_FROM_TAG) or None
        if mine and tags.get(REBOOT_STATE_TAG) == "sent":
            # A retry: this reboot already went out.
            return c.RebootResult(instance_id=iid, rebooted=False, from_boot=recorded_from)
        if req.dry_run:
            return c.RebootResult(instance_id=iid, rebooted=False, dry_run=True)
        # The key (and the boot it reboots from) is written before the reboot and marked sent
        # after. A retry that finds it pending was cut off in between: if the node shows the
        # reboot, it went out; only if it shows none is it sent again.
        if mine and tags.get(REBOOT_STATE_TAG) == "pending" and self._booting(tags, req.boot_wait_s):
            # It may have gone out, and a GPU server takes minutes to boot: not sent again within its
            # boot window (the episode waits for the new boot, and knows what to do if none comes).
            return c.RebootResult(instance_id=iid, rebooted=True, from_boot=recorded_from)
        if mine and tags.get(REBOOT_STATE_TAG) == "pending" and await self._rebooted_since(req.node, recorded_from):
            await self._aws("tag instance", self.ec2.create_tags, Resources=[iid],
                            Tags=[{"Key": REBOOT_STATE_TAG, "Value": "sent"}])
            return c.RebootResult(instance_id=iid, rebooted=True, from_boot=recorded_from)
        from_boot = kubelet_boot_id(n)
        await self._aws("tag instance", self.ec2.create_tags, Resources=[iid], Tags=[
            {"Key": REBOOT_KEY_TAG, "Value": req.idempotency_key[:255]}, {"Key": REBOOT_STATE_TAG, "Value": "pending"},
            {"Key": REBOOT_FROM_TAG, "Value": (from_boot or "")[:255]},
            {"Key": REBOOT_AT_TAG, "Value": datetime.now(UTC).isoformat(timespec="seconds")}])
        try:
            await self._aws("reboot instance", self.ec2.reboot_instances, InstanceIds=[iid])
        except ClientError:
            # Refused by the API: nothing went out, so a retry sends it at once.
            await self._aws("tag instance", self.ec2.create_tags, Resources=[iid],
                            Tags=[{"Key": REBOOT_STATE_TAG, "Value": "refused"}])
            raise
        except NEVER_SENT:
            # No connection was made, so no reboot went out: the key is taken back (the state stays
            # pending), and a retry sends it, instead of waiting out a boot window for nothing.
            await self._aws("untag instance", self.ec2.delete_tags, Resources=[iid], Tags=[{"Key": REBOOT_KEY_TAG}])
            raise
        await self._aws("tag instance", self.ec2.create_tags, Resources=[iid],
                        Tags=[{"Key": REBOOT_STATE_TAG, "Value": "sent"}])
        return c.RebootResult(instance_id=iid, rebooted=True, from_boot=from_boot)

    @staticmethod
    def _booting(tags: dict[str, str], boot_wait_s: float) -> bool:
        """Whether a pending reboot was asked for less than a boot window ago."""
        try:
            asked = datetime.fromisoformat(tags[REBOOT_AT_TAG])
        except (KeyError, ValueError):
            return False  # asked before the time was kept: the old rule (a sign within a minute)
        return (datetime.now(UTC) - asked).total_seconds() < boot_wait_s

    async def _lifecycle_state(self, iid: str) -> str | None:
        found = await self._aws("describe ASG membership", self.autoscaling.describe_auto_scaling_instances,
                                InstanceIds=[iid])
        return found["AutoScalingInstances"][0].get("LifecycleState") if found["AutoScalingInstances"] else None

    # --- replace -------------------------------------------------------------------------------
    async def replace(self, req: c.ReplaceRequest) -> c.ReplaceResult:
        """Terminate (ASG: keeping capacity, so a new instance takes its place) or delete the Node
        (Karpenter replaces capacity whose Node and NodeClaim are deleted)."""
        iid = await self._instance_id(req.node)
        inst = await self._describe(iid)
        if inst is None or inst["State"]["Name"] in _GONE_STATES:
            return c.ReplaceResult(instance_id=iid, action="already_terminated")
        self._require_owned(inst, req.ownership_tag)
        if req.dry_run:
            return c.ReplaceResult(instance_id=iid, action="dry_run")
        if req.mode == "karpenter":
            # Karpenter replaces capacity whose Node (and NodeClaim) is deleted. Marked first: its
            # termination finalizer keeps the Node (and the old host reporting) while it drains.
            marked = await mark_replaced(self.core, req.node, req.idempotency_key)
            try:
                await call_api(self.core.delete_node, req.node)
            except ApiException as err:
                if err.status != 404:
                    raise
            return c.ReplaceResult(instance_id=iid, action="karpenter", marked=marked)
        asg = None
        if req.mode == "auto":
            found = await self._aws("describe ASG membership", self.autoscaling.describe_auto_scaling_instances,
                                    InstanceIds=[iid])
            asg = found["AutoScalingInstances"][0]["AutoScalingGroupName"] if found["AutoScalingInstances"] else None
            lifecycle = found["AutoScalingInstances"][0].get("LifecycleState") if asg else None
            if lifecycle in TERMINATING_LIFECYCLE:
                # A retry: the terminate was accepted and a lifecycle hook holds the instance.
                return c.ReplaceResult(instance_id=iid, action="asg", lifecycle_state=lifecycle)
        if asg is not None:
            await self._aws("terminate in ASG", self.autoscaling.terminate_instance_in_auto_scaling_group,
                            InstanceId=iid, ShouldDecrementDesiredCapacity=False)
        else:
            await self._aws("terminate instance", self.ec2.terminate_instances, InstanceIds=[iid])
        after = await self._describe(iid)
        lifecycle = await self._lifecycle_state(iid) if asg else None
        if after is not None and after["State"]["Name"] not in _GONE_STATES and lifecycle not in TERMINATING_LIFECYCLE:
            raise fail(NO_EFFECT, f"instance {iid} still {after['State']['Name']} after terminate"
                       + (f" (Auto Scaling lifecycle {lifecycle})" if asg else ""))
        return c.ReplaceResult(instance_id=iid, action="asg" if asg else "ec2", lifecycle_state=lifecycle)

    # --- boot id (when the agent is gone) ------------------------------------------------------
    async def boot_id(self, n: client.V1Node) -> str | None:
        """Read on the instance through SSM, for a node whose kubelet reports none."""
        iid = instance_id_from_provider_id(n.spec.provider_id)
        sent = await self._aws("ssm send-command", self.ssm.send_command, InstanceIds=[iid],
                               DocumentName="AWS-RunShellScript",
                               Parameters={"commands": ["cat /proc/sys/kernel/random/boot_id"]})
        cid = sent["Command"]["CommandId"]
        for _ in range(30):
            out = await self._aws("ssm get-command-invocation", self.ssm.get_command_invocation,
                                  CommandId=cid, InstanceId=iid)
            if out["Status"] in ("Success", "Failed", "Cancelled", "TimedOut"):
                if out["Status"] != "Success":
                    raise RuntimeError(f"SSM command {cid} ended {out['Status']}")
                return out.get("StandardOutputContent", "").strip() or None
            activity.heartbeat(out["Status"])
            await asyncio.sleep(1)
        raise RuntimeError(f"SSM command {cid} did not finish")
