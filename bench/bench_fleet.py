"""The fleet benchmark: with model-placement every model pod ends up pinned NUMA-locally, and without it some do not,
as the real balloons plugin on every node says.

    python bench/bench_fleet.py [--nodes 100] [--events 2400] [--rate 10] [--seed 7] [--arms stock ours]

One fleet of virtual nodes (tests/e2e/vnode.py: per Node, the real NRI balloons plugin on a synthetic sysfs of the
node's shape, its own agent reading the node's BalloonsPolicy from the apiserver, and a kubelet stand-in that runs
the pods bound to it on the plugin) behind a real control plane (tests/e2e/cluster.py: etcd, kube-apiserver,
kube-controller-manager, kube-scheduler, model-placement installed from its chart). Mixed shapes: 2 NUMA nodes on
2 packages, 4 on 1 (SNC-4) and on 2 (SNC-2), 8 on 2 (SNC-4), SMT on and off, with and without AMX; each shape its
generated `group.<shape>` BalloonsPolicy, a few nodes their own `node.<name>` one. One stream, played twice on the
same fleet, each time on a fresh control plane:
- model pods created and deleted (TP 1/2/4, some with PP or DP ranks, cpu: as a user writes it), bare and from
  Deployments scaled up and down;
- non-model pods in kube-system and other namespaces, scheduled by the default scheduler in both arms.
Arms:
- **stock**: the default kube-scheduler (default profile), our webhook off. Model pods carry what a careful user
  would write by hand after reading the plugin's documentation: the balloon annotation and the CPU request our
  webhook would give them (computed offline by the same mutation), so only admission and scheduling differ;
- **ours**: the manifests' secondary scheduler with our extender, and our webhook (mutating and validating).
Judged by what the plugins did (the virtual nodes' cpusets): model pods the plugin failed, spread over more NUMA
nodes than ranks (or a rank short of its share on its NUMA node), or on a core another container uses; pods
refused at admission; create → Running (p50/p99); cores stranded at the end (free, but on a NUMA node with room for
no rank of the smallest model); model pods placed.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import random
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import urllib3

if __package__ in (None, ""):  # `python bench/bench_fleet.py` from a checkout
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from placement.balloons import node_balloons_policy
from placement.balloonspolicy import GROUP_LABEL
from placement.cluster import ClusterState
from placement.config import Settings
from placement.demand import read_model_pod
from placement.mutation import mutate_pod
from placement.topology import CPUSet, linux_layout
from tests.e2e.cluster import Cluster
from tests.e2e.vnode import VirtualNode, start_fleet, stop_fleet
from tests.oracle.judge import cores_by_numa, rank_per_numa, shared_cores
from tests.oracle.sysfs import NodeShape

AMX_LABEL = "feature.node.kubernetes.io/cpu-security.amx.enabled"
MODEL_LABEL = "model-manager.io/model"
MODEL_NAMESPACES = ("team-a", "team-b")
OTHER_NAMESPACES = ("kube-system", "monitoring", "default")
POLICY_NAMESPACE = "kube-system"
ARMS = ("stock", "ours")
# (packages, NUMA nodes per package, cores per NUMA node choices, weight)
SHAPES = ((2, 1, (24, 32), 0.40), (1, 4, (16,), 0.15), (2, 2, (16, 20), 0.30), (2, 4, (12,), 0.15))
SMT_ON, AMX_ON, OWN_POLICY = 0.75, 0.8, 0.05
# TP, weight, cpu: choices (cores, as `nri_cpu_request: cores` reads them)
MODELS = ((1, 0.55, (4, 6, 8, 12, 16)), (2, 0.3, (8, 12, 16, 24)), (4, 0.15, (16, 24, 32)))
SMALLEST_RANK = 4  # cores: the stream's smallest model rank (TP=1, cpu: 4)
# Every rank of the stream is a multiple of this many cores, so a NUMA node whose model cores are not is left
# that remainder even when packed perfectly.
RANK_STEP = math.gcd(*(cpu // tp for tp, _, cpus in MODELS for cpu in cpus))


# -- fleet and stream ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class VNode:
    name: str
    shape: NodeShape
    amx: bool
    own_policy: bool

    @property
    def group(self) -> str:
        s = self.shape
        return f"p{s.packages}n{s.numa_per_package}c{s.cores_per_numa}t{s.threads_per_core}"

    @property
    def labels(self) -> dict[str, str]:
        return {GROUP_LABEL: self.group, **({AMX_LABEL: "true"} if self.amx else {})}


def make_fleet(count: int, rng: random.Random) -> list[VNode]:
    out = []
    for i in range(count):
        r, chosen = rng.random(), SHAPES[-1]
        for shape in SHAPES:
            if r < shape[3]:
                chosen = shape
                break
            r -= shape[3]
        packages, per_package, cores, _ = chosen
        shape = NodeShape(packages=packages, numa_per_package=per_package, cores_per_numa=rng.choice(cores),
                          threads_per_core=2 if rng.random() < SMT_ON else 1, memory_gib_per_numa=256)
        out.append(VNode(f"vn-{i:03d}", shape, rng.random() < AMX_ON, rng.random() < OWN_POLICY))
    return out


def policies(fleet: list[VNode]) -> list[dict[str, Any]]:
    """`model-placement balloons-policy` for each shape (group.<shape>), and for the nodes of their own a policy
    with another deployment profile (node.<name>, which the plugin's agent prefers)."""
    out, seen = [], set()
    for n in fleet:
        topo = linux_layout([n.shape.cores_per_numa] * n.shape.numa_nodes, n.shape.threads_per_core, "labels")
        if n.group not in seen:
            seen.add(n.group)
            policy = node_balloons_policy(n.name, topo, Settings(), POLICY_NAMESPACE)
            policy["metadata"]["name"] = f"group.{n.group}"
            out.append(policy)
        if n.own_policy:
            policy = node_balloons_policy(n.name, topo, Settings(nri_deployment_profile="observability"),
                                          POLICY_NAMESPACE)
            policy["metadata"]["name"] = f"node.{n.name}"
            out.append(policy)
    return out


def model_spec(model: str, tp: int, cpu: int, extra: list[str]) -> dict[str, Any]:
    memory = f"{max(16, cpu * 4)}Gi"
    return {"containers": [{
        "name": "vllm", "image": "vllm/vllm-openai-cpu:v0.10.0",
        "args": ["--model", f"/models/{model}", "--tensor-parallel-size", str(tp), *extra],
        "resources": {"requests": {"cpu": str(cpu), "memory": memory}, "limits": {"cpu": str(cpu), "memory": memory}},
    }]}


def model_pod(name: str, namespace: str, tp: int, cpu: int, extra: list[str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": {MODEL_LABEL: name}},
            "spec": model_spec(name, tp, cpu, extra)}


def deployment(name: str, namespace: str, replicas: int, tp: int, cpu: int) -> dict[str, Any]:
    labels = {MODEL_LABEL: name, "app": name}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": namespace},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                     "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}},
                     "template": {"metadata": {"labels": labels}, "spec": model_spec(name, tp, cpu, [])}}}


