"""Cold `fit` per node: one model demand asked of every node of a fleet whose ledgers all differ, each ledger
asked for the first time since its last change (as the extender's first pod of a new model meets it), in
process, one core. The figure is the median µs of one `ClusterState.fit` call per node.

    python bench/bench_fit.py [--nodes 500] [--rounds 5] [--profile] [--against TREE]...

The fleet: nodes of five shapes (2/4/8 NUMA nodes, SMT on and off), each shape's generated BalloonsPolicy
(`group.<shape>`), every node with its own mix of running model pods (TP 1/2/4, distinct sizes), so no two
ledgers hold the same. The demand is a fresh pod of TP 1, 2, 4 and 8 as the webhook mutates it (TP=4 fits only
4- and 8-NUMA nodes, TP=8 only 8-NUMA ones: the rest are refused by shape, which costs little). "warm" asks the
same ledger again (its free cores already computed): the difference is the ledger's `free()`.

The kubelet-static rows ask the same of a fleet of the same shapes pinned by the kubelet (nodes labelled
model-manager.io/cpu-manager=static, Topology Manager single-numa-node or restricted, the same running models as
kubelet-static pods): the CPU-level model of the kubelet's managers, whose cold fit is held to within 1.5x the
balloons fit of the same TP.

`--against TREE` (a checkout of another commit, e.g. `git worktree add /tmp/before f1673d7`) measures that
tree's placement/ on the same fleet: each round runs in a fresh process per tree, the trees taking turns, so a
machine others load weighs on both alike. Runs on any tree whose placement/ has ClusterState.fit, mutate_pod and
balloons.node_balloons_policy."""

from __future__ import annotations

import argparse
import cProfile
import gc
import json
import os
import pstats
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple, TextIO

CHECKOUT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(CHECKOUT))
# This checkout's fleet (it imports placement/ only when called, so from the tree measured), then that tree.
from bench.common import FIT_SHAPES, child_json, fit_fleet, load_average, raw_model_pod, static_fleet  # noqa: E402

# The tree whose placement/ is measured: this checkout, or the one a parent run names (--against).
sys.path.insert(0, os.environ.get("BENCH_FIT_TREE", str(CHECKOUT)))

from placement.cluster import ClusterState  # noqa: E402
from placement.config import Settings  # noqa: E402
from placement.mutation import mutate_pod  # noqa: E402


def fresh_ledgers(cluster: ClusterState, pods: list[dict[str, Any]], names: Sequence[str]) -> list[Any]:
    """Every ledger rebuilt from the pods (and nothing asked of it since)."""
    cluster.replace("Pod", pods)
    return [cluster.ledger(n) for n in names]


TPS = (1, 2, 4, 8)
GOAL = 10.0  # µs, median cold fit per node


class Round(NamedTuple):
    cold: float  # median µs per node, every node
    cold_fits: float  # the same over the nodes it fits (0 when none)
    warm: float
    fits: int


def measure(cluster: ClusterState, demand: Any, pods: list[dict[str, Any]], names: Sequence[str]) -> Round:
    """The first and a second `fit` per node, on fresh ledgers."""
    ledgers = fresh_ledgers(cluster, pods, names)
    cold, warm, fitting = [], [], []
    clock = time.perf_counter_ns
    for ledger in ledgers:
        t0 = clock()
        result = cluster.fit(demand, ledger)
        t1 = clock()
        cluster.fit(demand, ledger)
        t2 = clock()
        cold.append(t1 - t0)
        warm.append(t2 - t1)
        if result.ok:
            fitting.append(t1 - t0)
    return Round(statistics.median(cold) / 1000, statistics.median(fitting) / 1000 if fitting else 0.0,
                 statistics.median(warm) / 1000, len(fitting))


class Fleet(NamedTuple):
    cluster: ClusterState
    pods: list[dict[str, Any]]
    names: list[str]
    demands: dict[int, Any]  # TP -> the new pod's demand as the webhook mutates it


def prepare(nodes: int, out: TextIO, policy: str = "nri-balloons") -> Fleet:
    settings = Settings()
    objects = fit_fleet(nodes, settings) if policy == "nri-balloons" else static_fleet(nodes)
    pods = [o for o in objects if o["kind"] == "Pod"]
    cluster = ClusterState.from_objects(objects, settings)
    names = sorted(cluster.nodes)
    distinct = len({(ledger.capacity, ledger.threads_per_core, ledger.free()) for ledger in cluster.ledgers()})
    print(f"{policy}: {len(names)} nodes of {len(FIT_SHAPES)} shapes, {len(pods)} running model pods, "
          f"{distinct} distinct (shape, free cores) ledgers", file=out)
    demands = {}
    for tp in TPS:
        pod = raw_model_pod(f"new-tp{tp}", tp, 8 * tp, policy="" if policy == "nri-balloons" else policy)
        mutation = mutate_pod(pod, cluster)
        assert mutation.demand is not None and mutation.demand.policy == policy, mutation.resolution
        demands[tp] = mutation.demand
    return Fleet(cluster, pods, names, demands)


