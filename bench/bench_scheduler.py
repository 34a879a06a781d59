"""The real kube-scheduler placing pending model pods, with our extender and without it, same run.

    python bench/bench_scheduler.py [--nodes 1000 5000] [--pods 300] [--rounds 3]

For each fleet size: one control plane (tests/e2e/cluster.py), N empty 2-NUMA Xeon nodes, model-placement
installed from manifests/. Two kube-scheduler configurations from the same binary and the manifests' configuration:
one with our extender (profile model-placement-scheduler), one with the `extenders:` stanza removed (profile
bench-plain). Each round places `--pods` pods with each, in turn (the order alternates between rounds, so a machine
growing busier or quieter favours neither): the pods are created while that scheduler is stopped, then it is started;
pods/s is the bound pods over the time from the first bind seen to the last; then they are deleted. Both get the same
pods: copies of one pod as our webhook mutated it (20 models), differing only in schedulerName. The figures are
medians over the rounds, the ratio the median of the rounds' own ratios; the machine's load average is printed.
The extender's share: the seconds our server spent answering /filter and /prioritize (its own request-duration
metric) over the wall time of the run; /bind runs off the scheduling cycle and is shown apart.
"""

from __future__ import annotations

import argparse
import copy
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.e2e.cluster import Cluster, node, wait_until  # noqa: E402
from tests.e2e.fleet import model_pod  # noqa: E402

TEMPLATE_NS, EXTENDED_NS, PLAIN_NS = "bench-template", "bench", "bench-plain"
PLAIN = "bench-plain"


def without_extender(config: dict[str, Any]) -> None:
    config.pop("extenders", None)
    config["profiles"] = [{"schedulerName": PLAIN}]
    config["leaderElection"] = {"leaderElect": False}


def route_seconds(cluster: Cluster) -> dict[str, float]:
    """Server-side seconds our extender spent per route, from its /metrics."""
    _, body = cluster.get_ours("extender", "/metrics")
    out: dict[str, float] = {}
    for m in re.finditer(r'^model_placement_http_request_duration_seconds_sum\{([^}]*)\} (\S+)$', body.decode(), re.M):
        route = re.search(r'route="([^"]*)"', m.group(1))
        if route:
            out[route.group(1)] = out.get(route.group(1), 0.0) + float(m.group(2))
    return out


def bound_count(cluster: Cluster, namespace: str) -> int:
    pods = cluster.api.get(f"/api/v1/namespaces/{namespace}/pods?fieldSelector=spec.nodeName!%3D&limit=100000")
    return len(pods["items"])


def timed_run(cluster: Cluster, namespace: str, pods: int, start: Any) -> tuple[float, float]:
    """(pods/s, wall seconds): `start` launches the scheduler; measured from its first bind to the last."""
    start()
    first = wait_until("the first bind", lambda: bound_count(cluster, namespace) > 0 and time.monotonic(),
                       timeout=300, every=0.05)
    first_bound = bound_count(cluster, namespace)
    wait_until(f"{pods} pods bound in {namespace}", lambda: bound_count(cluster, namespace) >= pods,
               timeout=1800, every=0.25)
    wall = time.monotonic() - first
    return (pods - first_bound) / wall, wall


def clones(template: dict[str, Any], namespace: str, scheduler: str, count: int) -> list[dict[str, Any]]:
    """`count` copies of a pod as our webhook left it, 20 models, for `scheduler`; what the apiserver adds
    (uid, the ServiceAccount volume, status) dropped, as a controller's create would not carry them."""
    out = []
    for i in range(count):
        pod = copy.deepcopy(template)
        meta = pod["metadata"]
        pod["metadata"] = {"name": f"m-{i:05d}", "namespace": namespace, "annotations": meta.get("annotations", {}),
                           "labels": {**meta.get("labels", {}), "model-manager.io/model": f"model-{i % 20}"}}
        spec = pod["spec"]
        for key in ("nodeName", "volumes", "serviceAccount", "serviceAccountName"):
            spec.pop(key, None)
        for c in spec["containers"]:
            c.pop("volumeMounts", None)
        spec["schedulerName"] = scheduler
        pod.pop("status", None)
        out.append(pod)
    return out


