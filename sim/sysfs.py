"""Fake /sys/class/infiniband trees, laid out as the kernel does, for NIC probes in tests and sims."""

from __future__ import annotations

from pathlib import Path

PORT_UP = ("4: ACTIVE", "5: LinkUp", "400 Gb/sec (4X NDR)")
PORT_DOWN = ("1: DOWN", "2: Polling", "400 Gb/sec (4X NDR)")
EFA_UP = ("4: ACTIVE", "5: LinkUp", "100 Gb/sec (4X EDR)")


def write_ib_ports(root: Path, ports: list[tuple[str, str, str]], link_layer: str = "InfiniBand") -> Path:
    """ports: (state, phys_state, rate) per port, one mlx5_<i> device each (RoCE: link_layer Ethernet)."""
    for i, (state, phys, rate) in enumerate(ports):
        _port(root / f"mlx5_{i}", state, phys, rate, link_layer, vendor="0x15b3")
    root.mkdir(parents=True, exist_ok=True)
    return root


def write_efa_ports(root: Path, ports: list[tuple[str, str, str]]) -> Path:
    """EFA devices (efa_<i>, PCI vendor 0x1d0f, as on AWS p4d/p5): one port each, link layer unspecified."""
    for i, (state, phys, rate) in enumerate(ports):
        _port(root / f"efa_{i}", state, phys, rate, "Unspecified", vendor="0x1d0f")
    root.mkdir(parents=True, exist_ok=True)
    return root


def _port(dev: Path, state: str, phys: str, rate: str, link_layer: str, vendor: str) -> None:
    p = dev / "ports" / "1"
    (p / "counters").mkdir(parents=True, exist_ok=True)
    (dev / "device").mkdir(parents=True, exist_ok=True)
    (dev / "device" / "vendor").write_text(vendor + "\n")
    (p / "state").write_text(state + "\n")
    (p / "phys_state").write_text(phys + "\n")
    (p / "rate").write_text(rate + "\n")
    (p / "link_layer").write_text(link_layer + "\n")
    (p / "counters" / "link_downed").write_text("3\n")