def rounds_of(fleets: Sequence[Fleet], rounds: int, profile: bool, out: TextIO) -> list[dict[int, list[Round]]]:
    """`rounds` rounds of every TP on each fleet, the fleets taking turns round by round, so a machine others load
    weighs on each alike."""
    results: list[dict[int, list[Round]]] = [{tp: [] for tp in TPS} for _ in fleets]
    gc.collect()
    gc.disable()
    try:
        for _ in range(rounds):
            for got, one in zip(results, fleets):
                for tp in TPS:
                    got[tp].append(measure(one.cluster, one.demands[tp], one.pods, one.names))
    finally:
        gc.enable()
    if profile:
        for one in fleets:
            ledgers = fresh_ledgers(one.cluster, one.pods, one.names)
            prof = cProfile.Profile()
            prof.enable()
            for ledger in ledgers:
                one.cluster.fit(one.demands[1], ledger)
            prof.disable()
            pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(14)
    return results


def run(nodes: int, rounds: int, profile: bool, out: TextIO = sys.stdout) -> dict[int, list[Round]]:
    return rounds_of([prepare(nodes, out)], rounds, profile, out)[0]


def run_trees(trees: Sequence[Path], nodes: int, rounds: int) -> list[dict[int, list[Round]]]:
    """One fresh process per tree and round, the trees taking turns (reversed every other round)."""
    results: list[dict[int, list[Round]]] = [{tp: [] for tp in TPS} for _ in trees]
    for r in range(rounds):
        order = list(enumerate(trees))
        for k, tree in order if r % 2 == 0 else reversed(order):
            out = child_json("fit", [__file__, "--child", "--nodes", str(nodes), "--rounds", "1"],
                             env={**os.environ, "BENCH_FIT_TREE": str(tree)})
            for tp, got in out.items():
                results[k][int(tp)].extend(Round(*g) for g in got)
    return results


def label(tree: Path) -> str:
    head = subprocess.run(["git", "-C", str(tree), "log", "-1", "--format=%h"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", str(tree), "status", "--porcelain", "--untracked-files=no", "placement"],
                           capture_output=True, text=True).stdout
    return f"{tree} ({head.stdout.strip() or 'not a git tree'}{' + changes' if dirty else ''})"


def report(name: str, results: dict[int, list[Round]], nodes: int) -> float:
    """Print one tree's figures; the worst cold median of TP=1/2 (the goal's cases)."""
    print(name)
    worst = 0.0
    for tp, rounds in results.items():
        cold = statistics.median(r.cold for r in rounds)
        fits = rounds[0].fits
        on_fit = f", {statistics.median(r.cold_fits for r in rounds):.1f} µs on the {fits} it fits" \
            if 0 < fits < nodes else ""
        goal = f"  goal <= {GOAL:g} µs: {'met' if cold <= GOAL else 'NOT met'}" if tp <= 2 else ""
        each = ", ".join(f"{r.cold:.1f}" for r in rounds)
        warm = statistics.median(r.warm for r in rounds)
        print(f"  TP={tp}: cold fit median {cold:.1f} µs per node (rounds {each}){on_fit}; warm {warm:.1f} µs; "
              f"fits {fits}/{nodes}{goal}")
        if tp <= 2:
            worst = max(worst, cold)
    return worst


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--profile", action="store_true", help="cProfile the cold fits of one round (TP=1)")
    parser.add_argument("--against", type=Path, action="append", default=[], metavar="TREE",
                        help="also measure another checkout's placement/, taking turns with this one")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(run(args.nodes, args.rounds, False, sys.stderr)))  # stdout is the parent's to read
        return 0
    print(f"load average {load_average()}")
    if not args.against:
        both = [prepare(args.nodes, sys.stdout), prepare(args.nodes, sys.stdout, "kubelet-static")]
        balloons, static = rounds_of(both, args.rounds, args.profile, sys.stdout)
        worst = report(label(CHECKOUT), balloons, args.nodes)
        report(f"{label(CHECKOUT)}, kubelet-static", static, args.nodes)
        for tp in (1, 2):
            ratio = statistics.median(r.cold for r in static[tp]) / statistics.median(r.cold for r in balloons[tp])
            print(f"  TP={tp}: kubelet-static cold fit / balloons cold fit = {ratio:.2f}  goal <= 1.5: "
                  f"{'met' if ratio <= 1.5 else 'NOT met'}")
    else:
        trees = [CHECKOUT, *args.against]
        results = run_trees(trees, args.nodes, args.rounds)
        worst = report(label(CHECKOUT), results[0], args.nodes)
        for tree, got in zip(trees[1:], results[1:]):
            report(label(tree), got, args.nodes)
    print(f"load average {load_average()}")
    return 0 if worst <= GOAL else 1


if __name__ == "__main__":
    sys.exit(main())
