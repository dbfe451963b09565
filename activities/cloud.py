"""Cloud side effects as activities: reboot, replace and the boot id, through the fleet's provider
(activities/providers: AWS, Cluster API). What every provider shares is here: the Node read,
the kubelet's boot id first, and the replaced mark on the Node."""

from __future__ import annotations

from kubernetes import client
from temporalio import activity

import api as c
from activities.errors import INVALID_REQUEST, fail
from activities.providers.base import CloudProvider, kubelet_boot_id, mark_replaced, read_node


class CloudActivities:
    def __init__(self, provider: CloudProvider, core: client.CoreV1Api):
        self.provider, self.core = provider, core

    @classmethod
    def aws(cls, ec2, autoscaling, ssm, core: client.CoreV1Api) -> CloudActivities:
        from activities.providers.aws import AwsProvider

        return cls(AwsProvider(ec2, autoscaling, ssm, core), core)

    @activity.defn(name=c.CLOUD_REBOOT)
    async def reboot(self, req: c.RebootRequest) -> c.RebootResult:
        if not self.provider.can_reboot:
            # Fails the rung, which is no evidence for replace: the node stays quarantined for a person,
            # who may `gpuheal approve NODE replace`.
            raise fail(INVALID_REQUEST, f"provider {self.provider.name} has no reboot: {req.node} is left for a person "
                       "(gpuheal approve NODE replace replaces it)")
        return await self.provider.reboot(req)

    @activity.defn(name=c.CLOUD_REPLACE)
    async def replace(self, req: c.ReplaceRequest) -> c.ReplaceResult:
        """The provider's replacement, then the Node marked replaced (unless the provider marked it
        first, as it must when its replacement deletes the Node) so its old host's last reports
        start nothing."""
        done = await self.provider.replace(req)
        if done.action == "dry_run" or done.marked:
            return done
        return done.model_copy(update={"marked": await mark_replaced(self.core, req.node, req.idempotency_key)})

    @activity.defn(name=c.CLOUD_BOOT_ID)
    async def boot_id(self, req: c.BootIdRequest) -> str | None:
        """The node's boot id without its agent: the kubelet's (status.nodeInfo.bootID) when it
        reports one, else the provider's way (SSM on AWS). None when neither can tell."""
        n = await read_node(self.core, req.node)
        return kubelet_boot_id(n) or await self.provider.boot_id(n)
