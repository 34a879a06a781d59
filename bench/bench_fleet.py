"""The fleet benchmark: with model-placement every model pod ends up pinned NUMA-locally, and without it some do not,
as the real node agents (the balloons plugin, or the kubelet's own CPU, Topology and Memory Managers) say.

    python bench/bench_fleet.py [--fleets balloons kubelet-static] [--arms stock nrt ours] [--nodes 100]
                                [--events 2000] [--rate 1.5] [--seed 7] [--plots docs/] [--no-plots]

Needs the bench extra (`pip install -e '.[bench]'`: matplotlib, for the plots; nothing in the product imports it).

Two fleets of virtual nodes behind a real control plane (tests/e2e/cluster.py: etcd, kube-apiserver,
kube-controller-manager, kube-scheduler, model-placement installed from its chart), each with one stream played
once per arm on a fresh control plane and fresh nodes. Mixed shapes in both: 2 NUMA nodes on 2 packages, 4 on 1
(SNC-4) and on 2 (SNC-2), 8 on 2 (SNC-4), SMT on and off, with and without AMX.

- **balloons** (tests/e2e/vnode.py `VirtualNode`): per Node, the real NRI balloons plugin on a synthetic sysfs of the
  node's shape, its own agent reading the node's BalloonsPolicy from the apiserver (each shape its generated
  `group.<shape>` policy, a few nodes their own `node.<name>` one) and writing the node's NodeResourceTopology, and
  a kubelet stand-in that runs the pods bound to it on the plugin.
- **kubelet-static** (`KubeletStaticNode`): per Node, kubelet v1.35.4's own CPU Manager (static), Topology Manager
  and Memory Manager (None) with that node's KubeletConfiguration (the `kube` peer's `kubelet` subcommand, one
  process per node), a kubelet stand-in that admits each bound pod through them and sets a rejected one Failed with
  the kubelet's Reason (a ReplicaSet replaces it), their podresources API served on a socket, and
  node-feature-discovery v0.19.0's real topology-updater writing the node's NodeResourceTopology from it every 15 s
  (UPDATE_INTERVAL; its chart's default is 60 s). Topology Manager policies single-numa-node 35 %, restricted
  25 %, best-effort 20 %, none 20 %; scope pod on 40 %; full-pcpus-only on 80 %; 2 CPUs kube-reserved. Nodes are
  labelled `model-manager.io/cpu-manager=static` (our default node group); those without full-pcpus-only also
  `bench.model-placement.io/single-threads=true`, which the ours arm's configuration declares as a node group of
  its own (`kubelet_node_groups`: the CPU Manager options are what no object announces). 100 such nodes are 300
  processes (kubelet managers, podresources server, updater): about 40 MiB private memory each node (14 + 10 + 13
  MiB anonymous, measured), the binaries' pages shared.

The stream: model pods created and deleted (TP 1/2/4, some with PP or DP ranks, `cpu:` as a user writes it; on
the kubelet-static fleet each with a Guaranteed native sidecar of 1, 2 or 0.5 CPU), bare and from Deployments
scaled up and down; non-model pods (Guaranteed, 0.1-2 CPU) in kube-system and other namespaces, always scheduled by
the default scheduler. Creates and deletes are steered to keep the live model demand near 85 % of the fleet's
cores (balloons: `cpu:` read as cores) or CPUs (kubelet-static).

Arms:
- **stock**: the default kube-scheduler (default profile), our webhook off. Model pods carry what a careful user
  would write by hand: our webhook's output computed offline by the same mutation (balloon annotation and CPU
  request; on kubelet-static nodes Guaranteed whole cores, the model's CPUs rounded to whole cores), so only
  admission and scheduling differ;
- **nrt**: the same pods, scheduled by kube-scheduler v1.35.4 with scheduler-plugins' NodeResourceTopologyMatch
  (v0.35.4-devel, tests/peers/nrt) as the secondary scheduler `topo-aware-scheduler`, configured as its README and
  README.deploy.md recommend for production (tests/e2e/nrt-scheduler/config.yaml): the overreserve cache
  (`cacheResyncPeriodSeconds: 5`, the shortest the README recommends; `discardReservedNodes` off: it reads NRTs live
  and stops no double booking between bind and the next NFD update), scoring `LeastNUMANodes` (the one strategy
  that scores under every Topology Manager policy; LeastAllocated/BalancedAllocation give 0 on every node but
  single-numa-node ones). Traps avoided: it starts after every node's NRT exists (NRTs created later are ignored,
  scheduler-plugins#967); `foreignPodsDetect: OnlyExclusiveResources` (with the default, All, every pod the default
  scheduler binds marks its node "invalid node topology data"); `resyncMethod: All` (NFD fingerprints every pod);
  `informerMode: Shared` (the Dedicated informer counts Failed pods, which the kubelet's podresources List never
  shows, so a node with a rejected pod would never resync). Traps it falls into anyway, visible in the figures: a
  node whose pods the kubelet all rejected has no Running pod to fingerprint ("cannot find any pod for node"), so
  its overreserved resources are never flushed and it refuses pods until a restart; its Filter checks
  single-numa-node nodes only (restricted, best-effort and none pass unchecked, scheduler-plugins#885) and knows no
  SMT (`full-pcpus-only`): those rejections reach the kubelet. On the balloons fleet its NRTs have no `Node` zones
  and no Topology Manager attribute: the plugin reads policy `none` and filters nothing;
- **ours**: the chart's secondary scheduler with our extender, and our webhook (mutating and validating).

The stream's author is the same on every arm and does what a person or a GitOps tool does with a create that did
not get going: a model create refused at admission, or a bare model pod the kubelet rejected (deleted, and created
again under `<name>-r<n>`), is tried again as Argo CD's sync retry does once enabled (5 s, doubling, at most 3 min
apart) until it is admitted and runs or the stream deletes it; a Deployment refused at its create takes the stream's
later scales with it. create → Running counts from the author's first try.

Judged per arm, from the nodes' records (the cpusets the plugin or the kubelet gave each container) and the pods'
status: model pods refused at admission; Running; "NUMA-local": Running with every rank on a NUMA node of its own
with its whole share; Running with ranks sharing a NUMA node but none crossing one (the kubelet keeps a TP=2 pod one
NUMA node holds on one NUMA node), not NUMA-local: vLLM's default binding (`VLLM_CPU_OMP_THREADS_BIND=auto`) gives
rank i the i-th NUMA node of the container's CPUs and stops at start, "No enough allowed NUMA nodes to bind threads
of N CPUWorkers", when there are fewer NUMA nodes than ranks; split (more NUMA nodes than ranks, or a rank short of
its share), and of those the ones on nodes whose policy refuses rather than spreads (single-numa-
node, restricted, balloons); a core shared with another container; rejected by the kubelet (by Reason); pods a
ReplicaSet created to replace rejected ones; the plugin failing a container (balloons); deleted while Pending;
Pending at the end; NUMA-local Running at the end (still serving when the stream ends); create → Running p50/p99;
free cores at the end (and of them stranded: on NUMA nodes with room for no rank of the smallest model). Goal on the
kubelet-static fleet: ours 0 rejected, 0 split on a single-numa-node or restricted node whose kubelet, empty, keeps
that pod local (the real kubelet's managers with the node's settings, started afresh, decide: `kept_local`), and
more NUMA-local Running pods than stock and nrt; on the balloons fleet: ours no plugin failure, no split, no shared
core (NUMA-local Running pods and free cores reported; "strand no more cores than stock" is no goal: a NUMA-local
packing cannot meet it while stock spreads). The exit code is 1 when a goal is not met. Each fleet's table is
printed (dated, with the seed and wall time) and plotted to <plots>/fleet-<fleet>.png. "split on single-numa-node /
restricted" counts every split pod on such a node, also those the policy cannot keep local there (a TP=2 request
larger than one NUMA node, which the CPU Manager packs unevenly over two; a pod-scope pod whose sidecar takes it
past one NUMA node): ours binds such a placement only when no node offers better.

On a shared 2-core machine one arm at 100 nodes and 2,000 events takes 15-30 minutes (the stock arm longest: its
ReplicaSets replace rejected pods without end). The arms can run side by side, one process each (`--arms stock
--plots /tmp/s > s.log`, ...), then `--fleets <fleet> --from-logs s.log n.log o.log` prints the table and draws the
plot from their output; SIGUSR1 cuts a run's stream short (its row says how many events it played).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import random
import signal
import statistics
import sys
import tempfile
import threading
import time
import warnings
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import urllib3
import yaml

if __package__ in (None, ""):  # `python bench/bench_fleet.py` from a checkout
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from placement.balloons import node_balloons_policy
from placement.balloonspolicy import GROUP_LABEL
from placement.cluster import ClusterState
from placement.config import KUBELET_STATIC_LABEL, Settings
from placement.demand import read_model_pod
from placement.mutation import mutate_pod
from placement.topology import CPUSet, linux_layout
from tests.e2e.cluster import Cluster, wait_until
from tests.e2e.nrt import SCHEDULER_NAME as NRT_SCHEDULER
from tests.e2e.nrt import start_nrt_scheduler
from tests.e2e.vnode import KubeletStandIn, kubelet_settings, start_fleet, start_kubelet_fleet, stop_fleet
from tests.oracle.judge import cores_by_numa, rank_per_numa, shared_cores
from tests.oracle.kubeletpeer import KubeletPeer
from tests.oracle.sysfs import NodeShape

AMX_LABEL = "feature.node.kubernetes.io/cpu-security.amx.enabled"
MODEL_LABEL = "model-manager.io/model"
MODEL_NAMESPACES = ("team-a", "team-b")
OTHER_NAMESPACES = ("kube-system", "monitoring", "default")
POLICY_NAMESPACE = "kube-system"
FLEETS = ("balloons", "kubelet-static")
ARMS = ("stock", "nrt", "ours")
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

# kubelet-static nodes: (Topology Manager policy, weight); scope pod on POD_SCOPE of them, full-pcpus-only on
# FULL_PCPUS (on the rest the kubelet may hand out single threads of a core).
KUBELET_POLICIES = (("single-numa-node", 0.35), ("restricted", 0.25), ("best-effort", 0.2), ("none", 0.2))
POD_SCOPE, FULL_PCPUS = 0.4, 0.8
# Policies under which the kubelet refuses (TopologyAffinityError) rather than spreads a pod it cannot align:
# a pod split there by the kubelet was split by its own choice of too few free CPUs, not for want of a policy.
ALIGNING = ("single-numa-node", "restricted", "balloons")
# NFD's topology-updater rewrites each NRT this often (its chart's default is 60 s; 100 updaters GET and PUT their
# NRT each time, changed or not: at 1 s that alone kept this shared 2-core machine's apiserver busy).
UPDATE_INTERVAL = "15s"
SIDECAR_CPUS = ("1", "2", "500m")  # the Guaranteed native sidecar of a kubelet-static model pod
# What no object announces of a kubelet (its CPU Manager options) an operator tells us per node group: the nodes
# without full-pcpus-only carry this label and the group that selects them (NODE_GROUPS, first match wins).
THREADS_LABEL = "bench.model-placement.io/single-threads"
NODE_GROUPS = [{"name": "single-threads", "node_selector": {KUBELET_STATIC_LABEL: "static", THREADS_LABEL: "true"},
                "cpu_manager_policy_options": []},
               {"name": "static", "node_selector": {KUBELET_STATIC_LABEL: "static"}}]


@dataclass
class VNode:
    name: str
    shape: NodeShape
    amx: bool
    own_policy: bool = False
    kubelet: dict[str, Any] | None = None  # a kubelet-static node's KubeletConfiguration

    @property
    def group(self) -> str:
        s = self.shape
        return f"p{s.packages}n{s.numa_per_package}c{s.cores_per_numa}t{s.threads_per_core}"

    @property
    def policy(self) -> str:
        """Who decides where its containers run: `balloons`, or the kubelet's Topology Manager policy."""
        return "balloons" if self.kubelet is None else str(self.kubelet["topologyManagerPolicy"])

    @property
    def labels(self) -> dict[str, str]:
        if self.kubelet is None:
            pins = {GROUP_LABEL: self.group}
        else:
            pins = {KUBELET_STATIC_LABEL: "static",
                    **({} if self.kubelet["cpuManagerPolicyOptions"] else {THREADS_LABEL: "true"})}
        return {**pins, **({AMX_LABEL: "true"} if self.amx else {})}


