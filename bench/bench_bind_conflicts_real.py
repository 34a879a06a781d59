"""Bind conflicts with the real kube-scheduler: binds our extender refuses when pods arrive at once.

    python bench/bench_bind_conflicts_real.py [--pods 200] [--runs 1] [--fleet empty graded]

One control plane (tests/e2e/cluster.py) with model-placement installed from its chart, 2-NUMA Xeon nodes (29 model
cores per NUMA node) and `--pods` TP=1 model pods of 16 cores (as our webhook mutated one), which just fit:
- `empty`: `--pods / 2` empty nodes, one pod per NUMA node, while kube-scheduler's own count (node-wide CPUs) would
  put four on a node;
- `graded`: `--pods` nodes with one free slot each: NUMA node 0 already runs 14..29 cores (node i: 14 + i mod 16),
  NUMA node 1 is free, so our MostAllocated score ranks the nodes in levels and a level's last node draws every
  pod scheduled before its bind lands (kube-scheduler's own scores, which do see the pods it assumed, weigh less
  than one step of ours).
The pods are all created, then kube-scheduler (the manifests' configuration, without leader election) is started,
so every pod is pending at once; it binds asynchronously, so the next pod's /filter can arrive before the previous
pod's /bind. A conflict is a /bind our extender refused (`model_placement_extender_bind_total` other than `bound`);
the pod then backs off and is scheduled again.

Holds (extender/holds.py: the node a pod was scored highest on is held for it until its /bind) have no setting to
switch them off, so "holds off" is the same source tree (`git archive HEAD`) with HOLD_SECONDS = 0: a hold then
expires at the next /filter, which is the extender before holds (006a731) in this respect and unchanged in every
other. Each run restarts the extender from its tree on the same cluster, deletes the pods and creates them again.
At the end of each run: every pod bound, and no two pods holding the same cores (GET /debug/nodes).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import (
    ROOT,
    TEMPLATE_NS,
    Binds,
    clones,
    control_plane,
    delete_pods,
    our_metric,
    template_pod,
    tree_env,
)
from tests.e2e.cluster import Cluster, node, wait_until
from tests.e2e.fleet import model_pod

BENCH_NS, PLACED_NS = "bench", "bench-placed"
SCHEDULER = "model-placement-scheduler"


def holds_off_tree(where: Path) -> Path:
    """HEAD's source with holds that expire at once."""
    tree = where / "holds-off"
    tree.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", "HEAD"], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    holds = tree / "extender" / "holds.py"
    text = holds.read_text()
    patched = re.sub(r"^HOLD_SECONDS = [0-9.]+", "HOLD_SECONDS = 0.0", text, flags=re.M)
    if patched == text:
        raise SystemExit("extender/holds.py has no HOLD_SECONDS to switch the holds off with")
    holds.write_text(patched)
    return tree


def start_extender(cluster: Cluster, tree: Path) -> None:
    """Our extender with the args of its container, its code from `tree`."""
    old = cluster.components["extender"]
    old.stop()
    env = {**old.env, **tree_env(tree)}
    cluster.components["extender"] = dataclasses.replace(old, env=env, proc=None).start()
    cluster.wait_ready("extender")


def bind_results(cluster: Cluster) -> dict[str, float]:
    return our_metric(cluster, "model_placement_extender_bind_total", "result")


def check_cores(cluster: Cluster, pods: int) -> str:
    """'' when every bound pod is held once, where the apiserver says it runs, and no NUMA node holds more
    cores than it has; else what is wrong."""
    on_node = {p["metadata"]["name"]: p["spec"]["nodeName"] for p in cluster.pods(BENCH_NS)
               if p["spec"].get("nodeName")}
    if len(on_node) != pods:
        return f"{len(on_node)} of {pods} pods bound"
    _, body = cluster.get_ours("extender", "/debug/nodes")
    held: dict[str, str] = {}
    for ledger in json.loads(body)["nodes"]:
        for numa in ledger["numa"]:
            if sum(h["cores"] for h in numa["held"]) > numa["capacity"]:
                return f"node {ledger['node']} NUMA {numa['numa']} holds more cores than it has: {numa}"
            for h in numa["held"]:
                namespace, name = h["pod"].split("/", 1)
                if namespace != BENCH_NS:
                    continue
                if name in held:
                    return f"{name} is held on {held[name]} and {ledger['node']}"
                held[name] = ledger["node"]
    differ = set(held.items()) ^ set(on_node.items())
    return "" if not differ else f"the ledger and the apiserver disagree on {sorted(differ)}"


