"""What the benchmarks share, so that each bench/bench_*.py is its docstring, its flags, its measurement and its
printout:

- the synthetic fleets: Nodes, model and non-model pods, BalloonsPolicies, NodeResourceTopologies, and a
  `--cluster` file of them;
- the payloads kube-apiserver and kube-scheduler send (recorded under tests/fixtures/recorded/), varied as they
  vary between the replicas of one model: an AdmissionReview, a pending pod in ExtenderArgs;
- our servers on loopback (the extender in a process of its own, built on a synthetic fleet; the webhook over TLS;
  the fake apiserver; our command line from another source tree), the keep-alive client that calls the extender as
  kube-scheduler does, and a control plane with model-placement installed (tests/e2e/cluster.py) with a watch of the
  binds;
- the figures: percentiles, a process's CPU and memory, the machine's load, a child process's JSON answer.

Nothing of placement/ is imported at module level: bench/bench_fit.py measures the placement/ of another tree
(`--against`) and imports it after this module.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import functools
import gc
import json
import logging
import os
import random
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import suppress
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RECORDED = ROOT / "tests/fixtures/recorded"

# The labels node-feature-discovery writes, and the node group a BalloonsPolicy is chosen by.
NUMA_LABEL = "feature.node.kubernetes.io/memory-numa.node_count"
SMT_LABEL = "feature.node.kubernetes.io/cpu-hardware_multithreading"
AMX_LABEL = "feature.node.kubernetes.io/cpu-security.amx.enabled"
GROUP_LABEL = "config.nri/group"
# The apiserver's generated-name characters (k8s.io/apimachinery/pkg/util/rand.String): no vowels, no 0/1/3.
NAME_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"


# -- figures -----------------------------------------------------------------------------------------------------

def pct(values: Sequence[float], p: float) -> float:
    """The `p`th percentile, nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def best(repeat: int, run: Callable[[], Any]) -> float:
    """The shortest of `repeat` wall times of `run`, each after a collection, its result freed untimed."""
    times = []
    for _ in range(repeat):
        gc.collect()
        started = time.perf_counter()
        result = run()
        times.append(time.perf_counter() - started)
        del result
    return min(times)


