"""The scenarios tests/oracle plays on the real balloons plugin and on our ledger side by side: a node's shape and
BalloonsPolicy (`Group`: the generated policy or a hand-written kind), its Node and BalloonsPolicy objects, the
NodeResourceTopology the plugin exports, and `Node`, the plugin and a live ledger fed the same pods in the same
order, model pods bound as the extender binds them."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass
from typing import Any

from placement.assume import AssumeCache
from placement.balloons import NUMA_TYPE, node_balloons_policy
from placement.cluster import ClusterState
from placement.config import Settings
from placement.demand import read_model_pod
from placement.fit import Fit
from placement.ledger import PLACEMENT
from placement.mutation import mutate_pod
from placement.topology import SMT_LABEL, linux_layout
from tests.oracle.judge import cores_by_numa
from tests.oracle.kubelet import PodRun, peer_pod, run_pod
from tests.oracle.peer import BalloonsPeer
from tests.oracle.sysfs import NodeShape

SETTINGS = Settings(require_amx=False)
NODE = "node-0"
POLICIES = ("generated", "generated", "generated", "generated-capped", "plain", "plain-shared", "elastic")


@dataclass(frozen=True)
class Group:
    seed: int
    shape: NodeShape
    policy: str
    # The TPs whose `vllm-balloon-tp<N>` type the policy leaves out: their pods resolve to best-effort and the
    # plugin serves them from the shared balloon their namespace routes to.
    lacking: tuple[int, ...] = ()
    # Streams with init containers up to the node's size and sidecar-less best-effort fallbacks (`widened`);
    # off for the groups of older tests and regressions, whose streams must replay as they were found.
    widened: bool = False

    @property
    def label(self) -> str:
        s = self.shape
        return (f"{s.numa_nodes} NUMA ({s.packages} pkg) x {s.cores_per_numa} cores, "
                f"SMT {'on' if s.threads_per_core == 2 else 'off'}, {self.policy}"
                + (f" without TP {'/'.join(map(str, self.lacking))}" if self.lacking else ""))


def make_group(seed: int, widened: bool = False) -> Group:
    """The group of `seed`; `widened`, one of the kinds issue 39 found the first draw missed: the hand-written
    policy without hideHyperthreads (`threads`), policies lacking some TP's type, streams with init containers.
    Their draws come from a second generator, so the first draw of every seed is what it was."""
    rng = random.Random(seed)
    numa = rng.choice((1, 2, 2, 4, 4, 8))
    packages = 1 if numa == 1 else rng.choice((1, 2)) if numa > 2 else 2
    shape = NodeShape(packages=packages, numa_per_package=numa // packages, cores_per_numa=rng.randint(16, 60),
                      threads_per_core=rng.choice((1, 2, 2)))
    group = Group(seed, shape, rng.choice(POLICIES))
    if not widened:
        return group
    more = random.Random(f"widened-{seed}")
    policy = "threads" if more.random() < 0.2 else group.policy
    tps = [tp for tp in (1, 2, 4, 8) if tp <= numa]
    lacking = tuple(sorted(more.sample(tps, more.randint(1, len(tps))))) if more.random() < 0.3 else ()
    return Group(seed, shape, policy, lacking, widened=True)


def policy_spec(group: Group) -> dict[str, Any]:
    shape = group.shape
    topo = linux_layout([shape.cores_per_numa] * shape.numa_nodes, shape.threads_per_core, "labels")
    rng = random.Random(group.seed)
    profile = rng.choice(("siblings", "minimal", "standard", "observability"))
    spec = node_balloons_policy(NODE, topo, Settings(nri_deployment_profile=profile), "kube-system")["spec"]
    types = spec["balloonTypes"]
    if group.policy == "generated-capped":
        for btype in types:
            if btype["name"] == "vllm-balloon-tp1":
                btype["maxBalloons"] = rng.randint(1, 3)
            if btype["name"].startswith(NUMA_TYPE) and rng.random() < 0.5:
                btype["maxCPUs"] = rng.choice((8, 16, 24))
    elif group.policy in ("plain", "plain-shared"):
        # The usual hand-written shape: one plain hide-hyperthreads type per TP, the reserved type for kube-system only.
        spec["balloonTypes"] = [{"name": "reserved", "namespaces": ["kube-system"]}] + [
            {"name": f"vllm-balloon-tp{tp}", "hideHyperthreads": True,
             **({"preferNewBalloons": True} if group.policy == "plain" else {})}
            for tp in (1, 2, 4, 8) if tp <= shape.numa_nodes]
    elif group.policy == "elastic":
        # Generated types, but a reserved balloon that grows and kube-system alone routed to it.
        types[0] = {"name": "reserved", "namespaces": ["kube-system"]}
    elif group.policy == "threads":
        # Another usual hand-written shape (issue 39): a reserved CPU count, one plain type per TP that shows the
        # hyperthreads, no minBalloons, no preferNewBalloons, and the plugin's built-in reserved and default types.
        spec = {"reservedResources": {"cpu": str(rng.choice((1, 2, 4)))},
                "balloonTypes": [{"name": f"vllm-balloon-tp{tp}"} for tp in (1, 2, 4, 8) if tp <= shape.numa_nodes]}
    if group.lacking:
        lacking = {f"vllm-balloon-tp{tp}" for tp in group.lacking}
        spec["balloonTypes"] = [t for t in spec["balloonTypes"] if t["name"] not in lacking]
    return spec


def node_objects(group: Group, spec: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The Node and its BalloonsPolicy (the group's, or `spec`)."""
    shape = group.shape
    node = {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": NODE, "labels": {
                SETTINGS.numa_count_label: str(shape.numa_nodes),
                SMT_LABEL: "true" if shape.threads_per_core == 2 else "false"}},
            "spec": {}, "status": {"capacity": {"cpu": str(shape.cpus)}, "allocatable": {"cpu": str(shape.cpus)}}}
    policy = {"apiVersion": "config.nri/v1alpha1", "kind": "BalloonsPolicy",
              "metadata": {"name": f"node.{NODE}", "namespace": "kube-system"},
              "spec": spec or policy_spec(group), "status": {"nodes": {NODE: {"status": "Success", "generation": 1}}}}
    return [node, policy]


