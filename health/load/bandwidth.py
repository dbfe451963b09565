"""Bandwidth: device-to-device copy and pinned host<->device copies per GPU, and all-pairs peer
copies when the node has more than one GPU. The best of a few repeats counts (a first copy pays
for mapping); floors and the SKU's median judge them (policies/load.py)."""

from __future__ import annotations

from health.load.device import GpuDevice

REPEATS = 3


def _best(copy, nbytes: int) -> float:
    return nbytes / min(copy(nbytes) for _ in range(REPEATS))


def run_bandwidth(dev: GpuDevice, nbytes: int) -> dict[str, float]:
    return {"d2d_tbps": _best(dev.copy_device, nbytes) / 1e12,
            "h2d_gbps": _best(dev.copy_to_device, nbytes) / 1e9,
            "d2h_gbps": _best(dev.copy_to_host, nbytes) / 1e9}


def run_peer(devs: list[GpuDevice], nbytes: int) -> tuple[dict[int, float], list[str]]:
    """Each GPU's slowest peer copy (GB/s, either direction) and the pairs that could not copy."""
    slowest: dict[int, float] = {}
    unreachable = []
    for src in devs:
        for dst in devs:
            if src is dst:
                continue
            took = min((src.copy_peer(dst, nbytes) or 0.0) for _ in range(REPEATS))
            if not took:
                unreachable.append(f"{src.info.index}->{dst.info.index}")
                continue
            gbps = nbytes / took / 1e9
            for i in (src.info.index, dst.info.index):
                slowest[i] = min(slowest.get(i, gbps), gbps)
    return slowest, unreachable