TICK = os.sysconf("SC_CLK_TCK")


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system) the process has used so far, every thread, the event loop's transports too."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def vm_kb(field: str) -> int:
    """This process's /proc/self/status `field` (VmRSS, VmHWM), kB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def load_average() -> str:
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())


def calibration() -> str:
    """How fast this machine runs plain Python, to put the figures in context."""
    started = time.perf_counter()
    total = 0
    for i in range(2_000_000):
        total += i
    per = (time.perf_counter() - started) / 2_000_000 * 1e9
    return f"{os.cpu_count()} CPUs, load average {load_average()}; a bare Python loop iteration takes {per:.0f} ns"


def child_json(what: str, argv: list[str], env: dict[str, str] | None = None) -> Any:
    """Run a child Python process, and read the JSON its stdout ends with; its stderr shown if it fails."""
    res = subprocess.run([sys.executable, *argv], cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        sys.stderr.write(res.stderr)
        raise SystemExit(f"{what} child failed")
    return json.loads(res.stdout.strip().splitlines()[-1])


def metric(text: str, name: str, label: str) -> dict[str, float]:
    """A metric of a Prometheus text exposition, summed by the value of one of its labels."""
    out: dict[str, float] = {}
    for m in re.finditer(rf'^{name}\{{([^}}]*)\}} (\S+)$', text, re.M):
        value = re.search(rf'(?<!\w){label}="([^"]*)"', m.group(1))
        if value:
            out[value.group(1)] = out.get(value.group(1), 0.0) + float(m.group(2))
    return out


# -- the synthetic fleet -----------------------------------------------------------------------------------------
# bench_extender's, bench_load's and bench_bind_conflicts': nodes of seven shapes, a BalloonsPolicy per NUMA count
# (and its smaller variant), model pods placed where they fit and many small shared-pool pods.

# (NUMA nodes, physical cores per NUMA node): 2-socket SPR/EMR, SNC-2/SNC-4, 8-NUMA 4-socket boxes
SHAPES = ((2, 32), (2, 56), (2, 28), (4, 24), (4, 30), (8, 12), (8, 16))
RESERVED = 8  # CPUs per node (BalloonsPolicy reservedResources.cpu)


def node(name: str, labels: dict[str, str], cpus: int, *, allocatable_cpus: int | None = None,
         memory: tuple[str, str] = ("1024Gi", "1000Gi"), pods: str = "250", ready: bool = False) -> dict[str, Any]:
    """A Node as the apiserver returns it: `cpus` logical CPUs, `memory` its capacity and allocatable."""
    status: dict[str, Any] = {
        "capacity": {"cpu": str(cpus), "memory": memory[0], "pods": pods},
        "allocatable": {"cpu": str(cpus if allocatable_cpus is None else allocatable_cpus), "memory": memory[1],
                        "pods": pods}}
    if ready:
        status["conditions"] = [{"type": "Ready", "status": "True"}]
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}, "spec": {},
            "status": status}


def node_name(i: int) -> str:
    return f"node-{i:05d}"


def node_shape(i: int) -> tuple[int, int, bool]:
    numa, cores = SHAPES[i % len(SHAPES)]
    return numa, cores, i % 5 != 0  # every fifth node has SMT off


def node_object(i: int, full: bool = False) -> dict[str, Any]:
    """The fleet's node `i`; `full` adds what a real kubelet reports (the NodeList case)."""
    numa, cores, smt = node_shape(i)
    name = node_name(i)
    labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
              NUMA_LABEL: str(numa), SMT_LABEL: "true" if smt else "false", AMX_LABEL: "true"}
    # One BalloonsPolicy per hardware class (group.numaN), as an operator deploys the generated one; every tenth
    # node is in a class whose policy lacks the type that spans all its NUMA nodes.
    labels[GROUP_LABEL] = f"numa{numa}" + ("-small" if i % 10 == 3 else "")
    obj = node(name, labels, numa * cores * (2 if smt else 1))
    if full:
        obj["metadata"].update(uid=f"00000000-0000-4000-8000-{i:012d}", resourceVersion=str(1000 + i),
                               creationTimestamp="2026-01-05T08:00:00Z",
                               annotations={"node.alpha.kubernetes.io/ttl": "0",
                                            "volumes.kubernetes.io/controller-managed-attach-detach": "true"})
        obj["spec"] = {"podCIDR": f"10.{i // 250}.{i % 250}.0/24", "podCIDRs": [f"10.{i // 250}.{i % 250}.0/24"]}
        obj["status"].update(
            conditions=[{"type": t, "status": s, "reason": r, "message": m, "lastHeartbeatTime": "2026-01-05T09:00:00Z",
                         "lastTransitionTime": "2026-01-05T08:01:00Z"}
                        for t, s, r, m in (
                            ("MemoryPressure", "False", "KubeletHasSufficientMemory",
                             "kubelet has sufficient memory available"),
                            ("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
                            ("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
                            ("Ready", "True", "KubeletReady", "kubelet is posting ready status"))],
            addresses=[{"type": "InternalIP", "address": f"10.0.{i // 250}.{i % 250}"},
                       {"type": "Hostname", "address": name}],
            daemonEndpoints={"kubeletEndpoint": {"Port": 10250}},
            nodeInfo={"machineID": f"{i:032x}", "systemUUID": f"{i:08x}-0000-4000-8000-000000000000",
                      "bootID": f"{i:08x}-1111-4000-8000-000000000000", "kernelVersion": "6.8.0-49-generic",
                      "osImage": "Ubuntu 24.04.1 LTS", "containerRuntimeVersion": "containerd://1.7.22",
                      "kubeletVersion": "v1.31.2", "kubeProxyVersion": "v1.31.2", "operatingSystem": "linux",
                      "architecture": "amd64"},
            images=[{"names": [f"registry.example.com/img-{k}@sha256:{'0' * 64}", f"registry.example.com/img-{k}:v1"],
                     "sizeBytes": 100_000_000 + k} for k in range(8)])
    return obj


def model_pod(name: str, uid: str, tp: int, cpus: int, node: str | None = None, model: str = "llama",
              created: str = "2026-01-05T08:30:00Z") -> dict[str, Any]:
    """A model pod as the webhook leaves it (annotations written, Guaranteed), as the apiserver returns it."""
    pod: dict[str, Any] = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "generateName": name.rsplit("-", 1)[0] + "-", "namespace": "llm", "uid": uid,
                     "resourceVersion": "1", "creationTimestamp": created,
                     "labels": {"model-manager.io/model": model, "pod-template-hash": "7d9f8c6b5"},
                     "annotations": {"cpu-policy.model-manager.io/type": "nri-balloons",
                                     "cpu-policy.model-manager.io/tensor-parallel-size": str(tp),
                                     "cpu-policy.model-manager.io/cpus": str(cpus * 2),
                                     "balloon.balloons.resource-policy.nri.io/container.main": f"vllm-balloon-tp{tp}"},
                     "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": name.rsplit("-", 1)[0],
                                          "uid": "ad0d3f5c-9ca8-4bbd-92e0-f660b23f82f1", "controller": True,
                                          "blockOwnerDeletion": True}]},
        "spec": {"containers": [{"name": "main", "image": "vllm/vllm-openai-cpu:v0.10.0",
                                 "args": ["--model", "/mnt/models", "--dtype", "bfloat16",
                                          "--tensor-parallel-size", str(tp)],
                                 "resources": {"requests": {"cpu": str(cpus), "memory": "64Gi"},
                                               "limits": {"cpu": str(cpus), "memory": "64Gi"}}}],
                 "schedulerName": "model-placement", "restartPolicy": "Always", "priority": 0,
                 "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute",
                                  "tolerationSeconds": 300}]},
        "status": {"phase": "Pending" if node is None else "Running"},
    }
    if node is not None:
        pod["spec"]["nodeName"] = node
    return pod