def other_pod(name: str, namespace: str, cpu: str) -> dict[str, Any]:
    resources = {"requests": {"cpu": cpu, "memory": "128Mi"}, "limits": {"cpu": cpu, "memory": "128Mi"}}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace,
                                                             "labels": {"app": name}},
            "spec": {"containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10", "resources": resources}]}}


def make_stream(fleet: list[VNode], events: int, rng: random.Random) -> list[dict[str, Any]]:
    """Creates and deletes steered to keep the live model demand near the fleet's model cores (so that both
    arms meet full nodes): bare model pods (some with PP or DP ranks), Deployments created, scaled and deleted,
    and non-model pods."""
    capacity = sum(n.shape.cores for n in fleet) * 0.85
    live_pods: dict[str, int] = {}  # name -> cores
    live_deploys: dict[str, tuple[int, int]] = {}  # name -> (replicas, cores per replica)
    others: list[tuple[str, str]] = []
    out: list[dict[str, Any]] = []
    for k in range(events):
        demand = sum(live_pods.values()) + sum(r * c for r, c in live_deploys.values())
        r = rng.random()
        if r < 0.12:
            if others and rng.random() < 0.4:
                name, ns = others.pop(rng.randrange(len(others)))
                out.append({"op": "delete-pod", "namespace": ns, "name": name})
            else:
                ns = rng.choice(OTHER_NAMESPACES)
                name = f"svc-{k:05d}"
                others.append((name, ns))
                out.append({"op": "create-pod", "model": False,
                            "object": other_pod(name, ns, rng.choice(("100m", "250m", "500m", "1", "2")))})
            continue
        grow = rng.random() < min(0.95, max(0.05, 0.5 + (capacity - demand) / capacity))
        tp, _, cpus = rng.choices(MODELS, [m[1] for m in MODELS])[0]
        cpu = rng.choice(cpus)
        if r < 0.30:  # Deployments
            if grow and (not live_deploys or rng.random() < 0.4):
                name = f"dep-{k:05d}"
                replicas = rng.randint(1, 3)
                live_deploys[name] = (replicas, cpu)
                out.append({"op": "create-deploy", "object": deployment(name, rng.choice(MODEL_NAMESPACES),
                                                                         replicas, tp, cpu)})
            elif live_deploys:
                name = rng.choice(sorted(live_deploys))
                replicas, per = live_deploys[name]
                replicas = min(4, replicas + 1) if grow else replicas - 1
                if replicas <= 0:
                    del live_deploys[name]
                    out.append({"op": "delete-deploy", "name": name})
                else:
                    live_deploys[name] = (replicas, per)
                    out.append({"op": "scale", "name": name, "replicas": replicas})
            continue
        if grow or not live_pods:
            name = f"m-{k:05d}"
            extra: list[str] = []
            if tp == 1 and rng.random() < 0.15:
                extra, cpu = ["--pipeline-parallel-size", "2"], cpu * 2
            elif tp == 1 and rng.random() < 0.1:
                extra, cpu = ["--data-parallel-size", "2"], cpu * 2
            live_pods[name] = cpu
            out.append({"op": "create-pod", "model": True,
                        "object": model_pod(name, rng.choice(MODEL_NAMESPACES), tp, cpu, extra)})
        else:
            name = rng.choice(sorted(live_pods))
            del live_pods[name]
            out.append({"op": "delete-pod", "name": name})
    return out


