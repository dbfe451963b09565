"""The probe cycle runs what PROBES lists: a new probe is one entry, and one that breaks is a
probe_broken finding naming it, never a healthy cycle."""

from __future__ import annotations

import time

import pytest

from health import runner
from health.runner import PROBES, Probe, ProbeConfig, run_cycle
from policies.findings import Finding, FindingKind
from sim.nvml import SimulatedNvml


def config(tmp_path) -> ProbeConfig:
    return ProbeConfig(sysfs_infiniband=tmp_path / "absent", require_nvidia_smi=False, probe_timeout_s=0.5)


def test_the_cycle_names_every_registered_probe(tmp_path):
    snap = run_cycle(config(tmp_path), SimulatedNvml("reg", gpus=2))
    assert snap.checks == [p.name for p in PROBES] == ["nvml", "nics", "dependencies"]
    assert len(snap.gpus) == 2 and snap.inventory is not None and not snap.findings


def test_a_new_probe_is_one_entry(tmp_path, monkeypatch: pytest.MonkeyPatch):
    fans = Probe("fans", lambda cfg, nv: [Finding(kind=FindingKind.THERMAL, message="fan 3 stopped")],
                 lambda snap, found: snap.findings.extend(found))
    monkeypatch.setattr(runner, "PROBES", (*PROBES, fans))
    snap = run_cycle(config(tmp_path), SimulatedNvml("fans", gpus=1))
    assert snap.checks[-1] == "fans" and [f.message for f in snap.findings] == ["fan 3 stopped"]


@pytest.mark.parametrize("run,said", [
    (lambda cfg, nv: 1 / 0, "probe flaky raised ZeroDivisionError"),
    (lambda cfg, nv: time.sleep(2), "probe flaky hung past 0.5s"),
])
def test_a_broken_probe_is_a_finding_naming_it(tmp_path, monkeypatch: pytest.MonkeyPatch, run, said):
    monkeypatch.setattr(runner, "PROBES", (*PROBES, Probe("flaky", run, lambda snap, r: None)))
    snap = run_cycle(config(tmp_path), SimulatedNvml("flaky", gpus=1))
    [f] = snap.findings
    assert f.kind == FindingKind.PROBE_BROKEN and said in f.message