def extended_run(cluster: Cluster, template: dict[str, Any], namespace: str, pods: int) -> dict[str, float]:
    cluster.create_pods(clones(template, namespace, "model-placement-scheduler", pods))
    before = route_seconds(cluster)
    rate, wall = timed_run(cluster, namespace, pods, cluster.start_scheduler)
    after = route_seconds(cluster)
    ms = {r: 1000 * (after.get(r, 0) - before.get(r, 0)) / pods for r in ("/filter", "/prioritize", "/bind")}
    return {"rate": rate, "share": (ms["/filter"] + ms["/prioritize"]) * pods / 1000 / wall, **ms}


def plain_run(cluster: Cluster, template: dict[str, Any], namespace: str, pods: int) -> float:
    cluster.create_pods(clones(template, namespace, PLAIN, pods))
    return timed_run(cluster, namespace, pods, lambda: cluster.start_scheduler("kube-scheduler-plain",
                                                                              without_extender))[0]


def run(nodes: int, pods: int, rounds: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="mp-bench-") as tmp:
        cluster = Cluster(Path(tmp))
        try:
            cluster.start()
            cluster.install()
            cluster.kubectl("apply", "-f", str(Path(__file__).resolve().parents[1] / "manifests" / "examples"
                                               / "balloonspolicy.yaml"))
            cluster.create_namespace(TEMPLATE_NS, enabled=True)
            cluster.create_nodes([node(f"node-{i:05d}", numa=2, cores_per_numa=32) for i in range(nodes)])
            cluster.start_model_placement("webhook")
            cluster.start_model_placement("extender")
            # One pod through our webhook gives the production shape; the measured pods are its copies, so both
            # schedulers get the very same pods and the measure is the scheduler's, not the webhook's.
            cluster.create_pods([model_pod("template", TEMPLATE_NS, tp=1, cpu="16")])
            template = cluster.pods(TEMPLATE_NS)[0]
            extended: list[dict[str, float]] = []
            plain: list[float] = []
            for i in range(rounds):
                order = ("extended", "plain") if i % 2 == 0 else ("plain", "extended")
                for which in order:
                    namespace = f"{EXTENDED_NS if which == 'extended' else PLAIN_NS}-{i}"
                    cluster.create_namespace(namespace, enabled=False)
                    if which == "extended":
                        extended.append(extended_run(cluster, template, namespace, pods))
                        cluster.components["kube-scheduler"].stop()
                    else:
                        plain.append(plain_run(cluster, template, namespace, pods))
                        cluster.components["kube-scheduler-plain"].stop()
                    # Same nodes, empty again for the next run. Forced: with no kubelet, a graceful delete of a
                    # bound pod never completes.
                    cluster.api.call("DELETE", f"/api/v1/namespaces/{namespace}/pods?gracePeriodSeconds=0")
                    wait_until(f"the pods of {namespace} gone", lambda ns=namespace: not cluster.pods(ns), timeout=120)
            med = {key: statistics.median(r[key] for r in extended) for key in extended[0]}
            return {"nodes": nodes, "pods": pods, "rounds": rounds, "extended": med["rate"],
                    "plain": statistics.median(plain),
                    "ratio": statistics.median(e["rate"] / p for e, p in zip(extended, plain)),
                    "ratios": [e["rate"] / p for e, p in zip(extended, plain)], **med}
        except BaseException:
            print(cluster.tails(), file=sys.stderr)
            raise
        finally:
            cluster.stop()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, nargs="+", default=[1000, 5000])
    p.add_argument("--pods", type=int, default=300)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    goals = {1000: 0.8, 5000: 0.5}
    rows = []
    for n in args.nodes:
        load = os.getloadavg()
        rows.append({**run(n, args.pods, args.rounds), "load": (load, os.getloadavg())})
    print("| nodes | pods × rounds | with extender (pods/s) | without (pods/s) | ratio (goal) [each round] "
          "| extender share of the cycle | /filter per pod | /prioritize per pod | /bind per pod "
          "| load before → after |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        goal = goals.get(r["nodes"])
        each = ", ".join(f"{x:.2f}" for x in r["ratios"])
        print(f"| {r['nodes']:,} | {r['pods']} × {r['rounds']} | {r['extended']:.1f} | {r['plain']:.1f} "
              f"| **{r['ratio']:.2f}**{f' (≥ {goal})' if goal else ''} [{each}] | {100 * r['share']:.0f} % "
              f"| {r['/filter']:.1f} ms | {r['/prioritize']:.1f} ms | {r['/bind']:.1f} ms "
              f"| {r['load'][0][0]:.1f} → {r['load'][1][0]:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
