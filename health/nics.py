"""Network adapters (InfiniBand / EFA) from sysfs: ports up at the expected rate vs the expected count."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from policies.findings import Finding, FindingKind

_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*Gb/sec")


@dataclass(frozen=True)
class NicExpectation:
    ports: int = 8  # H100/H200/B200 nodes: 8 ports
    min_rate_gbps: float = 400.0  # ... each at 400 Gb/s or more


DEFAULT_EXPECTATIONS = {"ampere": NicExpectation(ports=1, min_rate_gbps=200.0), "hopper": NicExpectation(),
                        "blackwell": NicExpectation()}


@dataclass(frozen=True)
class PortState:
    device: str
    port: str
    state: str
    phys_state: str
    rate_gbps: float
    link_downed: int | None

    @property
    def up(self) -> bool:
        # sysfs gives "4: ACTIVE" and "5: LinkUp"; the number is the stable part.
        return self.state.startswith("4") and self.phys_state.startswith("5")


def read_ports(root: Path = Path("/sys/class/infiniband")) -> list[PortState]:
    ports = []
    for dev in sorted(p for p in root.iterdir() if p.is_dir()) if root.exists() else []:
        for port in sorted((dev / "ports").iterdir()) if (dev / "ports").exists() else []:
            def read(name: str, _port=port) -> str:
                try:
                    return (_port / name).read_text().strip()
                except OSError:
                    return ""
            rate = _RATE.match(read("rate"))
            downed = read("counters/link_downed")
            ports.append(PortState(device=dev.name, port=port.name, state=read("state"), phys_state=read("phys_state"),
                                   rate_gbps=float(rate.group(1)) if rate else 0.0,
                                   link_downed=int(downed) if downed.isdigit() else None))
    return ports


def probe_nics(expect: NicExpectation, root: Path = Path("/sys/class/infiniband")) -> list[Finding]:
    """A degraded adapter does not crash a job, it slows every collective: count what is really up."""
    if expect.ports == 0:
        return []
    if not root.exists():
        return [Finding(kind=FindingKind.PROBE_BROKEN, message=f"{root} missing: cannot count network ports")]
    ports = read_ports(root)
    good = [p for p in ports if p.up and p.rate_gbps >= expect.min_rate_gbps]
    if len(good) >= expect.ports:
        return []
    bad = [f"{p.device}/{p.port} ({p.state or '?'}, {p.phys_state or '?'}, {p.rate_gbps:g} Gb/s)"
           for p in ports if p not in good]
    return [Finding(kind=FindingKind.NIC_PORTS_DOWN,
                    message=f"{len(good)} of {expect.ports} ports up at >= {expect.min_rate_gbps:g} Gb/s; "
                            f"not: {', '.join(bad) or 'none found'}"[:2000])]
