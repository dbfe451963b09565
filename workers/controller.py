"""The controller: workflows plus the cluster-side activities (kube, cloud, ledger, guard) on `gpuheal`."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import boto3
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode
from temporalio.worker import Worker
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

import api as c
from activities.cloud import CloudActivities
from activities.guard import GuardActivities
from activities.kube import KubeActivities
from activities.kube_client import CLUSTER_CALL_THREADS, load_core_api
from activities.ledger import DynamoLedger, LedgerActivities, SqliteLedger
from activities.load_ledger import LoadFigureActivities
from activities.node_profile import NodeProfileActivities
from activities.policy import PolicyActivities
from activities.providers import make_provider
from activities.providers.aws import AWS_CLIENT_CONFIG
from activities.providers.base import ProviderSettings
from activities.room_pool import RoomPool
from api.names import guard_workflow_id
from policies.guard_policy import GuardPolicy
from policies.loader import default_policy
from policies.model import Policy
from workers.condition_watcher import ConditionRule, ConditionWatcher, WatcherConfig
from workflows.fleet_guard import FleetGuard
from workflows.node_admission import NodeAdmission
from workflows.node_profile import NodeProfileLookup
from workflows.node_remediation import NodeRemediation

log = logging.getLogger("gpuheal.controller")


@dataclass
class ControllerConfig:
    task_queue: str = c.DEFAULT_TASK_QUEUE
    kubeconfig: str | None = None  # None: in-cluster config, else ~/.kube/config
    gpu_node_selector: str | None = "nvidia.com/gpu.present=true"
    ledger: str = ".gpuheal/ledger.db"  # a SQLite path, or dynamodb://<table>
    events_namespace: str = "default"
    max_concurrent_activities: int = 200
    # Node conditions other detectors set (NPD, DCGM exporter) that count as GPU faults; empty: no watcher.
    watch_conditions: list[ConditionRule] = field(default_factory=list)
    policy: Policy | None = None  # the policy every episode acts on (None: the defaults)
    policy_source: str = "default"  # where it was loaded from, shown with its hash in status
    cluster: str = "default"
    # Who reboots and replaces machines (activities/providers): aws (EC2, Auto Scaling, Karpenter) or
    # clusterapi (delete the Machine; its MachineSet makes a new one; no reboot).
    provider: str = "aws"
    provider_kubeconfig: str | None = None  # clusterapi: the management cluster's (None: the Machines are here)


CONTROLLER_WORKFLOWS = [NodeRemediation, FleetGuard, NodeAdmission, NodeProfileLookup]


def controller_activities(kube: KubeActivities, cloud: CloudActivities, ledger: LedgerActivities,
                          guard: GuardActivities, policy: PolicyActivities) -> list:
    """Every cluster-side activity, in one list: the controller, the simulator and the tests register it.
    The policy is answered per node (its profile applied), from the nodes' labels."""
    profiles = NodeProfileActivities(kube.core, policy.snapshot.policy, policy.snapshot.source, policy.snapshot.cluster,
                                     kube)
    return [kube.quarantine, kube.return_to_service, kube.attribute_pods, kube.drain, kube.event, kube.fleet_size,
            kube.check_node, kube.quarantined_nodes,
            cloud.reboot, cloud.replace, cloud.boot_id, ledger.record, ledger.count_recent, ledger.denylist,
            ledger.check_denied, ledger.admit, ledger.admitted, ledger.last_started, guard.signal_guard,
            guard.running_holders, guard.take_room, guard.liveness,
            guard.running_episodes, profiles.current, profiles.expectations, profiles.record_baseline,
            *LoadFigureActivities(ledger.ledger).activities()]


def build_worker(client: Client, cfg: ControllerConfig, room: RoomPool | None = None) -> Worker:
    """`room`: the quarantine room the guard reserves ahead for this process (None: every cordon asks)."""
    core = load_core_api(cfg.kubeconfig)
    kube = KubeActivities(core, cfg.events_namespace, cfg.gpu_node_selector)
    # boto3 finds region, credentials and endpoints (AWS_ENDPOINT_URL) the standard way.
    session = boto3.Session()
    provider = make_provider(cfg.provider, core, ProviderSettings(
        cluster=cfg.cluster, boto3_session=session, kubeconfig=cfg.provider_kubeconfig))
    cloud = CloudActivities(provider, core)
    if cfg.ledger.startswith("dynamodb://"):
        store = DynamoLedger(session.client("dynamodb", config=AWS_CLIENT_CONFIG), cfg.ledger.removeprefix("dynamodb://"))
    else:
        Path(cfg.ledger).parent.mkdir(parents=True, exist_ok=True)
        store = SqliteLedger(cfg.ledger)
    return controller_worker(client, cfg.task_queue,
                             controller_activities(kube, cloud, LedgerActivities(store), GuardActivities(client, room),
                                                   PolicyActivities(cfg.policy or default_policy(), cfg.policy_source,
                                                                    cfg.cluster)),
                             cfg.max_concurrent_activities)


