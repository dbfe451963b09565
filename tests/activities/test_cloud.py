"""Cloud activities against moto's server mode, with nodes in the fake Kubernetes API server."""


import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

import api as c
from activities.kube import KubeActivities
from activities.providers.aws import (
    instance_id_from_provider_id,
)


def run(fn, *args):
    return ActivityEnvironment().run(fn, *args)


def state(ec2, iid):
    return ec2.describe_instances(InstanceIds=[iid])["Reservations"][0]["Instances"][0]["State"]["Name"]


def test_provider_id_parsing():
    assert instance_id_from_provider_id("aws:///us-east-1a/i-0123abcd") == "i-0123abcd"
    with pytest.raises(ApplicationError):
        instance_id_from_provider_id("gce://x/y")


async def test_unowned_instance_is_refused(cloud):
    acts, instance, ec2, _, _ = cloud
    iid = instance("n2", tags=[{"Key": "team", "Value": "x"}])
    for call, req in ((acts.reboot, c.RebootRequest(node="n2", idempotency_key="k")),
                      (acts.replace, c.ReplaceRequest(node="n2", idempotency_key="k"))):
        with pytest.raises(ApplicationError) as err:
            await run(call, req)
        assert err.value.type == "NotOwned" and err.value.non_retryable
    assert state(ec2, iid) == "running"


async def test_replace_plain_instance_and_idempotent(cloud):
    acts, instance, ec2, _, _ = cloud
    iid = instance("n3")
    r = await run(acts.replace, c.ReplaceRequest(node="n3", idempotency_key="k"))
    assert r.action == "ec2" and state(ec2, iid) in ("shutting-down", "terminated")
    assert (await run(acts.replace, c.ReplaceRequest(node="n3", idempotency_key="k"))).action == "already_terminated"


async def test_replaced_node_is_marked_and_its_old_host_is_not_ours(cloud):
    """The terminated host runs (and reports) on a while: the Node says which host was replaced, and
    the node check refuses reports from it; a new host under the same name is ours (issue 22, 14)."""
    acts, instance, _, _, kube = cloud
    instance("n10")
    kube.set_boot_id("n10", "boot-old")
    r = await run(acts.replace, c.ReplaceRequest(node="n10", idempotency_key="remediate/n10/run/replace/1"))
    assert r.marked
    ann = kube.get("Node", "", "n10")["metadata"]["annotations"]
    assert ann[c.REPLACED_ANNOTATION] == "remediate/n10/run/replace/1" and ann[c.REPLACED_BOOT_ANNOTATION] == "boot-old"
    check = KubeActivities(acts.core)
    old = await run(check.check_node, c.NodeCheckRequest(node="n10"))
    assert old.exists and not old.ours and "was replaced" in old.reason
    again = await run(acts.replace, c.ReplaceRequest(node="n10", idempotency_key="remediate/n10/run/replace/1"))
    assert again.action == "already_terminated" and again.marked
    kube.set_boot_id("n10", "boot-new")  # another machine registered under the name
    assert (await run(check.check_node, c.NodeCheckRequest(node="n10"))).ours


async def test_replaced_node_refuses_the_old_hosts_report_once_the_new_host_took_the_name(cloud):
    """The report's boot id decides, not only the Node's: once a new host registered under the name,
    a late report from the old host (or any boot but the kubelet's now) is refused; the new host's is ours."""
    acts, instance, _, _, kube = cloud
    instance("n11")
    kube.set_boot_id("n11", "boot-old")
    assert (await run(acts.replace, c.ReplaceRequest(node="n11", idempotency_key="remediate/n11/run/replace/1"))).marked
    kube.set_boot_id("n11", "boot-new")
    check = KubeActivities(acts.core)
    old = await run(check.check_node, c.NodeCheckRequest(node="n11", boot_id="boot-old"))
    assert old.exists and not old.ours and "boot-old" in old.reason
    assert not (await run(check.check_node, c.NodeCheckRequest(node="n11", boot_id="boot-other"))).ours
    assert (await run(check.check_node, c.NodeCheckRequest(node="n11", boot_id="boot-new"))).ours
    assert (await run(check.check_node, c.NodeCheckRequest(node="n11"))).ours


