"""Reboot against moto's server mode, once per idempotency key: an attempt cut off at any point is
neither lost nor sent twice, and the boot id tells a reboot that happened."""

from datetime import UTC, datetime, timedelta

import pytest
from botocore.exceptions import ClientError

import api as c
from activities.providers.aws import REBOOT_AT_TAG, REBOOT_FROM_TAG, REBOOT_KEY_TAG, REBOOT_STATE_TAG
from tests.activities.test_cloud import run


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


async def test_boot_id_from_kubelet_then_ssm(cloud):
    acts, instance, _, _, kube = cloud
    instance("n7")
    # moto's SSM reports Success with empty output: no boot id known, and it says so.
    assert await run(acts.boot_id, c.BootIdRequest(node="n7")) is None
    kube.set_boot_id("n7", "boot-k")
    assert await run(acts.boot_id, c.BootIdRequest(node="n7")) == "boot-k"


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
