"""Node-local side effects (task queue node/<name>): GPU processes, GPU reset, validation, boot id."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
from pathlib import Path

import pynvml
from temporalio import activity

from activities import contracts as c
from activities.errors import DEPENDENCY_MISSING, MIG_ACTIVE, NO_EFFECT, PROCESSES_REMAIN, fail
from health.nvml import probe_nvml
from health.runner import ProbeConfig, run_cycle
from policies.findings import Finding

_POD_UID = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})")


class NodeActivities:
    def __init__(self, config: ProbeConfig, nv=pynvml, proc: Path = Path("/proc"), nvidia_smi: str = "nvidia-smi",
                 dcgmi: str = "dcgmi"):
        self.config, self.nv, self.proc = config, nv, proc
        self.nvidia_smi, self.dcgmi = nvidia_smi, dcgmi

    def activities(self) -> list:
        """What the node's worker registers on node/<name>."""
        return [self.kill_gpu_processes, self.reset_gpu, self.validate, self.gpu_pods, self.hardware_ids]

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
        nv = self.nv
        nv.nvmlInit()
        try:
            wanted = gpus or list(range(nv.nvmlDeviceGetCount()))
            out = []
            for i in wanted:
                for p in nv.nvmlDeviceGetComputeRunningProcesses(nv.nvmlDeviceGetHandleByIndex(i)):
                    if self._alive(p.pid):
                        out.append(c.GpuProcess(pid=p.pid, gpu_index=i, pod=self._pod_of(p.pid),
                                                used_memory_bytes=p.usedGpuMemory))
            return out
        finally:
            nv.nvmlShutdown()

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
        self.nv.nvmlInit()
        try:
            count = self.nv.nvmlDeviceGetCount()
        finally:
            self.nv.nvmlShutdown()
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
        procs = self.gpu_processes(req.gpus)
        if req.dry_run or not procs:
            return c.KillResult(killed=procs if req.dry_run else [], dry_run=req.dry_run)
        for p in procs:
            self._signal(p.pid, signal.SIGTERM)
        deadline = asyncio.get_running_loop().time() + req.grace_s
        while any(self._alive(p.pid) for p in procs) and asyncio.get_running_loop().time() < deadline:
            activity.heartbeat("waiting for SIGTERM")
            await asyncio.sleep(0.1)
        for p in procs:
            if self._alive(p.pid):
                self._signal(p.pid, signal.SIGKILL)
        for _ in range(50):
            if not any(self._alive(p.pid) for p in procs):
                return c.KillResult(killed=procs)
            await asyncio.sleep(0.1)
        left = [p.pid for p in procs if self._alive(p.pid)]
        raise fail(NO_EFFECT, f"GPU processes survived SIGKILL: {left}", pids=left)

    @staticmethod
    def _signal(pid: int, sig: int) -> None:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass

    # --- reset ---------------------------------------------------------------------------------
    @activity.defn(name=c.NODE_RESET)
    async def reset_gpu(self, req: c.ResetRequest) -> c.ResetResult:
        smi = shutil.which(self.nvidia_smi)
        if smi is None:
            raise fail(DEPENDENCY_MISSING, f"{self.nvidia_smi} not found: cannot reset GPUs {req.gpus or 'all'}")
        if left := self.gpu_processes(req.gpus):
            raise fail(PROCESSES_REMAIN, f"processes still on the GPU: {[p.pid for p in left]}")
        before = probe_nvml(self.nv)
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
        after = probe_nvml(self.nv)
        still = [f for f in after.findings if f.gpu_index in gpus or f.gpu_index is None]
        if still:
            raise fail(NO_EFFECT, "GPU reset reported success but faults remain: " + ", ".join(f.label() for f in still))
        return c.ResetResult(reset=gpus)

    # --- validation ----------------------------------------------------------------------------
    @activity.defn(name=c.NODE_VALIDATE)
    async def validate(self, req: c.ValidateRequest) -> c.ValidationResult:
        config = self.config
        if req.expected_gpus is not None:
            config = ProbeConfig(**{**config.__dict__, "expected_gpus": req.expected_gpus})
        snap = await asyncio.to_thread(run_cycle, config, self.nv)
        findings, checks = list(snap.findings), list(snap.checks)
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