# -- watching and judging -----------------------------------------------------------------------------------

@dataclass
class PodFate:
    uid: str
    key: str
    model: bool
    created: float
    running: float | None = None
    failed: str | None = None
    node: str | None = None
    verdict: str | None = None  # local | spread | shared | memory, once its containers are seen
    placement: str = ""  # where the plugin put it, for the summary of the pods judged not local
    ever_shared: bool = False
    deleted: bool = False


@dataclass
class Observer:
    """Every pod's fate from one watch on pods, and the placements from the virtual nodes' records."""

    cluster: Cluster
    fleet: dict[str, VNode]
    fates: dict[str, PodFate] = field(default_factory=dict)
    posted: dict[str, float] = field(default_factory=dict)  # "ns/name" -> when our create returned
    pods: dict[str, dict[str, Any]] = field(default_factory=dict)  # uid -> the pod as last seen
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def watch(self) -> None:
        api = self.cluster.api
        version = self.relist()
        while not self.stop.is_set():
            try:
                for event in api.watch(f"/api/v1/pods?watch=1&resourceVersion={version}&timeoutSeconds=60", 90):
                    if event["type"] == "ERROR":  # history compacted: list again
                        version = self.relist()
                        continue
                    version = event["object"]["metadata"]["resourceVersion"]
                    self.seen(event["type"], event["object"])
            except (urllib3.exceptions.HTTPError, OSError, ValueError):
                time.sleep(0.5)  # the next watch resumes from the last version seen

    def relist(self) -> str:
        listed = self.cluster.api.get("/api/v1/pods")
        for pod in listed["items"]:
            self.seen("MODIFIED", pod)
        return str(listed["metadata"]["resourceVersion"])

    def seen(self, kind: str, pod: dict[str, Any]) -> None:
        now, meta = time.monotonic(), pod["metadata"]
        uid, key = meta["uid"], f"{meta['namespace']}/{meta['name']}"
        with self.lock:
            fate = self.fates.get(uid)
            if fate is None:
                fate = self.fates[uid] = PodFate(uid, key, MODEL_LABEL in (meta.get("labels") or {}),
                                                 self.posted.get(key, now))
            self.pods[uid] = pod
            fate.deleted = fate.deleted or kind == "DELETED"
            status = pod.get("status") or {}
            fate.node = pod["spec"].get("nodeName") or fate.node
            if status.get("phase") == "Running" and fate.running is None:
                fate.running = now
            if fate.failed is None:
                fate.failed = next((c["state"]["waiting"].get("message", "") for c in (
                    *(status.get("initContainerStatuses") or ()), *(status.get("containerStatuses") or ()))
                    if c.get("state", {}).get("waiting", {}).get("reason") == "CreateContainerError"), None)

    def judge(self, records: dict[str, dict[str, Any]]) -> None:
        """Each running model pod's container, against the rest of its node: spread, short, shared, memory."""
        with self.lock:
            by_uid = {f.uid: f for f in self.fates.values()}
            for node, record in records.items():
                shape = self.fleet[node].shape
                entries = [(e["uid"], c, CPUSet.parse(v["cpuset"]).cpus, v["mems"])
                           for e in record["pods"].values() for c, v in e["containers"].items() if v["cpuset"]]
                for uid, container, cpus, mems in entries:
                    fate, pod = by_uid.get(uid), self.pods.get(uid)
                    if fate is None or pod is None or not fate.model:
                        continue
                    demand = read_model_pod(pod, Settings())
                    if demand is None or container != demand.container:
                        continue
                    others = [c for u, _, c, _ in entries if u != uid]
                    if shared_cores(shape, cpus, others):
                        fate.ever_shared = True
                    if fate.verdict is None:
                        spread = cores_by_numa(shape, cpus)
                        numa = {int(m) for m in str(mems).split(",") if m != ""}
                        fate.verdict = ("shared" if fate.ever_shared else
                                        "spread" if not rank_per_numa(spread, demand.numa_nodes, demand.cpus, shape)
                                        else "memory" if numa != set(spread) else "local")
                        fate.placement = (f"{fate.key} on {node}: {demand.numa_nodes} rank(s) of {demand.cpus} CPUs, "
                                          f"got cores per NUMA node {dict(sorted(spread.items()))}, memory {mems}")