def exported_nrt(node: BalloonsPeer, containers: bool = True) -> dict[str, Any]:
    """The NodeResourceTopology the plugin's agent writes from its zones (field names as the CRD spells them); its
    container zones only with `containers` (showContainersInNrt, which the peer turns on for the judge's sake)."""
    zones = [{"name": z["Name"], "type": z["Type"], **({"parent": z["Parent"]} if z.get("Parent") else {}),
              "attributes": [{"name": a["Name"], "value": a["Value"]} for a in z.get("Attributes") or ()]}
             for z in node.request("balloons")["zones"] if containers or z["Type"] != "allocation for container"]
    return {"apiVersion": "topology.node.k8s.io/v1alpha2", "kind": "NodeResourceTopology",
            "metadata": {"name": NODE}, "zones": zones}


def bound_pod(pod: dict[str, Any], placement: str | None = None) -> dict[str, Any]:
    meta = pod["metadata"]
    if placement is not None:
        meta = {**meta, "annotations": {**(meta.get("annotations") or {}), PLACEMENT: placement}}
    return {**pod, "metadata": meta, "spec": {**pod["spec"], "nodeName": NODE}, "status": {"phase": "Running"}}


def model_pod(name: str, tp: int, cpu: int | str, init: int | None = None) -> dict[str, Any]:
    """A Guaranteed model pod of `cpu` (cores, in the webhook's cores mode) in namespace models; with an init
    container of `init` CPUs (a weights download, say) when given."""
    resources = {"requests": {"cpu": str(cpu), "memory": "8Gi"}, "limits": {"cpu": str(cpu), "memory": "8Gi"}}
    spec: dict[str, Any] = {"containers": [{"name": "vllm", "args": ["--tensor-parallel-size", str(tp)],
                                            "resources": resources}]}
    if init is not None:
        fetch = {"cpu": str(init), "memory": "1Gi"}
        spec["initContainers"] = [{"name": "fetch", "resources": {"requests": fetch, "limits": fetch}}]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "models", "uid": f"uid-{name}",
                         "labels": {"model-manager.io/model": name}},
            "spec": spec, "status": {"phase": "Pending"}}


def system_pod(name: str, namespace: str, cpu: int, annotations: dict[str, str] | None = None,
               burstable: bool = False) -> dict[str, Any]:
    """A non-model pod, Guaranteed (or Burstable: no limits), bound to the node."""
    requests = {"cpu": str(cpu), "memory": "1Gi"}
    resources = {"requests": requests} if burstable else {"requests": requests, "limits": requests}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}",
                         **({"annotations": annotations} if annotations else {})},
            "spec": {"nodeName": NODE, "containers": [{"name": "agent", "resources": resources}]},
            "status": {"phase": "Running"}}


