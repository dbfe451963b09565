"""Cloud activities against moto's server mode, with nodes in the fake Kubernetes API server."""

from datetime import UTC, datetime, timedelta

import pytest
from botocore.exceptions import ClientError
from kubernetes import client
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

import api as c
from activities.cloud import CloudActivities
from activities.kube import KubeActivities
from activities.providers.aws import (
    REBOOT_AT_TAG,
    REBOOT_FROM_TAG,
    REBOOT_KEY_TAG,
    REBOOT_STATE_TAG,
    instance_id_from_provider_id,
)
from sim.fake_kube import FakeKubeServer

OWNED = [{"Key": "gpuheal.io/managed", "Value": "true"}]


@pytest.fixture
def cloud(aws):
    server = FakeKubeServer().start()
    api = server.api_client()
    ec2, asg, ssm = aws("ec2"), aws("autoscaling"), aws("ssm")
    ami = ec2.describe_images()["Images"][0]["ImageId"]

    def instance(node: str, tags=OWNED, in_asg: bool = False) -> str:
        if in_asg:
            ec2.create_launch_template(LaunchTemplateName=f"lt-{node}", LaunchTemplateData={"ImageId": ami,
                                                                                           "InstanceType": "p5.48xlarge"})
            asg.create_auto_scaling_group(AutoScalingGroupName=f"asg-{node}", MinSize=1, MaxSize=2, DesiredCapacity=1,
                                          LaunchTemplate={"LaunchTemplateName": f"lt-{node}"},
                                          AvailabilityZones=["us-east-1a"],
                                          Tags=[{"Key": t["Key"], "Value": t["Value"], "PropagateAtLaunch": True}
                                                for t in tags])
            iid = asg.describe_auto_scaling_groups(AutoScalingGroupNames=[f"asg-{node}"])[
                "AutoScalingGroups"][0]["Instances"][0]["InstanceId"]
        else:
            iid = ec2.run_instances(ImageId=ami, MinCount=1, MaxCount=1, InstanceType="p5.48xlarge",
                                    Placement={"AvailabilityZone": "us-east-1a"},
                                    TagSpecifications=[{"ResourceType": "instance", "Tags": tags}] if tags else [])[
                "Instances"][0]["InstanceId"]
        server.kube.add_node(node, provider_id=f"aws:///us-east-1a/{iid}")
        return iid

    yield CloudActivities.aws(ec2, asg, ssm, client.CoreV1Api(api)), instance, ec2, asg, server.kube
    api.close()
    server.stop()


def run(fn, *args):
    return ActivityEnvironment().run(fn, *args)


def state(ec2, iid):
    return ec2.describe_instances(InstanceIds=[iid])["Reservations"][0]["Instances"][0]["State"]["Name"]


def test_provider_id_parsing():
    assert instance_id_from_provider_id("aws:///us-east-1a/i-0123abcd") == "i-0123abcd"
    with pytest.raises(ApplicationError):
        instance_id_from_provider_id("gce://x/y")


async def test_reboot_once_per_key(cloud):
    acts, instance, ec2, _, _ = cloud
    iid = instance("n1")
    first = await run(acts.reboot, c.RebootRequest(node="n1", idempotency_key="ep1/reboot/1"))
    assert first.rebooted and first.instance_id == iid
    again = await run(acts.reboot, c.RebootRequest(node="n1", idempotency_key="ep1/reboot/1"))
    assert not again.rebooted, "a retried activity must not reboot twice"
    tags = {t["Key"]: t["Value"] for t in ec2.describe_tags(Filters=[{"Name": "resource-id", "Values": [iid]}])["Tags"]}
    assert tags[REBOOT_STATE_TAG] == "sent"
    assert (await run(acts.reboot, c.RebootRequest(node="n1", idempotency_key="ep1/reboot/2"))).rebooted


def cut_off_after_pending(ec2, kube, iid: str, node: str) -> None:
    """What an attempt leaves when it dies right after tagging its reboot pending (from boot-a)."""
    kube.set_boot_id(node, "boot-a")
    ec2.create_tags(Resources=[iid], Tags=[{"Key": REBOOT_KEY_TAG, "Value": "ep1/reboot/1"},
                                           {"Key": REBOOT_STATE_TAG, "Value": "pending"},
                                           {"Key": REBOOT_FROM_TAG, "Value": "boot-a"}])


def count_reboots(ec2) -> list:
    sent = []
    ec2.meta.events.register("provide-client-params.ec2.RebootInstances", lambda params, **kw: sent.append(params["InstanceIds"]))
    return sent