def _shape(rng: random.Random) -> NodeShape:
    r = rng.random()
    chosen: tuple[int, int, tuple[int, ...], float] = SHAPES[-1]
    for shape in SHAPES:
        if r < shape[3]:
            chosen = shape
            break
        r -= shape[3]
    packages, per_package, cores, _ = chosen
    return NodeShape(packages=packages, numa_per_package=per_package, cores_per_numa=rng.choice(cores),
                     threads_per_core=2 if rng.random() < SMT_ON else 1, memory_gib_per_numa=256)


def make_fleet(count: int, rng: random.Random) -> list[VNode]:
    out = []
    for i in range(count):
        shape = _shape(rng)
        out.append(VNode(f"vn-{i:03d}", shape, rng.random() < AMX_ON, rng.random() < OWN_POLICY))
    return out


def make_kubelet_fleet(count: int, rng: random.Random) -> list[VNode]:
    """The same shapes, each node's kubelet pinning with the static CPU Manager: a Topology Manager policy and
    scope, full-pcpus-only or not, 2 CPUs kube-reserved (the kubelet reserves its lowest whole cores for them),
    Memory Manager None."""
    out = []
    for i in range(count):
        shape = _shape(rng)
        amx = rng.random() < AMX_ON
        policy = rng.choices([p for p, _ in KUBELET_POLICIES], [w for _, w in KUBELET_POLICIES])[0]
        config = {"apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
                  "cpuManagerPolicy": "static",
                  "cpuManagerPolicyOptions": {"full-pcpus-only": "true"} if rng.random() < FULL_PCPUS else {},
                  "kubeReserved": {"cpu": "2"}, "memoryManagerPolicy": "None", "topologyManagerPolicy": policy,
                  "topologyManagerScope": "pod" if rng.random() < POD_SCOPE else "container"}
        out.append(VNode(f"ks-{i:03d}", shape, amx, kubelet=config))
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


