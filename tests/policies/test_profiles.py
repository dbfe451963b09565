"""Node profiles in the policy: shipped ones with sources, selection by labels, errors naming the key."""

import pytest

from policies.classify import classify
from policies.findings import Finding
from policies.loader import (
    PolicyError,
    default_policy,
    load_policy,
    policy_from_mapping,
    policy_yaml,
    resolve_profile,
)
from policies.profiles import for_node, select_profile

H100 = "NVIDIA-H100-80GB-HBM3"


def test_shipped_profiles_each_with_sources():
    p = default_policy()
    assert set(p.profiles) == {"hopper-ib-8x400", "aws-p4d", "aws-p5", "h200-1gpu-no-rdma", "blackwell-b200-8x400"}
    assert all(prof.sources and prof.gpus and prof.network and prof.pcie for prof in p.profiles.values())
    assert (p.profiles["aws-p5"].network.ports, p.profiles["aws-p5"].network.rate_gbps) == (32, 100)
    assert (p.profiles["aws-p4d"].network.kind, p.profiles["aws-p4d"].network.ports) == ("efa", 4)
    assert p.profiles["h200-1gpu-no-rdma"].network.kind == "none"
    assert p.profiles["blackwell-b200-8x400"].gpus == 8


@pytest.mark.parametrize("labels,profile,why", [
    ({"nvidia.com/gpu.product": "NVIDIA-H200", "nvidia.com/gpu.count": "1"}, "h200-1gpu-no-rdma", "GPU product"),
    ({"nvidia.com/gpu.product": H100, "nvidia.com/gpu.count": "8"}, "hopper-ib-8x400", "GPU product"),
    # p5 carries the same GPU product: the instance type is more specific and wins.
    ({"nvidia.com/gpu.product": H100, "nvidia.com/gpu.count": "8", "node.kubernetes.io/instance-type": "p5.48xlarge"},
     "aws-p5", "instance type p5.48xlarge"),
    ({"node.kubernetes.io/instance-type": "p4d.24xlarge"}, "aws-p4d", "instance type"),
    ({"nvidia.com/gpu.product": "NVIDIA-B200", "nvidia.com/gpu.count": "8"}, "blackwell-b200-8x400", "GPU product"),
    ({"nvidia.com/gpu.product": H100, "nvidia.com/gpu.count": "4"}, None, "no profile matches"),
    ({"gpuheal.io/profile": "aws-p5"}, "aws-p5", "label gpuheal.io/profile=aws-p5"),
    ({"gpuheal.io/profile": "nope"}, None, "names no profile"),
])
def test_selection_and_why(labels, profile, why):
    s = select_profile(default_policy(), labels, "n1")
    assert s.profile == profile and why in s.reason, s


def test_node_group_beats_instance_type_and_a_file_adds_profiles():
    p = policy_from_mapping({"profiles": {"inference": {
        "match": {"node_groups": ["infer-pool"]}, "gpus": 1, "network": {"kind": "none"}, "mode": "observe"}}})
    labels = {"eks.amazonaws.com/nodegroup": "infer-pool", "node.kubernetes.io/instance-type": "p5.48xlarge"}
    s = select_profile(p, labels)
    assert s.profile == "inference" and "node group infer-pool (eks.amazonaws.com/nodegroup)" in s.reason