def plain_pod(name: str, uid: str, node: str | None, milli: int) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "apps", "uid": uid,
                         "labels": {"app": name.rsplit("-", 2)[0]}, "creationTimestamp": "2026-01-05T08:10:00Z"},
            "spec": {"containers": [{"name": "app", "image": "registry.example.com/app:1",
                                     "resources": {"requests": {"cpu": f"{milli}m", "memory": "256Mi"}}}],
                     **({"nodeName": node} if node else {})},
            "status": {"phase": "Running" if node else "Pending"}}


def balloons_policy(name: str, nodes_status: dict[str, str], types: list[dict[str, Any]]) -> dict[str, Any]:
    """A BalloonsPolicy in kube-system with its `reserved` type and `types`, and the nodes' status of it."""
    return {"apiVersion": "config.nri/v1alpha1", "kind": "BalloonsPolicy",
            "metadata": {"name": name, "namespace": "kube-system"},
            "spec": {"reservedResources": {"cpu": str(RESERVED)}, "pinCPU": True, "pinMemory": True,
                     "balloonTypes": [{"name": "reserved", "namespaces": ["kube-system"]}, *types]},
            "status": {"nodes": {n: {"status": s, "generation": 1} for n, s in nodes_status.items()}}}


def model_balloon_types(numa: int, without: str = "") -> list[dict[str, Any]]:
    """The model balloon types `model-placement balloons-policy` generates for `numa` NUMA nodes (per-NUMA
    types and composites over them), less the type named `without`."""
    from types import SimpleNamespace

    from placement.balloons import model_balloon_types as generated

    return [t for t in generated(SimpleNamespace(numa_count=numa), "vllm-balloon-tp")  # type: ignore[arg-type]
            if t["name"] != without]


def build_fleet(n_nodes: int, n_pods: int, seed: int = 7) -> list[dict[str, Any]]:
    """Nodes, a BalloonsPolicy per NUMA count (and its smaller variant) and pods: one in ten a model pod, placed only
    where it fits (as the extender would have), the rest small shared-pool pods."""
    rng = random.Random(seed)
    objects: list[dict[str, Any]] = [node_object(i) for i in range(n_nodes)]
    status = {node_name(i): ("Failure" if i % 97 == 5 else "Success") for i in range(n_nodes)}
    for numa in sorted({n for n, _ in SHAPES}):
        for small in (False, True):
            members = {node_name(i): status[node_name(i)] for i in range(n_nodes)
                       if node_shape(i)[0] == numa and (i % 10 == 3) == small}
            objects.append(balloons_policy(f"group.numa{numa}{'-small' if small else ''}", members,
                                           model_balloon_types(numa, f"vllm-balloon-tp{numa}" if small else "")))
    free = []
    for i in range(n_nodes):
        numa, cores, _ = node_shape(i)
        free.append([cores - 2] * numa)  # about what RESERVED CPUs leave on each NUMA node
    for p in range(n_pods):
        i = rng.randrange(n_nodes)
        name = f"pod-{p:06d}"
        if p % 10:
            objects.append(plain_pod(f"svc-{p % 997}-7c9d8f6b5d-{p:06d}", f"uid-{p}", node_name(i),
                                     rng.choice((50, 100, 250))))
            continue
        numa = len(free[i])
        tp = rng.choice([t for t in (1, 2, 4, 8) if t <= numa])
        per = rng.choice((2, 4, 6, 8))
        order = sorted(range(numa), key=lambda k: (-free[i][k], k))[:tp]
        if any(free[i][k] < per for k in order):
            continue
        for k in order:
            free[i][k] -= per
        smt = 2 if node_shape(i)[2] else 1  # cpu: N is N logical CPUs: per cores on each NUMA node
        objects.append(model_pod(f"{name}-x", f"uid-{p}", tp, per * tp * smt, node_name(i), model=f"model-{p % 40}",
                                 created=f"2026-01-05T08:{(p // 6000) % 60:02d}:{(p // 100) % 60:02d}Z"))
    return objects


