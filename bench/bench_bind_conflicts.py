"""Bind conflicts: how many binds the extender refuses when kube-scheduler binds asynchronously.

    python bench/bench_bind_conflicts.py [--before DIR] [--pods 200] [--bind-delay-ms 5]

The real command (`model-placement extender --cluster FILE`) serves a fleet where the model pods just fit
(every NUMA node holds exactly two). This process plays kube-scheduler as pkg/scheduler/schedule_one.go does:
one scheduling cycle at a time (/filter with every node, /prioritize unless one node passed, the node of the
highest total score, ties at random), the extender's score weighted 15 x 10 against an in-tree
LeastAllocated score kept from its own cache of assumed pods, and each bind started in its own task
after `--bind-delay-ms` (the binding goroutine's PreBind and the HTTP call) while the next cycle goes on.
A refused bind goes back to the queue, as does a pod that fits nowhere for now (the scheduler requeues it on
the next cluster event: here, when the binds in flight end). With `--before DIR` the same run is repeated
against the extender of another source tree (e.g. `git archive` of the commit before a change), same fleet,
same machine. Prints conflicts per 100 pods. bench/bench_bind_conflicts_real.py measures the same with the real
kube-scheduler, whose own scores see the pods it assumed and steer the next pod away from them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (
    ROOT,
    balloons_policy,
    cluster_list,
    extender_args,
    model_balloon_types,
    model_pod,
    node_name,
    node_object,
    node_shape,
    tree_env,
)
from tests.support.process import ServerProcess

WEIGHT = 15  # manifests/base/config/kube-scheduler.yaml
RESERVED_CORES_PER_NUMA = 2  # the synthetic fleet's 8 reserved CPUs (common.RESERVED) on a 2-NUMA SMT node


def uniform_nodes() -> list[int]:
    """The synthetic fleet's node indices of one shape, outside its node group with a policy of its own."""
    return [i for i in range(100_000) if node_shape(i) == (2, 32, True) and i % 10 != 3]  # group numa2


