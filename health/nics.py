"""RDMA adapters (InfiniBand, EFA, RoCE) from sysfs: ports up at a rate, held against what the node
should have (its profile) and what it had when admitted (its baseline). One meaning for missing
hardware: none expected is healthy; expected but absent is `nic_ports_down`; unreadable sysfs is
`probe_broken`."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from policies.baseline import NicInventory, NodeBaseline
from policies.findings import Finding, FindingKind
from policies.profile_model import NetworkProfile, NicKind

_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*Gb/sec")
EFA_VENDOR = "0x1d0f"  # Amazon: EFA devices sit under /sys/class/infiniband too
SYSFS_INFINIBAND = Path("/sys/class/infiniband")


@dataclass(frozen=True)
class PortState:
    device: str
    port: str
    kind: NicKind
    state: str
    phys_state: str
    rate_gbps: float
    link_downed: int | None

    @property
    def up(self) -> bool:
        # sysfs gives "4: ACTIVE" and "5: LinkUp"; the number is the stable part.
        return self.state.startswith("4") and self.phys_state.startswith("5")


def _read(path: Path) -> str:
    """A sysfs attribute; "" when absent. Any other error (permissions, I/O) propagates: probe_broken."""
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        return ""


def _kind(dev: Path, port: Path) -> NicKind:
    if _read(dev / "device" / "vendor") == EFA_VENDOR or dev.name.startswith("efa"):
        return NicKind.EFA
    return NicKind.ROCE if _read(port / "link_layer") == "Ethernet" else NicKind.INFINIBAND


def read_ports(root: Path = SYSFS_INFINIBAND) -> list[PortState]:
    """Every port under root; [] when root is absent (no adapters). Raises OSError when unreadable."""
    if not root.exists():
        return []
    ports = []
    for dev in sorted(p for p in root.iterdir() if p.is_dir()):
        for port in sorted((dev / "ports").iterdir()) if (dev / "ports").exists() else []:
            rate = _RATE.match(_read(port / "rate"))
            downed = _read(port / "counters" / "link_downed")
            ports.append(PortState(device=dev.name, port=port.name, kind=_kind(dev, port), state=_read(port / "state"),
                                   phys_state=_read(port / "phys_state"), rate_gbps=float(rate.group(1)) if rate else 0.0,
                                   link_downed=int(downed) if downed.isdigit() else None))
    return ports


def inventory(ports: list[PortState]) -> list[NicInventory]:
    """Up ports per kind and the slowest one's rate: what a baseline records."""
    out = []
    for kind in NicKind:
        up = [p for p in ports if p.kind is kind and p.up]
        if up:
            out.append(NicInventory(kind=kind, ports_up=len(up), rate_gbps=min(p.rate_gbps for p in up)))
    return out


def expectations(profile: NetworkProfile | None, baseline: NodeBaseline | None) -> list[tuple[NicKind, int, float, str]]:
    """(kind, ports, rate, why) the node must meet: its profile's figures, and what it had at admission."""
    out = []
    if profile is not None and profile.kind is not NicKind.NONE:
        out.append((profile.kind, profile.ports, profile.rate_gbps, "the profile"))
    for nic in baseline.nics if baseline is not None else []:
        out.append((nic.kind, nic.ports_up, nic.rate_gbps, baseline.origin()))
    return out


def probe_nics(profile: NetworkProfile | None, root: Path = SYSFS_INFINIBAND,
               baseline: NodeBaseline | None = None) -> list[Finding]:
    return check_nics(profile, root, baseline)[0]


def check_nics(profile: NetworkProfile | None, root: Path = SYSFS_INFINIBAND,
               baseline: NodeBaseline | None = None) -> tuple[list[Finding], list[NicInventory] | None]:
    """A degraded adapter does not crash a job, it slows every collective: count what is really up.
    Nothing expected (kind none, or nothing declared or learned): nothing to find. Also returns what
    is there (None when sysfs could not be read), for the node's baseline."""
    wanted = expectations(profile, baseline)
    try:
        ports = read_ports(root)
    except OSError as err:
        broken = Finding(kind=FindingKind.PROBE_BROKEN, message=f"{root} unreadable: {err.strerror or err}")
        return ([broken] if wanted else []), None
    short = []
    for kind, count, rate, why in wanted:
        good = [p for p in ports if p.kind is kind and p.up and p.rate_gbps >= rate]
        if len(good) < count:
            bad = [f"{p.device}/{p.port} ({p.state or '?'}, {p.phys_state or '?'}, {p.rate_gbps:g} Gb/s)"
                   for p in ports if p.kind is kind and p not in good]
            where = "" if root.exists() else f" ({root} absent)"
            short.append(f"{len(good)} of {count} {kind.value} ports up at >= {rate:g} Gb/s ({why}){where}; "
                         f"not: {', '.join(bad) or 'none found'}")
    found = [Finding(kind=FindingKind.NIC_PORTS_DOWN, message="; ".join(short)[:2000])] if short else []
    return found, inventory(ports)


def NicExpectation(ports: int = 8, min_rate_gbps: float = 400.0) -> NetworkProfile:  # noqa: N802
    """InfiniBand ports as callers written before profiles said them (ports=0: no adapters expected)."""
    if ports == 0:
        return NetworkProfile(kind=NicKind.NONE)
    return NetworkProfile(kind=NicKind.INFINIBAND, ports=ports, rate_gbps=min_rate_gbps)