def build_mixed_fleet(n_nodes: int, placed: bool, seed: int = 39) -> list[dict[str, Any]]:
    """Issue 39's fleet: 1-, 2- and 4-NUMA nodes of 24-48 cores per NUMA node (SMT on 9 in 10, AMX on 8 in 10) under
    one `default` BalloonsPolicy with plain types for TP 1/2/4, each node running two TP=1 model pods and 18 small
    pods. `placed`: each model pod carries the placement our /bind would have recorded (else they are of unknown
    placement, as right after an install)."""
    from placement.assume import AssumeCache
    from placement.cluster import ClusterState
    from placement.config import Settings
    from placement.demand import read_model_pod
    from placement.ledger import PLACEMENT

    rng = random.Random(seed)
    nodes, pods = [], []
    for i in range(n_nodes):
        numa, cores, smt = rng.choice((1, 2, 4)), rng.randint(24, 48), rng.random() < 0.9
        name = node_name(i)
        labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", NUMA_LABEL: str(numa),
                  SMT_LABEL: "true" if smt else "false", **({AMX_LABEL: "true"} if rng.random() < 0.8 else {})}
        nodes.append(node(name, labels, numa * cores * (2 if smt else 1)))
        for k in range(2):
            per = rng.randint(4, 12)
            pods.append(model_pod(f"run-{i:05d}-{k}-x", f"uid-run-{i}-{k}", 1, per * (2 if smt else 1), name,
                                  model=f"model-{(i + k) % 40}"))
        for k in range(18):
            pods.append(plain_pod(f"svc-{k}-7c9d8f6b5d-{i:05d}{k:02d}", f"uid-svc-{i}-{k}", name,
                                  rng.choice((50, 100, 250))))
    policy = balloons_policy("default", {n["metadata"]["name"]: "Success" for n in nodes},
                             [{"name": f"vllm-balloon-tp{tp}", "hideHyperthreads": True, "preferNewBalloons": True}
                              for tp in (1, 2, 4)])
    if placed:
        # Where /bind would have put each, in creation order: the placement its Binding records.
        settings = Settings()
        cluster = ClusterState.from_objects([*nodes, policy], settings)
        cache = AssumeCache(cluster)
        for pod in pods:
            if "model-manager.io/model" not in pod["metadata"]["labels"]:
                continue
            meta = pod["metadata"]
            demand = read_model_pod(pod, settings)
            if cache.assume(meta["uid"], meta["namespace"], meta["name"], demand, pod["spec"]["nodeName"]).ok:
                meta["annotations"][PLACEMENT] = cache.placement(meta["uid"])
    return [*nodes, policy, *pods]


def cluster_list(objects: list[dict[str, Any]]) -> dict[str, Any]:
    """The objects as `kubectl get … -A -o json` prints them: a `--cluster` file."""
    return {"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": ""}, "items": objects}


# -- bench_fit's fleet: every ledger different ---------------------------------------------------------------------

FIT_SHAPES = ((2, 32, 2), (2, 48, 2), (4, 24, 2), (4, 16, 1), (8, 20, 2))  # NUMA nodes, cores per NUMA, SMT width


def fit_node(name: str, numa: int, cores: int, tpc: int) -> dict[str, Any]:
    cpus = numa * cores * tpc
    # AMX: model pods require it by default
    return node(name, {NUMA_LABEL: str(numa), SMT_LABEL: str(tpc == 2).lower(), GROUP_LABEL: f"n{numa}-c{cores}-t{tpc}",
                       AMX_LABEL: "true"},
                cpus, allocatable_cpus=cpus - 2, memory=("512Gi", "500Gi"), pods="110", ready=True)


def raw_model_pod(name: str, tp: int, cpus: int, node_name: str | None = None, policy: str = "") -> dict[str, Any]:
    """A model pod as a user writes it (what the webhook mutates), Running on `node_name` if given."""
    pod: dict[str, Any] = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "models", "uid": f"uid-{name}",
                     "labels": {"model-manager.io/model": name},
                     "annotations": {"model-manager.io/cpu-policy": policy} if policy else {},
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