def controller_worker(client: Client, task_queue: str, activities: list, max_concurrent_activities: int = 200,
                      workflows: list | None = None) -> Worker:
    """The controller's worker settings, in one place (the controller, the simulator, the benches).

    The cluster-side activities block in the kubernetes and boto3 clients off the event loop, so
    they get their own thread pool rather than asyncio's default (cores + 4 threads), which a
    storm of cordons would queue behind."""
    loop = asyncio.get_running_loop()
    if not isinstance(getattr(loop, "_default_executor", None), _ClusterCallPool):
        loop.set_default_executor(_ClusterCallPool(max_workers=CLUSTER_CALL_THREADS, thread_name_prefix="cluster-call"))
    return Worker(client, task_queue=task_queue, workflows=workflows or CONTROLLER_WORKFLOWS, activities=activities,
                  max_concurrent_activities=max_concurrent_activities, max_concurrent_local_activities=200,
                  max_concurrent_workflow_tasks=200, max_concurrent_workflow_task_polls=8,
                  workflow_runner=WORKFLOW_RUNNER)


# The sandbox re-imports every non-passed-through module for each new workflow run: for gpuheal's
# workflow modules that was the largest cost of a cold workflow task (a storm of first reports).
# They are passed through instead; tests/workflows/test_determinism.py keeps them free of clocks,
# randomness, I/O and module-level mutable state, which is what the re-import protected against.
WORKFLOW_RUNNER = SandboxedWorkflowRunner(restrictions=SandboxRestrictions.default.with_passthrough_modules("workflows", "api"))


class _ClusterCallPool(concurrent.futures.ThreadPoolExecutor):
    """The thread pool of blocking cluster calls (asyncio.to_thread in the activities)."""


async def tell_guard_the_policy(client: Client, cluster: str, guard: GuardPolicy) -> bool:
    """The controller's policy is the guard's: a running guard gets it as an update (recorded in its
    history); a guard not yet started takes it from the first episode that starts it."""
    handle = client.get_workflow_handle(guard_workflow_id(cluster))
    try:
        await handle.execute_update(FleetGuard.set_policy, args=[guard, client.identity],
                                    rpc_timeout=timedelta(seconds=10))
        # The running guard takes the deployed code's patches now, not at its next continue-as-new
        # (which may be months away).
        await handle.execute_update(FleetGuard.upgrade, args=[client.identity], rpc_timeout=timedelta(seconds=10))
    except Exception as err:  # noqa: BLE001 - a closed guard, a timeout: the controller serves on
        if not (isinstance(err, RPCError) and err.status == RPCStatusCode.NOT_FOUND):  # none yet: nothing to say
            log.warning("could not give fleet guard %s the policy: %s", cluster, err)
        return False
    log.info("fleet guard %s takes the controller's guard policy", cluster)
    return True


async def run_controller(client: Client, cfg: ControllerConfig, stop: asyncio.Event) -> None:
    # Room reserved ahead only where the policy asks for it (guard.room_ahead, 0 by default).
    room = RoomPool(client) if (cfg.policy or default_policy()).guard.room_ahead else None
    worker = build_worker(client, cfg, room)
    async with worker:
        log.info("controller serving task queue %s", cfg.task_queue)
        # In the background: a guard whose workers are elsewhere (or gone) must not hold up serving or stopping.
        told = asyncio.create_task(tell_guard_the_policy(client, cfg.cluster, (cfg.policy or default_policy()).guard))
        if room is not None:
            room.start(cfg.cluster)  # room for the first fault, before it comes
        try:
            await _serve(client, cfg, stop)
        finally:
            told.cancel()
            if room is not None:
                await room.close()


async def _serve(client: Client, cfg: ControllerConfig, stop: asyncio.Event) -> None:
    """Until stopped: the node-condition watcher, if any conditions are watched."""
    if not cfg.watch_conditions:
        await stop.wait()
        return
    watcher = ConditionWatcher(client, load_core_api(cfg.kubeconfig), WatcherConfig(
        rules=cfg.watch_conditions, cluster=cfg.cluster,
        task_queue=cfg.task_queue, label_selector=cfg.gpu_node_selector))
    await watcher.run(stop)
