"""Node-local activities against the simulated NVML, real processes and stand-in binaries."""

import contextlib
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

import api as c
from activities.node import NodeActivities
from health.nics import NicExpectation
from health.runner import ProbeConfig
from policies.model import Policy
from sim.load_device import sim_opener
from sim.nvml import SimulatedNvml


def tool(tmp_path: Path, name: str, body: str) -> str:
    p = tmp_path / name
    p.write_text(f"#!/bin/sh\n{body}\n")
    p.chmod(0o755)
    return str(p)


@contextlib.contextmanager
def gpu_process(nv: SimulatedNvml, gpu: int, code: str = "import time; time.sleep(60)"):
    """A real process that the simulated driver lists on one GPU; killed afterwards whatever happens."""
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    nv.gpus[gpu].processes = [(proc.pid, 1 << 30)]
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture
def node(tmp_path):
    nv = SimulatedNvml("a1", gpus=4)
    cfg = ProbeConfig(expected_gpus=4, nics=NicExpectation(ports=0), require_nvidia_smi=False,
                      sysfs_infiniband=tmp_path)
    acts = NodeActivities(cfg, nv, nvidia_smi=tool(tmp_path, "nvidia-smi", "exit 0"),
                          dcgmi=str(tmp_path / "no-dcgmi"))
    return nv, acts


async def test_kill_terminates_gpu_processes(node):
    nv, acts = node
    with gpu_process(nv, 1) as proc:
        result = await ActivityEnvironment().run(acts.kill_gpu_processes, c.KillRequest(node="a1", gpus=[1], grace_s=2))
        assert [p.pid for p in result.killed] == [proc.pid]
        assert proc.wait(timeout=5) != 0
        assert acts.gpu_processes([1]) == []


async def test_kill_escalates_to_sigkill(node):
    nv, acts = node
    stubborn = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(60)"
    with gpu_process(nv, 0, stubborn) as proc:
        proc.stdout.readline()
        await ActivityEnvironment().run(acts.kill_gpu_processes, c.KillRequest(node="a1", gpus=[0], grace_s=0.3))
        assert proc.wait(timeout=5) == -9


async def test_kill_dry_run_changes_nothing(node):
    nv, acts = node
    with gpu_process(nv, 2) as proc:
        result = await ActivityEnvironment().run(acts.kill_gpu_processes, c.KillRequest(node="a1", gpus=[2], dry_run=True))
        assert result.dry_run and [p.pid for p in result.killed] == [proc.pid]
        assert proc.poll() is None


async def test_kill_with_no_gpu_named_kills_nothing(node):
    """An Xid whose bus id maps to no GPU implicates none: other tenants' processes live on (issue 22, 4)."""
    nv, acts = node
    with gpu_process(nv, 0) as a, gpu_process(nv, 3) as b:
        result = await ActivityEnvironment().run(acts.kill_gpu_processes, c.KillRequest(node="a1", gpus=[], grace_s=1))
        assert result.killed == [] and "no GPU implicated" in result.spared[0]
        assert a.poll() is None and b.poll() is None
        everything = await ActivityEnvironment().run(acts.kill_gpu_processes,
                                                     c.KillRequest(node="a1", all_gpus=True, grace_s=2))
        assert sorted(p.pid for p in everything.killed) == sorted([a.pid, b.pid]), "all_gpus says every GPU"


async def test_kill_on_mig_stops_only_the_implicated_instance(node):
    """MIG on: the processes of other GPU instances on the same GPU are other tenants (issue 22, 4)."""
    nv, acts = node
    nv.gpus[1].mig = True
    with gpu_process(nv, 1) as mine, gpu_process(nv, 2) as theirs:
        nv.gpus[1].processes = [(mine.pid, 1 << 30, 1, 0), (theirs.pid, 1 << 30, 2, 0)]
        nv.gpus[2].processes = []
        req = c.KillRequest(node="a1", gpus=[1], mig=[c.MigTarget(gpu_index=1, gpu_instance_id=1)], grace_s=2)
        result = await ActivityEnvironment().run(acts.kill_gpu_processes, req)
        assert [p.pid for p in result.killed] == [mine.pid] and result.killed[0].gpu_instance_id == 1
        assert mine.wait(timeout=5) != 0 and theirs.poll() is None
        assert "not the implicated instance" in result.spared[0]
        unnamed = await ActivityEnvironment().run(acts.kill_gpu_processes, c.KillRequest(node="a1", gpus=[1], grace_s=1))
        assert unnamed.killed == [] and theirs.poll() is None, "MIG on and no instance named: no tenant is killed"