def records(vnodes: list[VirtualNode]) -> dict[str, dict[str, Any]]:
    out = {}
    for v in vnodes:
        try:
            out[v.name] = v.record()
        except (OSError, ValueError):
            continue  # being replaced: read it next time
    return out


def free_cores(fleet: dict[str, VNode], recs: dict[str, dict[str, Any]], reserved: dict[str, CPUSet]) -> dict[str, Any]:
    """What the fleet has free at the end, from the cpusets the plugins gave. `stranded`: free cores on NUMA nodes
    where no rank of the smallest model fits; `stranded_forced`: how many of those the NUMA nodes' own sizes force
    (on such a NUMA node its model cores modulo RANK_STEP stay free under any NUMA-local packing of the stream's
    ranks); `free`: every free model core, stranded or not; `slivers`: how many NUMA nodes end with 0, 1, 2, 3 free
    cores. Read together they say whether an arm strands cores by packing badly or by packing more."""
    total = forced = free_all = 0
    slivers = [0] * SMALLEST_RANK
    for name, record in recs.items():
        shape = fleet[name].shape
        held = {shape.core_of(c) for c in reserved[name].cpus}
        used = {shape.core_of(c) for e in record["pods"].values() for v in e["containers"].values()
                for c in CPUSet.parse(v["cpuset"]).cpus} | held
        for numa in range(shape.numa_nodes):
            cores = range(numa * shape.cores_per_numa, (numa + 1) * shape.cores_per_numa)
            free = sum(1 for core in cores if core not in used)
            free_all += free
            if free < SMALLEST_RANK:
                slivers[free] += 1
                total += free
                forced += sum(1 for core in cores if core not in held) % RANK_STEP
    return {"stranded": total, "stranded_forced": forced, "free": free_all, "slivers": slivers}


# -- one arm --------------------------------------------------------------------------------------------------

def stock_scheduler(config: dict[str, Any]) -> None:
    """kube-scheduler as shipped: the default profile, no extender, its own adaptive percentageOfNodesToScore."""
    for key in ("extenders", "percentageOfNodesToScore"):
        config.pop(key, None)
    config["profiles"] = [{"schedulerName": "default-scheduler"}]
    config["leaderElection"] = {"leaderElect": False}


def premutated(obj: dict[str, Any], state: ClusterState) -> dict[str, Any]:
    """What a careful user writes by hand for the stock arm: our mutation (balloon annotation, CPU request, AMX
    affinity), applied before the create, without our scheduler's name."""
    if obj["kind"] == "Pod":
        return mutate_pod(obj, state).pod
    out = copy.deepcopy(obj)
    template = out["spec"]["template"]
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {**template["metadata"], "name": obj["metadata"]["name"],
                                                           "namespace": obj["metadata"]["namespace"]},
           "spec": template["spec"]}
    mutated = mutate_pod(pod, state).pod
    template["metadata"] = {k: v for k, v in mutated["metadata"].items() if k not in ("name", "namespace")}
    template["spec"] = mutated["spec"]
    return out