async def test_reboot_cut_off_before_marked_sent_is_not_sent_again(cloud):
    """A controller killed between RebootInstances and the `sent` tag: the retry sees the node's
    new boot id and marks the reboot sent instead of rebooting again."""
    acts, instance, ec2, _, kube = cloud
    iid = instance("n1")
    cut_off_after_pending(ec2, kube, iid, "n1")
    kube.set_boot_id("n1", "boot-b")  # the reboot that attempt sent has happened
    sent = count_reboots(ec2)
    r = await run(acts.reboot, c.RebootRequest(node="n1", idempotency_key="ep1/reboot/1"))
    assert r.rebooted and sent == []
    tags = {t["Key"]: t["Value"] for t in ec2.describe_tags(Filters=[{"Name": "resource-id", "Values": [iid]}])["Tags"]}
    assert tags[REBOOT_STATE_TAG] == "sent"


async def test_reboot_pending_without_a_sign_is_sent(cloud):
    """Cut off before the reboot went out: no new boot id, still Ready: it is sent now, once."""
    acts, instance, ec2, _, kube = cloud
    iid = instance("n1")
    cut_off_after_pending(ec2, kube, iid, "n1")
    sent = count_reboots(ec2)
    r = await run(acts.reboot, c.RebootRequest(node="n1", idempotency_key="ep1/reboot/1"))
    assert r.rebooted and sent == [[iid]]
    again = await run(acts.reboot, c.RebootRequest(node="n1", idempotency_key="ep1/reboot/1"))
    assert not again.rebooted and sent == [[iid]]


async def test_hung_node_with_pending_reboot_is_rebooted(cloud):
    """NotReady is no proof the pending reboot went out (a hung node is NotReady too): with the
    boot id unchanged, the reboot is sent."""
    acts, instance, ec2, _, kube = cloud
    iid = instance("n1")
    cut_off_after_pending(ec2, kube, iid, "n1")
    kube.set_node_ready("n1", False)
    sent = count_reboots(ec2)
    r = await run(acts.reboot, c.RebootRequest(node="n1", idempotency_key="ep1/reboot/1"))
    assert r.rebooted and sent == [[iid]]
    assert r.from_boot == "boot-a", "the kubelet's boot id it rebooted from, to tell a reboot that happened"


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


async def test_boot_id_from_kubelet_then_ssm(cloud):
    acts, instance, _, _, kube = cloud
    instance("n7")
    # moto's SSM reports Success with empty output: no boot id known, and it says so.
    assert await run(acts.boot_id, c.BootIdRequest(node="n7")) is None
    kube.set_boot_id("n7", "boot-k")
    assert await run(acts.boot_id, c.BootIdRequest(node="n7")) == "boot-k"


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


async def test_pending_reboot_is_not_sent_again_within_the_boot_window(cloud):
    """A reboot that may have gone out 2 minutes ago shows no new boot yet (GPU servers take many
    minutes): it is not sent again within the policy's boot window; past it, it is (defect 13)."""
    acts, instance, ec2, _, kube = cloud
    iid = instance("n1")
    cut_off_after_pending(ec2, kube, iid, "n1")
    asked = (datetime.now(UTC) - timedelta(minutes=2)).isoformat(timespec="seconds")
    ec2.create_tags(Resources=[iid], Tags=[{"Key": REBOOT_AT_TAG, "Value": asked}])
    sent = count_reboots(ec2)
    r = await run(acts.reboot, c.RebootRequest(node="n1", idempotency_key="ep1/reboot/1", boot_wait_s=900))
    assert r.rebooted and r.from_boot == "boot-a" and sent == [], "not re-sent 2 min into a 15 min boot"
    r = await run(acts.reboot, c.RebootRequest(node="n1", idempotency_key="ep1/reboot/1", boot_wait_s=60))
    assert r.rebooted and sent == [[iid]], "past the boot window with no new boot: sent"


async def test_refused_reboot_is_sent_on_retry(cloud):
    """RebootInstances refused (throttled): nothing went out, so the retry sends it at once."""
    acts, instance, ec2, _, _ = cloud
    instance("n1")
    calls = []

    def refuse_once(params, **kw):
        calls.append(params["InstanceIds"])
        if len(calls) == 1:
            raise ClientError({"Error": {"Code": "RequestLimitExceeded", "Message": "slow down"}}, "RebootInstances")

    ec2.meta.events.register("provide-client-params.ec2.RebootInstances", refuse_once)
    with pytest.raises(ClientError):
        await run(acts.reboot, c.RebootRequest(node="n1", idempotency_key="ep1/reboot/1", boot_wait_s=900))
    r = await run(acts.reboot, c.RebootRequest(node="n1", idempotency_key="ep1/reboot/1", boot_wait_s=900))
    assert r.rebooted and len(calls) == 2