def fleet(n_pods: int) -> tuple[list[dict[str, Any]], int, int]:
    """Uniform 2-NUMA, 32-core, SMT nodes, enough for exactly `n_pods` pods of half a NUMA node each."""
    per = (32 - RESERVED_CORES_PER_NUMA) // 2
    indices = uniform_nodes()[: -(-n_pods // 4)]
    nodes = [node_object(i) for i in indices]
    policy = balloons_policy("group.numa2", {node_name(i): "Success" for i in indices}, model_balloon_types(2))
    return [*nodes, policy], per, len(nodes)


class Scheduler:
    def __init__(self, session: aiohttp.ClientSession, url: str, names: list[str], cpus_per_node: int,
                 bind_delay: float, rng: random.Random) -> None:
        self.session, self.url, self.names = session, url, names
        self.capacity = cpus_per_node
        self.bind_delay = bind_delay
        self.rng = rng
        self.assumed: Counter[str] = Counter()  # the scheduler's cache: CPUs requested per node
        self.in_flight: set[asyncio.Task[None]] = set()
        self.queue: list[tuple[dict[str, Any], int]] = []
        self.outcomes: Counter[str] = Counter()

    async def post(self, verb: str, payload: dict[str, Any]) -> Any:
        async with self.session.post(f"{self.url}/{verb}", data=json.dumps(payload).encode(),
                                     headers={"Content-Type": "application/json"}) as resp:
            assert resp.status == 200, (verb, resp.status, await resp.text())
            return await resp.json()

    def least_allocated(self, node: str) -> float:
        return 100 * (1 - self.assumed[node] / self.capacity)

    async def cycle(self, pod: dict[str, Any], cpus: int) -> None:
        passed = (await self.post("filter", extender_args(pod, self.names)))["NodeNames"]
        if not passed:
            self.outcomes["unschedulable-for-now"] += 1
            if self.in_flight:
                await asyncio.wait(self.in_flight)  # requeued on the next cluster event
            self.queue.append((pod, cpus))
            return
        if len(passed) == 1:
            node = passed[0]  # schedulePod skips scoring for a single feasible node
        else:
            scores = {p["Host"]: p["Score"] for p in await self.post("prioritize", extender_args(pod, passed))}
            totals = {n: scores.get(n, 0) * WEIGHT * 10 + self.least_allocated(n) for n in passed}
            top = max(totals.values())
            node = self.rng.choice([n for n, t in totals.items() if t == top])
        self.assumed[node] += cpus
        task = asyncio.create_task(self.bind(pod, cpus, node))
        self.in_flight.add(task)
        task.add_done_callback(self.in_flight.discard)

    async def bind(self, pod: dict[str, Any], cpus: int, node: str) -> None:
        await asyncio.sleep(self.bind_delay)
        meta = pod["metadata"]
        body = {"PodName": meta["name"], "PodNamespace": meta["namespace"], "PodUID": meta["uid"], "Node": node}
        error = (await self.post("bind", body))["Error"]
        if error:
            self.outcomes["conflict"] += 1
            self.assumed[node] -= cpus
            self.queue.append((pod, cpus))  # backoff, then another cycle
        else:
            self.outcomes["bound"] += 1

    async def run(self, pods: list[tuple[dict[str, Any], int]], cycle_overhead: float) -> None:
        self.queue = list(pods)
        cycles = 0
        while self.queue or self.in_flight:
            if not self.queue:
                await asyncio.wait(self.in_flight)
                continue
            cycles += 1
            if cycles > 20 * len(pods):
                break
            pod, cpus = self.queue.pop(0)
            await self.cycle(pod, cpus)
            await asyncio.sleep(cycle_overhead)  # the scheduler's own plugins and queue


async def measure(tree: Path, args: argparse.Namespace, cluster_file: Path, per: int, n_nodes: int) -> Counter[str]:
    # `tree`'s command line: ServerProcess's own command would run this checkout's whatever the environment says
    proc = ServerProcess(["extender", "--cluster", str(cluster_file), "--insecure-http", "--host", "127.0.0.1",
                          "--port", "0", "--drain-seconds", "0"],
                         env=tree_env(tree), argv0=[sys.executable, "-m", "cli"])
    try:
        pods = [(model_pod(f"llm-{k:04d}-x", f"uid-{k}", 1, per), per) for k in range(args.pods)]
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64)) as session:
            names = [node_name(i) for i in uniform_nodes()[:n_nodes]]
            sched = Scheduler(session, proc.url, names, 2 * per, args.bind_delay_ms / 1000, random.Random(args.seed))
            started = time.perf_counter()
            await sched.run(pods, args.cycle_ms / 1000)
            sched.outcomes["seconds_x1000"] = round((time.perf_counter() - started) * 1000)
            return sched.outcomes
    finally:
        proc.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=200)
    parser.add_argument("--bind-delay-ms", type=float, default=5.0, help="end of cycle to /bind")
    parser.add_argument("--cycle-ms", type=float, default=1.0, help="the scheduler's own time per cycle")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--before", type=Path, help="a source tree to compare with, e.g. the commit before")
    args = parser.parse_args(argv)
    objects, per, n_nodes = fleet(args.pods)
    with tempfile.TemporaryDirectory() as tmp:
        cluster_file = Path(tmp) / "fleet.json"
        cluster_file.write_text(json.dumps(cluster_list(objects)))
        runs = [("after", ROOT)] + ([("before", args.before)] if args.before else [])
        print(f"{args.pods} TP=1 pods of {per} cores onto {n_nodes} nodes (2 NUMA x {2 * per} model cores: they just "
              f"fit); bind {args.bind_delay_ms:g} ms after its cycle, {args.cycle_ms:g} ms per cycle")
        print(f"{'extender':<8} {'conflicts/100 pods':>18} {'bound':>6} {'unschedulable-for-now':>22} {'wall s':>7}")
        for label, tree in runs:
            out = asyncio.run(measure(tree, args, cluster_file, per, n_nodes))
            print(f"{label:<8} {100 * out['conflict'] / args.pods:>18.1f} {out['bound']:>6} "
                  f"{out['unschedulable-for-now']:>22} {out['seconds_x1000'] / 1000:>7.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