def play_arm(arm: str, fleet: list[VNode], stream: list[dict[str, Any]], rate: float) -> dict[str, Any]:
    started = time.monotonic()
    cluster = Cluster(Path(tempfile.mkdtemp(prefix=f"mp-fleet-{arm}-")))
    vnodes: list[VirtualNode] = []
    observer = Observer(cluster, {n.name: n for n in fleet})
    fleet_policies = policies(fleet)
    try:
        cluster.start()
        cluster.install()
        for policy in fleet_policies:
            cluster.kubectl("apply", "-f", "-", input=json.dumps(policy))
        for ns in (*MODEL_NAMESPACES, "monitoring"):
            cluster.create_namespace(ns, enabled=ns in MODEL_NAMESPACES)
        vnodes = start_fleet(cluster, [(n.name, n.shape, n.labels) for n in fleet],
                             on_record=lambda record: observer.judge({record["node"]: record}))
        cluster.start_scheduler("default-scheduler", stock_scheduler)
        if arm == "ours":
            cluster.start_model_placement("webhook")
            cluster.start_model_placement("extender")
            cluster.start_scheduler()
        else:
            for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):
                cluster.kubectl("delete", kind, "model-placement")
        state = ClusterState.from_objects(
            [*(v.api.get(f"/api/v1/nodes/{v.name}") for v in vnodes), *fleet_policies], Settings(scheduler_name=""))
        by_name = {p["metadata"]["name"]: p for p in fleet_policies}
        reserved = {n.name: CPUSet.parse(str(p["spec"]["reservedResources"]["cpu"]).removeprefix("cpuset:"))
                    for n in fleet for p in [by_name.get(f"node.{n.name}") or by_name[f"group.{n.group}"]]}
        watcher = threading.Thread(target=observer.watch, daemon=True)
        watcher.start()
        ready_at = time.monotonic()
        refused: Counter[str] = Counter()
        deploys: dict[str, str] = {}
        pods_ns: dict[str, str] = {}
        for i, event in enumerate(stream):
            due = ready_at + i / rate
            time.sleep(max(0.0, due - time.monotonic()))
            apply(cluster, arm, event, state, observer, refused, deploys, pods_ns)
        stream_seconds = time.monotonic() - ready_at
        settle(observer)
        recs = records(vnodes)
        observer.judge(recs)
        observer.stop.set()
        return summarize(arm, observer, recs, reserved, refused, stream_seconds, time.monotonic() - started, vnodes)
    except BaseException:
        print(cluster.tails(), file=sys.stderr)
        raise
    finally:
        stop_fleet(cluster, vnodes)
        cluster.stop()


def apply(cluster: Cluster, arm: str, event: dict[str, Any], state: ClusterState, observer: Observer,
          refused: Counter[str], deploys: dict[str, str], pods_ns: dict[str, str]) -> None:
    api, op = cluster.api, event["op"]
    if op in ("create-pod", "create-deploy"):
        obj = event["object"]
        is_model = op == "create-deploy" or event["model"]
        if arm == "stock" and is_model:
            obj = premutated(obj, state)
        ns, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
        path = f"/api/v1/namespaces/{ns}/pods" if op == "create-pod" else f"/apis/apps/v1/namespaces/{ns}/deployments"
        with observer.lock:
            observer.posted[f"{ns}/{name}"] = time.monotonic()
        got = api.call("POST", path, obj, ok=(201, 400, 403, 422))
        if got.get("kind") == "Status":
            refused["model pods" if is_model else "other pods"] += 1
            return
        (deploys if op == "create-deploy" else pods_ns)[name] = ns
    elif op == "delete-pod" and event["name"] in pods_ns:
        ns = pods_ns.pop(event["name"])
        api.call("DELETE", f"/api/v1/namespaces/{ns}/pods/{event['name']}", ok=(200, 202, 404))
    elif op == "scale" and event["name"] in deploys:
        api.call("PATCH", f"/apis/apps/v1/namespaces/{deploys[event['name']]}/deployments/{event['name']}/scale",
                 {"spec": {"replicas": event["replicas"]}}, ok=(200, 404),
                 content_type="application/merge-patch+json")
    elif op == "delete-deploy" and event["name"] in deploys:
        ns = deploys.pop(event["name"])
        api.call("DELETE", f"/apis/apps/v1/namespaces/{ns}/deployments/{event['name']}?propagationPolicy=Background",
                 ok=(200, 202, 404))


