"""The controller and the agent started exactly as deploy/ starts them: the container args and env of
the controller Deployment and the agent DaemonSet, the gpuheal-temporal ConfigMap's TEMPORAL_ADDRESS,
the policy ConfigMap mounted at /etc/gpuheal, the client certificates mounted from their Secrets. Only
what points outside is redirected, each through the same variable or path: TEMPORAL_ADDRESS at a
mutual-TLS frontend in front of the test's dev server (tests/mtls.py), the mounted certificates at
ones its CA issued for each workload, the in-cluster API at the fake API
server (KUBECONFIG, which the client reads when not in a pod), AWS at moto (AWS_ENDPOINT_URL), the
mounted policy at a file with shorter timings, the metrics port at a free one.

The agent runs on this machine, which has no GPU: NVML is missing, which the agent reports as a
broken probe (fail closed), and the ladder walks reset -> reboot -> replace; the production policy
wants approval for replace, given with `gpuheal approve` through TEMPORAL_ADDRESS alone."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from api.episode import RemediationResult
from api.names import remediation_workflow_id
from sim.fake_kube import FakeKubeServer
from tests.mtls import MtlsProxy, Pki
from tests.net import free_port
from workflows.node_remediation import NodeRemediation

ROOT = Path(__file__).resolve().parents[2]
POLICY_MOUNT = "/etc/gpuheal/policy.yaml"
KMSG_STATE = "/var/lib/gpuheal/kmsg-position"  # a hostPath on the node
TLS_MOUNT = "/var/run/gpuheal/temporal-tls"  # each workload's client certificate Secret
QUICK = {"ladder": {"reboot": {"return_timeout": "3s"}}, "validation": {"soak": "1s"},
         "drain": {"checkpoint_grace": "0s", "pod_grace_seconds": 0}, "probation": "2s"}


def docs(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((ROOT / "deploy" / name).read_text()) if d]


def container(name: str, kind: str, cname: str) -> tuple[list[str], dict[str, str]]:
    """A container's args and its environment as the kubelet would give it (ConfigMap envFrom, literal
    values, and spec.nodeName through the downward API)."""
    all_docs = [d for f in (ROOT / "deploy").glob("*.yaml") for d in yaml.safe_load_all(f.read_text()) if d]
    configmaps = {d["metadata"]["name"]: d.get("data", {}) for d in all_docs if d["kind"] == "ConfigMap"}
    workload = next(d for d in docs(name) if d["kind"] == kind)
    spec = next(c for c in workload["spec"]["template"]["spec"]["containers"] if c["name"] == cname)
    env = {}
    for src in spec.get("envFrom", []):
        env.update(configmaps[src["configMapRef"]["name"]])
    for e in spec.get("env", []):
        env[e["name"]] = e.get("value", "<downward:" + e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath", "") + ">")
    return spec["args"], env


def expand(args: list[str], env: dict[str, str]) -> list[str]:
    """$(VAR) in container args, as the kubelet expands it."""
    return [re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), a) for a in args]


def compose_controller() -> tuple[list[str], dict[str, str]]:
    """docker/compose.yaml's controller service: its command and environment."""
    svc = yaml.safe_load((ROOT / "docker" / "compose.yaml").read_text())["services"]["controller"]
    return list(svc["command"]), {k: str(v) for k, v in (svc.get("environment") or {}).items()}


