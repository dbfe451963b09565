"""A simulated GPU fleet on this machine: fake API server, moto, simulated hosts with real agents.

Every node is an EC2 instance in moto, a Node in the fake API server, and a host with simulated
GPUs whose real agent probes them, reports to Temporal and serves node-local activities (the
host: sim/sim_host.py). The controller side runs the real activities.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import boto3
from kubernetes import client
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.worker import Worker

import api as c
from activities.cloud import CloudActivities
from activities.guard import GuardActivities
from activities.kube import KubeActivities
from activities.ledger import LedgerActivities, SqliteLedger
from activities.policy import PolicyActivities
from activities.providers.aws import AWS_CLIENT_CONFIG
from api.names import node_task_queue, remediation_workflow_id
from health.nics import NicExpectation
from health.runner import ProbeConfig
from policies.model import Policy
from sim.events import apply_event
from sim.fake_kube import FakeKubeServer
from sim.load_device import sim_opener
from sim.nvml import SimulatedNvml
from sim.scenario import Scenario
from sim.sim_host import SimHost, SimNodeActivities
from sim.sysfs import PORT_UP, write_ib_ports
from workers.agent import AgentConfig
from workers.controller import controller_activities, controller_worker

log = logging.getLogger("gpuheal.sim")

@dataclass
class SimulatedFleet:
    scenario: Scenario
    policy: Policy
    temporal: Client
    task_queue: str = c.DEFAULT_TASK_QUEUE
    cluster: str = "sim"
    poll_s: float = 0.2
    hosts: dict[str, SimHost] = field(default_factory=dict)
    _starting: dict[str, float] = field(default_factory=dict)  # job pod -> when it turns Ready
    _pods_made: int = 0
    ledger_path: Path | None = None  # the controller's ledger (the demo's is .gpuheal/ledger.db); default: a temp one

    def episode_id(self, node: str) -> str:
        return remediation_workflow_id(node, self.cluster)

    def agent_config(self, host: SimHost) -> AgentConfig:
        """The agent's production timings on the scenario's clock, so scenarios see its re-sends and
        held events where production would (the poll no faster than the fleet's beat)."""
        probe = ProbeConfig(expected_gpus=self.scenario.fleet.gpus_per_node, generation=self.scenario.fleet.generation,
                            nics=NicExpectation(), sysfs_infiniband=host.sysfs, require_nvidia_smi=False)
        defaults, scale = AgentConfig(node=host.name, policy=self.policy), self.scenario.time_scale
        return AgentConfig(node=host.name, policy=self.policy, cluster=self.cluster, task_queue=self.task_queue,
                           generation=self.scenario.fleet.generation, probe=probe,
                           poll_interval_s=max(self.poll_s, defaults.poll_interval_s * scale),
                           persist_polls=1, resend_interval_s=defaults.resend_interval_s * scale,
                           event_hold_s=defaults.event_hold_s * scale, kmsg=None, admit_on_start=False)

    @contextlib.asynccontextmanager
    async def running(self, moto_url: str, controller: bool = True, controller_aws_url: str | None = None):
        """Everything up. `controller=False` leaves the controller to the caller (a `gpuheal
        controller` process on `self.kubeconfig`); `controller_aws_url` points its AWS clients
        elsewhere (a fault-injecting proxy in front of moto). The hosts always see moto itself."""
        self.tmp = Path(tempfile.mkdtemp(prefix="gpuheal-sim-"))
        session = boto3.Session(aws_access_key_id="sim", aws_secret_access_key="sim", region_name="us-east-1")
        self.ec2 = session.client("ec2", endpoint_url=moto_url, config=AWS_CLIENT_CONFIG)
        server = FakeKubeServer().start()
        self.kube = server.kube
        self.kubeconfig = server.write_kubeconfig(self.tmp / "kubeconfig")
        aws = controller_aws_url or moto_url
        api = server.api_client()
        core = client.CoreV1Api(api)
        smi = self.tmp / "nvidia-smi"
        smi.write_text("#!/bin/sh\nexit 0\n")  # the simulated driver's reset always returns
        smi.chmod(0o755)
        self._build(core)
        workers = []
        if controller:
            cloud = CloudActivities.aws(*(session.client(s, endpoint_url=aws, config=AWS_CLIENT_CONFIG) for s in ("ec2", "autoscaling", "ssm")), core)
            self.ledger = SqliteLedger(self.ledger_path or self.tmp / "ledger.db")
            ledger, guard = LedgerActivities(self.ledger), GuardActivities(self.temporal)
            # Kept to start the controller again (a scenario's controller_restart event).
            self.new_controller = lambda: controller_worker(self.temporal, self.task_queue, controller_activities(
                KubeActivities(core), cloud, ledger, guard, PolicyActivities(self.policy, "scenario", self.cluster)))
            self.controller = self.new_controller()
            workers.append(self.controller)

        def node_worker(host: SimHost) -> Worker:
            acts = SimNodeActivities(host, self.agent_config(host).probe, host.nv, proc=host.proc, nvidia_smi=str(smi),
                                     dcgmi=str(self.tmp / "no-dcgmi"), open_devices=sim_opener(host.nv))
            return Worker(self.temporal, task_queue=node_task_queue(host.name, self.cluster), activities=acts.activities())
        self.new_node_worker = node_worker  # an agent started again (a scenario's agent_start event)
        for host in self.hosts.values():
            host.worker = node_worker(host)
            workers.append(host.worker)
        try:
            async with contextlib.AsyncExitStack() as stack:
                for w in workers:
                    await stack.enter_async_context(w)
                stack.push_async_callback(self._stop_restarted)
                yield self
        finally:
            api.close()
            server.stop()

    def _build(self, core) -> None:
        ami = self.ec2.describe_images()["Images"][0]["ImageId"]
        sc = self.scenario
        for name in sc.fleet.names():
            iid = self.ec2.run_instances(
                ImageId=ami, MinCount=1, MaxCount=1, InstanceType="p5.48xlarge",
                Placement={"AvailabilityZone": "us-east-1a"},
                TagSpecifications=[{"ResourceType": "instance", "Tags": [
                    {"Key": "gpuheal.io/managed", "Value": "true"}, {"Key": "Name", "Value": name}]}])[
                "Instances"][0]["InstanceId"]
            self.kube.add_node(name, labels={"nvidia.com/gpu.present": "true"}, provider_id=f"aws:///us-east-1a/{iid}",
                               boot_id=f"{name}-boot-1")
            root = self.tmp / name
            (root / "proc/sys/kernel/random").mkdir(parents=True)
            host = SimHost(name, self, iid, root, SimulatedNvml(name, sc.fleet.gpus_per_node, sc.fleet.generation))
            write_ib_ports(host.sysfs, [PORT_UP] * 8)
            host.agent = host.new_agent()
            self.hosts[name] = host
        for job in sc.fleet.jobs:
            for i, node in enumerate(job.nodes):
                self.kube.add_pod(f"{job.name}-{i}", node, labels={"job": job.name})
            self.kube.add_pdb(job.name, {"job": job.name}, min_available=job.min_available)

    async def play(self, deadline_s: float = 600.0, on_tick=None) -> None:
        """Inject each fault at its (scaled) time; run every host until all episodes have ended."""
        loop = asyncio.get_running_loop()
        start = loop.time()
        pending = sorted(self.scenario.faults, key=lambda f: f.at)
        events = sorted(self.scenario.events, key=lambda e: e.at)
        while loop.time() - start < deadline_s:
            elapsed = loop.time() - start
            while events and events[0].at.total_seconds() * self.scenario.time_scale <= elapsed:
                await apply_event(self, events.pop(0))
            while pending and pending[0].at.total_seconds() * self.scenario.time_scale <= elapsed:
                f = pending.pop(0)
                host = self.hosts[f.node]
                host.fault, host.recurs_left = f, f.recurs
                host.inject()
                await host.notice()
            await self._beat()
            if on_tick is not None:
                await on_tick(self)
            if not pending and not events and await self._all_settled():
                return
            await asyncio.sleep(self.poll_s)
        raise TimeoutError(f"scenario {self.scenario.name} did not settle within {deadline_s:.0f}s")

    async def _stop_restarted(self) -> None:
        """Workers the scenario's events started (an agent or the controller started again)."""
        for w in getattr(self, "restarted", []):
            with contextlib.suppress(Exception):
                await w.shutdown()

    async def serve(self) -> None:
        """Keep every host beating after the scenario (the demo's --keep): hand-sent reports get
        reboots, re-sends and validations as during the scenario. Runs until cancelled."""
        while True:
            await self._beat()
            await asyncio.sleep(self.poll_s)

    async def _beat(self) -> None:
        """Every host's beat (reboots, recurrences, its agent's probe cycle), then the jobs'."""
        await asyncio.gather(*(h.tick() for h in self.hosts.values()))
        self._run_jobs(asyncio.get_running_loop().time())

    def _run_jobs(self, now: float) -> None:
        """The jobs' controller: an evicted pod comes back on another schedulable node and turns
        Ready after the job's reschedule time, which is what lets a PDB-blocked drain go on."""
        for job in self.scenario.fleet.jobs:
            pods = self.kube.list("Pod", "default", labels=f"job={job.name}")
            live = [p for p in pods if "deletionTimestamp" not in p["metadata"]]
            for p in live:
                ready_at = self._starting.get(p["metadata"]["name"])
                if ready_at is not None and now >= ready_at:
                    del self._starting[p["metadata"]["name"]]
                    self.kube.set_pod_ready(p["metadata"]["name"])
            busy = {p["spec"]["nodeName"] for p in live}
            free = [n for n in self.scenario.fleet.names() if n not in busy and self._schedulable(n)]
            for _ in range(len(job.nodes) - len(live)):
                if not free:
                    break
                self._pods_made += 1
                name = f"{job.name}-r{self._pods_made}"
                self.kube.add_pod(name, free.pop(0), labels={"job": job.name}, ready=False)
                self._starting[name] = now + job.reschedule.total_seconds() * self.scenario.time_scale

    def _schedulable(self, node: str) -> bool:
        obj = self.kube.get("Node", "", node)
        return not obj["spec"].get("unschedulable") and not obj["spec"].get("taints")

    async def _all_settled(self) -> bool:
        for host in self.hosts.values():
            if not host.injected:
                continue
            if host.await_uncordon:
                return False
            try:
                desc = await self.temporal.get_workflow_handle(self.episode_id(host.name)).describe()
            except Exception:  # noqa: BLE001 - not started yet
                return False
            if desc.status == WorkflowExecutionStatus.RUNNING:
                return False
        return True