async def test_kill_never_signals_a_reused_pid(node):
    """The pid listed is checked against its start time before each signal: a pid the kernel gave
    to another process meanwhile is left alone (issue 22, 4)."""
    nv, acts = node
    with gpu_process(nv, 1) as proc:
        listed = acts.gpu_processes([1])[0]
        assert listed.start_ticks is not None
        reused = listed.model_copy(update={"start_ticks": listed.start_ticks - 1})  # an earlier process of that pid
        assert acts.signal(reused, signal.SIGKILL) is False
        assert proc.poll() is None, "the process now holding the pid is not signalled"
        assert acts.signal(listed, signal.SIGKILL) is True
        assert proc.wait(timeout=5) == -9


async def test_reset_refuses_while_processes_remain(node):
    nv, acts = node
    with gpu_process(nv, 1), pytest.raises(ApplicationError) as err:
        await ActivityEnvironment().run(acts.reset_gpu, c.ResetRequest(node="a1", gpus=[1]))
    assert err.value.type == "ProcessesRemain" and err.value.non_retryable


async def test_reset_refuses_with_mig(node):
    nv, acts = node
    nv.gpus[3].mig = True
    with pytest.raises(ApplicationError) as err:
        await ActivityEnvironment().run(acts.reset_gpu, c.ResetRequest(node="a1", gpus=[3]))
    assert err.value.type == "MigActive"


async def test_reset_without_nvidia_smi_fails_closed(node, tmp_path):
    nv, acts = node
    acts.nvidia_smi = str(tmp_path / "missing-smi")
    with pytest.raises(ApplicationError) as err:
        await ActivityEnvironment().run(acts.reset_gpu, c.ResetRequest(node="a1", gpus=[0]))
    assert err.value.type == "DependencyMissing"


async def test_reset_verified_with_nvml(node, tmp_path):
    nv, acts = node
    log = tmp_path / "smi.log"
    acts.nvidia_smi = tool(tmp_path, "nvidia-smi", f'echo "$@" >> {log}')
    result = await ActivityEnvironment().run(acts.reset_gpu, c.ResetRequest(node="a1", gpus=[0, 2]))
    assert result.reset == [0, 2]
    assert log.read_text().splitlines() == ["-r -i 0", "-r -i 2"]


async def test_reset_that_did_not_clear_the_fault_is_no_effect(node):
    nv, acts = node
    nv.inject("row_remap_failure", gpu=2)
    with pytest.raises(ApplicationError) as err:
        await ActivityEnvironment().run(acts.reset_gpu, c.ResetRequest(node="a1", gpus=[2]))
    assert err.value.type == "NoEffect" and "row_remap_failure" in str(err.value)


async def test_failed_smi_is_retryable(node, tmp_path):
    nv, acts = node
    acts.nvidia_smi = tool(tmp_path, "nvidia-smi", "echo 'GPU in use'; exit 3")
    with pytest.raises(RuntimeError, match="exited 3"):
        await ActivityEnvironment().run(acts.reset_gpu, c.ResetRequest(node="a1", gpus=[1]))


async def test_validate_passes_and_fails(node):
    nv, acts = node
    ok = await ActivityEnvironment().run(acts.validate, c.ValidateRequest(node="a1"))
    assert ok.passed and "nvml" in ok.checks
    nv.inject("ecc_dbe", gpu=1)
    bad = await ActivityEnvironment().run(acts.validate, c.ValidateRequest(node="a1"))
    assert not bad.passed and [f.kind for f in bad.findings] == ["ecc_dbe"]


async def test_validate_requires_dcgm_when_policy_says(node, tmp_path):
    nv, acts = node
    res = await ActivityEnvironment().run(acts.validate, c.ValidateRequest(node="a1", dcgm_required=True))
    assert not res.passed and "dcgmi required" in res.findings[0].message
    acts.dcgmi = tool(tmp_path, "dcgmi", "echo diag failed; exit 1")
    res = await ActivityEnvironment().run(acts.validate, c.ValidateRequest(node="a1", dcgm_level=2))
    assert not res.passed and "dcgm-r2" in res.checks
    acts.dcgmi = tool(tmp_path, "dcgmi2", "exit 0")
    assert (await ActivityEnvironment().run(acts.validate, c.ValidateRequest(node="a1"))).passed


async def test_validate_counts_gpus(node):
    nv, acts = node
    res = await ActivityEnvironment().run(acts.validate, c.ValidateRequest(node="a1", expected_gpus=8))
    assert not res.passed and res.findings[0].kind == "gpu_count_mismatch"


