import pytest

from policies.classify import classify
from policies.findings import Finding
from policies.loader import default_policy

P = default_policy()


def xid(code, gpu=0, **kw):
    return Finding(kind="xid", xid=code, gpu_index=gpu, **kw)


@pytest.mark.parametrize("code,rung,attribution,fault_class", [
    (13, "kill", "application", "application"),
    (31, "kill", "application", "application"),
    (43, "kill", "application", "application"),
    (48, "reset", "platform", "memory"),
    (79, "reboot", "platform", "gpu_lost"),
    (119, "reset", "platform", "gsp"),
    (54, "replace", "platform", "power"),
    (8, "reset", "platform", "gpu_hang"),  # RESTART_APP but platform: the node goes through reset
    (151, "reboot", "platform", "confidential_computing"),
])
def test_xid_mapping(code, rung, attribution, fault_class):
    t = classify([xid(code)], "hopper", P)
    assert (t.start_rung, t.attribution, t.fault_class) == (rung, attribution, fault_class)


def test_ignored_codes_need_no_action():
    t = classify([xid(63), xid(92)], "hopper", P)
    assert not t.actionable and t.severity == "info"


def test_unknown_and_wrong_generation_fail_closed():
    assert classify([xid(4242)], "hopper", P).start_rung == "reset"
    t = classify([xid(74)], "blackwell", P)  # NVLink Xid 74 is not a Blackwell code
    assert (t.fault_class, t.start_rung) == ("unknown_xid", "reset")
    t = classify([xid(110)], "ampere", P)
    assert t.fault_class == "unknown_xid"


def test_probe_broken_fails_closed():
    t = classify([Finding(kind="probe_broken", message="NVML not loadable")], "hopper", P)
    assert (t.attribution, t.start_rung, t.fault_class) == ("platform", "reset", "probe_broken")


def test_repeated_application_xid_on_one_gpu_points_at_hardware():
    assert classify([xid(13, 1), xid(13, 2), xid(13, 3)], "hopper", P).attribution == "application"
    t = classify([xid(13, 1)] * 3, "hopper", P)
    assert (t.attribution, t.start_rung) == ("platform", "reset")


def test_platform_wins_over_application_and_highest_rung_wins():
    t = classify([xid(13, 1), xid(48, 2), xid(79, 3)], "hopper", P)
    assert (t.attribution, t.start_rung, t.gpus) == ("platform", "reboot", [1, 2, 3])


@pytest.mark.parametrize("action,rung", [("GPU_RESET", "reset"), ("DRAIN_AND_RESET", "reset"),
                                         ("NODE_REBOOT", "reboot"), ("SYSTEM_REBOOT", "reboot")])
def test_recovery_action_maps_to_rung(action, rung):
    t = classify([Finding(kind="recovery_action", recovery_action=action, gpu_index=0)], "hopper", P)
    assert t.start_rung == rung


def test_recovery_action_none_needs_nothing():
    assert not classify([Finding(kind="recovery_action", recovery_action="NONE")], "hopper", P).actionable


def test_nvlink5_fatal_vs_nonfatal():
    assert classify([xid(145, fatal=True)], "blackwell", P).start_rung == "reset"
    assert not classify([xid(145, fatal=False)], "blackwell", P).actionable


@pytest.mark.parametrize("kind,rung", [("ecc_dbe", "reset"), ("row_remap_failure", "reset"), ("gpu_lost", "reboot"),
                                       ("gpu_count_mismatch", "reboot"), ("pcie_degraded", "reboot"),
                                       ("nvlink_down", "reset"), ("nic_ports_down", "reboot"), ("thermal", "reset")])
def test_non_xid_findings(kind, rung):
    assert classify([Finding(kind=kind)], "hopper", P).start_rung == rung


def test_healthy():
    t = classify([], "hopper", P)
    assert not t.actionable and t.reason == "healthy"
