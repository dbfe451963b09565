"""`gpuheal profiles`: which profile each GPU node gets and why, read from the API server."""

import json
import subprocess
import sys

from policies.baseline import BASELINE_ANNOTATION
from sim.fake_kube import FakeKubeServer

GPU = {"nvidia.com/gpu.present": "true"}
BASELINE = ('{"gpus": 8, "nics": [{"kind": "infiniband", "ports_up": 8, "rate_gbps": 400}], "pcie_generation": 5, '
            '"pcie_width": 16, "learned_at": "2026-12-01T10:00:00Z", "validated": true}')


def test_profiles_names_each_nodes_profile_and_why(tmp_path):
    server = FakeKubeServer().start()
    try:
        k = server.kube
        k.add_node("p5-a", labels={**GPU, "node.kubernetes.io/instance-type": "p5.48xlarge",
                                   "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.count": "8"})
        k.add_node("h200-a", labels={**GPU, "nvidia.com/gpu.product": "NVIDIA-H200", "nvidia.com/gpu.count": "1"})
        k.add_node("plain", labels=GPU)
        k.patch("Node", "", "plain", {"metadata": {"annotations": {BASELINE_ANNOTATION: BASELINE}}},
                "application/merge-patch+json")
        k.add_node("cpu-only", labels={})
        policy = tmp_path / "p.yaml"
        policy.write_text("profiles:\n  aws-p5:\n    mode: observe\n")
        cfg = server.write_kubeconfig(tmp_path / "kubeconfig")
        run = subprocess.run([sys.executable, "-m", "workers.cli", "profiles", "--kubeconfig", str(cfg), "--policy",
                              str(policy), "--json"], capture_output=True, text=True, timeout=60)
        text = subprocess.run([sys.executable, "-m", "workers.cli", "profiles", "--kubeconfig", str(cfg), "-o", "wide"],
                              capture_output=True, text=True, timeout=60)
        yml = subprocess.run([sys.executable, "-m", "workers.cli", "profiles", "--kubeconfig", str(cfg), "-o", "yaml"],
                             capture_output=True, text=True, timeout=60)
    finally:
        server.stop()
    assert run.returncode == 0, run.stderr
    rows = {r["node"]: r for r in json.loads(run.stdout)["nodes"]}
    assert set(rows) == {"p5-a", "h200-a", "plain"}, "only the GPU node selector's nodes"
    assert (rows["p5-a"]["profile"], rows["p5-a"]["mode"]) == ("aws-p5", "observe")
    assert "instance type p5.48xlarge" in rows["p5-a"]["reason"]
    assert rows["h200-a"]["profile"] == "h200-1gpu-no-rdma" and "GPU product NVIDIA-H200" in rows["h200-a"]["reason"]
    assert rows["plain"]["profile"] is None and "learned baseline only" in rows["plain"]["reason"]
    assert rows["plain"]["baseline"]["validated"] and "8x400 Gb/s infiniband" in rows["plain"]["baseline_summary"]
    assert text.returncode == 0 and "h200-1gpu-no-rdma" in text.stdout and "8 GPUs, 8x400 Gb/s infiniband" in text.stdout
    assert text.stdout.split()[:5] == ["NODE", "PROFILE", "MODE", "BASELINE", "WHY"], text.stdout
    doc = __import__("yaml").safe_load(yml.stdout)
    assert {r["node"]: r["profile"] for r in doc["nodes"]}["p5-a"] == "aws-p5"


def test_profiles_with_a_bad_policy_names_the_key(tmp_path):
    policy = tmp_path / "p.yaml"
    policy.write_text("profiles:\n  mine:\n    network: {kind: efa}\n")
    run = subprocess.run([sys.executable, "-m", "workers.cli", "profiles", "--policy", str(policy)],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "profiles.mine.network: kind efa needs ports" in run.stderr