def fleet(kind: str, pods: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Nodes and the model pods already running on them (bound by name, as our webhook leaves them)."""
    if kind == "empty":
        return [node(f"node-{i:04d}", numa=2, cores_per_numa=32) for i in range(-(-pods // 2))], []
    nodes, placed = [], []
    for i in range(pods):
        name = f"node-{i:04d}"
        nodes.append(node(name, numa=2, cores_per_numa=32))
        # the balloons plugin puts it on NUMA node 0, and the next balloon on NUMA node 1 (fewest instances)
        cores = 14 + i % 16
        placed.append(model_pod(f"{name}-0", PLACED_NS, tp=1, cpu=str(2 * cores), memory="8Gi", model="placed",
                                node_name=name))
    return nodes, placed


def overtaken(lines: list[str]) -> int:
    """Pods whose /bind reached the extender after another pod's /filter or /prioritize had (the race holds are
    for), from the extender's log lines: each is written when its answer is, `duration_ms` after the request came."""
    arrivals = []
    for line in lines:
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if entry.get("verb") in ("filter", "prioritize", "bind") and "duration_ms" in entry:
            answered = datetime.strptime(entry["time"], "%Y-%m-%dT%H:%M:%S.%fZ").timestamp()
            arrivals.append((answered - entry["duration_ms"] / 1000, entry))
    waiting: set[str] = set()  # pods scored (or the only feasible node) whose bind has not come
    late: set[str] = set()
    for _, entry in sorted(arrivals, key=lambda a: a[0]):
        verb, pod = entry["verb"], entry.get("pod")
        if verb == "bind":
            waiting.discard(pod)
            continue
        late |= waiting - {pod}
        if verb == "prioritize" or entry.get("nodes_out") == 1:
            waiting.add(pod)
    return len(late)


def run(cluster: Cluster, template: dict[str, Any], tree: Path, pods: int) -> dict[str, Any]:
    start_extender(cluster, tree)
    log = cluster.components["extender"].log
    since = len(log.read_text().splitlines())
    cluster.create_pods(clones(template, BENCH_NS, SCHEDULER, pods))
    before = bind_results(cluster)
    binds = Binds(cluster, BENCH_NS)
    started = time.monotonic()
    cluster.start_scheduler(edit=lambda c: c.update(leaderElection={"leaderElect": False}))
    try:
        wait_until(f"{pods} pods bound", lambda: len(binds.times) >= pods, timeout=900, every=0.5)
    finally:
        binds.close()
    wall = time.monotonic() - started
    after = bind_results(cluster)
    results = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    problem = check_cores(cluster, pods)
    cluster.components["kube-scheduler"].stop()
    delete_pods(cluster, BENCH_NS)
    refused = sum(v for k, v in results.items() if k != "bound")
    return {"results": results, "conflicts": refused, "wall": wall, "problem": problem,
            "overtaken": overtaken(log.read_text().splitlines()[since:])}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=200)
    parser.add_argument("--runs", type=int, default=1, help="runs of each variant, taking turns")
    parser.add_argument("--fleet", nargs="+", choices=("empty", "graded"), default=["empty", "graded"])
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="mp-bench-conflicts-") as tmp:
        off = holds_off_tree(Path(tmp))
        for kind in args.fleet:
            rows += [(kind, label, r) for label, r in measure(Path(tmp) / kind, kind, args.pods, args.runs, off)]
    print(f"{args.pods} TP=1 pods of 16 cores created at once onto a fleet where they just fit (one per free NUMA "
          "node of 29 model cores), the real kube-scheduler")
    print("| fleet | extender | refused binds (conflicts) per 100 pods (goal ≤ 2) | bind results "
          "| pods bound after another pod's /filter or /prioritize | all bound, no core held twice | wall s |")
    print("|---|---|---|---|---|---|---|")
    for kind, label, r in rows:
        results = ", ".join(f"{k} {v:g}" for k, v in sorted(r["results"].items()) if v)
        print(f"| {kind} | {label} | **{100 * r['conflicts'] / args.pods:.1f}** | {results} | {r['overtaken']} "
              f"| {r['problem'] or 'yes'} | {r['wall']:.1f} |")
    return 1 if any(r["problem"] for _, _, r in rows) else 0


def measure(root: Path, kind: str, pods: int, runs: int, off: Path) -> list[tuple[str, dict[str, Any]]]:
    nodes, placed = fleet(kind, pods)
    with control_plane(root, nodes, (BENCH_NS, PLACED_NS), placed) as cluster:
        template = template_pod(cluster, memory="16Gi")
        # it is pending for our scheduler too: it would take a NUMA node of the fleet that just fits
        cluster.api.call("DELETE", f"/api/v1/namespaces/{TEMPLATE_NS}/pods/template?gracePeriodSeconds=0")
        return [(label, run(cluster, template, tree, pods))
                for _ in range(runs) for label, tree in (("holds on", ROOT), ("holds off", off))]


if __name__ == "__main__":
    sys.exit(main())