def model_spec(model: str, tp: int, cpu: int, extra: list[str], sidecar: str | None) -> dict[str, Any]:
    memory = f"{max(16, cpu * 4)}Gi"
    spec: dict[str, Any] = {"containers": [{
        "name": "vllm", "image": "vllm/vllm-openai-cpu:v0.10.0",
        "args": ["--model", f"/models/{model}", "--tensor-parallel-size", str(tp), *extra],
        "resources": {"requests": {"cpu": str(cpu), "memory": memory}, "limits": {"cpu": str(cpu), "memory": memory}},
    }]}
    if sidecar is not None:  # a metrics exporter beside the model for the pod's life
        amounts = {"cpu": sidecar, "memory": "1Gi"}
        spec["initContainers"] = [{"name": "metrics", "image": "prom/node-exporter:v1.8.2", "restartPolicy": "Always",
                                   "resources": {"requests": amounts, "limits": dict(amounts)}}]
    return spec


def model_pod(name: str, namespace: str, tp: int, cpu: int, extra: list[str], sidecar: str | None) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": {MODEL_LABEL: name}},
            "spec": model_spec(name, tp, cpu, extra, sidecar)}


def deployment(name: str, namespace: str, replicas: int, tp: int, cpu: int, sidecar: str | None) -> dict[str, Any]:
    labels = {MODEL_LABEL: name, "app": name}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": namespace},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                     "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}},
                     "template": {"metadata": {"labels": labels},
                                  "spec": model_spec(name, tp, cpu, [], sidecar)}}}


def other_pod(name: str, namespace: str, cpu: str) -> dict[str, Any]:
    resources = {"requests": {"cpu": cpu, "memory": "128Mi"}, "limits": {"cpu": cpu, "memory": "128Mi"}}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace,
                                                             "labels": {"app": name}},
            "spec": {"containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10", "resources": resources}]}}


def make_stream(capacity: float, events: int, rng: random.Random, sidecars: bool) -> list[dict[str, Any]]:
    """Creates and deletes steered to keep the live model demand near `capacity` (so that every arm meets full
    nodes): bare model pods (some with PP or DP ranks), Deployments created, scaled and deleted, and non-model
    pods; with `sidecars`, each model pod has a Guaranteed native sidecar."""
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
        sidecar = rng.choice(SIDECAR_CPUS) if sidecars else None
        if r < 0.30:  # Deployments
            if grow and (not live_deploys or rng.random() < 0.4):
                name = f"dep-{k:05d}"
                replicas = rng.randint(1, 3)
                live_deploys[name] = (replicas, cpu)
                out.append({"op": "create-deploy", "object": deployment(name, rng.choice(MODEL_NAMESPACES),
                                                                         replicas, tp, cpu, sidecar)})
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
                        "object": model_pod(name, rng.choice(MODEL_NAMESPACES), tp, cpu, extra, sidecar)})
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
    owner: str | None = None  # the uid of the controller (ReplicaSet) that created it
    running: float | None = None
    failed: str | None = None  # the plugin's CreateContainerError (balloons)
    rejected: str | None = None  # the kubelet's Reason when it rejected the pod (phase Failed)
    rejected_at: float | None = None
    node: str | None = None
    verdict: str | None = None  # local | packed | split | shared | memory, once its containers are seen
    placement: str = ""  # where the pod's containers run, for the summary of the pods judged not local
    ever_shared: bool = False
    deleted: bool = False


def rank_verdict(shape: NodeShape, cpus: frozenset[int], ranks: int, asked: int) -> str:
    """`local`: each rank on a NUMA node of its own with its whole share (NUMA-local); `packed`: fewer NUMA nodes
    than ranks, each holding whole ranks (ranks share a NUMA node, none crosses one: what the kubelet does with a TP=2
    pod one NUMA node holds, and where vLLM's auto binding stops); `split`: anything else (more NUMA nodes than
    ranks, or a rank short of its share)."""
    spread = cores_by_numa(shape, cpus)
    if rank_per_numa(spread, ranks, asked, shape):
        return "local"
    share = asked / (ranks * shape.threads_per_core)  # cores per rank
    if len(spread) < ranks and sum(math.floor(c / share + 1e-9) for c in spread.values()) >= ranks:
        return "packed"
    return "split"


