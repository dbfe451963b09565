"""Slow signals (a degraded PCIe link, NVLink down, throttling) need hysteresis however the catalogue
rates them; fatal findings still count at once."""

from policies.findings import Finding
from policies.loader import default_policy
from workers.agent import Agent, AgentConfig


def agent(persist: int = 3) -> Agent:
    return Agent(None, AgentConfig(node="n", policy=default_policy(), kmsg=None, persist_polls=persist),
                 boot_id="b", clock=lambda: 0.0)


def test_slow_signals_must_persist_before_they_are_reported():
    a = agent()
    for kind in ("pcie_degraded", "thermal", "nvlink_down"):
        a = agent()
        f = Finding(kind=kind, gpu_index=1, message="x")
        assert a.confirmed([f]) == [] and a.confirmed([f]) == [], kind
        assert a.confirmed([f]) == [f], kind
        assert a.confirmed([]) == [] and a.confirmed([f]) == [], f"{kind}: a gap starts the count again"


def test_fatal_findings_still_count_at_once():
    f = Finding(kind="gpu_lost", gpu_index=0)
    assert agent().confirmed([f]) == [f]
    nic = Finding(kind="nic_ports_down", message="7 of 8")
    assert agent().confirmed([nic]) == [nic]