def test_a_file_changes_a_shipped_profile_naming_only_what_it_changes_or_removes_one(tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text("profiles:\n  aws-p5:\n    mode: observe\n  aws-p4d: null\n")
    p = load_policy(f)
    assert p.profiles["aws-p5"].mode == "observe" and p.profiles["aws-p5"].network.ports == 32
    assert "aws-p4d" not in p.profiles
    assert load_policy_roundtrip(p) == p


def load_policy_roundtrip(p):
    return policy_from_mapping(__import__("yaml").safe_load(policy_yaml(p)))


@pytest.mark.parametrize("profiles,problem", [
    ({"x": {"network": {"kind": "infiniband"}}}, "profiles.x.network: kind infiniband needs ports and rate_gbps"),
    ({"x": {"network": {"kind": "none", "ports": 2}}}, "profiles.x.network: kind none expects no ports"),
    ({"aws-p5": {"mode": "watch"}}, "profiles.aws-p5.mode: Input should be 'act', 'dry_run' or 'observe'"),
    ({"x": {"gpu": 8}}, "profiles.x.gpu: unknown key"),
    ({"x": {"pcie": {"width": 12}}}, "profiles.x.pcie.width: must be one of 1, 2, 4, 8, 16, 32"),
    ({"x": {"network": {"kind": "myrinet", "ports": 1, "rate_gbps": 1}}}, "profiles.x.network.kind"),
    ({"x": {"ladder": {"reboot": {"retries": 0}}}}, "profiles.x.ladder.reboot.retries"),
    ({"x": {"finding_rungs": {"nic_ports_down": "nap"}}}, "profiles.x.finding_rungs.nic_ports_down"),
])
def test_bad_profile_refused_at_load_with_the_key_named(profiles, problem):
    with pytest.raises(PolicyError) as err:
        policy_from_mapping({"profiles": profiles}, "site.yaml")
    assert any(line.startswith(problem) for line in err.value.problems), err.value.problems


def test_for_node_applies_ladder_overrides_and_mode():
    p = policy_from_mapping({"profiles": {
        "careful": {"ladder": {"reboot": {"requires_approval": True}}, "finding_rungs": {"nic_ports_down": "reset"},
                    "mode": "dry_run"},
        "watch": {"mode": "observe", "load_floors": {"NVIDIA H200": {"tflops_sustained": 600}}}}})
    careful = for_node(p, "careful")
    watch = for_node(p, "watch")
    assert watch.validation.load.floors["NVIDIA H200"].tflops_sustained == 600 and p.validation.load.floors["NVIDIA H200"].tflops_sustained == 530
    assert watch.validation.load.floors["NVIDIA H100 80GB HBM3"] == p.validation.load.floors["NVIDIA H100 80GB HBM3"]
    assert careful.ladder.reboot.requires_approval and careful.ladder.reboot.retries == p.ladder.reboot.retries
    assert careful.triage.finding_rungs["nic_ports_down"] == "reset" and careful.dry_run and not careful.observe
    assert careful.name == "default/careful"
    assert for_node(p, "watch").observe and not for_node(p, "watch").dry_run
    assert for_node(p, None) is p and for_node(p, "gone") is p


def test_recovery_action_stays_a_floor_under_a_profile_that_lowers_a_rung():
    p = for_node(policy_from_mapping({"profiles": {"x": {"finding_rungs": {"nic_ports_down": "reset"}}}}), "x")
    nic = Finding(kind="nic_ports_down", message="7 of 8")
    assert classify([nic], "hopper", p).start_rung == "reset"
    driver = Finding(kind="recovery_action", recovery_action="NODE_REBOOT", gpu_index=0)
    assert classify([nic, driver], "hopper", p).start_rung == "reboot"


def test_profile_by_name_or_file(tmp_path):
    assert resolve_profile(default_policy(), "aws-p5")[0] == "aws-p5"
    f = tmp_path / "mine.yaml"
    f.write_text("gpus: 2\nnetwork: {kind: roce, ports: 2, rate_gbps: 200}\n")
    name, prof = resolve_profile(default_policy(), str(f))
    assert name == "mine" and prof.network.kind == "roce"
    f.write_text("gpus: 2\nnetwork: {kind: roce}\n")
    with pytest.raises(PolicyError, match="network: kind roce needs ports"):
        resolve_profile(default_policy(), str(f))
    with pytest.raises(PolicyError, match="no profile of that name"):
        resolve_profile(default_policy(), "nope")