@dataclass
class Observer:
    """Every pod's fate from one watch on pods, and the placements from the virtual nodes' records."""

    cluster: Cluster
    fleet: dict[str, VNode]
    fates: dict[str, PodFate] = field(default_factory=dict)
    posted: dict[str, float] = field(default_factory=dict)  # "ns/name" -> when its author first asked for it
    by_key: dict[str, PodFate] = field(default_factory=dict)  # "ns/name" -> the fate of the pod last of that name
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
                owner = next((o["uid"] for o in meta.get("ownerReferences") or () if o.get("controller")), None)
                fate = self.fates[uid] = PodFate(uid, key, MODEL_LABEL in (meta.get("labels") or {}),
                                                 self.posted.get(key, now), owner)
                self.by_key[key] = fate
            self.pods[uid] = pod
            fate.deleted = fate.deleted or kind == "DELETED"
            status = pod.get("status") or {}
            fate.node = pod["spec"].get("nodeName") or fate.node
            if status.get("phase") == "Running" and fate.running is None:
                fate.running = now
            if status.get("phase") == "Failed" and fate.rejected is None:
                fate.rejected, fate.rejected_at = status.get("reason") or "Failed", now
            if fate.failed is None:
                fate.failed = next((c["state"]["waiting"].get("message", "") for c in (
                    *(status.get("initContainerStatuses") or ()), *(status.get("containerStatuses") or ()))
                    if c.get("state", {}).get("waiting", {}).get("reason") == "CreateContainerError"), None)

    def judge(self, records: dict[str, dict[str, Any]]) -> None:
        """Each running model pod's container, against the rest of its node: local, packed, split, shared core,
        memory off its NUMA nodes."""
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
                        # The Memory Manager's None policy pins no memory: nothing to judge there.
                        numa = {int(m) for m in str(mems).split(",") if m != ""}
                        ranks = rank_verdict(shape, cpus, demand.numa_nodes, demand.cpus)
                        fate.verdict = ("shared" if fate.ever_shared else
                                        "memory" if ranks != "split" and numa and numa != set(spread) else ranks)
                        fate.placement = (f"{fate.key} on {node} ({self.fleet[node].policy}): {demand.numa_nodes} "
                                          f"rank(s) of {demand.cpus} CPUs, got cores per NUMA node "
                                          f"{dict(sorted(spread.items()))}, memory {mems or '-'}")


def records(vnodes: Sequence[KubeletStandIn]) -> dict[str, dict[str, Any]]:
    out = {}
    for v in vnodes:
        try:
            out[v.name] = v.record()
        except (OSError, ValueError):
            continue  # being replaced: read it next time
    return out


def free_cores(fleet: dict[str, VNode], recs: dict[str, dict[str, Any]], reserved: dict[str, CPUSet]) -> dict[str, Any]:
    """What the fleet has free at the end, from the cpusets the plugins (or kubelets) gave: `free`, every core no
    container holds a thread of and none reserved; `stranded`, those of them on NUMA nodes where no rank of the
    smallest model fits; `stranded_forced`, how many of those the NUMA nodes' own sizes force (on such a NUMA node
    its model cores modulo RANK_STEP stay free under any NUMA-local packing of the stream's ranks); `slivers`: how
    many NUMA nodes end with 0, 1, 2, 3 free cores."""
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


def replacements(fates: list[PodFate]) -> int:
    """Pods a controller created to replace ones the kubelet rejected: per ReplicaSet, each rejection matched to
    the first pod of that ReplicaSet created after it and not matched already."""
    out = 0
    by_owner: dict[str, list[PodFate]] = {}
    for f in fates:
        if f.owner is not None:
            by_owner.setdefault(f.owner, []).append(f)
    for pods in by_owner.values():
        created = sorted(f.created for f in pods)
        taken = 0
        for at in sorted(f.rejected_at for f in pods if f.rejected_at is not None):
            while taken < len(created) and created[taken] <= at:
                taken += 1
            if taken < len(created):
                out += 1
                taken += 1
    return out


# SIGUSR1 cuts the stream short where it is: the arm settles briefly and reports what it played ("events_played").
CUT = threading.Event()


# -- the stream's author ---------------------------------------------------------------------------------------

# A refused create, or a bare pod the kubelet rejected, is tried again as Argo CD's sync retry does (its defaults
# once enabled: 5 s, doubling, at most 3 min apart), until it is admitted and runs or the stream deletes it. Without
# it an arm that refuses early would lose the workload for good while one that admits everything runs it later.
RETRY_FIRST, RETRY_MAX = 5.0, 180.0


@dataclass
class Retry:
    event: dict[str, Any]  # the create, its object as the stream last changed it (a Deployment's replicas)
    due: float = 0.0
    wait: float = RETRY_FIRST
    replaced: int = 0  # pods of this bare model pod the kubelet rejected: the next is `<name>-r<replaced>`


