"""RDMA ports from sysfs against the profile and the baseline: one meaning for missing hardware."""

import os
from datetime import UTC, datetime

import pytest

from health.nics import check_nics, probe_nics, read_ports
from policies.baseline import NicInventory, NodeBaseline
from policies.profile_model import NetworkProfile
from sim.sysfs import EFA_UP, PORT_DOWN, write_efa_ports
from sim.sysfs import PORT_UP as UP
from sim.sysfs import write_ib_ports as make_tree

IB_8x400 = NetworkProfile(kind="infiniband", ports=8, rate_gbps=400)
NONE = NetworkProfile(kind="none")


def test_all_up(tmp_path):
    root = make_tree(tmp_path, [UP] * 8)
    assert probe_nics(IB_8x400, root) == []
    assert read_ports(root)[0].link_downed == 3 and read_ports(root)[0].kind == "infiniband"


@pytest.mark.parametrize("bad", [PORT_DOWN, ("4: ACTIVE", "5: LinkUp", "200 Gb/sec (4X HDR)"),
                                 ("1: DOWN", "3: Disabled", "400 Gb/sec (4X NDR)")])
def test_one_port_short_is_flagged_against_the_profile(tmp_path, bad):
    root = make_tree(tmp_path, [UP] * 7 + [bad])
    [f] = probe_nics(IB_8x400, root)
    assert f.kind == "nic_ports_down" and "7 of 8 infiniband" in f.message and "mlx5_7/1" in f.message
    assert "the profile" in f.message


@pytest.mark.parametrize("layout", ["absent", "empty", "ports"])
def test_no_adapters_expected_is_healthy_whatever_is_there(tmp_path, layout):
    root = tmp_path / "ib"
    if layout == "empty":
        root.mkdir()
    elif layout == "ports":
        make_tree(root, [PORT_DOWN])
    assert probe_nics(NONE, root) == [] and probe_nics(None, root) == []


@pytest.mark.parametrize("layout", ["absent", "empty"])
def test_expected_but_missing_is_nic_ports_down_both_ways(tmp_path, layout):
    root = tmp_path / "ib"
    if layout == "empty":
        root.mkdir()
    [f] = probe_nics(IB_8x400, root)
    assert f.kind == "nic_ports_down" and "0 of 8" in f.message


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file: the unreadable case needs a normal user")
def test_unreadable_sysfs_is_probe_broken(tmp_path):
    root = make_tree(tmp_path / "ib", [UP] * 8)
    (root / "mlx5_0" / "ports" / "1" / "state").chmod(0)
    [f] = probe_nics(IB_8x400, root)
    assert f.kind == "probe_broken" and "unreadable" in f.message


def test_unreadable_sysfs_is_probe_broken_even_as_root(tmp_path):
    # A path that is not a directory cannot be listed, for root too (ENOTDIR): sysfs that cannot be read.
    root = tmp_path / "ib"
    root.write_text("not a directory")
    [f] = probe_nics(IB_8x400, root)
    assert f.kind == "probe_broken" and "unreadable" in f.message
    assert probe_nics(NONE, root) == [], "nothing expected: nothing to read, nothing broken"


def test_efa_ports_are_counted_as_efa_not_infiniband(tmp_path):
    root = write_efa_ports(tmp_path, [EFA_UP] * 32)
    assert probe_nics(NetworkProfile(kind="efa", ports=32, rate_gbps=100), root) == []
    [f] = probe_nics(IB_8x400, root)
    assert "0 of 8 infiniband" in f.message, "EFA devices must not pass for InfiniBand ones"


def test_roce_by_link_layer(tmp_path):
    root = make_tree(tmp_path, [UP] * 2, link_layer="Ethernet")
    assert probe_nics(NetworkProfile(kind="roce", ports=2, rate_gbps=400), root) == []


def test_baseline_flags_fewer_ports_with_no_profile(tmp_path):
    base = NodeBaseline(gpus=8, nics=[NicInventory(kind="infiniband", ports_up=8, rate_gbps=400)],
                        learned_at=datetime(2026, 12, 1, tzinfo=UTC), validated=True)
    assert probe_nics(None, make_tree(tmp_path / "a", [UP] * 8), base) == []
    [f] = probe_nics(None, make_tree(tmp_path / "b", [UP] * 7 + [PORT_DOWN]), base)
    assert f.kind == "nic_ports_down" and "7 of 8" in f.message and "at admission 2026-12-01" in f.message


def test_inventory_is_what_is_up(tmp_path):
    root = make_tree(tmp_path, [UP] * 3 + [PORT_DOWN])
    _, inv = check_nics(None, root)
    assert [(n.kind, n.ports_up, n.rate_gbps) for n in inv] == [("infiniband", 3, 400.0)]