class Node:
    """The real plugin and a live ledger, fed the same pods in the same order; a model pod the ledger admits is
    bound as /bind binds it (assumed, then the watch's view of it with the placement the Binding wrote)."""

    def __init__(self, plugin: BalloonsPeer, group: Group, spec: dict[str, Any] | None = None) -> None:
        self.plugin, self.group, self.shape, self.spec = plugin, group, group.shape, spec
        self.cluster = ClusterState.from_objects(node_objects(group, spec), SETTINGS)
        # Built now, empty, so that it follows every pod as it comes (one built on first read from the pods listed
        # then would be a ledger rebuilt from a list, which does not know their history).
        self.cluster.ledger(NODE)
        self.pods: dict[str, tuple[dict[str, Any], PodRun]] = {}
        self.left: set[str] = set()  # pods whose containers are gone while their objects stay (`leave`)

    def add_model(self, name: str, tp: int, cpu: int | str, cluster: ClusterState | None = None,
                  init: int | None = None) -> tuple[Fit, dict[int, int]]:
        """The ledger's verdict (of `cluster`, the live one by default), and where the plugin put the model's cores
        ({} when it failed it, or an init container before it); the pod stays on both only if the ledger admitted
        it."""
        cluster = cluster or self.cluster
        mutated = mutate_pod(model_pod(name, tp, cpu, init), cluster).pod
        demand = read_model_pod(mutated, SETTINGS)
        assert demand is not None
        uid = mutated["metadata"]["uid"]
        verdict = AssumeCache(cluster).assume(uid, "models", name, demand, NODE)
        run = peer_pod(mutated)
        created = run_pod(self.plugin, run).get(demand.container)
        got = cores_by_numa(self.shape, next(b.cpus for b in self.plugin.balloons()
                                             if f"models/{name}/{demand.container}" in b.containers)) \
            if created is not None and created.ok else {}
        if verdict.ok:
            bound = bound_pod(mutated, AssumeCache(cluster).placement(uid))
            cluster.apply("Pod", "ADDED", bound)
            self.pods[name] = (bound, run)
        else:
            self.plugin.remove_pod(run.pod)
        return verdict, dict(got)

    def add_system(self, name: str, namespace: str, cpu: int, annotations: dict[str, str] | None = None,
                   burstable: bool = False) -> bool:
        """False when the plugin has no room for it (the kubelet would fail it): it is not kept."""
        pod = system_pod(name, namespace, cpu, annotations, burstable)
        run = peer_pod(pod)
        if not all(c.ok for c in run_pod(self.plugin, run).values()):
            self.plugin.remove_pod(run.pod)
            return False
        self.cluster.apply("Pod", "ADDED", pod)
        self.pods[name] = (pod, run)
        return True

    def delete(self, name: str) -> None:
        pod, run = self.pods.pop(name)
        if name not in self.left:
            self.plugin.remove_pod(run.pod)
        self.left.discard(name)
        self.cluster.apply("Pod", "DELETED", pod)

    def leave(self, name: str) -> None:
        """The pod is being deleted and the kubelet has removed its containers, but its object is not gone yet: the
        watch shows it with a deletionTimestamp (`delete` ends it)."""
        pod, run = self.pods[name]
        self.plugin.remove_pod(run.pod)
        self.left.add(name)
        pod = {**pod, "metadata": {**pod["metadata"], "deletionTimestamp": "2026-12-06T05:06:36Z"}}
        self.pods[name] = (pod, run)  # as a relist would show it
        self.cluster.apply("Pod", "MODIFIED", pod)

    def rebuilt(self, annotated: bool = True, nrt: dict[str, Any] | None = None) -> ClusterState:
        """A ledger rebuilt from a list of what runs (as after a relist, a restart or a failover), with or without
        the placements the Bindings wrote, and the plugin's export where given."""
        pods = [pod if annotated else {**pod, "metadata": {**pod["metadata"], "annotations": {
            k: v for k, v in (pod["metadata"].get("annotations") or {}).items() if k != PLACEMENT}}}
            for pod, _ in self.pods.values()]
        return ClusterState.from_objects([*node_objects(self.group, self.spec), *pods, *([nrt] if nrt else [])],
                                         SETTINGS)

    def free(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Free model cores per NUMA node: the ledger's, and the plugin's (cores in no balloon)."""
        ledger = self.cluster.ledger(NODE)
        assert ledger is not None
        used: Counter[int] = Counter()
        for balloon in self.plugin.balloons():
            used.update(cores_by_numa(self.shape, balloon.cpus))
        return ledger.free(), tuple(self.shape.cores_per_numa - used[i] for i in range(len(ledger.capacity)))