@pytest.mark.timeout(240)
@pytest.mark.parametrize("controller_from", ["deploy", "compose"])
async def test_controller_and_agent_as_deployed_complete_a_remediation(dev_env, moto_url, aws, tmp_path,
                                                                       controller_from):
    address = dev_env.client.service_client.config.target_host
    node = f"as-deployed-{os.getpid()}"
    kube_server = FakeKubeServer().start()
    ec2 = aws("ec2")
    ami = ec2.describe_images()["Images"][0]["ImageId"]
    iid = ec2.run_instances(ImageId=ami, MinCount=1, MaxCount=1, InstanceType="p5.48xlarge", TagSpecifications=[
        {"ResourceType": "instance", "Tags": [{"Key": "gpuheal.io/managed", "Value": "true"}]}])["Instances"][0]["InstanceId"]
    gpu = {"nvidia.com/gpu.present": "true"}
    kube_server.kube.add_node(node, labels=gpu, provider_id=f"aws:///us-east-1a/{iid}", boot_id="kubelet-boot-1")
    for i in range(4):
        kube_server.kube.add_node(f"{node}-peer{i}", labels=gpu)
    kubeconfig = kube_server.write_kubeconfig(tmp_path / "kubeconfig")

    # The ledger table the Deployment names (dynamodb://gpuheal-ledger), in moto.
    from activities.ledger import DynamoLedger

    ctl_args, ctl_env = container("controller.yaml", "Deployment", "controller")
    ledger = next(a for a in ctl_args if a.startswith("dynamodb://")).removeprefix("dynamodb://")
    DynamoLedger.create_table(aws("dynamodb"), ledger)
    if controller_from == "compose":
        # The compose service names its servers by host name and mounts the kubeconfig.
        ctl_args, ctl_env = compose_controller()
        where = {"temporal:7233": address, "/kube/config": str(kubeconfig), "/tmp/ledger.db": str(tmp_path / "ledger.db")}
        ctl_args = [where.get(a, a) for a in ctl_args]
        ctl_env["TEMPORAL_ADDRESS"] = address  # what compose's `temporal` host name resolves to

    policy_yaml = yaml.safe_load(next(d for d in docs("policy-configmap.yaml"))["data"]["policy.yaml"])
    for key, value in QUICK.items():
        policy_yaml[key] = {**policy_yaml.get(key, {}), **value} if isinstance(value, dict) else value
    policy_file = tmp_path / "policy.yaml"
    policy_file.write_text(yaml.safe_dump(policy_yaml))

    pki = Pki(tmp_path / "pki")
    proxy = MtlsProxy(pki, address).start()

    def redirect(args: list[str], env: dict[str, str], workload: str) -> tuple[list[str], dict[str, str]]:
        mounts = {POLICY_MOUNT: str(policy_file), KMSG_STATE: str(tmp_path / "kmsg-position")}
        args = [mounts.get(a, a) for a in args]
        args = [re.sub(r"(prometheus://[^:]+:)\d+", lambda m: f"{m.group(1)}{free_port()}", a) for a in args]
        assert "TEMPORAL_ADDRESS" in env, "the manifests point the processes at Temporal through TEMPORAL_ADDRESS"
        env = {**env, "TEMPORAL_ADDRESS": address}
        if "TEMPORAL_TLS_CLIENT_CERT_PATH" in env:
            # The workload's Secret, as the kubelet would mount it: ca.crt, tls.crt, tls.key.
            secret = tmp_path / f"tls-{workload}"
            secret.mkdir()
            crt, key = pki.issue(workload)
            for name, src in {"ca.crt": pki.ca, "tls.crt": crt, "tls.key": key}.items():
                (secret / name).write_bytes(src.read_bytes())
            env = {k: v.replace(TLS_MOUNT, str(secret)) if k.startswith("TEMPORAL_TLS_") else v for k, v in env.items()}
            env["TEMPORAL_ADDRESS"] = proxy.address
        base = {k: v for k, v in os.environ.items() if not k.startswith("TEMPORAL_")}
        return args, {**base, **env, "KUBECONFIG": str(kubeconfig), "AWS_ENDPOINT_URL": moto_url,
                      "AWS_ACCESS_KEY_ID": "sim", "AWS_SECRET_ACCESS_KEY": "sim"}

    agent_args, agent_env = container("agent-daemonset.yaml", "DaemonSet", "agent")
    agent_env["NODE_NAME"] = node  # the downward API's spec.nodeName
    procs = []
    logs = {}
    try:
        for name, (args, env) in {"controller": redirect(ctl_args, ctl_env, "gpuheal-controller"),
                                  "agent": redirect(expand(agent_args, agent_env), agent_env, "gpuheal-agent")}.items():
            logs[name] = (tmp_path / f"{name}.log").open("w")
            procs.append(subprocess.Popen([sys.executable, "-m", "workers.cli", *args], cwd=ROOT, env=env,
                                          stdout=logs[name], stderr=subprocess.STDOUT))
        handle = dev_env.client.get_workflow_handle(remediation_workflow_id(node, "default"), result_type=RemediationResult)

        async def awaiting_replace() -> bool:
            try:
                return (await handle.query(NodeRemediation.status)).awaiting_approval == "replace"
            except Exception:  # noqa: BLE001 - no episode yet
                return False

        for _ in range(360):
            if await awaiting_replace():
                break
            assert all(p.poll() is None for p in procs), _tails(tmp_path)
            await asyncio.sleep(0.5)
        else:
            raise AssertionError("the episode never reached replace\n" + _tails(tmp_path))
        env = {k: v for k, v in os.environ.items() if not k.startswith("TEMPORAL_")} | {"TEMPORAL_ADDRESS": address}
        approve = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "workers.cli", "approve", node, "replace"],
                                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
        assert approve.returncode == 0, approve.stderr
        result = await asyncio.wait_for(handle.result(), 90)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                # The controller's node-condition watcher holds a 30 s watch call (issue: stream it).
                p.wait(timeout=45)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for f in logs.values():
            f.close()
        kube_server.stop()
        proxy.stop()
    assert (result.outcome, result.fault_class, result.rungs) == ("replaced", "probe_broken", ["reset", "reboot", "replace"]), \
        (result, _tails(tmp_path))
    state = ec2.describe_instances(InstanceIds=[iid])["Reservations"][0]["Instances"][0]["State"]["Name"]
    assert state in ("shutting-down", "terminated")
    assert [p.returncode for p in procs] == [0, 0], ("both stopped cleanly on SIGTERM", _tails(tmp_path))
    tls_clients = {"gpuheal-agent"} | ({"gpuheal-controller"} if controller_from == "deploy" else set())
    assert set(proxy.clients) == tls_clients, "each deployed workload came through mutual TLS with its own certificate"


async def test_temporal_without_a_client_certificate_is_refused(dev_env, tmp_path):
    """The frontend the manifests assume: a client with the CA but no certificate of its own gets no
    connection, and says so in one line."""
    pki = Pki(tmp_path / "pki")
    proxy = MtlsProxy(pki, dev_env.client.service_client.config.target_host).start()
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith("TEMPORAL_")}
        env |= {"TEMPORAL_ADDRESS": proxy.address, "TEMPORAL_TLS_SERVER_CA_CERT_PATH": str(pki.ca)}
        run = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "workers.cli", "status"], cwd=ROOT,
                                      env=env, capture_output=True, text=True, timeout=60)
    finally:
        proxy.stop()
    assert run.returncode != 0 and proxy.refused >= 1 and not proxy.clients
    assert "Traceback" not in run.stderr and len(run.stderr.strip().splitlines()) == 1, run.stderr


def _tails(tmp_path: Path) -> str:
    return "\n".join(f"--- {f.name}\n{f.read_text()[-1500:]}" for f in sorted(tmp_path.glob("*.log")))
