"""The real kube-scheduler placing pending model pods: with our extender, with extenders that do no work, and
without any, same run.

    python bench/bench_scheduler.py [--nodes 1000 5000] [--pods 300] [--rounds 3] [--qps N] [--profile DIR]

For each fleet size: one control plane (tests/e2e/cluster.py), N empty 2-NUMA Xeon nodes, model-placement
installed from its chart. Five kube-scheduler configurations from the same binary and the manifests' configuration:
- ours: as the manifests give it (profile model-placement-scheduler);
- null: the `extenders:` stanza pointed at tests/peers/nullextender (a Go server whose /filter passes every candidate
  and whose /prioritize states no preference, in the same scheme as ours, no bindVerb): what calling any extender costs
  kube-scheduler here, apart from what the extender itself spends;
- pynull: the same null extender in Python on aiohttp and orjson (bench/null_extender.py), as ours is built: the
  floor of an extender on that stack before it judges anything (plain HTTP only; skipped under HTTPS);
- pybind: the Python null extender with bindVerb, binding each pod through the apiserver with our own client code
  (server.kubeapi): the floor of an extender on that stack that records its own bindings, as ours must (the design:
  /bind holds the cores at once and persists the placement on the pod), still without a watch or a log line;
- plain: the `extenders:` stanza removed.
Each round places `--pods` pods with each, in turn (the order rotates between rounds, so a machine growing busier or
quieter favours none): the pods are created while that scheduler is stopped, then it is started; pods/s is the bound
pods over the time from the first bind seen (one watch) to the last; then they are deleted. All get the same pods:
copies of one pod as our webhook mutated it (20 models), differing only in schedulerName. The figures are medians
over the rounds, each ratio the median of the rounds' own ratios; the machine's load average is printed. Per pod, the
milliseconds our server spent answering /filter, /prioritize and /bind (its own request-duration metric). CPU per
placed pod is read for every process from /proc over the same span; the goals: our extender's at most 1.5x the Go
null extender's, kube-scheduler's with ours within 1 ms of its own with the Go null, throughput ours / Go null ≥ 0.9.

kube-scheduler's own API client is limited to 50 requests/s (burst 100) unless its configuration says otherwise, and
the manifests leave it: the plain scheduler then binds at that rate once the burst is spent, while with our extender
the binds are ours. `--qps` lifts the limit in all three, which measures the scheduling work alone.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import Binds, clones, control_plane, delete_pods, our_metric, process_cpu, template_pod
from tests.e2e.cluster import Cluster, Component, free_port, node, wait_until
from tests.peers.build import build

EXTENDED_NS = "bench"


def route_seconds(cluster: Cluster) -> dict[str, float]:
    """Server-side seconds our extender spent per route, from its /metrics."""
    return our_metric(cluster, "model_placement_http_request_duration_seconds_sum", "route")


def cpu_seconds(cluster: Cluster) -> dict[str, float]:
    """CPU seconds (user + system) each running component has used so far, from /proc."""
    out = {}
    for name, comp in cluster.components.items():
        if comp.alive():
            assert comp.proc is not None
            process = name.removesuffix("-plain").removesuffix("-pynull").removesuffix("-pybind").removesuffix("-null")
            out[process] = process_cpu(comp.proc.pid)
    return out


def timed_run(cluster: Cluster, namespace: str, pods: int, start: Any) -> tuple[float, dict[str, float]]:
    """(pods/s, CPU ms per pod of each component): `start` launches the scheduler; measured from
    its first bind to the last."""
    binds = Binds(cluster, namespace)
    try:
        start()
        wait_until("the first bind", lambda: binds.times, timeout=300, every=0.01)
        before = cpu_seconds(cluster)
        wait_until(f"{pods} pods bound in {namespace}", lambda: len(binds.times) >= pods, timeout=1800, every=0.05)
        after = cpu_seconds(cluster)
    finally:
        binds.close()
    times = sorted(binds.times.values())
    wall = times[-1] - times[0]
    placed = len(times) - 1
    return placed / wall, {k: 1000 * (after[k] - before[k]) / placed for k in after if k in before}


ARMS = ("ours", "null", "pynull", "pybind", "plain")
SCHEDULER = {"ours": "model-placement-scheduler", "null": "bench-null", "pynull": "bench-pynull",
             "pybind": "bench-pybind", "plain": "bench-plain"}


def arm_config(which: str, qps: int | None, null_ports: dict[str, int]) -> Any:
    """The edit of the manifests' KubeSchedulerConfiguration for one arm. `qps` sets kube-scheduler's own API client
    rate (clientConnection qps and burst); None leaves the manifests' (kube-scheduler's defaults, 50 and 100). Ours
    is otherwise as given. Null (and pynull) keep the extender stanza pointed at the (Python) null extender: the same
    scheme, filter and prioritize only. Plain drops it. Those two get their own profile and no leader election."""
    def edit(config: dict[str, Any]) -> None:
        if qps is not None:
            config.setdefault("clientConnection", {}).update(qps=qps, burst=qps)
        if which == "ours":
            return
        ours = config.pop("extenders")[0]
        if which in null_ports:
            port = null_ports[which]
            dropped = ("preemptVerb",) if which == "pybind" else ("bindVerb", "preemptVerb")
            config["extenders"] = [{**{k: v for k, v in ours.items() if k not in dropped},
                                    "urlPrefix": f"{ours['urlPrefix'].split(':', 1)[0]}://127.0.0.1:{port}"}]
        config["profiles"] = [{"schedulerName": SCHEDULER[which]}]
        config["leaderElection"] = {"leaderElect": False}
    return edit


def start_null_extenders(cluster: Cluster) -> dict[str, int]:
    """The Go null extender in the scheme ours is called in (the manifests: plain HTTP on loopback), and the Python
    one (bench/null_extender.py, plain HTTP only) twice, without and with /bind: their ports by arm."""
    ports = {"null": free_port(), "pynull": free_port(), "pybind": free_port()}
    tls = [f"--tls-cert={cluster.tls.cert_file}", f"--tls-key={cluster.tls.key_file}"] \
        if cluster.scheme("extender") == "https" else []
    cluster.components["null-extender"] = Component(
        "null-extender", [str(build("nullextender")), f"--listen=127.0.0.1:{ports['null']}", *tls],
        cluster.logs / "null-extender.log").start()
    if cluster.scheme("extender") == "http":
        for arm, extra in (("pynull", []), ("pybind", [f"--kubeconfig={cluster.admin_kubeconfig}"])):
            name = f"{arm}-extender"
            cluster.components[name] = Component(
                name, [sys.executable, str(Path(__file__).with_name("null_extender.py")),
                       f"--listen=127.0.0.1:{ports[arm]}", *extra], cluster.logs / f"{name}.log").start()
    return ports


class Profile:
    """cProfile of our extender's loop thread, by CPU time (bench/profiled.py), while its arm runs; a no-op without
    `--profile`. The stats of every run so far go to the one file."""

    def __init__(self, cluster: Cluster, on: bool) -> None:
        self.pid = cluster.components["extender"].proc.pid if on else None  # type: ignore[union-attr]
        if self.pid is not None:
            os.kill(self.pid, signal.SIGUSR1)

    def stop(self) -> None:
        if self.pid is not None:
            os.kill(self.pid, signal.SIGUSR2)


def arm_run(cluster: Cluster, template: dict[str, Any], which: str, namespace: str, pods: int, qps: int | None,
            null_ports: dict[str, int], profile: bool) -> dict[str, float]:
    cluster.create_pods(clones(template, namespace, SCHEDULER[which], pods))
    component = "kube-scheduler" if which == "ours" else f"kube-scheduler-{which}"
    before = route_seconds(cluster)
    sampler = Profile(cluster, profile and which == "ours")
    try:
        rate, cpu = timed_run(cluster, namespace, pods,
                                    lambda: cluster.start_scheduler(component, arm_config(which, qps, null_ports)))
    finally:
        sampler.stop()
    cluster.components[component].stop()
    out = {"rate": rate, **{f"cpu {k}": v for k, v in cpu.items()}}
    if which == "ours":
        after = route_seconds(cluster)
        out.update({r: 1000 * (after.get(r, 0) - before.get(r, 0)) / pods for r in ("/filter", "/prioritize", "/bind")})
    return out


def run(nodes: int, pods: int, rounds: int, qps: int | None, profile: Path | None) -> dict[str, Any]:
    argv0 = None if profile is None else [sys.executable, str(Path(__file__).with_name("profiled.py")),
                                          str(profile / f"extender-{nodes}.prof"), "-m", "cli"]
    with tempfile.TemporaryDirectory(prefix="mp-bench-") as tmp, control_plane(
            Path(tmp), [node(f"node-{i:05d}", numa=2, cores_per_numa=32) for i in range(nodes)],
            extender_argv0=argv0) as cluster:
        null_ports = start_null_extenders(cluster)
        template = template_pod(cluster)
        runs: dict[str, list[dict[str, float]]] = {arm: [] for arm in ARMS}
        for i in range(rounds):
            for which in ARMS[i % len(ARMS):] + ARMS[:i % len(ARMS)]:
                namespace = f"{EXTENDED_NS}-{which}-{i}"
                cluster.create_namespace(namespace, enabled=False)
                runs[which].append(arm_run(cluster, template, which, namespace, pods, qps, null_ports,
                                           profile is not None))
                delete_pods(cluster, namespace)  # same nodes, empty again for the next run
        med = {arm: {key: statistics.median(r[key] for r in runs[arm]) for key in runs[arm][0]} for arm in ARMS}
        ratios = {arm: [r["rate"] / p["rate"] for r, p in zip(runs[arm], runs["plain"])] for arm in ARMS}
        processes = sorted({k for arm in ARMS for k in med[arm] if k.startswith("cpu ")})
        return {"nodes": nodes, "pods": pods, "rounds": rounds, "qps": qps, "med": med, "ratios": ratios,
                "cpu": {k.removeprefix("cpu "): tuple(med[arm].get(k, 0.0) for arm in ARMS) for k in processes}}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, nargs="+", default=[1000, 5000])
    p.add_argument("--pods", type=int, default=300)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--qps", type=int, default=None,
                   help="kube-scheduler's API client qps and burst, all three schedulers (default: the manifests', "
                        "i.e. kube-scheduler's 50 and 100, which cap the plain scheduler's own binds)")
    p.add_argument("--profile", type=Path, default=None,
                   help="a folder: our extender's loop thread profiled by CPU time during its runs "
                        "(extender-NODES.prof, pstats)")
    args = p.parse_args()
    if args.profile is not None:
        args.profile.mkdir(parents=True, exist_ok=True)
    rows = []
    for n in args.nodes:
        load = os.getloadavg()
        rows.append({**run(n, args.pods, args.rounds, args.qps, args.profile), "load": (load, os.getloadavg())})
    print("| nodes | pods × rounds | client qps | ours (pods/s) | Go null | Python null | Python null + bind | plain "
          "| ours / Go null (goal ≥ 0.9) [each round] | ours / plain | Go null / plain | Python null / plain "
          "| Python null + bind / plain | /filter per pod | /prioritize per pod | /bind per pod "
          "| load before → after |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        med, ratios = r["med"], r["ratios"]
        to_null = [o / n for o, n in zip(ratios["ours"], ratios["null"])]
        print(f"| {r['nodes']:,} | {r['pods']} × {r['rounds']} | {r['qps'] or '50 (default)'} "
              + "".join(f"| {med[arm]['rate']:.1f} " for arm in ARMS)
              + f"| **{statistics.median(to_null):.2f}** [{', '.join(f'{x:.2f}' for x in to_null)}] "
              + "".join(f"| {statistics.median(ratios[arm]):.2f} " for arm in ARMS if arm != "plain")
              + f"| {med['ours']['/filter']:.1f} ms | {med['ours']['/prioritize']:.1f} ms "
              f"| {med['ours']['/bind']:.1f} ms "
              f"| {r['load'][0][0]:.1f} → {r['load'][1][0]:.1f} |")
    print(f"\nCPU ms per placed pod, each process (median over the rounds): {' / '.join(ARMS)}")
    print("| nodes | " + " | ".join(rows[0]["cpu"]) + " | all |")
    print("|---|" + "---|" * (len(rows[0]["cpu"]) + 1))
    for r in rows:
        cells = [" / ".join(f"{v:.1f}" for v in values) for values in r["cpu"].values()]
        totals = " / ".join(f"{sum(v[i] for v in r['cpu'].values()):.1f}" for i in range(len(ARMS)))
        print(f"| {r['nodes']:,} | " + " | ".join(cells) + f" | {totals} |")
    print("\nGoals, CPU ms per placed pod (medians):")
    for r in rows:
        cpu = r["cpu"]
        ours, go = cpu["extender"][ARMS.index("ours")], cpu["null-extender"][ARMS.index("null")]
        py = cpu.get("pynull-extender", (0.0,) * len(ARMS))[ARMS.index("pynull")]
        pybind = cpu.get("pybind-extender", (0.0,) * len(ARMS))[ARMS.index("pybind")]
        sched = cpu["kube-scheduler"]
        print(f"  {r['nodes']:,} nodes: our extender {ours:.1f} / the Go null extender {go:.1f} = {ours / go:.2f}x "
              f"(goal ≤ 1.5x: {'met' if ours <= 1.5 * go else 'not met'}; the Python null extender {py:.1f}, "
              f"with /bind {pybind:.1f}); "
              f"kube-scheduler with ours {sched[0]:.1f}, with the Go null {sched[1]:.1f}: "
              f"{sched[0] - sched[1]:+.1f} ms (goal within 1 ms: {'met' if sched[0] - sched[1] <= 1 else 'not met'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
