"""Detect-to-cordon under a storm: every node reports a fault at once.

Run: .venv/bin/python bench/storm.py --nodes 1000. Against the embedded dev server and the fake
Kubernetes API server (over HTTP, through the real client), with the controller's worker settings
(workers/controller.controller_worker). Quarantine admission (`guard.defer_quarantine`) is on, with
max_unhealthy at the whole fleet so that every cordon is timed, and the controller keeps the room its
guard reserves ahead (`guard.room_ahead`, `--room-ahead 0` for none). One untimed fault first starts
the guard, as a controller in service finds it running. Prints, and appends to bench/RESULTS.md:
- single-node detect-to-cordon p50/p95/p99 (one report at a time): from the report leaving the
  agent's side to the node being unschedulable in the fake API (goal p99 <= 150 ms);
- the same percentiles and the quarantine rate (nodes/s) when all nodes report at once;
- in the same run, the rate of a bare baseline (signal-with-start + one local activity that cordons) on
  the same server and worker settings, and the ratio gpuheal / baseline (goal >= 0.5);
- with `--controllers N`, a second storm of as many nodes once N-1 more controller processes
  (`gpuheal controller`, the real command) serve the same task queue: the rate and ratio for one and
  for N, against the same baseline.
An activity's declared failure (a non-retryable ApplicationError: the bench's nodes have no cloud
instance to reboot) is logged in one line, not with its traceback: it is not what is measured.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import boto3  # noqa: E402
from kubernetes import client as k8s  # noqa: E402
from temporalio.common import WorkflowIDConflictPolicy  # noqa: E402
from temporalio.contrib.pydantic import pydantic_data_converter  # noqa: E402
from temporalio.exceptions import ApplicationError  # noqa: E402
from temporalio.testing import WorkflowEnvironment  # noqa: E402

from activities.cloud import CloudActivities  # noqa: E402
from activities.guard import GuardActivities  # noqa: E402
from activities.kube import KubeActivities  # noqa: E402
from activities.ledger import LedgerActivities, SqliteLedger  # noqa: E402
from activities.policy import PolicyActivities  # noqa: E402
from activities.room_pool import RoomPool  # noqa: E402
from bench.baseline import BaselineActivities, StormBaseline  # noqa: E402
from bench.results import append_result  # noqa: E402
from policies.findings import Finding, GpuIds, HealthReport  # noqa: E402
from policies.loader import default_policy, policy_yaml  # noqa: E402
from sim.fake_kube import FakeKube, FakeKubeServer  # noqa: E402
from workers.controller import CONTROLLER_WORKFLOWS, controller_activities, controller_worker  # noqa: E402
from workers.embedded_temporal import binary, search_attribute_flags  # noqa: E402
from workers.reporting import send_report  # noqa: E402


class TimedKube(FakeKube):
    """Notes when each node first turns unschedulable, as the API server sees it."""

    def __init__(self) -> None:
        super().__init__()
        self.cordoned: dict[str, float] = {}
        self.waiters: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Event]] = {}

    def _bump(self, kind, obj, event):
        if kind == "Node" and obj.get("spec", {}).get("unschedulable") and obj["metadata"]["name"] not in self.cordoned:
            name = obj["metadata"]["name"]
            self.cordoned[name] = time.monotonic()
            if name in self.waiters:
                loop, ev = self.waiters[name]
                loop.call_soon_threadsafe(ev.set)
        return super()._bump(kind, obj, event)


class DeclaredFailuresInOneLine(logging.Filter):
    """The worker logs a failed activity with its traceback; a declared failure (non-retryable
    ApplicationError) says all it has to say in its type and message."""

    def filter(self, record: logging.LogRecord) -> bool:
        err = record.exc_info[1] if record.exc_info else None
        if isinstance(err, ApplicationError) and err.non_retryable:
            record.msg, record.args, record.exc_info = f"{record.getMessage()}: {err.type}: {err}", None, None
        return True


def more_controllers(n: int, env: WorkflowEnvironment, server: FakeKubeServer, tq: str, policy, workdir: Path):
    """n `gpuheal controller` processes on the bench's task queue, server and fake API (their logs in workdir)."""
    kubeconfig = server.write_kubeconfig(workdir / "kubeconfig")
    (workdir / "policy.yaml").write_text(policy_yaml(policy))
    procs = []
    for i in range(n):
        log = open(workdir / f"controller-{i + 2}.log", "w")  # noqa: SIM115 - closed with the process
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "workers.cli", "controller", "--temporal", env.client.service_client.config.target_host,
             "--kubeconfig", kubeconfig, "--task-queue", tq, "--cluster", f"c-{tq}", "--policy", str(workdir / "policy.yaml"),
             "--ledger", str(workdir / f"ledger-{i + 2}.db")],
            cwd=Path(__file__).resolve().parent.parent, stdout=log, stderr=subprocess.STDOUT,
            env={**os.environ, "AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "x", "AWS_DEFAULT_REGION": "us-east-1"}))
    return procs


def pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, max(0, round(p / 100 * len(values)) - 1))]