@dataclass
class User:
    """Who plays the stream on one arm: creates and deletes as the stream says, and tries again what did not get
    going. A bare pod the kubelet rejected is deleted and replaced by a pod of a new name (`<name>-r<n>`); a
    refused create is sent again as it was."""

    cluster: Cluster
    arm: str
    state: ClusterState
    scheduler: str | None
    observer: Observer
    pods: dict[str, tuple[str, str, Retry]] = field(default_factory=dict)  # stream name -> (ns, its pod, its create)
    deploys: dict[str, str] = field(default_factory=dict)  # stream name -> namespace
    retries: dict[str, Retry] = field(default_factory=dict)  # stream name -> its next try
    refused: set[str] = field(default_factory=set)  # model creates refused at least once (stream names)
    admitted_later: set[str] = field(default_factory=set)  # of those, admitted on a later try
    recreated: int = 0  # bare model pods created again after the kubelet rejected one
    counts: Counter[str] = field(default_factory=Counter)  # other pods refused, api errors
    said: Counter[str] = field(default_factory=Counter)  # why model creates were refused (the first sentence)

    def play(self, event: dict[str, Any]) -> None:
        api, op, name = self.cluster.api, event["op"], event.get("name")
        if op in ("create-pod", "create-deploy"):
            # Its own copy: a later scale changes it while it waits to be tried again, and the stream is the next
            # arm's too when arms share a process.
            self.create(Retry({**event, "object": copy.deepcopy(event["object"])}))
        elif op == "delete-pod" and name is not None:
            self.retries.pop(name, None)
            if name in self.pods:
                ns, pod, _ = self.pods.pop(name)
                api.call("DELETE", f"/api/v1/namespaces/{ns}/pods/{pod}", ok=(200, 202, 404))
        elif op == "scale" and name is not None:
            if name in self.deploys:
                api.call("PATCH", f"/apis/apps/v1/namespaces/{self.deploys[name]}/deployments/{name}/scale",
                         {"spec": {"replicas": event["replicas"]}}, ok=(200, 404),
                         content_type="application/merge-patch+json")
            elif name in self.retries:
                self.retries[name].event["object"]["spec"]["replicas"] = event["replicas"]
        elif op == "delete-deploy" and name is not None:
            self.retries.pop(name, None)
            if name in self.deploys:
                ns = self.deploys.pop(name)
                api.call("DELETE", f"/apis/apps/v1/namespaces/{ns}/deployments/{name}?propagationPolicy=Background",
                         ok=(200, 202, 404))

    def create(self, retry: Retry) -> None:
        event = retry.event
        obj = copy.deepcopy(event["object"])
        name, ns = obj["metadata"]["name"], obj["metadata"]["namespace"]
        if retry.replaced:
            obj["metadata"]["name"] = f"{name}-r{retry.replaced}"
        is_model = event["op"] == "create-deploy" or event["model"]
        if self.arm != "ours" and is_model:
            obj = premutated(obj, self.state, self.scheduler)
        path = (f"/api/v1/namespaces/{ns}/pods" if event["op"] == "create-pod"
                else f"/apis/apps/v1/namespaces/{ns}/deployments")
        with self.observer.lock:  # create -> Running counts from the first time its author asked
            first = self.observer.posted.setdefault(f"{ns}/{name}", time.monotonic())
            self.observer.posted[f"{ns}/{obj['metadata']['name']}"] = first
        got = self.cluster.api.call("POST", path, obj, ok=(201, 400, 403, 422))
        if got.get("kind") == "Status":
            if not is_model:
                self.counts["other pods refused"] += 1
            else:
                self.refused.add(name)
                self.said[str(got.get("message", "")).split(": ", 1)[-1].split(". ")[0][:240]] += 1
                self.again(name, retry)
            return
        if name in self.refused:
            self.admitted_later.add(name)
        if event["op"] == "create-deploy":
            self.deploys[name] = ns
        else:
            self.pods[name] = (ns, obj["metadata"]["name"], retry)

    def again(self, name: str, retry: Retry) -> None:
        retry.due = time.monotonic() + retry.wait
        retry.wait = min(RETRY_MAX, retry.wait * 2)
        self.retries[name] = retry

    def tick(self) -> None:
        """Bare model pods the kubelet rejected are deleted and queued to be replaced; due tries are sent."""
        with self.observer.lock:
            rejected = [name for name, (ns, pod, retry) in self.pods.items() if retry.event["model"]
                        and (fate := self.observer.by_key.get(f"{ns}/{pod}")) is not None and fate.rejected]
        for name in rejected:
            ns, pod, retry = self.pods.pop(name)
            self.cluster.api.call("DELETE", f"/api/v1/namespaces/{ns}/pods/{pod}", ok=(200, 202, 404))
            self.recreated += 1
            retry.replaced += 1
            self.again(name, retry)
        now = time.monotonic()
        for name in [n for n, r in self.retries.items() if r.due <= now]:
            self.create(self.retries.pop(name))


# -- one arm --------------------------------------------------------------------------------------------------

def stock_scheduler(config: dict[str, Any]) -> None:
    """kube-scheduler as shipped: the default profile, no extender, its own adaptive percentageOfNodesToScore."""
    for key in ("extenders", "percentageOfNodesToScore"):
        config.pop(key, None)
    config["profiles"] = [{"schedulerName": "default-scheduler"}]
    config["leaderElection"] = {"leaderElect": False}


def premutated(obj: dict[str, Any], state: ClusterState, scheduler: str | None) -> dict[str, Any]:
    """What a careful user writes by hand for the stock and nrt arms: our mutation (balloon annotation and CPU
    request, or Guaranteed whole cores on kubelet-static nodes; AMX affinity), applied before the create, with
    `scheduler` as its schedulerName (None: the default scheduler)."""
    if obj["kind"] == "Pod":
        out = mutate_pod(obj, state).pod
        spec = out["spec"]
    else:
        out = copy.deepcopy(obj)
        template = out["spec"]["template"]
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {**template["metadata"], "name": obj["metadata"]["name"],
                            "namespace": obj["metadata"]["namespace"]},
               "spec": template["spec"]}
        mutated = mutate_pod(pod, state).pod
        template["metadata"] = {k: v for k, v in mutated["metadata"].items() if k not in ("name", "namespace")}
        spec = template["spec"] = mutated["spec"]
    if scheduler is not None:
        spec["schedulerName"] = scheduler
    return out


def wait_healthy(cluster: Cluster, component: str, timeout: float = 90) -> None:
    """Until the scheduler's secure port answers /healthz (its first pods would otherwise count its start-up)."""
    http = urllib3.PoolManager(cert_reqs="CERT_NONE")
    url = f"https://127.0.0.1:{cluster.ports[component]}/healthz"

    def healthy() -> bool:
        if not cluster.components[component].alive():
            raise AssertionError(f"{component} exited:\n{cluster.components[component].tail()}")
        return http.request("GET", url, timeout=2, retries=False).status == 200

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", urllib3.exceptions.InsecureRequestWarning)
        wait_until(f"{component} /healthz", healthy, timeout)


def start_nodes(cluster: Cluster, kind: str, fleet: list[VNode], observer: Observer,
                fleet_policies: list[dict[str, Any]]) -> tuple[list[KubeletStandIn], dict[str, CPUSet]]:
    """The fleet's virtual nodes, and the CPUs each reserves (the policy's reservedResources, or what the
    kubelet keeps out of its podresources' allocatable)."""
    def judged(record: dict[str, Any]) -> None:
        observer.judge({record["node"]: record})

    if kind == "balloons":
        for policy in fleet_policies:
            cluster.kubectl("apply", "-f", "-", input=json.dumps(policy))
        nodes = start_fleet(cluster, [(n.name, n.shape, n.labels) for n in fleet], on_record=judged)
        by_name = {p["metadata"]["name"]: p for p in fleet_policies}
        return list(nodes), {
            n.name: CPUSet.parse(str(p["spec"]["reservedResources"]["cpu"]).removeprefix("cpuset:"))
            for n in fleet for p in [by_name.get(f"node.{n.name}") or by_name[f"group.{n.group}"]]}
    kubelets = start_kubelet_fleet(cluster, [(n.name, n.shape, n.kubelet or {}, n.labels) for n in fleet],
                                   on_record=judged, update_interval=UPDATE_INTERVAL)
    reserved = {}
    for k in kubelets:  # before any pod: the peer answers one request at a time
        assert k.peer is not None
        allocatable = set(k.peer.podresources_answer()["allocatable"]["cpu_ids"])
        reserved[k.name] = CPUSet.of(c for c in range(k.shape.cpus) if c not in allocatable)
    return list(kubelets), reserved