async def test_replace_in_asg_keeps_capacity(cloud):
    acts, instance, ec2, asg, _ = cloud
    iid = instance("n4", in_asg=True)
    r = await run(acts.replace, c.ReplaceRequest(node="n4", idempotency_key="k"))
    assert r.action == "asg"
    group = asg.describe_auto_scaling_groups(AutoScalingGroupNames=["asg-n4"])["AutoScalingGroups"][0]
    assert group["DesiredCapacity"] == 1
    assert iid not in [i["InstanceId"] for i in group["Instances"]], "a replacement took its place"


async def test_replace_karpenter_deletes_node(cloud):
    acts, instance, _, _, kube = cloud
    instance("n5")
    r = await run(acts.replace, c.ReplaceRequest(node="n5", idempotency_key="k", mode="karpenter"))
    assert r.action == "karpenter" and not kube.list("Node", None, fields="metadata.name=n5")


async def test_dry_run_touches_nothing(cloud):
    acts, instance, ec2, _, _ = cloud
    iid = instance("n6")
    assert (await run(acts.replace, c.ReplaceRequest(node="n6", idempotency_key="k", dry_run=True))).action == "dry_run"
    assert (await run(acts.reboot, c.RebootRequest(node="n6", idempotency_key="k", dry_run=True))).dry_run
    assert state(ec2, iid) == "running"


async def test_missing_node_is_node_gone(cloud):
    acts, *_ = cloud
    with pytest.raises(ApplicationError) as err:
        await run(acts.reboot, c.RebootRequest(node="ghost", idempotency_key="k"))
    assert err.value.type == "NodeGone"


async def test_karpenter_replacement_checks_ownership_before_deleting_the_node(cloud):
    acts, instance, _, _, kube = cloud
    instance("n8", tags=[{"Key": "team", "Value": "someone-else"}])
    with pytest.raises(ApplicationError) as err:
        await run(acts.replace, c.ReplaceRequest(node="n8", idempotency_key="k", mode="karpenter"))
    assert err.value.type == "NotOwned"
    assert kube.list("Node", None, fields="metadata.name=n8"), "the Node was not deleted"


class HookedAutoScaling:
    """moto's Auto Scaling with a termination lifecycle hook, as AWS documents it (moto has none):
    TerminateInstanceInAutoScalingGroup leaves the instance `running` in EC2 and in
    Terminating:Wait until the hook completes or times out (lifecycle-hooks-overview)."""

    def __init__(self, real):
        self.real, self.waiting = real, set()

    def terminate_instance_in_auto_scaling_group(self, InstanceId, ShouldDecrementDesiredCapacity):  # noqa: N803
        self.waiting.add(InstanceId)
        return {"Activity": {"StatusCode": "InProgress", "Description": f"Terminating EC2 instance: {InstanceId}"}}

    def describe_auto_scaling_instances(self, InstanceIds):  # noqa: N803
        out = self.real.describe_auto_scaling_instances(InstanceIds=InstanceIds)
        for i in out["AutoScalingInstances"]:
            if i["InstanceId"] in self.waiting:
                i["LifecycleState"] = "Terminating:Wait"
        return out

    def __getattr__(self, name):
        return getattr(self.real, name)


async def test_replace_behind_a_lifecycle_hook_is_under_way(cloud):
    """A termination hook holds the instance (still `running`): the replacement is under way, not
    failed, and a retry does not terminate again (issue 22, defect 13)."""
    acts, instance, ec2, asg, _ = cloud
    iid = instance("n9", in_asg=True)
    acts.provider.autoscaling = HookedAutoScaling(asg)
    r = await run(acts.replace, c.ReplaceRequest(node="n9", idempotency_key="k"))
    assert (r.action, r.lifecycle_state) == ("asg", "Terminating:Wait") and state(ec2, iid) == "running"
    again = await run(acts.replace, c.ReplaceRequest(node="n9", idempotency_key="k"))
    assert again.lifecycle_state == "Terminating:Wait"
