"""Node-condition watcher: time from a condition change on the API server to the watcher handing the
node to `observe` (what then becomes a report), through the fake API server and the real client.

    .venv/bin/python -m bench.watcher_latency [--changes 200]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from kubernetes import client

from bench.results import append_result
from sim.fake_kube import FakeKubeServer
from workers.condition_watcher import ConditionRule, ConditionWatcher, WatcherConfig


class TimedWatcher(ConditionWatcher):
    def __init__(self, core):
        super().__init__(None, core, WatcherConfig(rules=[ConditionRule(type="XidCriticalError")]))
        self.arrivals: dict[str, float] = {}
        self.changed = asyncio.Event()

    async def observe(self, node):
        for cond in node.status.conditions or []:
            if cond.type == "XidCriticalError" and cond.message:
                self.arrivals.setdefault(cond.message, time.perf_counter())
        self.changed.set()


async def main(changes: int) -> None:
    server = FakeKubeServer().start()
    api = server.api_client()
    watcher = TimedWatcher(client.CoreV1Api(api))
    server.kube.add_node("bench-node")
    stop = asyncio.Event()
    task = asyncio.get_running_loop().create_task(watcher.run(stop, timeout_s=30))
    latencies = []
    try:
        await asyncio.sleep(0.5)
        for i in range(changes):
            mark = f"change-{i}"
            sent = time.perf_counter()
            server.kube.patch("Node", "", "bench-node", {"status": {"conditions": [
                {"type": "XidCriticalError", "status": "True" if i % 2 else "False", "message": mark}]}},
                "application/strategic-merge-patch+json", "status")
            while mark not in watcher.arrivals:
                watcher.changed.clear()
                await asyncio.wait_for(watcher.changed.wait(), 35)
            latencies.append((watcher.arrivals[mark] - sent) * 1000)
    finally:
        stop.set()
        await task
        api.close()
        server.stop()
    q = statistics.quantiles(latencies, n=100)
    figures = f"condition change -> observe p50 {q[49]:.1f} ms, p95 {q[94]:.1f} ms, p99 {q[98]:.1f} ms, max {max(latencies):.1f} ms"
    print(figures)
    print(append_result("watcher_latency", f"fake API server, real client, {changes} changes, 30 s watch calls",
                        figures, "p99 <= 1 s"))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--changes", type=int, default=200)
    asyncio.run(main(parser.parse_args().changes))
