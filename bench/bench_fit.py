"""Cold `fit` per node: one model demand asked of every node of a fleet whose ledgers all differ, each ledger
asked for the first time since its last change (as the extender's first pod of a new model meets it), in
process, one core. The figure is the median µs of one `ClusterState.fit` call per node.

    python bench/bench_fit.py [--nodes 500] [--rounds 5] [--profile]

The fleet: nodes of five shapes (2/4/8 NUMA nodes, SMT on and off), each shape's generated BalloonsPolicy
(`group.<shape>`), every node with its own mix of running model pods (TP 1/2/4, distinct sizes), so no two
ledgers hold the same. The demand is a fresh pod of TP 1, 2 and 4 as the webhook mutates it. "warm" asks the
same ledger again (its free cores already computed): the difference is the ledger's `free()`.
Runs on any tree whose placement/ has ClusterState.fit, mutate_pod and balloons.node_balloons_policy
(`PYTHONPATH=OTHER_TREE python bench/bench_fit.py` measures another commit)."""

from __future__ import annotations

import argparse
import cProfile
import gc
import pstats
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # `python bench/bench_fit.py` from a checkout
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from placement.balloons import node_balloons_policy  # noqa: E402
from placement.cluster import ClusterState  # noqa: E402
from placement.config import Settings  # noqa: E402
from placement.mutation import mutate_pod  # noqa: E402

SMT_LABEL = "feature.node.kubernetes.io/cpu-hardware_multithreading"
NUMA_LABEL = "feature.node.kubernetes.io/memory-numa.node_count"
GROUP_LABEL = "config.nri/group"
AMX_LABEL = "feature.node.kubernetes.io/cpu-security.amx.enabled"  # model pods require AMX by default
SHAPES = ((2, 32, 2), (2, 48, 2), (4, 24, 2), (4, 16, 1), (8, 20, 2))  # NUMA nodes, cores per NUMA, SMT width


def node(name: str, numa: int, cores: int, tpc: int) -> dict[str, Any]:
    cpus = numa * cores * tpc
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {NUMA_LABEL: str(numa), SMT_LABEL: str(tpc == 2).lower(),
                                                  GROUP_LABEL: f"n{numa}-c{cores}-t{tpc}", AMX_LABEL: "true"}},
            "status": {"capacity": {"cpu": str(cpus), "memory": "512Gi", "pods": "110"},
                       "allocatable": {"cpu": str(cpus - 2), "memory": "500Gi", "pods": "110"},
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def model_pod(name: str, tp: int, cpus: int, node_name: str | None = None) -> dict[str, Any]:
    pod: dict[str, Any] = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "models", "uid": f"uid-{name}",
                     "labels": {"model-manager.io/model": name}, "annotations": {},
                     "creationTimestamp": "2026-12-01T00:00:00Z"},
        "spec": {"containers": [{"name": "main", "image": "vllm", "command": ["vllm", "serve"],
                                 "args": ["/models/m", "--tensor-parallel-size", str(tp)],
                                 "resources": {"requests": {"cpu": str(cpus), "memory": "16Gi"},
                                               "limits": {"cpu": str(cpus), "memory": "16Gi"}}}]},
        "status": {"phase": "Pending"},
    }
    if node_name:
        pod["spec"]["nodeName"] = node_name
        pod["status"]["phase"] = "Running"
    return pod


def fleet(count: int, settings: Settings) -> list[dict[str, Any]]:
    nodes = [node(f"n-{k:04d}", *SHAPES[k % len(SHAPES)]) for k in range(count)]
    topology = ClusterState.from_objects(nodes, settings)
    policies = {}
    for obj in nodes:
        group = obj["metadata"]["labels"][GROUP_LABEL]
        if group not in policies:
            ledger = topology.ledger(obj["metadata"]["name"])
            policy = node_balloons_policy(obj["metadata"]["name"], ledger.topology, settings, "kube-system")
            policy["metadata"]["name"] = f"group.{group}"
            policies[group] = policy
    pods = []
    for k, obj in enumerate(nodes):
        numa = int(obj["metadata"]["labels"][NUMA_LABEL])
        # Distinct per node: k's digits pick the sizes of up to three running models.
        for j, tp in enumerate(t for t in (1, 2, 4) if t <= numa):
            size = 2 * tp * (1 + (k // (j + 1) + j) % 3)
            pods.append(model_pod(f"run-{k}-{j}", tp, size, obj["metadata"]["name"]))
    return [*nodes, *policies.values(), *pods]


def fresh_ledgers(cluster: ClusterState, pods: list[dict[str, Any]], names: Sequence[str]) -> list[Any]:
    """Every ledger rebuilt from the pods (and nothing asked of it since)."""
    cluster.replace("Pod", pods)
    return [cluster.ledger(n) for n in names]


def measure(cluster: ClusterState, demand: Any, pods: list[dict[str, Any]], names: Sequence[str]
            ) -> tuple[float, float]:
    """Median µs of the first and of a second `fit` per node, on fresh ledgers."""
    ledgers = fresh_ledgers(cluster, pods, names)
    cold, warm = [], []
    clock = time.perf_counter_ns
    for ledger in ledgers:
        t0 = clock()
        cluster.fit(demand, ledger)
        t1 = clock()
        cluster.fit(demand, ledger)
        t2 = clock()
        cold.append(t1 - t0)
        warm.append(t2 - t1)
    return statistics.median(cold) / 1000, statistics.median(warm) / 1000


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--profile", action="store_true", help="cProfile the cold fits of one round")
    args = parser.parse_args(argv)
    settings = Settings()
    objects = fleet(args.nodes, settings)
    pods = [o for o in objects if o["kind"] == "Pod"]
    cluster = ClusterState.from_objects(objects, settings)
    names = sorted(cluster.nodes)
    distinct = len({(ledger.capacity, ledger.threads_per_core, ledger.free()) for ledger in cluster.ledgers()})
    print(f"{len(names)} nodes of {len(SHAPES)} shapes, {len(pods)} running model pods, "
          f"{distinct} distinct (shape, free cores) ledgers")
    goal = 10.0
    worst = 0.0
    for tp in (1, 2, 4):
        mutation = mutate_pod(model_pod(f"new-tp{tp}", tp, 8 * tp), cluster)
        demand = mutation.demand
        assert demand is not None and demand.policy == "nri-balloons", mutation.resolution
        gc.collect()
        gc.disable()
        try:
            rounds = [measure(cluster, demand, pods, names) for _ in range(args.rounds)]
        finally:
            gc.enable()
        cold = statistics.median(r[0] for r in rounds)
        warm = statistics.median(r[1] for r in rounds)
        worst = max(worst, cold)
        print(f"TP={tp} cpu: {8 * tp} (request {demand.cpu_milli / 1000:g}): cold fit median {cold:.1f} µs per "
              f"node (rounds {', '.join(f'{r[0]:.1f}' for r in rounds)}), warm {warm:.1f} µs  "
              f"goal cold <= {goal:g} µs: {'met' if cold <= goal else 'NOT met'}")
        if args.profile and tp == 1:
            ledgers = fresh_ledgers(cluster, pods, names)
            profile = cProfile.Profile()
            profile.enable()
            for ledger in ledgers:
                cluster.fit(demand, ledger)
            profile.disable()
            pstats.Stats(profile).sort_stats("tottime").print_stats(14)
    return 0 if worst <= goal else 1


if __name__ == "__main__":
    sys.exit(main())