def play_arm(kind: str, arm: str, fleet: list[VNode], stream: list[dict[str, Any]], rate: float) -> dict[str, Any]:
    started = time.monotonic()
    cluster = Cluster(Path(tempfile.mkdtemp(prefix=f"mp-fleet-{kind}-{arm}-")))
    vnodes: list[KubeletStandIn] = []
    observer = Observer(cluster, {n.name: n for n in fleet})
    fleet_policies = policies(fleet) if kind == "balloons" else []
    try:
        cluster.start()
        cluster.install()
        for ns in (*MODEL_NAMESPACES, "monitoring"):
            cluster.create_namespace(ns, enabled=ns in MODEL_NAMESPACES)
        vnodes, reserved = start_nodes(cluster, kind, fleet, observer, fleet_policies)
        # Every arm starts with each node's NodeResourceTopology written: NodeResourceTopologyMatch's cache ignores
        # the ones created after it starts (scheduler-plugins#967), and our ledger learns a kubelet's policy there.
        nrts = wait_until("every node's NodeResourceTopology", lambda: len(cluster.api.get(
            "/apis/topology.node.k8s.io/v1alpha2/noderesourcetopologies")["items"]) >= len(fleet) or None,
            timeout=300, every=2)
        fleet_ready = time.monotonic() - started
        cluster.start_scheduler("default-scheduler", stock_scheduler)
        if arm == "ours":
            if kind != "balloons":
                configure_kubelet_fleet(cluster)
            cluster.start_model_placement("webhook")
            cluster.start_model_placement("extender")
            cluster.start_scheduler()
        else:
            for webhook in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):
                cluster.kubectl("delete", webhook, "model-placement")
        if arm == "nrt":
            start_nrt_scheduler(cluster)
            wait_healthy(cluster, "nrt-scheduler")
        wait_healthy(cluster, "default-scheduler")
        state = ClusterState.from_objects(
            [*(v.api.get(f"/api/v1/nodes/{v.name}") for v in vnodes), *fleet_policies],
            Settings(scheduler_name="", kubernetes_cpu_policy="nri-balloons" if kind == "balloons" else "kubelet-static"
                     ))
        watcher = threading.Thread(target=observer.watch, daemon=True)
        watcher.start()
        ready_at = time.monotonic()
        user = User(cluster, arm, state, NRT_SCHEDULER if arm == "nrt" else None, observer)
        played = 0
        for i, event in enumerate(stream):
            if CUT.is_set():
                break
            played = i + 1
            due = ready_at + i / rate
            while True:
                try:
                    user.tick()
                except (urllib3.exceptions.HTTPError, AssertionError) as exc:
                    user.counts[f"api error: {type(exc).__name__}"] += 1
                if time.monotonic() >= due:
                    break
                time.sleep(max(0.0, min(0.2, due - time.monotonic())))
            try:
                user.play(event)
            except (urllib3.exceptions.HTTPError, AssertionError) as exc:
                # An apiserver too busy to answer in 30 s (the stock arm's ReplicaSets replacing rejected pods
                # without end load it): the request is lost, as a user's kubectl would lose it; the stream goes on.
                user.counts[f"api error: {type(exc).__name__}"] += 1
        stream_seconds = time.monotonic() - ready_at
        settle(observer, *((5, 30) if CUT.is_set() else ()))
        recs = records(vnodes)
        observer.judge(recs)
        observer.stop.set()
        out = summarize(arm, observer, user, recs, reserved, stream_seconds, time.monotonic() - started, vnodes)
        out["fleet_start_seconds"], out["nrts_at_start"] = round(fleet_ready, 1), nrts
        out["api_errors"] = {k: v for k, v in user.counts.items() if k.startswith("api error")}
        out["events_played"] = played
        if arm == "nrt":
            out["nrt_scheduler_said"] = scheduler_reasons(cluster)
        return out
    except BaseException:
        print(cluster.tails(), file=sys.stderr)
        raise
    finally:
        stop_fleet(cluster, vnodes)
        cluster.stop()


def configure_kubelet_fleet(cluster: Cluster) -> None:
    """What an operator of a fleet the kubelet pins sets in the chart's `config` (the ConfigMap our servers read):
    model pods are kubelet-static (the chart's default, nri-balloons, would fall back to best-effort on every node
    here, where no balloons plugin runs), and NODE_GROUPS as `kubelet_node_groups`."""
    data = cluster.find("ConfigMap", "model-placement-config")["data"]
    key = next(iter(data))
    data[key] = yaml.safe_dump({**yaml.safe_load(data[key]), "kubernetes_cpu_policy": "kubelet-static",
                                "kubelet_node_groups": NODE_GROUPS})


def scheduler_reasons(cluster: Cluster) -> dict[str, int]:
    """Why NodeResourceTopologyMatch's scheduler left pods unschedulable: per reason, how many nodes it was given
    for, summed over its FailedScheduling events ("0/100 nodes are available: 3 <reason>, 97 <reason>. ...")."""
    events = cluster.api.get("/api/v1/events?fieldSelector=reason=FailedScheduling")["items"]
    said: Counter[str] = Counter()
    for e in events:
        if e.get("reportingComponent", e.get("source", {}).get("component")) != NRT_SCHEDULER:
            continue
        message = str(e.get("message", "")).split(". preemption:", 1)[0]
        for part in message.split(": ", 1)[-1].split(", "):
            count, _, reason = part.partition(" ")
            if count.isdigit():
                said[reason.split(". ", 1)[0].rstrip(".")] += int(count)
    return dict(said.most_common(8))


def settle(observer: Observer, quiet: float = 15, limit: float = 180) -> None:
    """Until nothing has changed for `quiet` seconds (pods still Pending then stay so), at most `limit`."""
    def state() -> tuple[int, int, int, int]:
        with observer.lock:
            fates = list(observer.fates.values())
        return (len(fates), sum(f.running is not None for f in fates), sum(f.failed is not None for f in fates),
                sum(f.rejected is not None for f in fates))

    last, since, start = state(), time.monotonic(), time.monotonic()
    while time.monotonic() - since < quiet and time.monotonic() - start < limit:
        time.sleep(1)
        now = state()
        if now != last:
            last, since = now, time.monotonic()


