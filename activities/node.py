"""Node-local side effects (task queue node/<cluster>/<node>): GPU processes, GPU reset, validation, boot id."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import signal
from pathlib import Path

import pynvml
from temporalio import activity

import api as c
from activities.errors import DEPENDENCY_MISSING, MIG_ACTIVE, NO_EFFECT, PROCESSES_REMAIN, fail
from health.load.battery import Opener, run_battery
from health.load.cupy_device import cupy_opener
from health.nvml import probe_nvml
from health.nvml_session import nvml_session
from health.runner import ProbeConfig, run_cycle
from health.xid_watch import mig_id
from policies.findings import Finding
from policies.load import LoadReport, LoadTestPolicy

_POD_UID = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})")


class NodeActivities:
    def __init__(self, config: ProbeConfig, nv=pynvml, proc: Path = Path("/proc"), nvidia_smi: str = "nvidia-smi",
                 dcgmi: str = "dcgmi", open_devices: Opener | None = None):
        self.config, self.nv, self.proc = config, nv, proc
        self.nvidia_smi, self.dcgmi = nvidia_smi, dcgmi
        # Real GPUs through CuPy unless told otherwise (the simulated hosts pass their own).
        self.open_devices = open_devices or cupy_opener(nv)

    def activities(self) -> list:
        """What the node's worker registers on node/<cluster>/<node>."""
        return [self.kill_gpu_processes, self.reset_gpu, self.validate, self.gpu_pods, self.inventory, self.hardware_ids]

    @activity.defn(name=c.NODE_HARDWARE_IDS)
    async def hardware_ids(self, req: c.HardwareIdsRequest) -> c.HardwareIdsResult:
        """The GPUs' own ids, from NVML on this node: admission checks these against the denylist."""
        found = await asyncio.to_thread(probe_nvml, self.nv)
        if not found.gpus:
            broken = "; ".join(f.message for f in found.findings)[:300]
            raise fail(DEPENDENCY_MISSING, f"no GPU ids readable on {req.node}" + (f": {broken}" if broken else ""))
        ids = {g.uuid for g in found.gpus} | {g.serial for g in found.gpus if g.serial}
        return c.HardwareIdsResult(hardware_ids=sorted(ids), gpus=len(found.gpus))

    # --- processes -----------------------------------------------------------------------------
    def gpu_processes(self, gpus: list[int]) -> list[c.GpuProcess]:
        """The live processes on these GPUs (empty: every GPU), with their MIG instance and start time.
        Blocking NVML calls: activities run it with asyncio.to_thread, never on the event loop."""
        with nvml_session(self.nv).use() as nv:
            wanted = gpus or list(range(nv.nvmlDeviceGetCount()))
            out = []
            for i in wanted:
                for p in nv.nvmlDeviceGetComputeRunningProcesses(nv.nvmlDeviceGetHandleByIndex(i)):
                    if self._alive(p.pid):
                        out.append(c.GpuProcess(pid=p.pid, gpu_index=i, pod=self._pod_of(p.pid),
                                                used_memory_bytes=p.usedGpuMemory,
                                                gpu_instance_id=mig_id(getattr(p, "gpuInstanceId", None)),
                                                compute_instance_id=mig_id(getattr(p, "computeInstanceId", None)),
                                                start_ticks=self._start_ticks(p.pid)))
            # A pid may have exited and been reused between the listing and the start time's read:
            # only a pid the driver still lists afterwards is the process whose start time was read.
            still = {(i, p.pid) for i in wanted
                     for p in nv.nvmlDeviceGetComputeRunningProcesses(nv.nvmlDeviceGetHandleByIndex(i))}
            return [p for p in out if (p.gpu_index, p.pid) in still]

    def _targets(self, req: c.KillRequest) -> tuple[list[c.GpuProcess], list[str]]:
        """The processes a kill may signal, and what it spares: only implicated GPUs (none named:
        none, unless all_gpus), and on a GPU in MIG mode only the implicated instances' processes."""
        if not req.gpus and not req.all_gpus:
            return [], ["no GPU implicated: nothing killed"]
        keep, spared = [], []
        for p in self.gpu_processes([] if req.all_gpus else req.gpus):
            if p.gpu_instance_id is None or req.all_gpus:
                keep.append(p)  # MIG off: the whole GPU is one tenant's
                continue
            named = [t for t in req.mig if t.gpu_index == p.gpu_index and t.gpu_instance_id == p.gpu_instance_id
                     and t.compute_instance_id in (None, p.compute_instance_id)]
            if named:
                keep.append(p)
            else:
                spared.append(f"pid {p.pid} on GPU {p.gpu_index} MIG instance {p.gpu_instance_id}/"
                              f"{p.compute_instance_id}: not the implicated instance")
        return keep, spared

    @activity.defn(name=c.NODE_GPU_PODS)
    async def gpu_pods(self, req: c.GpuPodsRequest) -> c.GpuPodsResult:
        """Which pod runs on which GPUs, from the GPUs' processes and their cgroups: what tells a
        failed GPU's job from its neighbours on the same node."""
        used: dict[str, set[int]] = {}
        for p in await asyncio.to_thread(self._readable_gpu_processes):
            if p.pod is not None:
                used.setdefault(p.pod, set()).add(p.gpu_index)
        return c.GpuPodsResult(pod_gpus={pod: sorted(g) for pod, g in used.items()})

    def _readable_gpu_processes(self) -> list[c.GpuProcess]:
        """Processes of every GPU that still answers: a lost GPU (the fault itself) lists none."""
        with nvml_session(self.nv).use() as nv:
            count = nv.nvmlDeviceGetCount()
        out = []
        for i in range(count):
            try:
                out += self.gpu_processes([i])
            except pynvml.NVMLError:
                continue
        return out

    def _pod_of(self, pid: int) -> str | None:
        """The pod uid from the process's cgroup path (kubepods.slice/...pod<uid>...)."""
        try:
            text = (self.proc / str(pid) / "cgroup").read_text()
        except OSError:
            return None
        m = _POD_UID.search(text)
        return f"uid:{m.group(1).replace('_', '-')}" if m else None

    def _alive(self, pid: int) -> bool:
        try:
            stat = (self.proc / str(pid) / "stat").read_text()
        except OSError:
            return False
        return stat.rsplit(")", 1)[-1].split()[0] != "Z"  # a zombie holds no GPU context

    @activity.defn(name=c.NODE_KILL)
    async def kill_gpu_processes(self, req: c.KillRequest) -> c.KillResult:
        procs, spared = await asyncio.to_thread(self._targets, req)
        if req.dry_run or not procs:
            return c.KillResult(killed=procs if req.dry_run else [], dry_run=req.dry_run, spared=spared)
        for p in procs:
            self.signal(p, signal.SIGTERM)
        deadline = asyncio.get_running_loop().time() + req.grace_s
        while any(self._same(p) for p in procs) and asyncio.get_running_loop().time() < deadline:
            activity.heartbeat("waiting for SIGTERM")
            await asyncio.sleep(0.1)
        for p in procs:
            self.signal(p, signal.SIGKILL)
        for _ in range(50):
            if not any(self._same(p) for p in procs):
                return c.KillResult(killed=procs, spared=spared)
            await asyncio.sleep(0.1)
        left = [p.pid for p in procs if self._same(p)]
        raise fail(NO_EFFECT, f"GPU processes survived SIGKILL: {left}", pids=left)

    def _start_ticks(self, pid: int) -> int | None:
        """Field 22 of /proc/<pid>/stat (clock ticks after boot): with the pid, names one process."""
        try:
            stat = (self.proc / str(pid) / "stat").read_text()
        except OSError:
            return None
        fields = stat.rsplit(")", 1)[-1].split()
        return int(fields[19]) if len(fields) > 19 and fields[19].isdigit() else None

    def _same(self, p: c.GpuProcess) -> bool:
        """The process listed is still alive: the pid is not a zombie and not reused by another process."""
        return self._alive(p.pid) and (p.start_ticks is None or self._start_ticks(p.pid) == p.start_ticks)

    def signal(self, p: c.GpuProcess, sig: int) -> bool:
        """Signals the process listed, never another that reused its pid: a pidfd pins the process,
        then its start time is compared with the listed one. False when it is gone or not the same."""
        try:
            fd = os.pidfd_open(p.pid)
        except ProcessLookupError:
            return False
        except OSError:  # no pidfd (kernel before 5.3): the start-time check alone
            if not self._same(p):
                return False
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, sig)
            return True
        try:
            if not self._same(p):
                return False
            signal.pidfd_send_signal(fd, sig)
            return True
        except ProcessLookupError:
            return False
        finally:
            os.close(fd)

    # --- reset ---------------------------------------------------------------------------------
    @activity.defn(name=c.NODE_RESET)
    async def reset_gpu(self, req: c.ResetRequest) -> c.ResetResult:
        smi = shutil.which(self.nvidia_smi)
        if smi is None:
            raise fail(DEPENDENCY_MISSING, f"{self.nvidia_smi} not found: cannot reset GPUs {req.gpus or 'all'}")
        if left := await asyncio.to_thread(self.gpu_processes, req.gpus):
            raise fail(PROCESSES_REMAIN, f"processes still on the GPU: {[p.pid for p in left]}")
        before = await asyncio.to_thread(probe_nvml, self.nv)
        gpus = req.gpus or [g.index for g in before.gpus]
        if mig := sorted(set(gpus) & set(before.mig_enabled)):
            raise fail(MIG_ACTIVE, f"MIG enabled on GPUs {mig}: destroy the instances before a reset")
        if req.dry_run:
            return c.ResetResult(reset=gpus, dry_run=True)
        for i in gpus:
            proc = await asyncio.create_subprocess_exec(smi, "-r", "-i", str(i), stdout=asyncio.subprocess.PIPE,
                                                        stderr=asyncio.subprocess.STDOUT)
            out, _ = await proc.communicate()
            if proc.returncode != 0:
                # Retryable: a monitor may have grabbed the GPU between our check and the reset.
                raise RuntimeError(f"nvidia-smi -r -i {i} exited {proc.returncode}: {out.decode()[-300:]}")
        after = await asyncio.to_thread(probe_nvml, self.nv)
        still = [f for f in after.findings if f.gpu_index in gpus or f.gpu_index is None]
        if still:
            raise fail(NO_EFFECT, "GPU reset reported success but faults remain: " + ", ".join(f.label() for f in still))
        return c.ResetResult(reset=gpus)

    # --- inventory -----------------------------------------------------------------------------
    @activity.defn(name=c.NODE_INVENTORY)
    async def inventory(self, req: c.InventoryRequest) -> c.InventoryResult:
        """What the node has now (GPUs, RDMA ports and rates, PCIe links): its baseline at admission."""
        snap = await asyncio.to_thread(run_cycle, self.config, self.nv)
        return c.InventoryResult(inventory=snap.inventory, findings=snap.findings)

    # --- validation ----------------------------------------------------------------------------
    @activity.defn(name=c.NODE_VALIDATE)
    async def validate(self, req: c.ValidateRequest) -> c.ValidationResult:
        config = self.config
        if req.expected_gpus is not None:
            config = ProbeConfig(**{**config.__dict__, "expected_gpus": req.expected_gpus})
        snap = await asyncio.to_thread(run_cycle, config, self.nv)
        findings, checks = list(snap.findings), list(snap.checks)
        if req.tier is not None:
            load = None
            if findings:
                checks.append(f"load-{req.tier}: not run, the status probes already failed")
            elif req.dry_run:
                checks.append(f"load-{req.tier}: dry run, not run")
            else:
                load = await self._load_test(req)
                findings += load.findings
                checks += [f"load-{req.tier}", *load.tests]
            if req.dcgm_required and shutil.which(self.dcgmi) is None:
                findings.append(Finding(kind="probe_broken", message="dcgmi required by policy but not installed"))
            return c.ValidationResult(passed=not findings, findings=findings, checks=checks, load=load)
        dcgmi = shutil.which(self.dcgmi)
        if dcgmi is not None:
            checks.append(f"dcgm-r{req.dcgm_level}")
            proc = await asyncio.create_subprocess_exec(dcgmi, "diag", "-r", str(req.dcgm_level),
                                                        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
            out, _ = await proc.communicate()
            if proc.returncode != 0:
                findings.append(Finding(kind="probe_broken", message=f"dcgmi diag -r {req.dcgm_level} failed: "
                                          f"{out.decode()[-500:]}"))
        elif req.dcgm_required:
            findings.append(Finding(kind="probe_broken", message="dcgmi required by policy but not installed"))
        return c.ValidationResult(passed=not findings, findings=findings, checks=checks)

    async def _load_test(self, req: c.ValidateRequest) -> LoadReport:
        """The battery in a thread, heartbeating meanwhile (a validation runs up to ~20 minutes)."""
        job = asyncio.ensure_future(asyncio.to_thread(
            run_battery, self.open_devices, self.nv, req.load or LoadTestPolicy(), req.tier, req.gpus or None,
            req.references, {"dcgmi": self.dcgmi}))
        while not job.done():
            activity.heartbeat(f"load test {req.tier} running")
            await asyncio.wait([job], timeout=5)
        return job.result()
