"""Red team, issue 22 second pass: the real activities (moto, the fake API server, the simulated
NVML with real processes) in the cases beside each fix's own test. xfail(strict): a defect found."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime, timedelta

import pytest
from botocore.exceptions import EndpointConnectionError
from kubernetes import client
from temporalio.testing import ActivityEnvironment

import api as c
from activities.kube import replaced_host
from activities.ledger import SqliteLedger
from activities.node import NodeActivities
from activities.providers.aws import REBOOT_STATE_TAG
from sim.nvml import SimulatedNvml
from tests.activities.conftest import cloud  # noqa: F401 (the fixture)
from tests.activities.test_cloud import run
from tests.activities.test_node import gpu_process, node  # noqa: F401 (the fixture)


# --- defect 13: a pending reboot is not re-sent inside the boot window ------------------------------
def tags_of(ec2, iid: str) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in ec2.describe_tags(Filters=[{"Name": "resource-id", "Values": [iid]}])["Tags"]}


async def test_reboot_whose_request_never_left_is_sent_on_retry(cloud):  # noqa: F811
    acts, instance, ec2, _, kube = cloud
    iid = instance("n1")
    kube.set_boot_id("n1", "boot-a")
    went_out = []

    def connection_fails_once(params, **kw):
        if not went_out and not getattr(connection_fails_once, "failed", False):
            connection_fails_once.failed = True
            raise EndpointConnectionError(endpoint_url="https://ec2.us-east-1.amazonaws.com")
        went_out.append(params["InstanceIds"])

    ec2.meta.events.register("provide-client-params.ec2.RebootInstances", connection_fails_once)
    req = c.RebootRequest(node="n1", idempotency_key="ep1/reboot/1", boot_wait_s=900)
    with pytest.raises(EndpointConnectionError):
        await run(acts.reboot, req)
    assert tags_of(ec2, iid)[REBOOT_STATE_TAG] == "pending"
    r = await run(acts.reboot, req)  # Temporal's retry, seconds later
    assert r.rebooted
    assert went_out == [[iid]], "answered rebooted, but no RebootInstances ever reached EC2"


async def test_reboot_refused_then_new_attempt_key_is_sent(cloud):  # noqa: F811
    """A second attempt of the rung (new key) inside the first one's boot window is sent: the window
    is per key, not per instance (held)."""
    acts, instance, ec2, _, kube = cloud
    iid = instance("n2")
    kube.set_boot_id("n2", "boot-a")
    sent = []
    ec2.meta.events.register("provide-client-params.ec2.RebootInstances", lambda params, **kw: sent.append(1))
    assert (await run(acts.reboot, c.RebootRequest(node="n2", idempotency_key="ep1/reboot/1", boot_wait_s=900))).rebooted
    assert (await run(acts.reboot, c.RebootRequest(node="n2", idempotency_key="ep2/reboot/1", boot_wait_s=900))).rebooted
    assert len(sent) == 2 and tags_of(ec2, iid)[REBOOT_STATE_TAG] == "sent"


# --- defect 14: the replaced mark ------------------------------------------------------------------
def node_obj(boot: str | None, ann: dict) -> client.V1Node:
    return client.V1Node(metadata=client.V1ObjectMeta(name="n", annotations=ann),
                         status=client.V1NodeStatus(node_info=client.V1NodeSystemInfo(
                             architecture="", boot_id=boot or "", container_runtime_version="", kernel_version="",
                             kube_proxy_version="", kubelet_version="", machine_id="", operating_system="",
                             os_image="", system_uuid="")))


def test_replaced_mark_without_a_boot_id_refuses_every_later_host():
    """The mark written when the kubelet reported no boot id (replaced-boot ""): a new host under the
    same name is then never ours, for good. Documented here: safe (nothing done), but such a node is
    never remediated again until a person removes the annotation (held as the current rule)."""
    ann = {c.REPLACED_ANNOTATION: "ep/1/replace/1", c.REPLACED_BOOT_ANNOTATION: ""}
    assert replaced_host(node_obj("boot-new", ann)) is not None
    assert replaced_host(node_obj("boot-new", {**ann, c.REPLACED_BOOT_ANNOTATION: "boot-old"})) is None


async def test_replace_marks_the_node_with_the_old_hosts_boot(cloud):  # noqa: F811
    """cloud.replace then kube.check_node against the fake API server: the old host is refused, and
    the same Node showing a new boot id is ours (held)."""
    from activities.kube import KubeActivities
    acts, instance, ec2, _, kube = cloud
    instance("n3")
    kube.set_boot_id("n3", "boot-old")
    r = await run(acts.replace, c.ReplaceRequest(node="n3", idempotency_key="ep/1/replace/1"))
    assert r.marked
    checker = KubeActivities(acts.core)
    assert not (await run(checker.check_node, c.NodeCheckRequest(node="n3"))).ours
    kube.set_boot_id("n3", "boot-new")
    assert (await run(checker.check_node, c.NodeCheckRequest(node="n3"))).ours


# --- defect 4: the kill -----------------------------------------------------------------------------
class ListedThenGone(SimulatedNvml):
    """The driver listed a pid once; by the next look the process that held a context is gone and
    the kernel has handed its pid to another (non-GPU) process. Real NVML lists a snapshot too."""

    def nvmlDeviceGetComputeRunningProcesses(self, h):  # noqa: N802
        out = super().nvmlDeviceGetComputeRunningProcesses(h)
        self._alive(h).processes = []
        return out


async def test_kill_never_signals_a_pid_reused_right_after_the_listing(tmp_path):
    from health.nics import NicExpectation
    from health.runner import ProbeConfig
    nv = ListedThenGone("a1", gpus=4)
    cfg = ProbeConfig(expected_gpus=4, nics=NicExpectation(ports=0), require_nvidia_smi=False, sysfs_infiniband=tmp_path)
    acts = NodeActivities(cfg, nv, dcgmi=str(tmp_path / "no-dcgmi"))
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        nv.gpus[1].processes = [(bystander.pid, 1 << 30)]  # the pid, as the driver listed it a moment ago
        await ActivityEnvironment().run(acts.kill_gpu_processes, c.KillRequest(node="a1", gpus=[1], grace_s=1))
        assert bystander.poll() is None, "a process holding no GPU context was killed"
    finally:
        bystander.kill()
        bystander.wait()


async def test_kill_on_mig_gpu_with_no_instance_named_spares_everyone(node):  # noqa: F811
    """MIG on, and the finding names the GPU but no instance (a kernel-log Xid): no tenant of any
    instance is killed (held; the rung then says what it spared)."""
    nv, acts = node
    nv.gpus[1].mig = True
    with gpu_process(nv, 1) as a, gpu_process(nv, 2) as b:
        nv.gpus[1].processes = [(a.pid, 1 << 30, 1, 0), (b.pid, 1 << 30, 2, 0)]
        nv.gpus[2].processes = []
        result = await ActivityEnvironment().run(acts.kill_gpu_processes, c.KillRequest(
            node="a1", gpus=[1], mig=[c.MigTarget(gpu_index=3, gpu_instance_id=1)], grace_s=1))
        assert result.killed == [] and len(result.spared) == 2
        assert a.poll() is None and b.poll() is None


async def test_kill_with_mig_target_on_a_non_mig_gpu_kills_that_gpu_only(node):  # noqa: F811
    """A MIG target for GPU 1 while GPU 2 (not MIG) is also named: GPU 2's process goes, GPU 0's stays."""
    nv, acts = node
    with gpu_process(nv, 0) as other, gpu_process(nv, 2) as mine:
        result = await ActivityEnvironment().run(acts.kill_gpu_processes, c.KillRequest(
            node="a1", gpus=[2], mig=[c.MigTarget(gpu_index=1, gpu_instance_id=1)], grace_s=2))
        assert [p.pid for p in result.killed] == [mine.pid]
        assert mine.wait(timeout=5) != 0 and other.poll() is None


# --- defect 15b: per-board counting ------------------------------------------------------------------
def rec(episode: str, boards: list[str], hw: list[str], at: datetime) -> c.RemediationRecord:
    return c.RemediationRecord(node="n", episode=episode, hardware_ids=hw, boards=boards, fault_class="xid",
                               attribution="platform", rungs=["reset"], outcome="returned", started_at=at,
                               ended_at=at)


def test_board_count_without_serials_counts_each_gpu_apart(tmp_path):
    """No serial reported (boards are then the GPU UUIDs): two GPUs of one board count apart (the
    safe side: never a replacement for a neighbour's faults), and SQLite never matches by substring."""
    ledger = SqliteLedger(tmp_path / "l.db")
    now = datetime.now(UTC)
    ledger.record(rec("e1", ["GPU-1"], ["GPU-1", "GPU-10"], now))
    ledger.record(rec("e2", ["GPU-10"], ["GPU-1", "GPU-10"], now))
    since = now - timedelta(days=1)
    assert ledger.count_recent(["GPU-1"], since, None, by_board=True) == 1
    assert ledger.count_recent(["GPU-1"], since, None, by_board=False) == 2
    assert ledger.count_recent([], since, None, by_board=True) == 0
    assert ledger.count_recent(["GPU-1"], since, "e1", by_board=True) == 0


def test_dynamo_board_count_without_serials_counts_each_gpu_apart(aws):
    """The same attack on DynamoDB (moto): boards are matched by exact key, never as a prefix (held)."""
    from activities.ledger import DynamoLedger
    ddb = aws("dynamodb")
    DynamoLedger.create_table(ddb, "ledger")
    ledger = DynamoLedger(ddb, "ledger")
    now = datetime.now(UTC)
    ledger.record(rec("e1", ["GPU-1"], ["GPU-1", "GPU-10"], now))
    ledger.record(rec("e2", ["GPU-10"], ["GPU-1", "GPU-10"], now))
    dry = rec("e3", ["GPU-1"], ["GPU-1"], now).model_copy(update={"outcome": "dry_run"})
    ledger.record(dry)
    since = now - timedelta(days=1)
    assert ledger.count_recent(["GPU-1"], since, None, by_board=True) == 1, "a dry run is no remediation"
    assert ledger.count_recent(["GPU-1"], since, None, by_board=False) == 2
    assert ledger.count_recent(["GPU-1"], since, "e1", by_board=True) == 0


async def test_karpenter_replaced_node_held_by_its_finalizer_is_not_ours(cloud):  # noqa: F811
    from activities.kube import KubeActivities
    acts, instance, ec2, _, kube = cloud
    instance("k1")
    kube.set_boot_id("k1", "boot-old")
    before = kube.get("Node", "", "k1")
    r = await run(acts.replace, c.ReplaceRequest(node="k1", idempotency_key="ep/1/replace/1", mode="karpenter"))
    assert r.action == "karpenter"
    # The API server keeps a Node with a finalizer until Karpenter removes it (karpenter.sh docs,
    # Disruption: "The finalizer blocks deletion of the node object while the Termination
    # Controller taints and drains the node"); the fake API server deletes at once, so it is put back
    # as the real one shows it meanwhile.
    held = {**before, "metadata": {**before["metadata"], "finalizers": ["karpenter.sh/termination"],
                                   "deletionTimestamp": datetime.now(UTC).isoformat(timespec="seconds")}}
    held["metadata"].pop("resourceVersion", None)
    kube.put("Node", held)
    assert kube.get("Node", "", "k1")["metadata"].get("deletionTimestamp")
    found = await run(KubeActivities(acts.core).check_node, c.NodeCheckRequest(node="k1"))
    assert not found.ours, "a Node being deleted after gpuheal replaced it is no node to remediate"