def settle(observer: Observer, quiet: float = 15, limit: float = 180) -> None:
    """Until nothing has changed for `quiet` seconds (pods still Pending then stay so), at most `limit`."""
    def state() -> tuple[int, int, int]:
        with observer.lock:
            fates = list(observer.fates.values())
        return (len(fates), sum(f.running is not None for f in fates), sum(f.failed is not None for f in fates))

    last, since, start = state(), time.monotonic(), time.monotonic()
    while time.monotonic() - since < quiet and time.monotonic() - start < limit:
        time.sleep(1)
        now = state()
        if now != last:
            last, since = now, time.monotonic()


def summarize(arm: str, observer: Observer, recs: dict[str, dict[str, Any]], reserved: dict[str, CPUSet],
              refused: Counter[str], stream_seconds: float, seconds: float,
              vnodes: list[VirtualNode]) -> dict[str, Any]:
    models = [f for f in observer.fates.values() if f.model]
    verdicts = Counter(f.verdict for f in models if f.verdict)
    waits = sorted(f.running - f.created for f in models if f.running is not None)
    pending = [f for f in models if f.running is None and not f.deleted]
    errors = [e for v in vnodes for e in v.errors]
    return {
        "arm": arm, "model_pods": len(models), "refused": refused["model pods"],
        "placed": sum(1 for f in models if f.running is not None),
        "failed": sum(1 for f in models if f.failed is not None),
        "spread": verdicts["spread"], "shared": sum(1 for f in models if f.ever_shared),
        "memory_off_numa": verdicts["memory"], "local": verdicts["local"],
        "unjudged": sum(1 for f in models if f.running is not None and f.verdict is None),
        "pending_at_end": len(pending),
        "p50": statistics.median(waits) if waits else None,
        "p99": waits[min(len(waits) - 1, int(0.99 * len(waits)))] if waits else None,
        **free_cores(observer.fleet, recs, reserved),
        "stream_seconds": round(stream_seconds, 1), "seconds": round(seconds, 1),
        "failures": sorted({f.failed for f in models if f.failed})[:5], "kubelet_errors": errors[:5],
        "not_local": sorted(f.placement for f in models if f.verdict not in (None, "local"))[:5],
    }


# -- main -----------------------------------------------------------------------------------------------------

def table(rows: list[dict[str, Any]]) -> Iterator[str]:
    yield ("| arm | model pods | refused at admission | placed | plugin failed | spread | shared core "
           "| pending at end | create → Running p50 / p99 | stranded cores (forced by NUMA sizes) | free cores "
           "| NUMA nodes left with 0 / 1 / 2 / 3 free cores |")
    yield "|---|---|---|---|---|---|---|---|---|---|---|---|"
    for r in rows:
        times = f"{r['p50']:.2f} s / {r['p99']:.2f} s" if r["p50"] is not None else "-"
        yield (f"| {r['arm']} | {r['model_pods']} | {r['refused']} | {r['placed']} | {r['failed']} | {r['spread']} "
               f"| {r['shared']} | {r['pending_at_end']} | {times} | {r['stranded']} ({r['stranded_forced']}) "
               f"| {r['free']} "
               f"| {' / '.join(map(str, r['slivers']))} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--events", type=int, default=2400)
    parser.add_argument("--rate", type=float, default=10, help="stream events per second")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    fleet = make_fleet(args.nodes, random.Random(f"fleet-{args.seed}"))
    stream = make_stream(fleet, args.events, random.Random(f"stream-{args.seed}"))
    ops = Counter(e["op"] + ("" if e["op"] != "create-pod" else "-model" if e["model"] else "-other") for e in stream)
    shapes = Counter(n.group for n in fleet)
    print(f"fleet: {args.nodes} virtual nodes, {len(shapes)} shapes {dict(shapes)}, "
          f"{sum(n.amx for n in fleet)} with AMX, {sum(n.own_policy for n in fleet)} with their own policy")
    print(f"stream: {len(stream)} events {dict(ops)}, at {args.rate}/s", flush=True)
    rows = []
    for arm in args.arms:
        rows.append(play_arm(arm, fleet, stream, args.rate))
        print(json.dumps(rows[-1]), flush=True)
    print()
    for line in table(rows):
        print(line)
    if args.json:
        print(json.dumps(rows, indent=2))
    ours = next((r for r in rows if r["arm"] == "ours"), None)
    stock = next((r for r in rows if r["arm"] == "stock"), None)
    bad = ours is not None and (ours["failed"] or ours["spread"] or ours["shared"]
                                or (stock is not None and ours["stranded"] > stock["stranded"]))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