def report(node: str) -> HealthReport:
    return HealthReport(node=node, boot_id="b1", seq=1, source="agent", detected_at=datetime.now(UTC),
                        gpus=[GpuIds(index=2, uuid=f"GPU-{node}", serial=f"S-{node}", pci="0000:91:00")],
                        findings=[Finding(kind="xid", xid=79, gpu_index=2, message="Xid 79: fallen off the bus")])


async def run(nodes: int, single: int, controllers: int = 1, room_ahead: int = 16) -> dict:
    kube = TimedKube()
    server = FakeKubeServer(kube).start()
    api = server.api_client()
    api.configuration.connection_pool_maxsize = 64
    core = k8s.CoreV1Api(api)
    groups = (("warmup", 1), ("single", single), ("base", nodes), ("gpuheal", nodes),
              *((("more", nodes),) if controllers > 1 else ()))
    names = {p: [f"{p}-{i}" for i in range(n)] if p != "warmup" else ["warmup"] for p, n in groups}
    for group in names.values():
        for n in group:
            kube.add_node(n, labels={"nvidia.com/gpu.present": "true"})
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=binary("temporal"), data_converter=pydantic_data_converter,
        dev_server_extra_args=search_attribute_flags())
    session = boto3.Session(aws_access_key_id="x", aws_secret_access_key="x", region_name="us-east-1")
    cloud = CloudActivities.aws(session.client("ec2"), session.client("autoscaling"), session.client("ssm"), core)
    ledger = LedgerActivities(SqliteLedger(str(Path(tempfile.mkdtemp()) / "ledger.db")))
    tq = f"storm-{uuid.uuid4().hex[:6]}"
    # The bench times every node's cordon: quarantine admission stays on (the guard counts every
    # cordon, room reserved ahead included), with max_unhealthy at the whole fleet so none is deferred.
    policy = default_policy()
    policy.guard.max_unhealthy = "100%"
    room = RoomPool(env.client, identity=f"bench-{tq}", retry_s=0.2) if room_ahead else None
    policy.guard.room_ahead = room_ahead
    acts = [*controller_activities(KubeActivities(core), cloud, ledger, GuardActivities(env.client, room),
                                  PolicyActivities(policy, "bench", f"c-{tq}")),
            BaselineActivities(core).cordon]
    loop = asyncio.get_running_loop()

    async def gpuheal_send(node: str) -> float:
        t0 = time.monotonic()
        await send_report(env.client, report(node), node=node, cluster=f"c-{tq}", task_queue=tq)
        return t0

    async def base_send(node: str) -> float:
        t0 = time.monotonic()
        await env.client.start_workflow(StormBaseline.run, id=f"base/{node}", task_queue=tq, start_signal="report",
                                        start_signal_args=[node],
                                        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING)
        return t0

    async def storm(group: list[str], send) -> tuple[list[float], float]:
        sent = await asyncio.gather(*(send(n) for n in group))
        while not all(n in kube.cordoned for n in group):
            await asyncio.sleep(0.05)
        lat = [(kube.cordoned[n] - t0) * 1000 for n, t0 in zip(group, sent, strict=True)]
        span = max(kube.cordoned[n] for n in group) - min(sent)
        return lat, len(group) / span

    try:
        async with controller_worker(env.client, tq, acts, workflows=[*CONTROLLER_WORKFLOWS, StormBaseline]):
            # One fault first, not timed: it starts the cluster's fleet guard (a controller in service
            # finds it running), and the room pool fills once the guard runs.
            await gpuheal_send("warmup")
            if room is not None:
                room.start(f"c-{tq}")
                for _ in range(100):
                    if room.held(f"c-{tq}"):
                        break
                    await asyncio.sleep(0.1)
            single_lat = []
            for n in names["single"]:
                ev = asyncio.Event()
                kube.waiters[n] = (loop, ev)
                t0 = await gpuheal_send(n)
                await asyncio.wait_for(ev.wait(), 30)
                single_lat.append((kube.cordoned[n] - t0) * 1000)
            base_lat, base_rate = await storm(names["base"], base_send)
            storm_lat, storm_rate = await storm(names["gpuheal"], gpuheal_send)
            more_rate, procs = None, []
            if controllers > 1:
                procs = more_controllers(controllers - 1, env, server, tq, policy, Path(tempfile.mkdtemp()))
                await asyncio.sleep(8)  # the processes start, connect and poll
                if any(p.poll() is not None for p in procs):
                    raise RuntimeError("a controller process exited at start (see its log)")
                _, more_rate = await storm(names["more"], gpuheal_send)
                for p in procs:
                    p.terminate()
                for p in procs:
                    p.wait(30)
    finally:
        if room is not None:
            await room.close()
        await env.shutdown()
        api.close()
        server.stop()
    return {"single": single_lat, "storm": storm_lat, "storm_rate": storm_rate, "base_rate": base_rate,
            "base": base_lat, "more_rate": more_rate}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--single", type=int, default=100, help="one-at-a-time episodes for the single-node figures")
    ap.add_argument("--controllers", type=int, default=1,
                    help="N > 1: a second storm with N-1 more controller processes on the same task queue")
    ap.add_argument("--room-ahead", type=int, default=16,
                    help="guard.room_ahead: quarantine slots reserved ahead per controller (0: every cordon asks the guard)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("temporalio.activity").addFilter(DeclaredFailuresInOneLine())
    r = asyncio.run(run(args.nodes, args.single, args.controllers, args.room_ahead))
    s, st = r["single"], r["storm"]
    ratio = r["storm_rate"] / r["base_rate"]
    print(f"command: .venv/bin/python bench/storm.py --nodes {args.nodes} --single {args.single}"
          + (f" --controllers {args.controllers}" if args.controllers > 1 else "") + f" --room-ahead {args.room_ahead}")
    print(f"single node ({len(s)} episodes one at a time): detect-to-cordon p50 {pct(s, 50):.0f} ms, "
          f"p95 {pct(s, 95):.0f} ms, p99 {pct(s, 99):.0f} ms, mean {statistics.mean(s):.0f} ms")
    print(f"storm ({args.nodes} nodes at once): p50 {pct(st, 50):.0f} ms, p95 {pct(st, 95):.0f} ms, "
          f"p99 {pct(st, 99):.0f} ms; quarantine rate {r['storm_rate']:.1f} nodes/s")
    print(f"baseline (signal-with-start + one local cordon activity, {args.nodes} at once): {r['base_rate']:.1f} nodes/s; "
          f"ratio gpuheal/baseline {ratio:.2f}")
    if r["more_rate"] is not None:
        print(f"{args.controllers} controller processes ({args.nodes} more nodes at once): {r['more_rate']:.1f} nodes/s; "
              f"ratio gpuheal/baseline {r['more_rate'] / r['base_rate']:.2f} (one controller: {ratio:.2f})")
    print(append_result(
        "storm", f"{args.nodes} nodes at once + {args.single} single, dev server + fake API, one worker process, "
        f"local-activity baseline, quarantine admission on (max_unhealthy 100%), room_ahead {args.room_ahead}",
        f"single p50/p95/p99 {pct(s, 50):.0f}/{pct(s, 95):.0f}/{pct(s, 99):.0f} ms; storm p50/p95/p99 "
        f"{pct(st, 50):.0f}/{pct(st, 95):.0f}/{pct(st, 99):.0f} ms, {r['storm_rate']:.1f} nodes/s; baseline "
        f"{r['base_rate']:.1f} nodes/s; ratio {ratio:.2f}" + (
            f"; {args.controllers} controllers {r['more_rate']:.1f} nodes/s, ratio {r['more_rate'] / r['base_rate']:.2f}"
            if r["more_rate"] is not None else ""), "goal: single p99 <= 150 ms, ratio >= 0.5"))


if __name__ == "__main__":
    main()