def summarize(arm: str, observer: Observer, user: User, recs: dict[str, dict[str, Any]], reserved: dict[str, CPUSet],
              stream_seconds: float, seconds: float, vnodes: Sequence[KubeletStandIn]) -> dict[str, Any]:
    with observer.lock:
        fates = list(observer.fates.values())
    models = [f for f in fates if f.model]
    verdicts = Counter(f.verdict for f in models if f.verdict)
    waits = sorted(f.running - f.created for f in models if f.running is not None)
    pending = [f for f in models if f.running is None and f.rejected is None and not f.deleted]
    errors = [e for v in vnodes for e in v.errors]
    split = [f for f in models if f.verdict == "split" and f.node is not None]
    split_aligning = [f for f in split if observer.fleet[f.node or ""].policy in ALIGNING]
    avoidable = [f for f in split_aligning if kept_local(observer.fleet[f.node or ""], observer.pods[f.uid])]
    live = [f for f in models if f.running is not None and not f.deleted and f.rejected is None]
    return {
        "arm": arm, "model_pods": len(models), "refused": len(user.refused),
        "admitted_later": len(user.admitted_later), "never_admitted": len(user.refused - user.admitted_later),
        "recreated": user.recreated,
        "running": sum(1 for f in models if f.running is not None),
        "numa_local": verdicts["local"], "packed": verdicts["packed"],
        "running_at_end": len(live), "numa_local_at_end": sum(1 for f in live if f.verdict == "local"),
        "split": verdicts["split"], "split_aligning": len(split_aligning),
        "split_avoidable": len(avoidable),
        "shared": sum(1 for f in models if f.ever_shared), "memory_off_numa": verdicts["memory"],
        "unjudged": sum(1 for f in models if f.running is not None and f.verdict is None),
        "rejected": dict(Counter(f.rejected for f in models if f.rejected)),
        "rejected_other": sum(1 for f in fates if not f.model and f.rejected),
        "replacements": replacements(fates),
        "plugin_failed": sum(1 for f in models if f.failed is not None),
        "deleted_pending": sum(1 for f in models if f.deleted and f.running is None and f.rejected is None),
        "pending_at_end": len(pending),
        "p50": statistics.median(waits) if waits else None,
        "p99": waits[min(len(waits) - 1, int(0.99 * len(waits)))] if waits else None,
        **free_cores(observer.fleet, recs, reserved),
        "stream_seconds": round(stream_seconds, 1), "seconds": round(seconds, 1),
        "failures": sorted({f.failed for f in models if f.failed})[:5], "kubelet_errors": errors[:5],
        "not_local": sorted(f.placement for f in models if f.verdict not in (None, "local"))[:5],
        # Each in full, with its uid: what a trace through the extender's log starts from (a rejected pod is gone
        # from the node and the apiserver once its ReplicaSet is scaled down).
        "split_avoidable_pods": [f"{f.placement}; uid {f.uid}" for f in avoidable],
        "rejected_pods": [f"{f.key} on {f.node}: {(observer.pods[f.uid].get('status') or {}).get('message')}; "
                          f"uid {f.uid}" for f in models if f.rejected][:20],
        "refused_said": dict(user.said.most_common(6)),
    }


def kept_local(node: VNode, pod: dict[str, Any]) -> bool:
    """Whether the node's kubelet, with nothing else on it, runs this pod NUMA-locally: the real kubelet's managers
    with the node's settings, started afresh, decide. A pod split on a single-numa-node or restricted node that an
    empty one keeps local was split by the node's state, which a scheduler chose; one that an empty node splits too
    (a TP=2 pod larger than one NUMA node, which the CPU Manager packs unevenly over two) was split by the policy."""
    if node.kubelet is None:
        return True  # balloons: the policy's types keep every rank on a NUMA node of its own
    demand = read_model_pod(pod, Settings())
    assert demand is not None
    with KubeletPeer() as peer:
        peer.start(node.shape, kubelet_settings(node.kubelet))
        verdict = peer.add({**pod, "metadata": {**pod["metadata"], "uid": "empty-node"}})
    placed = verdict.containers.get(demand.container)
    return placed is not None and rank_verdict(node.shape, placed.cpus, demand.numa_nodes, demand.cpus) != "split"


# -- main -----------------------------------------------------------------------------------------------------

def table(rows: list[dict[str, Any]]) -> Iterator[str]:
    yield ("| arm | model pods | refused at admission (admitted on a later try) | Running | NUMA-local Running "
           "(every rank on a NUMA node of its own) | NUMA-local Running at the end | ranks sharing a NUMA node "
           "(vLLM's auto binding stops) "
           "| split (on single-numa-node / restricted / balloons; of them an empty node keeps local) | shared core "
           "| kubelet rejected (by Reason) | replacements of rejected pods (by ReplicaSets / by their author) "
           "| plugin failed | deleted while Pending | Pending at end | create → Running p50 / p99 "
           "| free cores (stranded) | wall |")
    yield "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    for r in rows:
        times = f"{r['p50']:.2f} s / {r['p99']:.2f} s" if r["p50"] is not None else "-"
        rejected = ", ".join(f"{k} {v}" for k, v in sorted(r["rejected"].items())) or "0"
        yield (f"| {r['arm']} | {r['model_pods']} | {r['refused']} ({r['admitted_later']}) | {r['running']} "
               f"| {r['numa_local']} | {r['numa_local_at_end']} | {r['packed']} "
               f"| {r['split']} ({r['split_aligning']}; {r['split_avoidable']}) | {r['shared']} | {rejected} "
               f"| {r['replacements']} / {r['recreated']} | {r['plugin_failed']} | {r['deleted_pending']} "
               f"| {r['pending_at_end']} | {times} | {r['free']} ({r['stranded']}) | {r['seconds']:.0f} s |")


