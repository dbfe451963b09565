"""`gpuheal controller` as a process: kubeconfig to the fake API server, an application fault handled."""

import asyncio
import os
import signal
import subprocess
import sys

from temporalio.worker import Worker

from activities.node import NodeActivities
from api.episode import RemediationResult
from api.names import node_task_queue, remediation_workflow_id
from health.nics import NicExpectation
from health.runner import ProbeConfig
from policies.findings import Finding, HealthReport
from policies.loader import default_policy, policy_yaml
from sim.fake_kube import FakeKubeServer
from sim.nvml import SimulatedNvml
from workers.reporting import send_report


async def test_controller_process_runs_an_episode(dev_env, uniq, tmp_path):
    server = FakeKubeServer().start()
    node, tq = f"ctl-{uniq}", f"ctl-{uniq}"
    server.kube.add_node(node, labels={"nvidia.com/gpu.present": "true"})  # the controller's GPU node selector
    server.kube.add_pod("job-0", node)
    cfg = server.write_kubeconfig(tmp_path / "kubeconfig")
    address = dev_env.client.service_client.config.target_host
    policy = tmp_path / "policy.yaml"
    policy.write_text(policy_yaml(default_policy().scaled(0.001)))
    proc = subprocess.Popen([sys.executable, "-m", "workers.cli", "controller", "--temporal", address, "--task-queue", tq,
                             "--kubeconfig", str(cfg), "--ledger", str(tmp_path / "ledger.db"), "--policy", str(policy)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "AWS_DEFAULT_REGION": "us-east-1"})
    nv = SimulatedNvml(node, gpus=8)
    (tmp_path / "proc/sys/kernel/random").mkdir(parents=True)
    (tmp_path / "proc/sys/kernel/random/boot_id").write_text("b1\n")
    acts = NodeActivities(ProbeConfig(expected_gpus=8, nics=NicExpectation(ports=0), require_nvidia_smi=False,
                                      sysfs_infiniband=tmp_path), nv, proc=tmp_path / "proc")
    try:
        async with Worker(dev_env.client, task_queue=node_task_queue(node, "default"),
                          activities=acts.activities()):
            await send_report(dev_env.client, HealthReport(node=node, boot_id="b1", seq=1, findings=[
                Finding(kind="xid", xid=13, gpu_index=1)]), node=node, task_queue=tq)
            handle = dev_env.client.get_workflow_handle(remediation_workflow_id(node, "default"), result_type=RemediationResult)
            result = await asyncio.wait_for(handle.result(), 120)
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
        server.stop()
    assert (result.outcome, result.attribution, result.rungs) == ("returned", "application", ["kill"]), err[-2000:]
    ann = server.kube.get("Pod", "default", "job-0")["metadata"]["annotations"]
    assert ann["gpuheal.io/failure-attribution"] == "application"
    assert proc.returncode == 0 and "serving" in err


def test_bad_policy_is_one_line_naming_the_key(tmp_path):
    bad = tmp_path / "policy.yaml"
    bad.write_text("ladder:\n  reboot:\n    action_timeout: soon\n")
    run = subprocess.run([sys.executable, "-m", "workers.cli", "controller", "--policy", str(bad)],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2
    assert "Traceback" not in run.stderr
    assert "ladder.reboot.action_timeout" in run.stderr and len(run.stderr.strip().splitlines()) == 1


def test_temporal_address_comes_from_the_environment():
    """The deployed processes get their address from TEMPORAL_ADDRESS (the gpuheal-temporal ConfigMap)."""
    import os

    env = {**os.environ, "TEMPORAL_ADDRESS": "127.0.0.1:1"}
    # A hang (dialling 127.0.0.1:7233 instead, or waiting forever) fails on the timeout.
    run = subprocess.run([sys.executable, "-m", "workers.cli", "status"], capture_output=True, text=True, env=env,
                         timeout=15)
    assert run.returncode != 0 and "127.0.0.1:1" in run.stderr, run.stderr
