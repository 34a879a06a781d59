"""Placement-quality simulation: stock kube-scheduler against the extender, same fleet, same stream.

    python bench/simulate.py [--nodes 1000] [--events 20000] [--seed 7] [--load 1.0] [--replay 20] [--json]
                             [--exact]

A fleet of mixed Xeon nodes is generated as real Kubernetes objects (Nodes with NFD labels and the
`config.nri/group` label of their shape, one generated BalloonsPolicy per shape, `group.<shape>`, as
`model-placement balloons-policy` renders it, a kube-proxy and a node-exporter pod per node) and fed into the real
`ClusterState`. A stream of model deploys and undeploys (bare pods with the model label and vLLM args) is
played twice, each run on its own `ClusterState` built from the same objects; every deploy goes through the real
`mutate_pod`, which makes `cpu: N` a request of N x SMT width (`nri_cpu_request: cores`), and that request is what
kube-scheduler counts:

1. **stock** — the webhook's *mutation* only (balloon annotation, CPU request, AMX required node affinity:
   kube-scheduler's NodeAffinity filter honours it), no pre-flight, no extender. kube-scheduler as shipped:
   NodeResourcesFit counts CPU requests at face value against `status.allocatable.cpu`, scores LeastAllocated,
   and stops filtering after `percentageOfNodesToScore` (adaptive default: 420 feasible nodes of 1,000, scanned
   round-robin from where the previous cycle stopped). After the bind the ledger predicts what the node does
   (`fit` on the node's ledger); where it predicts no NUMA-local balloon the pod is counted failing: bound, its
   cores not held, its CPU request still counted by kube-scheduler until it is deleted, retried by kubelet
   when a pod leaves its node.
2. **extender** — the webhook's `mutate_pod` + `preflight` (enforce): a refused pod is never created ("refused up
   front"; a bare pod is not re-created, so the refusal is final for that deploy). An admitted pod goes to the
   secondary scheduler as `manifests/base/config/kube-scheduler.yaml` configures it: percentageOfNodesToScore 100,
   in-tree NodeAffinity + NodeResourcesFit filters, the extender's filter (`cluster.fit`) on what passes, the
   extender's score (MostAllocated, 0..10, weight 15 → ×150) plus NodeResourcesFit LeastAllocated (0..100, weight
   1, so it only breaks the extender's ties), bind = `cluster.assume`, then the watch's MODIFIED event confirms it.

Both runs: undeploys are `apply("Pod", "DELETED")`; a pod no node fits stays **pending** and is retried when a
pod on some node goes away (only that node can have become feasible, so it is tried there, FIFO: exactly what a
full retry would find); ties between equal best nodes are broken by a hash of (pod uid, node name), a stand-in
for kube-scheduler's random `selectHost` that is the same in both runs and in `--exact` mode. Memory, pod
count limits and the other default score plugins are not modelled.

**The plugin's word.** The ledger's figures are our model of the plugin. Each run records, per node, every
create and remove its kubelet saw; after the stream a seeded sample of nodes (`--replay`, 20 by default, the same
nodes in both runs) is replayed through the real NRI balloons plugin (`tests/oracle`: nri-plugins' balloons policy
on a synthetic sysfs of the node's shape, with the node's group policy): failing containers are retried after
each removal, and the plugin's cpusets are checked after every step. Its counts (failed, on more NUMA nodes than
ranks, sharing a core with another balloon, and where the ledger's per-NUMA cores differ from the balloon's at
the end) are the node-side failures. A peer start costs ~3 s, so the sample stays small.

Speed: `fit` costs ~10-25 µs per node, so asking it of every node for every deploy (and again for the
pre-flight) is millions of calls. The extender run instead keeps, per node, its free cores per NUMA node sorted
(refreshed from `ledger.free()` after every change on that node), and per class of node (policy, capacity, SMT
width) what a demand's balloon costs when empty (`placement.nri.plan_empty`): TP ranks of request / TP / the
node's SMT width cores. A node can only fit if its t-th emptiest NUMA node has a rank's cores, and when it fits
its MostAllocated score follows from its free total and the balloon's cores; but balance-balloons picks the NUMA
node or block by how many balloons it holds, not by room, so a candidate may still be refused. The candidates
are therefore ranked from the index and the real `cluster.fit` asked of them best first until one fits (its
score is checked against the prediction). The pre-flight runs on a short list of eligible nodes: a node where
`fit` says yes, when a candidate does; else the nodes that could hold the pod when empty (up to 8: their
refusals are the only resolvable ones); else one node per class (first by name): its verdict and check id are
those over every eligible node; only the node counts in its message differ. The kube-scheduler arithmetic
(node-level requests, LeastAllocated) is plain list arithmetic over all nodes in both runs. `--exact` turns all
of this off (every eligible node, real `preflight`, real `fit`), and `tests/test_simulation.py` checks both modes
give identical figures, the per-node histories included.

Other choices: allocatable = capacity - 2 CPUs (system + kube reserved); the generated policies reserve the
`standard` profile's 12 CPUs rounded up to whole cores on every NUMA node, which kube-scheduler knows nothing
about. Every deploy is its own model (unique `model-manager.io/model`), so the pre-flight's "a replacement may
have the cores of its model's pod being deleted" never applies. When a pod leaves a node, the scheduler's retry of
pending pods comes first (it reacts to the delete event), then kubelet's retry of failing pods there. The stream steers the number of live
deploys towards `--load` × the fleet's model cores / the mean deploy (in the user's cores). "Stranded" and the
other figures are defined in the printed output (`DEFINITIONS`).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # `python bench/simulate.py` from a checkout
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from placement import nri
from placement.balloons import node_balloons_policy, whole_core_reserved
from placement.cluster import ClusterState
from placement.config import Settings
from placement.demand import ModelDemand, read_model_pod
from placement.fit import Fit
from placement.ledger import PLACEMENT, NodeLedger, Placed
from placement.mutation import balloon_request, mutate_pod
from placement.preflight import preflight
from placement.quantity import cpu_milli
from placement.topology import GROUP_LABEL, Topology, linux_layout

AMX_LABEL = "feature.node.kubernetes.io/cpu-security.amx.enabled"
SMT_LABEL = "feature.node.kubernetes.io/cpu-hardware_multithreading"
NUMA_LABEL = "feature.node.kubernetes.io/memory-numa.node_count"
MODEL_LABEL = "model-manager.io/model"
REQUIRE_AMX = "model-manager.io/require-amx"
KUBELET_RESERVED_MILLI = 2000  # systemReserved cpu 1 + kubeReserved cpu 1: allocatable = capacity - 2
POLICY_NAMESPACE = "kube-system"
EPOCH = 1_780_000_000  # creationTimestamp of event k is EPOCH + k seconds

# Fleet mix: (NUMA nodes, weight, cores per NUMA node choices). 2 NUMA: two sockets, SNC off (24-60 cores a
# socket); 4 NUMA: SNC-2; 8 NUMA: SNC-4 on two big sockets.
SHAPES = ((2, 0.50, (24, 32, 40, 48, 56, 60)), (4, 0.33, (16, 20, 24, 28, 30)), (8, 0.17, (16, 20, 24)))
SMT_ON = 0.75
NO_AMX = 0.25  # of the nodes small enough to be Ice Lake (≤ 40 cores a NUMA node, 2 or 4 NUMA nodes)

# Stream mix: TP weights (small first) and the CPUs asked per TP. A TP=1 pod asking 64 CPUs fits no NUMA node
# of this fleet (the largest holds 57 model cores): the webhook refuses it, kube-scheduler binds it.
TP_WEIGHTS = ((1, 0.50), (2, 0.27), (4, 0.15), (8, 0.08))
CPU_CHOICES = {
    1: (4, 8, 8, 12, 16, 16, 24, 32, 48, 64),
    2: (8, 16, 16, 24, 32, 48, 64),
    4: (16, 32, 48, 64),
    8: (32, 48, 64),
}
AMX_OPT_OUT = 0.20  # pods annotated model-manager.io/require-amx: "false"
MODELS = (
    (8, ("phi-3-mini", "qwen2.5-3b", "granite-3.1-2b")),
    (24, ("llama-3.1-8b", "mistral-7b", "granite-3.1-8b", "qwen2.5-7b")),
    (48, ("qwen2.5-14b", "mixtral-8x7b", "qwen2.5-32b")),
    (10**9, ("llama-3.1-70b", "qwen2.5-72b")),
)
NAMESPACES = ("team-a", "team-b", "team-c", "research")
TP_FORMS = ("--tensor-parallel-size {}", "--tensor-parallel-size={}", "-tp {}")


# --------------------------------------------------------------------------------------------------
# Fleet and stream


@dataclass(frozen=True, slots=True)
class NodeSpec:
    name: str
    numa: int
    cores_per_numa: int
    smt: bool
    amx: bool

    @property
    def tpc(self) -> int:
        return 2 if self.smt else 1

    @property
    def cpus(self) -> int:
        return self.numa * self.cores_per_numa * self.tpc

    @property
    def group(self) -> str:
        """Nodes of one shape share one generated BalloonsPolicy, `group.<group>` (a policy must match the
        node's NUMA count and CPU numbering)."""
        return f"n{self.numa}-c{self.cores_per_numa}-smt{self.tpc}"

    @property
    def topology(self) -> Topology:
        """As the ledger reads it from the NUMA-count label, capacity and SMT label."""
        return linux_layout([self.cores_per_numa] * self.numa, self.tpc, "labels")


@dataclass(frozen=True, slots=True)
class Deploy:
    seq: int
    uid: str
    name: str
    namespace: str
    model: str
    tp: int
    cpus: int
    require_amx: bool
    tp_form: int

    @property
    def per_numa(self) -> int:
        """The user's cpu: N over its ranks: the cores each rank asks for (`nri_cpu_request: cores`). What a
        rank really costs on a node is that node's business (`Run.need`): the webhook's request over the
        ranks, over the node's SMT width."""
        return -(-self.cpus // self.tp)


def make_fleet(count: int, rng: random.Random) -> list[NodeSpec]:
    fleet = []
    width = len(str(count))
    for k in range(count):
        numa, cores = _shape(rng)
        smt = rng.random() < SMT_ON
        amx = not (numa <= 4 and cores <= 40 and rng.random() < NO_AMX)
        fleet.append(NodeSpec(f"xeon-{k:0{width}d}", numa, cores, smt, amx))
    return fleet


def _shape(rng: random.Random) -> tuple[int, int]:
    r = rng.random()
    for numa, weight, cores in SHAPES:
        if r < weight:
            return numa, rng.choice(cores)
        r -= weight
    numa, _, cores = SHAPES[-1]
    return numa, rng.choice(cores)


def node_object(spec: NodeSpec) -> dict[str, Any]:
    labels = {
        "kubernetes.io/hostname": spec.name,
        "kubernetes.io/os": "linux",
        "node-role.kubernetes.io/cpu-inference": "",
        GROUP_LABEL: spec.group,
        SMT_LABEL: "true" if spec.smt else "false",
        NUMA_LABEL: str(spec.numa),
        "feature.node.kubernetes.io/memory-numa": "true",
    }
    if spec.amx:
        labels[AMX_LABEL] = "true"
        labels["feature.node.kubernetes.io/cpu-cpuid.AMXTILE"] = "true"
    if spec.numa > 2:
        labels["feature.node.kubernetes.io/cpu-topology.snc"] = str(spec.numa // 2)
    memory = f"{spec.numa * 256}Gi"
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": spec.name, "labels": labels},
        "spec": {},
        "status": {
            "capacity": {"cpu": str(spec.cpus), "memory": memory, "pods": "110"},
            "allocatable": {"cpu": f"{spec.cpus * 1000 - KUBELET_RESERVED_MILLI}m", "memory": memory, "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def daemon_pods(spec: NodeSpec) -> list[dict[str, Any]]:
    out = []
    for ns, app, cpu in (("kube-system", "kube-proxy", "100m"), ("monitoring", "node-exporter", "250m")):
        out.append({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"{app}-{spec.name}", "namespace": ns, "uid": f"ds-{app}-{spec.name}",
                         "labels": {"app": app}, "creationTimestamp": _stamp(-1)},
            "spec": {"nodeName": spec.name, "containers": [{
                "name": app, "image": f"registry.k8s.io/{app}:v1",
                "resources": {"requests": {"cpu": cpu, "memory": "128Mi"},
                              "limits": {"cpu": cpu, "memory": "128Mi"}}}]},
            "status": {"phase": "Running"},
        })
    return out


def group_policies(fleet: Sequence[NodeSpec], settings: Settings) -> list[dict[str, Any]]:
    """One generated BalloonsPolicy per node shape (`model-placement balloons-policy`'s, named `group.<g>`),
    each reporting Success for its nodes."""
    groups: dict[str, list[NodeSpec]] = {}
    for n in fleet:
        groups.setdefault(n.group, []).append(n)
    out = []
    for group, nodes in sorted(groups.items()):
        policy = node_balloons_policy(nodes[0].name, nodes[0].topology, settings, POLICY_NAMESPACE)
        policy["metadata"]["name"] = f"group.{group}"
        policy["status"] = {"nodes": {n.name: {"status": "Success", "generation": 1} for n in nodes}}
        out.append(policy)
    return out


def fleet_objects(fleet: Sequence[NodeSpec], settings: Settings) -> list[dict[str, Any]]:
    objects: list[dict[str, Any]] = [node_object(n) for n in fleet]
    for n in fleet:
        objects.extend(daemon_pods(n))
    objects.extend(group_policies(fleet, settings))
    return objects


def _stamp(seq: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(EPOCH + seq))


def mean_cores() -> float:
    return sum(w * sum(-(-c // tp) * tp for c in CPU_CHOICES[tp]) / len(CPU_CHOICES[tp]) for tp, w in TP_WEIGHTS)


def approx_model_cores(fleet: Sequence[NodeSpec], settings: Settings) -> int:
    """For the stream's target only: cores minus the generated policies' reserved cores."""
    profile = settings.nri_deployment_profile
    return sum(n.numa * n.cores_per_numa - len(whole_core_reserved(n.topology, profile)) // n.tpc for n in fleet)


def make_stream(fleet: Sequence[NodeSpec], events: int, rng: random.Random, load: float,
                settings: Settings) -> list[tuple[str, Any]]:
    """Deploys and undeploys. The number of live deploys is steered towards `load` × the fleet's model cores /
    the mean deploy: deploy-only while filling, then about half and half; an undeploy takes a live deploy at
    random (whether or not it ever got placed)."""
    target = max(1, round(load * approx_model_cores(fleet, settings) / mean_cores()))
    tps = [tp for tp, _ in TP_WEIGHTS]
    weights = [w for _, w in TP_WEIGHTS]
    live: list[str] = []
    out: list[tuple[str, Any]] = []
    width = len(str(events))
    for seq in range(events):
        p_deploy = 1.0 if not live else min(1.0, max(0.05, 0.5 + 2.0 * (target - len(live)) / target))
        if rng.random() < p_deploy:
            tp = rng.choices(tps, weights)[0]
            cpus = rng.choice(CPU_CHOICES[tp])
            model = rng.choice(next(names for limit, names in MODELS if cpus <= limit))
            uid = f"sim-{seq:0{width}d}"
            d = Deploy(seq, uid, f"{model}-{seq:0{width}d}", rng.choice(NAMESPACES), model, tp, cpus,
                       rng.random() >= AMX_OPT_OUT, rng.randrange(len(TP_FORMS)))
            out.append(("deploy", d))
            live.append(uid)
        else:
            k = rng.randrange(len(live))
            live[k], live[-1] = live[-1], live[k]
            out.append(("undeploy", live.pop()))
    return out


def pod_object(d: Deploy) -> dict[str, Any]:
    """A bare model pod as a user (or a thin operator) creates it: model label, vLLM args, CPU request."""
    annotations = {} if d.require_amx else {REQUIRE_AMX: "false"}
    memory = f"{max(16, d.cpus * 4)}Gi"
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": d.name, "namespace": d.namespace, "uid": d.uid,
                     # Unique per deploy: a replacement's own-model rule never applies.
                     "labels": {MODEL_LABEL: d.name, "app.kubernetes.io/name": d.model},
                     "annotations": annotations, "creationTimestamp": _stamp(d.seq)},
        "spec": {"containers": [{
            "name": "main", "image": "public.ecr.aws/q9t5s3a7/vllm-cpu-release-repo:v0.9.2",
            "command": ["vllm", "serve"],
            "args": [f"/models/{d.model}", *TP_FORMS[d.tp_form].format(d.tp).split(), "--dtype", "bfloat16"],
            "resources": {"requests": {"cpu": str(d.cpus), "memory": memory},
                          "limits": {"cpu": str(d.cpus), "memory": memory}}}]},
        "status": {"phase": "Pending"},
    }


def bound(pod: Mapping[str, Any], node: str) -> dict[str, Any]:
    out = dict(pod)
    out["spec"] = {**pod["spec"], "nodeName": node}
    out["status"] = {"phase": "Running"}
    return out


# --------------------------------------------------------------------------------------------------
# kube-scheduler arithmetic


def num_feasible_nodes_to_find(nodes: int, percentage: int = 0) -> int:
    """kube-scheduler's numFeasibleNodesToFind (pkg/scheduler/schedule_one.go), minFeasibleNodesToFind 100."""
    if nodes < 100 or percentage >= 100:
        return nodes
    if percentage <= 0:
        percentage = max(5, 50 - nodes // 125)
    return max(100, nodes * percentage // 100)


def least_allocated(alloc: int, requested: int) -> int:
    """NodeResourcesFit LeastAllocated for CPU: (allocatable - requested) * 100 / allocatable, integer."""
    return 0 if alloc <= 0 or requested > alloc else (alloc - requested) * 100 // alloc


def tiebreak(uid: str, node: str) -> int:
    return zlib.crc32(f"{uid}|{node}".encode())


# --------------------------------------------------------------------------------------------------
# Runs

# Per node shape class, what a demand's balloon costs there: (cores of its smallest rank, cores in all), or
# None where no node of the class can ever hold it.
Need = tuple[tuple[int, int] | None, ...]


class _View:
    """What `mutate_pod` / `preflight` ask of a cluster, with `eligible` answered by the run (cached per
    affinity, or a short list); everything else is the real ClusterState."""

    def __init__(self, cluster: ClusterState, eligible: Any) -> None:
        self._cluster = cluster
        self.settings = cluster.settings
        self.eligible = eligible

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cluster, name)


@dataclass
class Counters:
    deploys: int = 0
    undeploys: int = 0
    bound: int = 0  # bound to a node by the scheduler
    started: int = 0  # the ledger placed the balloon at bind time
    node_failures: int = 0  # bound where the ledger (our own fit) says the plugin fails it
    failure_checks: dict[str, int] = field(default_factory=dict)
    recovered: int = 0  # failing pods that started later (kubelet retry after cores freed on their node)
    refused: int = 0
    refused_checks: dict[str, int] = field(default_factory=dict)
    ever_pending: int = 0
    placed_after_pending: int = 0
    samples: list[dict[str, int]] = field(default_factory=list)


class Run:
    kind = ""

    def __init__(self, objects: Sequence[Mapping[str, Any]], settings: Settings, exact: bool = False) -> None:
        self.exact = exact
        self.cluster = ClusterState.from_objects(objects, settings)
        c = self.cluster
        self.names = sorted(c.nodes)
        self.pos = {n: i for i, n in enumerate(self.names)}
        self.ledgers: list[NodeLedger] = [c.ledger(n) for n in self.names]  # type: ignore[misc]
        n = len(self.names)
        self.numa = [len(led.capacity) for led in self.ledgers]
        self.total = [sum(led.capacity) for led in self.ledgers]
        self.alloc = [cpu_milli(obj["status"]["allocatable"]["cpu"]) for obj in sorted(
            (o for o in objects if o.get("kind") == "Node"), key=lambda o: o["metadata"]["name"])]
        self.req = [0] * n  # node-level CPU requests kube-scheduler counts, millicores
        for rec in c.pods.values():
            if rec.active:
                self.req[self.pos[rec.node]] += rec.shared_milli  # type: ignore[index]
        self.free: list[tuple[int, ...]] = [()] * n
        # kth[t][i]: free cores of node i's t-th emptiest NUMA node (-1 when it has fewer than t).
        self.kth: dict[int, list[int]] = {t: [-1] * n for t in (1, 2, 4, 8)}
        self.sumfree = [0] * n
        # Bytes of NUMA memory that enter fit's score (the policy pins memory and the node's is known), else 0.
        self.memtotal = [led.memory_total if led.nri.policy is not None and led.nri.policy.pin_memory else 0
                         for led in self.ledgers]
        self.sumfreemem = [0] * n
        for i in range(n):
            self.refresh(i)
        # Nodes that look the same to `fit` when empty (one policy, capacity, SMT width) form a class: what a
        # balloon costs is a question per class, not per node.
        classes: dict[tuple[int, tuple[int, ...], int, bool], int] = {}
        self.cls = [classes.setdefault((id(led.nri.policy), led.capacity, led.threads_per_core, led.nri.running),
                                       len(classes)) for led in self.ledgers]
        self.reps = [self.ledgers[self.cls.index(k)] for k in range(len(classes))]
        self._needs: dict[tuple[str, str, int, int], Need | None] = {}
        self.strategy = settings.scoring_strategy
        self._eligible: dict[str, tuple[list[int], list[bool], list[NodeLedger]]] = {}
        self.full_view = _View(c, self.eligible_ledgers)
        # uid -> state: running | failing | pending | refused
        self.state: dict[str, str] = {}
        self.node_of: dict[str, int] = {}
        self.pod_of: dict[str, dict[str, Any]] = {}  # created pods (after the webhook)
        self.spec_of: dict[str, Mapping[str, Any]] = {}  # every deploy's spec after the mutation
        self.demand_of: dict[str, ModelDemand] = {}
        self.deploy_of: dict[str, Deploy] = {}
        self.request_of: dict[str, int] = {}  # the CPU request as the webhook leaves it, millicores
        self.pending: dict[str, None] = {}
        self.failing_on: dict[int, dict[str, None]] = {}
        self.placeable: dict[str, bool] = {}  # uid -> some eligible node could hold it when empty
        self._placeable: dict[tuple[int, int], bool] = {}
        # What each node's kubelet asked its runtime: ("create", uid, the ledger's verdict) at bind, ("remove",
        # uid, False) when a bound pod goes; the plugin replay plays exactly this.
        self.history: dict[int, list[tuple[str, str, bool]]] = {}
        self.frag_cpus = 0  # a fixed per-rank need in CPUs for the fragmentation figure (set by run_simulation)
        self.counters = Counters()
        self.seconds = 0.0

    # -- index -------------------------------------------------------------------------------------

    def refresh(self, i: int) -> None:
        f = self.ledgers[i].free()
        self.free[i] = f
        desc = sorted(f, reverse=True)
        for t, kth in self.kth.items():
            kth[i] = desc[t - 1] if t <= len(desc) else -1
        self.sumfree[i] = sum(f)
        if self.memtotal[i]:
            self.sumfreemem[i] = sum(self.ledgers[i].free_memory())

    def need(self, demand: ModelDemand) -> Need | None:
        """Per class, the balloon's rank and total cores as `placement.nri` plans it on an empty node of the
        class: a rank costs its share of the request over that node's SMT width. `fit` says yes only where
        the t-th emptiest NUMA node has the smallest rank's cores (necessary, not sufficient: balance-balloons
        picks a NUMA node or block by balloon count, not by room), and then the score follows from the
        node's free total and these cores. None: no shortcut (not nri-balloons, or maxBalloons), ask `fit`."""
        key = (demand.policy, demand.balloon_type, demand.cpu_milli, demand.numa_nodes)
        if key in self._needs:
            return self._needs[key]
        out: list[tuple[int, int] | None] | None = []
        for led in self.reps if demand.policy == "nri-balloons" else ():
            policy = led.nri.policy
            btype = policy.balloon_type(demand.balloon_type) if policy is not None and led.nri.running else None
            if btype is not None and btype.max_balloons:
                out = None
                break
            plan = None if btype is None or demand.numa_nodes > len(led.capacity) or not demand.cpu_milli \
                else nri.plan_empty(policy, btype, demand.cpu_milli, led.capacity, led.threads_per_core)  # type: ignore[arg-type]
            if isinstance(plan, nri.Plan) and len(plan.per_numa) == demand.numa_nodes:
                out.append((min(c for _, c in plan.per_numa), sum(c for _, c in plan.per_numa)))
            else:
                out.append(None)
        need = tuple(out) if out is not None and demand.policy == "nri-balloons" else None
        self._needs[key] = need
        return need

    def candidates(self, idx: Sequence[int], demand: ModelDemand, need: Need) -> list[int]:
        """Nodes where the balloon may fit now (every node `fit` accepts is one)."""
        kth, cls = self.kth[demand.numa_nodes], self.cls
        return [i for i in idx if need[cls[i]] is not None and kth[i] >= need[cls[i]][0]]  # type: ignore[index]

    def eligible_entry(self, spec: Mapping[str, Any]) -> tuple[list[int], list[bool], list[NodeLedger]]:
        """The real `cluster.eligible`, cached per nodeSelector/affinity: node labels do not change here."""
        key = repr((spec.get("nodeSelector"), spec.get("affinity"), spec.get("nodeName")))
        entry = self._eligible.get(key)
        if entry is None:
            ledgers = self.cluster.eligible(spec)
            idx = [self.pos[led.name] for led in ledgers]
            mask = [False] * len(self.names)
            for i in idx:
                mask[i] = True
            entry = (idx, mask, ledgers)
            self._eligible[key] = entry
        return entry

    def eligible_ledgers(self, spec: Mapping[str, Any]) -> list[NodeLedger]:
        return self.eligible_entry(spec)[2]

    def could_ever_fit(self, uid: str) -> bool:
        """Some node the (mutated) pod may use could hold its balloon when empty (not nri-balloons: taken as
        yes)."""
        idx, mask, _ = self.eligible_entry(self.spec_of[uid])
        need = self.need(self.demand_of[uid])
        if need is None:
            return True
        key = (id(mask), id(need))
        if key not in self._placeable:
            self._placeable[key] = any(need[self.cls[i]] is not None for i in idx)
        return self._placeable[key]

    def rank_cores(self, uid: str, i: int) -> int | None:
        """The cores each rank of the pod's balloon takes on node i (None: unknown, or it cannot be there)."""
        need = self.need(self.demand_of[uid])
        got = need[self.cls[i]] if need is not None else None
        return got[0] if got is not None else None

    def mutate(self, d: Deploy, cluster: Any) -> Any:
        """The webhook's mutation of the deploy's pod, remembered with what the scheduler then reads."""
        mutation = mutate_pod(pod_object(d), cluster)
        self.spec_of[d.uid] = mutation.pod["spec"]
        self.demand_of[d.uid] = read_model_pod(mutation.pod, self.cluster.settings)  # what /filter reads
        self.request_of[d.uid] = self.demand_of[d.uid].cpu_milli
        return mutation

    # -- the stream --------------------------------------------------------------------------------

    def play(self, stream: Sequence[tuple[str, Any]], sample_every: int) -> None:
        t0 = time.perf_counter()
        for k, (verb, item) in enumerate(stream, 1):
            if verb == "deploy":
                self.counters.deploys += 1
                self.deploy_of[item.uid] = item
                self.deploy(item)
                self.placeable[item.uid] = self.could_ever_fit(item.uid)
            else:
                self.counters.undeploys += 1
                self.undeploy(item)
            if k % sample_every == 0 or k == len(stream):
                self.counters.samples.append(self.sample(k))
        self.seconds = time.perf_counter() - t0

    def deploy(self, d: Deploy) -> None:
        raise NotImplementedError

    def undeploy(self, uid: str) -> None:
        state = self.state.pop(uid, None)
        if state is None or state == "refused":
            return
        if state == "pending":
            del self.pending[uid]
            self.forget_pending(uid)
            return
        i = self.node_of.pop(uid)
        self.req[i] -= self.request_of[uid]
        self.history[i].append(("remove", uid, False))
        if state == "running":
            self.cluster.apply("Pod", "DELETED", self.pod_of[uid])
            self.refresh(i)
        else:  # failing: never held cores
            del self.failing_on[i][uid]
        self.node_freed(i)

    def bound_to(self, uid: str, i: int, predicted: bool) -> None:
        """kube-scheduler bound the pod to node i: it counts its request there and the kubelet creates it."""
        self.counters.bound += 1
        self.node_of[uid] = i
        self.req[i] += self.request_of[uid]
        self.history.setdefault(i, []).append(("create", uid, predicted))

    def forget_pending(self, uid: str) -> None:
        pass

    def node_freed(self, i: int) -> None:
        """A pod left node i: retry the pending pods there (FIFO, the scheduling queue's order)."""
        for uid in list(self.pending):
            if self.retry_on(uid, i):
                del self.pending[uid]
                self.counters.placed_after_pending += 1

    def retry_on(self, uid: str, i: int) -> bool:
        raise NotImplementedError

    def go_pending(self, uid: str) -> None:
        self.state[uid] = "pending"
        self.pending[uid] = None
        self.counters.ever_pending += 1

    def start(self, uid: str, i: int) -> None:
        """The pod runs on node i: the watch shows it bound (the ledger places its balloon)."""
        self.cluster.apply("Pod", "MODIFIED", bound(self.pod_of[uid], self.names[i]))
        self.refresh(i)
        self.state[uid] = "running"

    # -- measuring ---------------------------------------------------------------------------------

    def waiting(self) -> list[str]:
        """Live deploys that hold no cores: pending, failing on their node, refused up front."""
        return [u for u, s in self.state.items() if s != "running"]

    def sample(self, k: int) -> dict[str, int]:
        waiting = self.waiting()
        # Per class: the smallest rank (in that class's cores) among the waiting pods some node could hold.
        threshold = [0] * len(self.reps)
        for u in waiting:
            need = self.need(self.demand_of[u]) if self.placeable[u] else None
            for c, got in enumerate(need or ()):
                if got is not None and (threshold[c] == 0 or got[0] < threshold[c]):
                    threshold[c] = got[0]
        frag = [-(-self.frag_cpus // led.threads_per_core) for led in self.reps]
        cls = self.cls
        stranded = sum(f for i, fr in enumerate(self.free) for f in fr if f < threshold[cls[i]])
        fragmented = sum(f for i, fr in enumerate(self.free) for f in fr if f < frag[cls[i]])
        free = sum(self.sumfree)
        capacity = sum(self.total)
        shown = [t for t in threshold if t]
        return {"event": k, "running": sum(1 for s in self.state.values() if s == "running"),
                "waiting": len(waiting), "threshold_min": min(shown, default=0),
                "threshold_max": max(shown, default=0), "stranded": stranded, "fragmented": fragmented,
                "free": free, "held": capacity - free}

    def audit(self, fleet: Sequence[NodeSpec]) -> dict[str, int]:
        """Independent of the ledger's own bookkeeping: recount every NUMA node's holdings against capacity
        computed from the topology and the reserved cpuset, check each balloon's shape (TP distinct NUMA
        nodes, each rank the cores the node's SMT width makes of the request), AMX, and that the ledger
        holds exactly the pods this run believes are running."""
        by_name = {n.name: n for n in fleet}
        over = shape_errors = amx = mismatched = topology = stale = shortfall = 0
        running_on: dict[int, set[str]] = {}
        for uid, s in self.state.items():
            if s == "running":
                running_on.setdefault(self.node_of[uid], set()).add(uid)
        for i, name in enumerate(self.names):
            led = self.cluster.ledger(name)
            assert led is not None
            if led is not self.ledgers[i] or led.free() != self.free[i]:
                stale += 1
            spec = by_name[name]
            topo = led.topology
            if (topo.numa_count, topo.threads_per_core) != (spec.numa, spec.tpc) or \
                    any(len(numa.cores) != spec.cores_per_numa for numa in topo.numa_nodes):
                topology += 1
            reserved = set(led.reserved.cpus)
            capacity = [sum(1 for core in numa.cores if not reserved.intersection(core.threads))
                        for numa in topo.numa_nodes]
            held = [0] * topo.numa_count
            for uid, h in led.holdings.items():
                d = self.deploy_of.get(uid)
                shortfall += h.shortfall > 0
                numas = [n for n, _ in h.per_numa]
                rank = -(-self.request_of.get(uid, 0) // (1000 * d.tp * spec.tpc)) if d is not None else 0
                if d is None or len(set(numas)) != d.tp or any(c != rank for _, c in h.per_numa):
                    shape_errors += 1
                if d is not None and d.require_amx and spec.amx is False:
                    amx += 1
                for n, c in h.per_numa:
                    held[n] += c
            over += sum(1 for h, cap in zip(held, capacity) if h > cap)
            if set(led.holdings) != running_on.get(i, set()):
                mismatched += 1
        return {"numa_overcommitted": over, "balloon_shape_errors": shape_errors, "amx_violations": amx,
                "ledger_pod_mismatch": mismatched, "topology_mismatch": topology, "index_stale": stale,
                "shortfall_holdings": shortfall}

    def figures(self, fleet: Sequence[NodeSpec]) -> dict[str, Any]:
        c = self.counters
        end = c.samples[-1] if c.samples else self.sample(0)
        mid = [s for s in c.samples if s["event"] >= c.samples[-1]["event"] // 2] if c.samples else []
        capacity = sum(self.total)

        def mean(key: str) -> float:
            return round(sum(s[key] for s in mid) / len(mid), 1) if mid else 0.0

        states = list(self.state.values())
        return {
            "deploys": c.deploys, "undeploys": c.undeploys,
            "bound": c.bound, "started_at_bind": c.started,
            "node_failures": c.node_failures, "node_failure_checks": dict(sorted(c.failure_checks.items())),
            "started_after_retry": c.recovered, "failing_at_end": states.count("failing"),
            "refused": c.refused, "refused_checks": dict(sorted(c.refused_checks.items())),
            "ever_pending": c.ever_pending, "placed_after_pending": c.placed_after_pending,
            "pending_at_end": states.count("pending"),
            "pods_placed": c.started + c.recovered,
            "running_at_end": end["running"], "waiting_at_end": end["waiting"],
            "capacity_cores": capacity, "held_at_end": end["held"], "free_at_end": end["free"],
            "stranded_at_end": end["stranded"],
            "stranded_threshold_at_end": [end["threshold_min"], end["threshold_max"]],
            "mean_held_2nd_half": mean("held"), "mean_stranded_2nd_half": mean("stranded"),
            "fragmented_at_end": end["fragmented"], "mean_fragmented_2nd_half": mean("fragmented"),
            "fragmented_threshold_cpus": self.frag_cpus,
            "mean_running_2nd_half": mean("running"),
            "samples": len(c.samples),
            "audit": self.audit(fleet),
            "history_crc": zlib.crc32(repr(sorted(self.history.items())).encode()),
            "seconds": round(self.seconds, 2),
        }


class StockRun(Run):
    """kube-scheduler as shipped, with the webhook's mutation (balloon annotation, CPU request, AMX affinity)
    only."""

    kind = "stock"

    def __init__(self, objects: Sequence[Mapping[str, Any]], settings: Settings, percentage: int = 0,
                 exact: bool = False) -> None:
        super().__init__(objects, settings, exact)
        self.to_find = num_feasible_nodes_to_find(len(self.names), percentage)
        self.next_start = 0
        self.order = list(range(len(self.names)))

    def deploy(self, d: Deploy) -> None:
        mutation = self.mutate(d, self.full_view)
        self.pod_of[d.uid] = mutation.pod
        _, eligible, _ = self.eligible_entry(mutation.pod["spec"])
        node = self.schedule(d.uid, eligible)
        if node is None:
            self.go_pending(d.uid)
        else:
            self.bind(d.uid, node)

    def schedule(self, uid: str, eligible: list[bool]) -> int | None:
        """Filter round-robin from where the last cycle stopped until `to_find` feasible nodes are found, score
        LeastAllocated, best wins (ties: hash)."""
        n = len(self.names)
        r = self.request_of[uid]
        alloc, req = self.alloc, self.req
        start = self.next_start
        rotated = self.order[start:] + self.order[:start]
        feasible = [i for i in rotated if eligible[i] and alloc[i] - req[i] >= r]
        if len(feasible) > self.to_find:
            feasible = feasible[: self.to_find]
            processed = (feasible[-1] - start) % n + 1  # the scan stops at the to_find-th feasible node
        else:
            processed = n
        self.next_start = (start + processed) % n
        if not feasible:
            return None
        scored = [((alloc[i] - req[i] - r) * 100 // alloc[i], i) for i in feasible]  # least_allocated
        best = max(scored)[0]
        return min((i for score, i in scored if score == best), key=lambda i: tiebreak(uid, self.names[i]))

    def bind(self, uid: str, i: int) -> None:
        """Bound: kube-scheduler counts the request on the node; the ledger predicts whether the plugin can
        carve the balloon (the replay asks the plugin itself)."""
        result = self.cluster.fit(self.demand_of[uid], self.ledgers[i])
        self.bound_to(uid, i, result.ok)
        if result.ok:
            self.counters.started += 1
            self.start_where(uid, i, result)
        else:
            self.counters.node_failures += 1
            self.counters.failure_checks[result.check] = self.counters.failure_checks.get(result.check, 0) + 1
            self.state[uid] = "failing"
            self.failing_on.setdefault(i, {})[uid] = None

    def retry_on(self, uid: str, i: int) -> bool:
        _, eligible, _ = self.eligible_entry(self.spec_of[uid])
        if not eligible[i] or self.alloc[i] - self.req[i] < self.request_of[uid]:
            return False
        self.bind(uid, i)
        return True

    def node_freed(self, i: int) -> None:
        super().node_freed(i)
        # kubelet retries CreateContainer with back-off: a failing pod starts once its balloon fits.
        for uid in list(self.failing_on.get(i, ())):
            result = self.cluster.fit(self.demand_of[uid], self.ledgers[i])
            if result.ok:
                del self.failing_on[i][uid]
                self.counters.recovered += 1
                self.start_where(uid, i, result)

    def start_where(self, uid: str, i: int, result: Fit) -> None:
        """The pod runs where the simulated node (the ledger's prediction) puts it. kube-scheduler's own binding
        records no placement: the node's truth reaches the ledger as a real node's exported balloon would."""
        pod = self.pod_of[uid]
        meta = {**pod["metadata"], "annotations": {**(pod["metadata"].get("annotations") or {}),
                                                   PLACEMENT: Placed(self.names[i], result.per_numa,
                                                                     result.types).annotation()}}
        self.pod_of[uid] = {**pod, "metadata": meta}
        self.start(uid, i)


class ExtenderRun(Run):
    """The webhook (mutate + pre-flight, enforce) and the secondary scheduler with the extender."""

    kind = "extender"
    SHORT_LIST = 8
    EXTENDER_WEIGHT = 15
    index_misses = 0  # candidates of the index that `fit` refused (the fast path's price for staying exact)

    def deploy(self, d: Deploy) -> None:
        mutation = self.mutate(d, self.cluster if self.exact else self.full_view)
        demand = mutation.demand
        assert demand is not None and mutation.resolution is not None
        spec = mutation.pod["spec"]
        if self.exact:
            verdict = preflight(demand, spec, self.cluster, 1, mutation.resolution)
        else:
            verdict = self.fast_preflight(demand, spec, mutation.resolution)
        if not verdict.allowed:
            self.counters.refused += 1
            self.counters.refused_checks[verdict.check] = self.counters.refused_checks.get(verdict.check, 0) + 1
            self.state[d.uid] = "refused"
            return
        self.pod_of[d.uid] = mutation.pod
        self.cluster.apply("Pod", "ADDED", mutation.pod)  # created, unbound: the watch sees it
        node = self.schedule(d.uid, spec)
        if node is None:
            self.go_pending(d.uid)
        else:
            self.bind(d.uid, node)

    def forget_pending(self, uid: str) -> None:
        self.cluster.apply("Pod", "DELETED", self.pod_of[uid])

    # -- the webhook's pre-flight --------------------------------------------------------------------

    def fast_preflight(self, demand: ModelDemand, spec: Mapping[str, Any], resolution: Any) -> Any:
        """`preflight` over a short list of the eligible nodes with the same verdict and check id as over all:
        a node that fits when there is one (allowed); else the nodes that could hold it empty, whose
        refusals are the only resolvable ones (insufficient-free); else one node of each class, first by
        name, so the refusals' checks and the first of them are those of every eligible node."""
        idx, _, ledgers = self.eligible_entry(spec)
        need = self.need(demand)
        if need is None:
            return preflight(demand, spec, _View(self.cluster, lambda _spec: ledgers), 1, resolution)
        cls = self.cls
        fits = None
        for i in self.candidates(idx, demand, need):
            if self.cluster.fit_admission(demand, self.ledgers[i]).ok:
                fits = i
                break
            self.index_misses += 1
        if fits is not None:
            pick = [fits]
        else:
            pick = sorted((i for i in idx if need[cls[i]] is not None), key=lambda i: -self.sumfree[i])
            pick = pick[: self.SHORT_LIST]
            if not pick:
                firsts: dict[int, int] = {}
                for i in idx:
                    firsts.setdefault(cls[i], i)
                pick = sorted(firsts.values())
        short = [self.ledgers[i] for i in pick]
        return preflight(demand, spec, _View(self.cluster, lambda _spec: short), 1, resolution)

    # -- the scheduler with the extender ------------------------------------------------------------

    def primary(self, uid: str, i: int, ext_score: int) -> int:
        """kube-scheduler's total: extender score × weight × 10 + NodeResourcesFit LeastAllocated (CPU)."""
        r = self.request_of[uid]
        return ext_score * self.EXTENDER_WEIGHT * 10 + least_allocated(self.alloc[i], self.req[i] + r)

    def schedule(self, uid: str, spec: Mapping[str, Any]) -> int | None:
        demand = self.demand_of[uid]
        idx, _, _ = self.eligible_entry(spec)
        r = self.request_of[uid]
        alloc, req = self.alloc, self.req
        need = None if self.exact or self.strategy != "MostAllocated" else self.need(demand)
        if need is None:
            best: tuple[int, int, int] | None = None
            for i in idx:
                if alloc[i] - req[i] < r:
                    continue
                result = self.cluster.fit(demand, self.ledgers[i])
                if result.ok:
                    k = (self.primary(uid, i, result.score), -tiebreak(uid, self.names[i]), i)
                    if best is None or k > best:
                        best = k
            return None if best is None else best[2]
        w = self.EXTENDER_WEIGHT * 10
        scored = [(self.predicted_score(i, demand, need) * w + (alloc[i] - req[i] - r) * 100 // alloc[i], i)
                  for i in self.candidates(idx, demand, need) if alloc[i] - req[i] >= r]
        while scored:
            top = max(scored)[0]
            i = min((i for s, i in scored if s == top), key=lambda i: tiebreak(uid, self.names[i]))
            result = self.cluster.fit(demand, self.ledgers[i])
            if result.ok:
                if self.primary(uid, i, result.score) != top:
                    raise AssertionError(f"predicted {top} for {self.names[i]} but fit scores {result.score}")
                return i
            # balance-balloons chose a NUMA node or block without room: the index's candidate is not feasible.
            self.index_misses += 1
            scored = [(s, j) for s, j in scored if j != i]
        return None

    def predicted_score(self, i: int, demand: ModelDemand, need: Need) -> int:
        """The score fit() gives node i when the balloon fits: placement.fit._score's MostAllocated over free
        cores less the balloon's, averaged with free NUMA memory less the pinned memory where it is pinned; the
        same float operations, so the prediction is exact."""
        total = self.total[i]
        value = (total - self.sumfree[i] + need[self.cls[i]][1]) / total  # type: ignore[index]
        memtotal = self.memtotal[i]
        if memtotal and demand.memory_bytes:
            pinned = -(-demand.memory_bytes // demand.numa_nodes) * demand.numa_nodes
            value = (value + (memtotal - self.sumfreemem[i] + pinned) / memtotal) / 2
        return max(0, min(10, math.floor(value * 10 + 0.5)))

    def bind(self, uid: str, i: int) -> None:
        """/bind: assume (hold the cores now), then the watch shows the binding and confirms it."""
        c = self.counters
        d = self.deploy_of[uid]
        result = self.cluster.assume(uid, d.namespace, d.name, self.demand_of[uid], self.names[i])
        if not result.ok:
            raise AssertionError(f"assume refused a node the filter passed: {result.reason}")
        self.bound_to(uid, i, True)
        self.start(uid, i)
        # The node's view, checked independently of the filter: TP NUMA nodes × the node's rank cores, no
        # shortfall.
        h = self.ledgers[i].holdings.get(uid)
        rank = self.rank_cores(uid, i)
        if h is None or h.assumed or h.shortfall or len({n for n, _ in h.per_numa}) != d.tp \
                or any(cores != rank for _, cores in h.per_numa) \
                or any(f < 0 for f in self.free[i]):
            c.node_failures += 1
            c.failure_checks["holding-mismatch"] = c.failure_checks.get("holding-mismatch", 0) + 1
        else:
            c.started += 1

    def retry_on(self, uid: str, i: int) -> bool:
        _, eligible, _ = self.eligible_entry(self.spec_of[uid])
        if not eligible[i] or self.alloc[i] - self.req[i] < self.request_of[uid]:
            return False
        if not self.cluster.fit(self.demand_of[uid], self.ledgers[i]).ok:
            return False
        self.bind(uid, i)
        return True


# --------------------------------------------------------------------------------------------------
# The plugin's own word: a sample of nodes replayed through the real balloons plugin (tests/oracle)


AGREEMENT = ("ledger fits, plugin runs", "ledger fits, PLUGIN FAILS", "ledger refuses, plugin runs",
             "ledger refuses, plugin fails")


@dataclass
class Replay:
    nodes: list[str] = field(default_factory=list)
    created: int = 0  # model containers created: once per bind
    failed: int = 0  # ... that the plugin failed at their bind (CreateContainerError)
    started_later: int = 0  # ... that started on a kubelet retry after a pod left their node
    failing_at_end: int = 0
    spans: int = 0  # model containers pinned, at some point, to more NUMA nodes than their ranks
    shares: int = 0  # model containers whose balloon, at some point, had a core another balloon has too
    unpinned: int = 0  # model containers the plugin gave no cpuset
    daemon_failed: int = 0  # kube-proxy / node-exporter containers the plugin failed
    mispredicted_at_end: int = 0  # pods the ledger holds at the end whose per-NUMA cores are not their balloon's
    agreement: dict[str, int] = field(default_factory=lambda: dict.fromkeys(AGREEMENT, 0))
    seconds: float = 0.0


def replay(run: Run, fleet: Sequence[NodeSpec], policies: Mapping[str, Mapping[str, Any]], sample: int,
           seed: int) -> Replay:
    """Replay `sample` nodes (seeded, the same nodes for both runs) through the real plugin: its daemon pods,
    then every create and remove its kubelet saw, in order, each failing container retried after every
    removal there (kubelet's back-off), the plugin's own cpusets checked after every step."""
    from tests.oracle.peer import BalloonsPeer
    from tests.oracle.sysfs import NodeShape

    t0 = time.perf_counter()
    by_name = {n.name: n for n in fleet}
    out = Replay()
    for i in sorted(random.Random(f"replay-{seed}").sample(range(len(run.names)), min(sample, len(run.names)))):
        spec = by_name[run.names[i]]
        shape = NodeShape(packages=2, numa_per_package=spec.numa // 2, cores_per_numa=spec.cores_per_numa,
                          threads_per_core=spec.tpc)
        with BalloonsPeer(shape, {"spec": policies[f"group.{spec.group}"]["spec"]}) as node:
            _replay_node(run, i, spec, shape, node, out)
        out.nodes.append(spec.name)
    out.seconds = round(time.perf_counter() - t0, 1)
    return out


def _replay_node(run: Run, i: int, spec: NodeSpec, shape: Any, node: Any, out: Replay) -> None:
    from tests.oracle.kubelet import peer_pod, run_pod

    for daemon in daemon_pods(spec):
        out.daemon_failed += sum(not got.ok for got in run_pod(node, peer_pod(daemon)).values())
    uid_of: dict[str, str] = {}  # "ns/pod/container" -> uid, the model containers
    failing: dict[str, None] = {}
    spanned: set[str] = set()
    shared: set[str] = set()
    unpinned: set[str] = set()

    def create(uid: str) -> bool:
        started = peer_pod(run.pod_of[uid])
        pod, [container] = started.pod, started.containers
        uid_of[f"{pod.namespace}/{pod.name}/{container.name}"] = uid
        return node.create(pod, container).ok

    def check() -> None:
        for key, placed in node.containers().items():
            uid = uid_of.get(key)
            if uid is not None and len({shape.numa_of(c) for c in placed.cpus}) > run.deploy_of[uid].tp:
                spanned.add(uid)
            if uid is not None and not placed.cpus:
                unpinned.add(uid)
        balloons = [(b, {shape.core_of(c) for c in b.cpus}) for b in node.balloons()]
        for b, cores in balloons:
            models = [uid_of[k] for k in b.containers if k in uid_of]
            if models and any(cores & other for o, other in balloons if o.name != b.name):
                shared.update(models)

    for op, uid, predicted in run.history.get(i, ()):
        if op == "create":
            ok = create(uid)
            out.created += 1
            out.agreement[AGREEMENT[(not predicted) * 2 + (not ok)]] += 1
            if not ok:
                out.failed += 1
                failing[uid] = None
        else:
            node.remove_pod(peer_pod(run.pod_of[uid]).pod)
            failing.pop(uid, None)
            for waiting in list(failing):
                if create(waiting):
                    del failing[waiting]
                    out.started_later += 1
        check()
    out.failing_at_end += len(failing)
    out.spans += len(spanned)
    out.shares += len(shared)
    out.unpinned += len(unpinned)
    # Where the plugin has each pod now against where the ledger says it is.
    observed: dict[str, tuple[tuple[int, int], ...]] = {}
    for b in node.balloons():
        per_numa: dict[int, set[int]] = {}
        for cpu in b.cpus:
            per_numa.setdefault(shape.numa_of(cpu), set()).add(shape.core_of(cpu))
        for key in b.containers:
            if key in uid_of:
                observed[uid_of[key]] = tuple(sorted((n, len(c)) for n, c in per_numa.items()))
    out.mispredicted_at_end += sum(observed.get(uid) != tuple(sorted(h.per_numa))
                                   for uid, h in run.ledgers[i].holdings.items())


# --------------------------------------------------------------------------------------------------
# The whole thing


def fleet_summary(fleet: Sequence[NodeSpec]) -> dict[str, Any]:
    return {
        "nodes": len(fleet),
        "numa": {str(k): sum(1 for n in fleet if n.numa == k) for k in (2, 4, 8)},
        "smt_on": sum(1 for n in fleet if n.smt), "smt_off": sum(1 for n in fleet if not n.smt),
        "amx": sum(1 for n in fleet if n.amx), "no_amx": sum(1 for n in fleet if not n.amx),
        "cores": sum(n.numa * n.cores_per_numa for n in fleet),
        "cores_per_numa": [min(n.cores_per_numa for n in fleet), max(n.cores_per_numa for n in fleet)],
    }


def stream_summary(stream: Sequence[tuple[str, Any]]) -> dict[str, Any]:
    deploys = [d for verb, d in stream if verb == "deploy"]
    return {
        "events": len(stream), "deploys": len(deploys), "undeploys": len(stream) - len(deploys),
        "tp": {str(t): sum(1 for d in deploys if d.tp == t) for t in (1, 2, 4, 8)},
        "cpus": [min(d.cpus for d in deploys), max(d.cpus for d in deploys)] if deploys else [0, 0],
        "require_amx": sum(1 for d in deploys if d.require_amx),
    }


DEFINITIONS = {
    "pods_placed": "pods whose NUMA-local balloon the ledger placed: at bind, or later when cores freed on their "
                   "node (fleet-wide, our model of the plugin)",
    "predicted failures": "pods bound where fit() on the node's ledger says the plugin cannot carve their "
                          "balloon (stock); or whose holding is not TP NUMA nodes x the node's rank cores "
                          "(extender); fleet-wide, counted once, at bind",
    "plugin replay": "a seeded sample of nodes (the same for both runs) replayed through the real NRI balloons "
                     "plugin (tests/oracle): daemon pods, then every create/remove the node's kubelet saw, in "
                     "order, failing containers retried after each removal; FAILED: the plugin failed the "
                     "container at bind; NUMA: pinned to more NUMA nodes than ranks; SHARED: its balloon had a "
                     "core another balloon had; at end: the ledger's per-NUMA cores differ from the balloon's",
    "refused": "pods the webhook's pre-flight refused at admission (never created)",
    "pending": "pods no node passed the scheduler's filters for; retried when a pod leaves a node",
    "waiting": "live deploys holding no cores: pending + failing on their node + refused up front",
    "stranded": "free model cores (ledger.free(), reserved excluded) in NUMA nodes with fewer free cores than "
                "the smallest rank (in that node's cores) among the waiting pods at that moment that some "
                "eligible node could hold when empty; 0 when nothing (placeable) waits",
    "fragmented": "free model cores in NUMA nodes with fewer free cores than the stream's median rank (its "
                  "webhook-set request over TP, in CPUs, over the node's SMT width; the same for both runs)",
    "mean 2nd half": "mean over the samples (every events/50) of the second half of the stream (steady state)",
}


def median_rank_cpus(stream: Sequence[tuple[str, Any]], settings: Settings) -> int:
    """The stream's median CPUs per rank as the webhook sets the request (a hide-hyperthreads type)."""
    tpc, mode = settings.mm_kubelet_threads_per_core, settings.nri_cpu_request
    ranks = sorted(-(-balloon_request(read_model_pod(pod_object(d), settings), {}, tpc, True, mode) // (1000 * d.tp))
                   for verb, d in stream if verb == "deploy")
    return ranks[len(ranks) // 2] if ranks else 0


def run_simulation(nodes: int = 1000, events: int = 20000, seed: int = 7, load: float = 1.0,
                   exact: bool = False, stock_percentage: int = 0, samples: int = 50,
                   settings: Settings | None = None, replay_nodes: int = 20) -> dict[str, Any]:
    """Both runs over the same fleet and stream, then `replay_nodes` of each through the real plugin; the
    figures as a dict (`format_report` prints them)."""
    settings = settings or Settings()
    t0 = time.perf_counter()
    fleet = make_fleet(nodes, random.Random(f"fleet-{seed}"))
    stream = make_stream(fleet, events, random.Random(f"stream-{seed}"), load, settings)
    objects = fleet_objects(fleet, settings)
    policies = {o["metadata"]["name"]: o for o in objects if o["kind"] == "BalloonsPolicy"}
    setup = time.perf_counter() - t0
    sample_every = max(1, events // max(1, samples))
    frag = median_rank_cpus(stream, settings)
    runs: dict[str, Any] = {}
    for run in (lambda: StockRun(objects, settings, stock_percentage), lambda: ExtenderRun(objects, settings, exact)):
        t1 = time.perf_counter()
        r = run()
        r.frag_cpus = frag
        build = time.perf_counter() - t1
        r.play(stream, sample_every)
        figures = r.figures(fleet)
        figures["build_seconds"] = round(build, 2)
        if isinstance(r, StockRun):
            figures["scheduler"] = (f"LeastAllocated on node CPU requests; {r.to_find} of {len(r.names)} "
                                    "feasible nodes scored")
        else:
            figures["scheduler"] = "pre-flight; fit() filter; MostAllocated ×150 + LeastAllocated; all nodes"
        figures["index_misses"] = getattr(r, "index_misses", 0)
        figures["replay"] = asdict(replay(r, fleet, policies, replay_nodes, seed)) if replay_nodes else None
        runs[r.kind] = figures
    return {
        "params": {"nodes": nodes, "events": events, "seed": seed, "load": load, "exact": exact,
                   "stock_percentage": stock_percentage or "adaptive", "replay_nodes": replay_nodes,
                   "policy": settings.kubernetes_cpu_policy, "scoring": settings.scoring_strategy,
                   "nri_cpu_request": settings.nri_cpu_request},
        "fleet": fleet_summary(fleet), "stream": stream_summary(stream),
        "setup_seconds": round(setup, 2), "runs": runs, "definitions": DEFINITIONS,
    }


def comparable(result: Mapping[str, Any]) -> dict[str, Any]:
    """The figures without wall times (what must repeat exactly for the same seed)."""
    out = json.loads(json.dumps(result))
    out.pop("setup_seconds", None)
    out["params"].pop("exact", None)
    for figures in out["runs"].values():
        figures.pop("seconds", None)
        figures.pop("build_seconds", None)
        figures.pop("index_misses", None)
        if figures.get("replay"):
            figures["replay"].pop("seconds", None)
    return out


def _checks(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{k} {v:,}" for k, v in counts.items()) or "-"


def format_report(result: Mapping[str, Any]) -> str:
    f, s, p = result["fleet"], result["stream"], result["params"]
    a, b = result["runs"]["stock"], result["runs"]["extender"]
    lines = [
        f"Placement-quality simulation (seed {p['seed']}, load {p['load']}, policy {p['policy']})",
        f"fleet:  {f['nodes']:,} nodes — NUMA 2/4/8: {f['numa']['2']}/{f['numa']['4']}/{f['numa']['8']}, "
        f"SMT on/off: {f['smt_on']}/{f['smt_off']}, AMX/none: {f['amx']}/{f['no_amx']}, "
        f"{f['cores_per_numa'][0]}-{f['cores_per_numa'][1]} cores per NUMA node, {f['cores']:,} cores "
        f"({a['capacity_cores']:,} model cores after the reserved CPUs); one generated BalloonsPolicy per "
        f"shape, cpu: N made N cores ({p['nri_cpu_request']} mode)",
        f"stream: {s['events']:,} events — {s['deploys']:,} deploys + {s['undeploys']:,} undeploys; "
        f"TP 1/2/4/8: {s['tp']['1']:,}/{s['tp']['2']:,}/{s['tp']['4']:,}/{s['tp']['8']:,}; "
        f"{s['cpus'][0]}-{s['cpus'][1]} CPUs; {s['require_amx']:,} require AMX",
        "",
    ]
    def row(label: str, show: Any) -> tuple[str, str, str]:
        return label, show(a), show(b)

    def n(key: str) -> Any:
        return lambda r: f"{r[key]:,}"

    rows: list[tuple[str, str, str]] = [
        ("", "stock kube-scheduler", "webhook + extender"),
        row("pods bound to a node", n("bound")),
        row("  balloon carved at bind (ledger)", n("started_at_bind")),
        row("  predicted to fail on the node (ledger)", n("node_failures")),
        row("  … started later (cores freed on its node)", n("started_after_retry")),
        row("  … still failing at the end", n("failing_at_end")),
        row("pods placed (got their balloon, ledger)", n("pods_placed")),
        ("refused up front (pre-flight)", "n/a", f"{b['refused']:,}"),
        row("left pending, ever / placed later / at end",
            lambda r: f"{r['ever_pending']:,} / {r['placed_after_pending']:,} / {r['pending_at_end']:,}"),
        row("running at the end", n("running_at_end")),
        row("waiting at the end (hold no cores)", n("waiting_at_end")),
        row("cores held at the end / mean 2nd half",
            lambda r: f"{r['held_at_end']:,} / {r['mean_held_2nd_half']:,.0f}"),
        row("  utilisation at the end", lambda r: f"{r['held_at_end'] / r['capacity_cores']:.1%}"),
        row("free cores at the end", n("free_at_end")),
        row("stranded free cores at the end (threshold)",
            lambda r: f"{r['stranded_at_end']:,} (<{'-'.join(map(str, sorted(set(r['stranded_threshold_at_end']))))})"),
        row("stranded free cores, mean 2nd half", lambda r: f"{r['mean_stranded_2nd_half']:,.0f}"),
        row(f"free cores in NUMA nodes with <{a['fragmented_threshold_cpus']} CPUs' cores free: end / mean",
            lambda r: f"{r['fragmented_at_end']:,} / {r['mean_fragmented_2nd_half']:,.0f}"),
        row("audit: NUMA nodes overcommitted", lambda r: str(r["audit"]["numa_overcommitted"])),
        row("audit: AMX violations / bad balloons",
            lambda r: f"{r['audit']['amx_violations']} / {r['audit']['balloon_shape_errors']}"),
        row("wall time (build state + play)", lambda r: f"{r['build_seconds']:.1f} s + {r['seconds']:.1f} s"),
    ]
    if a["replay"] and b["replay"]:
        ra, rb = a["replay"], b["replay"]

        def rp(label: str, show: Any) -> tuple[str, str, str]:
            return label, show(ra), show(rb)

        def m(key: str) -> Any:
            return lambda r: f"{r[key]:,}"

        rows += [
            rp(f"REAL PLUGIN on {len(ra['nodes'])} sampled nodes: model containers created", m("created")),
            rp("  FAILED BY THE PLUGIN at bind", m("failed")),
            rp("  … started later / still failing at the end",
               lambda r: f"{r['started_later']:,} / {r['failing_at_end']:,}"),
            rp("  PINNED TO MORE NUMA NODES THAN RANKS", m("spans")),
            rp("  SHARING A CORE WITH ANOTHER BALLOON", m("shares")),
            rp("  unpinned / daemon containers failed", lambda r: f"{r['unpinned']} / {r['daemon_failed']}"),
            rp("  ledger's per-NUMA cores wrong at the end", m("mispredicted_at_end")),
            *(rp(f"  {k}", lambda r, k=k: f"{r['agreement'][k]:,}") for k in AGREEMENT),
            rp("  wall time (a peer start costs ~3 s)", lambda r: f"{r['seconds']:.1f} s"),
        ]
    w0 = max(len(r[0]) for r in rows)
    w1 = max(len(r[1]) for r in rows)
    w2 = max(len(r[2]) for r in rows)
    for i, (k, x, y) in enumerate(rows):
        lines.append(f"{k:<{w0}}  {x:>{w1}}  {y:>{w2}}")
        if i == 0:
            lines.append("-" * (w0 + w1 + w2 + 4))
    lines += [
        "",
        f"predicted node-side failures by check (stock): {_checks(a['node_failure_checks'])}",
        f"refusals by check (extender):                  {_checks(b['refused_checks'])}",
        f"stock:    {a['scheduler']}",
        f"extender: {b['scheduler']}",
        f"setup (fleet + stream generation): {result['setup_seconds']:.1f} s",
        f"plugin replay: {len(a['replay']['nodes']) if a['replay'] else 0} of {f['nodes']:,} nodes per run "
        "(--replay N; each node costs a ~3 s start of the real plugin, so the default sample is small)",
        "",
    ]
    lines += [f"{k}: {v}" for k, v in result["definitions"].items()]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--events", type=int, default=20000)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--load", type=float, default=1.0,
                        help="live demand the stream steers towards, as a fraction of the fleet's model cores")
    parser.add_argument("--stock-percentage", type=int, default=0,
                        help="stock kube-scheduler percentageOfNodesToScore (0: the adaptive default)")
    parser.add_argument("--exact", action="store_true",
                        help="no index: real preflight and fit() over every eligible node (slow)")
    parser.add_argument("--replay", type=int, default=20, metavar="N",
                        help="nodes of each run replayed through the real NRI balloons plugin (0: none)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    result = run_simulation(args.nodes, args.events, args.seed, args.load, args.exact, args.stock_percentage,
                            replay_nodes=args.replay)
    print(json.dumps(result, indent=2) if args.json else format_report(result))
    ext = result["runs"]["extender"]
    plugin = ext["replay"] or {}
    bad = ext["node_failures"] or any(ext["audit"].values()) \
        or any(plugin.get(k) for k in ("failed", "spans", "shares", "unpinned", "mispredicted_at_end"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