def plot(kind: str, rows: list[dict[str, Any]], path: Path, title: str) -> None:
    """Per arm: NUMA-local Running, split, ranks sharing a NUMA node, kubelet-rejected, refused at admission and
    Pending at the end; and create → Running p50 and p99. matplotlib is the bench extra's; nothing in the product
    imports it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = [r["arm"] for r in rows]
    bars = {"NUMA-local\nRunning": [r["numa_local"] for r in rows],
            "NUMA-local\nat the end": [r["numa_local_at_end"] for r in rows], "split": [r["split"] for r in rows],
            "ranks sharing\na NUMA node": [r["packed"] for r in rows],
            "kubelet\nrejected": [sum(r["rejected"].values()) for r in rows],
            "plugin\nfailed": [r["plugin_failed"] for r in rows],
            "refused at\nadmission": [r["refused"] for r in rows],
            "Pending\nat the end": [r["pending_at_end"] for r in rows]}
    if kind == "balloons":
        bars.pop("kubelet\nrejected")
    else:
        bars.pop("plugin\nfailed")
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.8), gridspec_kw={"width_ratios": [3, 2]})
    width = 0.8 / len(arms)
    for i, arm in enumerate(arms):
        xs = [k + (i - (len(arms) - 1) / 2) * width for k in range(len(bars))]
        drawn = left.bar(xs, [values[i] for values in bars.values()], width, label=arm)
        left.bar_label(drawn, fontsize=7)
    left.set_xticks(range(len(bars)))
    left.set_xticklabels(list(bars), fontsize=8)
    left.set_ylabel("model pods")
    left.legend()
    left.set_title("what happened to the model pods")
    xs = range(len(arms))
    for k, (label, key) in enumerate((("p50", "p50"), ("p99", "p99"))):
        drawn = right.bar([x + (k - 0.5) * 0.35 for x in xs], [r[key] or 0 for r in rows], 0.35, label=label)
        right.bar_label(drawn, fmt="%.1f", fontsize=7)
    right.set_xticks(list(xs))
    right.set_xticklabels(arms)
    right.set_yscale("log")
    right.set_ylim(top=max(r["p99"] or 1 for r in rows) * 3)  # room for the tallest bar's label
    right.set_ylabel("seconds")
    right.legend()
    right.set_title("create → Running (model pods that ran)")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def goal(kind: str, rows: list[dict[str, Any]]) -> tuple[bool, str]:
    by = {r["arm"]: r for r in rows}
    ours = by.get("ours")
    if ours is None:
        return True, "ours not run"
    if kind == "balloons":
        met = not (ours["plugin_failed"] or ours["split"] or ours["shared"])
        return met, f"ours: {ours['plugin_failed']} plugin-failed, {ours['split']} split, {ours['shared']} shared"
    rejected = sum(ours["rejected"].values())
    beaten = [a for a in ("stock", "nrt") if a in by and ours["numa_local"] <= by[a]["numa_local"]]
    met = not rejected and not ours["split_avoidable"] and not beaten
    return met, (f"ours: {rejected} rejected, {ours['split_avoidable']} split where an empty node keeps it local, "
                 f"{ours['numa_local']} NUMA-local vs " +
                 ", ".join(f"{a} {by[a]['numa_local']}" for a in ("stock", "nrt") if a in by))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--events", type=int, default=2000)
    parser.add_argument("--rate", type=float, default=1.5, help="stream events per second")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--fleets", nargs="+", choices=FLEETS, default=list(FLEETS))
    parser.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS))
    parser.add_argument("--plots", type=Path, default=Path(__file__).resolve().parent.parent / "docs",
                        help="where docs/fleet-<fleet>.png go (needs the bench extra: matplotlib)")
    parser.add_argument("--no-plots", action="store_true")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--from-logs", nargs="+", type=Path, metavar="LOG",
                        help="no run: the table and plot of the one fleet of --fleets from the arms these runs' "
                             "output printed (arms run in separate processes, side by side)")
    args = parser.parse_args()
    signal.signal(signal.SIGUSR1, lambda *_: CUT.set())
    if args.from_logs:
        return from_logs(args.fleets[0], args.from_logs, args.plots)
    bad = False
    for kind in args.fleets:
        if kind == "balloons":
            fleet = make_fleet(args.nodes, random.Random(f"fleet-{args.seed}"))
            capacity = sum(n.shape.cores for n in fleet) * 0.85  # `cpu:` read as cores
        else:
            fleet = make_kubelet_fleet(args.nodes, random.Random(f"kubelet-fleet-{args.seed}"))
            capacity = sum(n.shape.cpus for n in fleet) * 0.85  # `cpu:` is CPUs to the kubelet
        stream = make_stream(capacity, args.events, random.Random(f"stream-{args.seed}"), kind != "balloons")
        ops = Counter(e["op"] + ("" if e["op"] != "create-pod" else "-model" if e["model"] else "-other")
                      for e in stream)
        shapes = Counter(n.group for n in fleet)
        kinds = Counter(n.policy + ("" if n.kubelet is None else f"/{n.kubelet['topologyManagerScope']}"
                                    + ("/full-pcpus-only" if n.kubelet["cpuManagerPolicyOptions"] else ""))
                        for n in fleet)
        when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        print(f"{kind} fleet, {when}, seed {args.seed}: {args.nodes} virtual nodes, {len(shapes)} shapes "
              f"{dict(shapes)}, {sum(n.amx for n in fleet)} with AMX, policies {dict(sorted(kinds.items()))}")
        print(f"stream: {len(stream)} events {dict(ops)}, at {args.rate}/s", flush=True)
        rows = []
        path = args.plots / f"fleet-{kind}.png"
        for arm in args.arms:
            rows.append(play_arm(kind, arm, fleet, stream, args.rate))
            print(json.dumps(rows[-1]), flush=True)
            if not args.no_plots:  # after each arm: a run cut short still leaves the arms it played
                plot(kind, rows, path, f"{kind} fleet: {args.nodes} nodes, {len(stream)} events at {args.rate}/s, "
                                       f"seed {args.seed}, {when}")
        print()
        for line in table(rows):
            print(line)
        met, why = goal(kind, rows)
        bad = bad or not met
        print(f"goal {'met' if met else 'NOT met'}: {why}\n", flush=True)
        if args.json:
            print(json.dumps(rows, indent=2))
        if not args.no_plots:
            print(f"plot: {path}")
    return 1 if bad else 0


def from_logs(kind: str, logs: list[Path], plots: Path) -> int:
    header, rows = "", []
    for log in logs:
        fleet = ""
        for line in log.read_text().splitlines():
            if " fleet, " in line and line.split(" fleet, ")[0] in FLEETS:
                fleet = line.split(" fleet, ")[0]
                if fleet == kind and not header:
                    header = line
            elif fleet == kind and line.startswith('{"arm"'):
                rows.append(json.loads(line))
    rows.sort(key=lambda r: ARMS.index(r["arm"]))
    print(header)
    for line in table(rows):
        print(line)
    met, why = goal(kind, rows)
    print(f"goal {'met' if met else 'NOT met'}: {why}")
    plot(kind, rows, plots / f"fleet-{kind}.png", header.split(": ", 1)[0] + ", arms in parallel runs")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