async def test_gpu_pods_maps_pods_to_their_gpus(tmp_path):
    """The pod of each GPU process comes from its cgroup, as the kubelet's cgroup layout names it."""
    nv = SimulatedNvml("a1", gpus=4)
    proc = tmp_path / "proc"
    uids = {11: "0b5e5c4a-1111-4c3e-9a57-6c1d2f3e4a5b", 12: "0b5e5c4a-1111-4c3e-9a57-6c1d2f3e4a5b",
            13: "7f00aa00-2222-4c3e-9a57-6c1d2f3e4a5b"}
    for pid, uid in [*uids.items(), (14, None)]:
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "stat").write_text(f"{pid} (python) S 1")
        pod = f"kubepods-burstable-pod{uid.replace('-', '_')}.slice" if uid else "user.slice"
        (proc / str(pid) / "cgroup").write_text(f"0::/kubepods.slice/{pod}/cri-containerd-abc.scope\n")
    nv.gpus[0].processes, nv.gpus[1].processes = [(11, 1 << 30)], [(12, 1 << 30), (14, 1 << 20)]
    nv.gpus[3].processes = [(13, 1 << 30)]
    acts = NodeActivities(ProbeConfig(expected_gpus=4, nics=NicExpectation(ports=0), require_nvidia_smi=False,
                                      sysfs_infiniband=tmp_path), nv, proc=proc)
    result = await ActivityEnvironment().run(acts.gpu_pods, c.GpuPodsRequest(node="a1"))
    assert result.pod_gpus == {f"uid:{uids[11]}": [0, 1], f"uid:{uids[13]}": [3]}


# --- validation under load ----------------------------------------------------------------------
def loaded(tmp_path, nv, open_devices=None):
    cfg = ProbeConfig(expected_gpus=len(nv.gpus), nics=NicExpectation(ports=0), require_nvidia_smi=False,
                      sysfs_infiniband=tmp_path)
    return NodeActivities(cfg, nv, dcgmi=str(tmp_path / "no-dcgmi"), open_devices=open_devices)


QUICK = c.ValidateRequest(node="a1", tier="quick", load=Policy().scaled(0.01).validation.load)


async def test_validate_under_load_records_every_gpu_figure(tmp_path):
    nv = SimulatedNvml("a1", gpus=2)
    res = await ActivityEnvironment().run(loaded(tmp_path, nv, sim_opener(nv)).validate, QUICK)
    assert res.passed and "load-quick" in res.checks and "compute" in res.checks
    assert [(g.uuid, g.serial) for g in res.load.gpus] == [(g.uuid, g.serial) for g in nv.gpus]
    assert res.load.gpus[1].figures["tflops_sustained"] > 500


async def test_validate_fails_a_gpu_that_corrupts_only_under_load(tmp_path):
    nv = SimulatedNvml("a1", gpus=2)
    nv.inject("corrupt_under_load", gpu=1)
    acts = loaded(tmp_path, nv, sim_opener(nv))
    assert (await ActivityEnvironment().run(acts.validate, c.ValidateRequest(node="a1"))).passed  # status alone: fooled
    res = await ActivityEnvironment().run(acts.validate, QUICK)
    assert not res.passed and [(f.kind.value, f.gpu_index) for f in res.findings] == [("silent_data_corruption", 1)]


async def test_validate_without_cupy_fails_closed(tmp_path):
    """The real opener on a machine without CuPy (this one): probe_broken with the reason, never a pass."""
    nv = SimulatedNvml("a1", gpus=2)
    res = await ActivityEnvironment().run(loaded(tmp_path, nv).validate, QUICK)
    assert not res.passed and [f.kind.value for f in res.findings] == ["probe_broken"]
    assert "CuPy is not installed" in res.findings[0].message and "gpuheal[gpu]" in res.findings[0].message


async def test_validate_skips_the_load_when_the_status_probes_fail(tmp_path):
    nv = SimulatedNvml("a1", gpus=2)
    nv.inject("ecc_dbe", gpu=0)
    res = await ActivityEnvironment().run(loaded(tmp_path, nv, sim_opener(nv)).validate, QUICK)
    assert not res.passed and res.load is None and "load-quick: not run, the status probes already failed" in res.checks


async def test_hardware_ids_are_the_nodes_own(node):
    """What admission checks against the denylist: read from NVML on the node, whoever started it."""
    nv, acts = node
    got = await ActivityEnvironment().run(acts.hardware_ids, c.HardwareIdsRequest(node="a1"))
    assert got.gpus == 4
    assert got.hardware_ids == sorted({f"GPU-a1-{i:02d}" for i in range(4)} | {"SN-a1-0", "SN-a1-1"})
