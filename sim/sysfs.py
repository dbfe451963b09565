"""Fake /sys/class/infiniband trees, laid out as the kernel does, for NIC probes in tests and sims."""

from __future__ import annotations

from pathlib import Path

PORT_UP = ("4: ACTIVE", "5: LinkUp", "400 Gb/sec (4X NDR)")


def write_ib_ports(root: Path, ports: list[tuple[str, str, str]]) -> Path:
    """ports: (state, phys_state, rate) per port, one mlx5_<i> device each."""
    for i, (state, phys, rate) in enumerate(ports):
        p = root / f"mlx5_{i}" / "ports" / "1"
        (p / "counters").mkdir(parents=True, exist_ok=True)
        (p / "state").write_text(state + "\n")
        (p / "phys_state").write_text(phys + "\n")
        (p / "rate").write_text(rate + "\n")
        (p / "counters" / "link_downed").write_text("3\n")
    return root