def _running_models(k: int, obj: dict[str, Any], policy: str = "") -> list[dict[str, Any]]:
    """Node `k`'s running model pods, distinct per node: k's digits pick the sizes of up to three models."""
    numa = int(obj["metadata"]["labels"][NUMA_LABEL])
    return [raw_model_pod(f"run-{k}-{j}", tp, 2 * tp * (1 + (k // (j + 1) + j) % 3), obj["metadata"]["name"], policy)
            for j, tp in enumerate(t for t in (1, 2, 4) if t <= numa)]


def fit_fleet(count: int, settings: Any) -> list[dict[str, Any]]:
    """Nodes of the five shapes, each shape's generated BalloonsPolicy (`group.<shape>`), the running models."""
    from placement.balloons import node_balloons_policy
    from placement.cluster import ClusterState

    nodes = [fit_node(f"n-{k:04d}", *FIT_SHAPES[k % len(FIT_SHAPES)]) for k in range(count)]
    topology = ClusterState.from_objects(nodes, settings)
    policies = {}
    for obj in nodes:
        group = obj["metadata"]["labels"][GROUP_LABEL]
        if group not in policies:
            ledger = topology.ledger(obj["metadata"]["name"])
            policy = node_balloons_policy(obj["metadata"]["name"], ledger.topology, settings, "kube-system")
            policy["metadata"]["name"] = f"group.{group}"
            policies[group] = policy
    pods = [pod for k, obj in enumerate(nodes) for pod in _running_models(k, obj)]
    return [*nodes, *policies.values(), *pods]


def static_fleet(count: int) -> list[dict[str, Any]]:
    """The same shapes and running models, pinned by the kubelet."""
    nodes = [fit_node(f"n-{k:04d}", *FIT_SHAPES[k % len(FIT_SHAPES)]) for k in range(count)]
    nrts = []
    for k, obj in enumerate(nodes):
        obj["metadata"]["labels"]["model-manager.io/cpu-manager"] = "static"
        numa, cores, tpc = FIT_SHAPES[k % len(FIT_SHAPES)]
        cpus = cores * tpc
        nrts.append({"apiVersion": "topology.node.k8s.io/v1alpha2", "kind": "NodeResourceTopology",
                     "metadata": {"name": obj["metadata"]["name"]},
                     "attributes": [{"name": "topologyManagerPolicy",
                                     "value": ("single-numa-node", "restricted")[k % 2]},
                                    {"name": "topologyManagerScope", "value": "container"}],
                     "zones": [{"name": f"node-{i}", "type": "Node", "resources": [
                         {"name": "cpu", "capacity": str(cpus), "allocatable": str(cpus - 2 * (i == 0))}]}
                         for i in range(numa)]})
    pods = [pod for k, obj in enumerate(nodes) for pod in _running_models(k, obj, "kubelet-static")]
    return [*nodes, *nrts, *pods]


# -- payloads ------------------------------------------------------------------------------------------------------

def extender_args(pod: dict[str, Any], names: list[str] | None = None,
                  nodes: dict[str, Any] | None = None) -> dict[str, Any]:
    """ExtenderArgs as kube-scheduler sends them: the pod, and the candidates by name (nodeCacheCapable) or whole."""
    return {"Pod": pod, "Nodes": nodes, "NodeNames": names}


@functools.cache
def recorded_pod() -> dict[str, Any]:
    """The pod of the ExtenderArgs the real kube-scheduler sent our /filter."""
    pod: dict[str, Any] = json.loads((RECORDED / "extender-filter-args.json").read_text())["request"]["Pod"]
    return pod


def new_model(rng: random.Random, serial: int, new_shape: bool = False) -> tuple[int, int, str]:
    """(TP, cores, CPU request) of one of 12 models; with `new_shape`, of a demand never asked before."""
    tp = rng.choice((1, 1, 2, 2, 4, 8))
    cores = rng.choice((4, 8, 16)) * tp
    return tp, cores, str(2 * cores) if not new_shape else f"{(2 * cores - 1) * 1000 + 1 + serial % 999}m"


def pending_pod(rng: random.Random, serial: int, new_shape: bool = False,
                model: tuple[int, int, str] | None = None) -> dict[str, Any]:
    """The pod the real kube-scheduler sent our /filter (tests/fixtures/recorded/, a ReplicaSet's KServe pod as our
    webhook mutated it), as a replica of one of 12 models (TP 1/2/4/8 x 4/8/16 cores per NUMA node): its own
    generated name, uid and resourceVersion, the model's label, TP and CPUs where our webhook writes them (a request
    of cores x 2 CPUs, `requested-cpu` the user's figure). With `new_shape`, a demand never asked before (its CPU
    request in millicores is unique), so no verdict is cached. `model`: (TP, cores, the CPU request) of a replica of
    that model instead."""
    tp, cores, cpu = model or new_model(rng, serial, new_shape)
    pod = copy.deepcopy(recorded_pod())
    meta, container = pod["metadata"], pod["spec"]["containers"][0]
    meta["name"] = meta["generateName"] + "".join(rng.choice(NAME_ALPHABET) for _ in range(5))
    meta["uid"] = f"bench-{serial}-{rng.random()}"
    meta["resourceVersion"] = str(100_000 + serial)
    meta["labels"]["serving.kserve.io/inferenceservice"] = f"model-tp{tp}-{cores}"
    ann = meta["annotations"]
    ann["cpu-policy.model-manager.io/tensor-parallel-size"] = str(tp)
    ann["cpu-policy.model-manager.io/requested-cpu"] = str(cores)
    ann["cpu-policy.model-manager.io/cpus"] = str(2 * cores)
    ann[f"balloon.balloons.resource-policy.nri.io/container.{container['name']}"] = f"vllm-balloon-tp{tp}"
    container["resources"] = {"requests": {"cpu": cpu, "memory": "64Gi"}, "limits": {"cpu": cpu, "memory": "64Gi"}}
    container["args"] = [*container["args"][:-1], str(tp)]  # --tensor-parallel-size N, last in the recorded pod
    return pod


def admission_review(serial: int = 0, distinct: bool = False) -> dict[str, Any]:
    """The AdmissionReview the real kube-apiserver sent for a ReplicaSet-created KServe pod
    (tests/fixtures/recorded/), as it sends its `serial`-th replica: the request uid, the ServiceAccount token volume
    `kube-api-access-<5 random characters>` (and its volumeMounts), managedFields' time (to the second); names are
    generated after admission, so there are none. With `distinct`, the pod of one of 500 models (a label of its
    own)."""
    body: dict[str, Any] = json.loads((RECORDED / "admissionreview-mutate-pod-replicaset.json").read_text())["request"]
    request = body["request"]
    request["uid"] = f"00000000-0000-4000-8000-{serial:012d}"
    pod = request["object"]
    suffix = "".join(NAME_ALPHABET[(serial * 7919 // len(NAME_ALPHABET) ** k) % len(NAME_ALPHABET)] for k in range(5))
    spec = pod["spec"]
    token = next(v for v in spec["volumes"] if v["name"].startswith("kube-api-access-"))
    old, token["name"] = token["name"], f"kube-api-access-{suffix}"
    for c in spec["containers"]:
        for mount in c.get("volumeMounts", []):
            if mount["name"] == old:
                mount["name"] = token["name"]
    for entry in pod["metadata"].get("managedFields", []):
        entry["time"] = f"2026-12-03T08:{serial // 3600 % 60:02d}:{serial // 60 % 60:02d}Z"
    if distinct:
        pod["metadata"]["labels"]["serving.kserve.io/inferenceservice"] = f"model-{serial % 500}"
    return body


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


# -- our servers on loopback ---------------------------------------------------------------------------------------

def serve_app(app: Any, report: Callable[[int], object], ssl_context: Any = None) -> None:
    """Serve an aiohttp app on 127.0.0.1 on a free port, tell `report` the port, and serve until killed."""
    from aiohttp import web

    async def main() -> None:
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ssl_context)
        await site.start()
        report(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]
        await asyncio.Event().wait()

    asyncio.run(main())


def fleet_objects(fleet: str, n_nodes: int, n_pods: int) -> list[dict[str, Any]]:
    """bench_extender's `--fleet`: synthetic, mixed or mixed-placed."""
    if fleet == "synthetic":
        return build_fleet(n_nodes, n_pods)
    return build_mixed_fleet(n_nodes, placed=fleet == "mixed-placed")


def serve_extender(n_nodes: int, n_pods: int, gc_mode: str, conn: Any, fleet: str = "synthetic") -> None:
    """The real extender app on the fleet, in this (forked) process: sends (port, seconds to build the state, pods,
    model pods) down `conn`, then serves until killed. Its Server-Timing says more (GcPauses)."""
    from cli.runner import build_app
    from placement.cluster import ClusterState
    from placement.config import Settings
    from server.app import Runtime
    from server.logs import JSONFormatter

    handler = logging.StreamHandler(open(os.devnull, "w"))  # noqa: SIM115 - lives as long as the process
    handler.setFormatter(JSONFormatter())
    logging.getLogger().handlers[:] = [handler]
    logging.getLogger().setLevel(logging.INFO)
    logging.getLogger("model_placement.cluster").setLevel(logging.ERROR)
    started = time.perf_counter()
    settings = Settings()
    if gc_mode == "server":
        from cli.runner import tune_gc
        from server.kubesource import BulkLoadGC

        # As `model-placement extender` does (cli.runner.run): the GC tuned before its source starts, the first
        # list under the source's bulk-load GC, every ledger built before its end freezes what was loaded.
        tune_gc()
        with BulkLoadGC():
            cluster = ClusterState.from_objects(fleet_objects(fleet, n_nodes, n_pods), settings)
            cluster.ledgers()
    else:
        cluster = ClusterState.from_objects(fleet_objects(fleet, n_nodes, n_pods), settings)
        cluster.ledgers()  # the ledgers are built lazily; a synced server has built them
    built = time.perf_counter() - started
    if gc_mode == "freeze":
        gc.collect()
        gc.freeze()  # the synced state is long-lived: keep the cyclic GC from walking it on every gen-2 pass
    if gc_mode == "tuned":
        from cli.runner import tune_gc

        tune_gc()  # what the server does after loading its state

    pauses = GcPauses()
    app = build_app(Runtime(settings, cluster), "extender")
    app.middlewares.append(pauses.middleware)
    app.router.add_post("/bench/profile", pauses.profile)
    serve_app(app, lambda port: conn.send((port, built, len(cluster.pods),
                                           sum(1 for r in cluster.pods.values() if r.model))))


class GcPauses:
    """What the server process spent in the cyclic collector and in building ledgers during each request, added to
    its Server-Timing header (`cpu;dur=` the request's CPU ms on the loop thread, `gc;dur=` wall ms, `gccpu;dur=`
    its thread's CPU ms, `gcgen;desc=` the oldest generation collected, -1 for none, `ledgers;desc=N`): a slow
    call says whether a collection or a cold ledger made it slow, and, on a machine busy with other work, whether
    the collection was long or only descheduled. POST /bench/profile starts a cProfile of every request (body
    "start") or ends it and answers its top entries (body "stop")."""

    def __init__(self) -> None:
        self.wall = self.cpu = 0.0
        self.oldest = -1
        self._began = (0.0, 0.0)
        self.profiler: Any = None
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._began = (time.perf_counter(), time.thread_time())
        else:
            self.wall += time.perf_counter() - self._began[0]
            self.cpu += time.thread_time() - self._began[1]
            self.oldest = max(self.oldest, info["generation"])

    @property
    def middleware(self) -> Any:
        from aiohttp import web

        from extender.routes import JUDGE
        from server.app import RUNTIME

        @web.middleware
        async def timed(request: Any, handler: Any) -> Any:
            cluster = request.app[RUNTIME].cluster
            judge = request.app[JUDGE]
            wall, cpu, built_before, fits = self.wall, self.cpu, len(cluster._ledgers), judge.fits_asked
            began = time.thread_time()
            self.oldest = -1
            if self.profiler is not None:
                self.profiler.enable()
            try:
                response = await handler(request)
            finally:
                if self.profiler is not None:
                    self.profiler.disable()
            built = len(cluster._ledgers) - built_before
            response.headers["Server-Timing"] = (
                f"{response.headers.get('Server-Timing', 'app;dur=nan')}, "
                f"cpu;dur={(time.thread_time() - began) * 1000:.3f}, "
                f"gc;dur={(self.wall - wall) * 1000:.3f}, "
                f"gccpu;dur={(self.cpu - cpu) * 1000:.3f}, gcgen;desc={self.oldest}, ledgers;desc={built}, "
                f"fits;desc={judge.fits_asked - fits}")
            return response
        return timed

    async def profile(self, request: Any) -> Any:
        import cProfile
        import io
        import pstats

        from aiohttp import web

        if (await request.text()) == "start":
            self.profiler = cProfile.Profile()
            return web.Response(text="started")
        out = io.StringIO()
        pstats.Stats(self.profiler, stream=out).sort_stats(os.environ.get("BENCH_SORT", "tottime")).print_stats(
            int(os.environ.get("BENCH_TOP", "18")))
        self.profiler = None
        return web.Response(text=out.getvalue())


class Client:
    """HTTP/1.1 over one keep-alive connection, as lean as kube-scheduler's Go client: `http.client`
    parses headers through the email package and would add ~0.4 ms of its own to every round trip."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as Go sets it
        self.buffer = b""

    def post(self, path: str, body: bytes) -> tuple[float, float, Any]:
        """(round trip ms, the server's own ms from its Server-Timing, the answer); `timing` keeps every metric."""
        started = time.perf_counter()
        headers, data = self.exchange(path, body)
        elapsed = (time.perf_counter() - started) * 1000
        self.timing = dict(_timing(part) for part in headers.get("server-timing", "app;dur=nan").split(","))
        return elapsed, self.timing["app"], json.loads(data)

    def exchange(self, path: str, body: bytes, ctype: str = "application/json") -> tuple[dict[str, str], bytes]:
        """One POST: the answer's headers (lower-case names) and body; anything but a 200 ends the run."""
        self.sock.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: {ctype}\r\n"
                          f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        data = self.buffer
        while b"\r\n\r\n" not in data:
            data += self._recv()
        head, _, data = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        length = int(headers["content-length"])
        while len(data) < length:
            data += self._recv()
        self.buffer = data[length:]
        status = int(lines[0].split()[1])
        if status != 200:
            raise SystemExit(f"{path}: HTTP {status}: {data[:300]!r}")
        return headers, data[:length]

    def _recv(self) -> bytes:
        chunk = self.sock.recv(1 << 20)
        if not chunk:
            raise SystemExit("the server closed the connection")
        return chunk


def _timing(part: str) -> tuple[str, float]:
    """One Server-Timing metric as (name, its dur or desc)."""
    name, _, rest = part.strip().partition(";")
    return name, float(rest.split("=", 1)[1])


WEBHOOK_HOST = "model-placement-webhook.model-placement.svc"  # the name our webhook's certificate is for


def serve_webhook(mode: str, cert: str, key: str, port_file: str) -> None:
    """mode: ours (as `model-placement webhook` serves, its GC tuned), ours-no-memo (without its replica memo), or
    bare (an aiohttp handler that parses the AdmissionReview and answers the same JSON); over TLS, its port written
    to `port_file`."""
    import orjson
    from aiohttp import web

    from certs import server_ssl_context
    from cli.runner import build_app
    from placement.cluster import ClusterState
    from placement.config import Settings
    from server.app import Runtime
    from server.sources import demo_text, load_objects

    if mode.startswith("ours"):
        settings = Settings()
        runtime = Runtime(settings, ClusterState.from_objects(load_objects(demo_text()), settings))
        app = build_app(runtime, "webhook")
        if mode == "ours-no-memo":
            from webhook.routes import REPLICAS

            app[REPLICAS] = None  # type: ignore[assignment]  # the handler then mutates every pod afresh
        from cli.runner import tune_gc

        tune_gc()  # as the server does once its state is loaded
    else:
        async def bare(request: web.Request) -> web.Response:
            return web.Response(body=orjson.dumps(orjson.loads(await request.read())), content_type="application/json")

        app = web.Application()
        app.router.add_post("/mutate", bare)
    serve_app(app, lambda port: Path(port_file).write_text(str(port)), server_ssl_context(cert, key).context)


def get_tls(port: int, path: str, ca: str) -> str:
    """GET `path` of our server over TLS on loopback (its certificate names the Service, not 127.0.0.1)."""
    import ssl
    import urllib.request

    ctx = ssl.create_default_context(cafile=ca)
    ctx.check_hostname = False
    return str(urllib.request.urlopen(f"https://127.0.0.1:{port}{path}", context=ctx, timeout=10).read().decode())


def tree_env(tree: Path) -> dict[str, str]:
    """The environment that runs `python -m cli` from the source tree `tree` (PYTHONSAFEPATH: not the cwd's)."""
    return {"PYTHONSAFEPATH": "1", "PYTHONPATH": str(tree)}


@contextlib.contextmanager
def fake_apiserver(nodes: int, pods: int) -> Iterator[str]:
    """tests/support/fakeapi.py serving a synthetic fleet from a process of its own; yields its URL."""
    server = subprocess.Popen(
        [sys.executable, "-m", "tests.support.fakeapi", "--nodes", str(nodes), "--pods", str(pods)],
        cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )
    try:
        assert server.stdout is not None
        line = server.stdout.readline()
        if not line.startswith("PORT "):
            raise SystemExit(f"fake apiserver did not start: {line!r}")
        yield f"http://127.0.0.1:{int(line.split()[1])}"
    finally:
        if server.stdin:
            server.stdin.close()
        server.wait(timeout=30)


# -- a control plane with model-placement installed ------------------------------------------------------------------

TEMPLATE_NS = "bench-template"


@contextlib.contextmanager
def control_plane(root: Path, nodes: list[dict[str, Any]], namespaces: tuple[str, ...] = (),
                  placed: list[dict[str, Any]] | None = None, extender_argv0: list[str] | None = None) -> Iterator[Any]:
    """tests/e2e/cluster.py's control plane under `root`, model-placement installed from its chart with the example
    BalloonsPolicy, `namespaces` (not opted in) and TEMPLATE_NS (opted in), `nodes` and the pods `placed` on them,
    our webhook and extender running; the components' last log lines printed if anything fails."""
    from tests.e2e.cluster import Cluster

    cluster = Cluster(root)
    try:
        cluster.start()
        cluster.install()
        cluster.kubectl("apply", "-f", str(ROOT / "manifests" / "examples" / "balloonspolicy.yaml"))
        cluster.create_namespace(TEMPLATE_NS, enabled=True)
        for namespace in namespaces:
            cluster.create_namespace(namespace, enabled=False)
        cluster.create_nodes(nodes)
        if placed:
            cluster.create_pods(placed)
        cluster.start_model_placement("webhook")
        cluster.start_model_placement("extender", argv0=extender_argv0)
        yield cluster
    except BaseException:
        print(cluster.tails(), file=sys.stderr)
        raise
    finally:
        cluster.stop()


def template_pod(cluster: Any, memory: str = "64Gi") -> dict[str, Any]:
    """One TP=1 model pod of 16 CPUs through our webhook, as the apiserver then holds it: the production shape the
    measured pods are copied from (`clones`), so every arm gets the very same pods."""
    from tests.e2e.fleet import model_pod as user_model_pod

    cluster.create_pods([user_model_pod("template", TEMPLATE_NS, tp=1, cpu="16", memory=memory)])
    template: dict[str, Any] = cluster.pods(TEMPLATE_NS)[0]
    return template


def delete_pods(cluster: Any, namespace: str) -> None:
    """Every pod of `namespace` gone. Forced: with no kubelet, a graceful delete of a bound pod never completes."""
    from tests.e2e.cluster import wait_until

    cluster.api.call("DELETE", f"/api/v1/namespaces/{namespace}/pods?gracePeriodSeconds=0")
    wait_until(f"the pods of {namespace} gone", lambda: not cluster.pods(namespace), timeout=120)


def our_metric(cluster: Any, name: str, label: str) -> dict[str, float]:
    """A metric of our extender's /metrics, summed by one label's value."""
    _, body = cluster.get_ours("extender", "/metrics")
    return metric(body.decode(), name, label)


class Binds:
    """When each pod of a namespace was first seen bound, from one watch (polling the pod list instead cost the
    apiserver ~15 ms a list of 300 pods, 2 ms per placed pod, and more the longer a run took: it taxed the slower
    run most)."""

    def __init__(self, cluster: Any, namespace: str) -> None:
        self.times: dict[str, float] = {}
        self._resp = cluster.api.http.request(
            "GET", f"{cluster.server}/api/v1/namespaces/{namespace}/pods?watch=1&fieldSelector=spec.nodeName%21%3D",
            headers={**cluster.api.auth, "Accept": "application/json"}, preload_content=False, timeout=None)
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        buffer = b""
        with suppress(Exception):  # the stream ends when `close` shuts it
            for chunk in self._resp.stream(65536):
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    event = json.loads(line)
                    name = event["object"]["metadata"]["name"]
                    if event["type"] in ("ADDED", "MODIFIED") and name not in self.times:
                        self.times[name] = time.monotonic()

    def close(self) -> None:
        self._resp.shutdown()
        self._resp.release_conn()
