import pytest

from health.nics import NicExpectation, probe_nics, read_ports
from sim.sysfs import PORT_UP as UP
from sim.sysfs import write_ib_ports as make_tree


def test_all_up(tmp_path):
    root = make_tree(tmp_path, [UP] * 8)
    assert probe_nics(NicExpectation(), root) == []
    assert read_ports(root)[0].link_downed == 3


@pytest.mark.parametrize("bad", [("1: DOWN", "2: Polling", "400 Gb/sec (4X NDR)"),
                                 ("4: ACTIVE", "5: LinkUp", "200 Gb/sec (4X HDR)"),
                                 ("1: DOWN", "3: Disabled", "400 Gb/sec (4X NDR)")])
def test_one_port_short(tmp_path, bad):
    root = make_tree(tmp_path, [UP] * 7 + [bad])
    [f] = probe_nics(NicExpectation(), root)
    assert f.kind == "nic_ports_down" and "7 of 8" in f.message and "mlx5_7/1" in f.message


def test_ampere_expectation(tmp_path):
    root = make_tree(tmp_path, [("4: ACTIVE", "5: LinkUp", "200 Gb/sec (4X HDR)")])
    assert probe_nics(NicExpectation(ports=1, min_rate_gbps=200), root) == []


def test_missing_sysfs_fails_closed(tmp_path):
    [f] = probe_nics(NicExpectation(), tmp_path / "nope")
    assert f.kind == "probe_broken"


def test_no_nics_expected(tmp_path):
    assert probe_nics(NicExpectation(ports=0), tmp_path / "nope") == []
