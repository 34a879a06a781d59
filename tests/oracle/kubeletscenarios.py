"""The scenarios tests/oracle plays on the real kubelet (its CPU, Topology and Memory Managers, driven by the `kube
kubelet` peer) and on our ledger side by side: a machine shape and kubelet settings (`Scenario`), the Node and
NodeResourceTopology objects the cluster sees of it, pods of every kind, and `KubeletNode`, the real managers and a
live ledger fed the same pods in the same order, model pods bound as the extender binds them."""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from placement import kubelet as kub
from placement.assume import AssumeCache
from placement.cluster import ClusterState
from placement.config import KubeletGroup, Settings
from placement.demand import read_model_pod
from placement.fit import Fit
from placement.ledger import PLACEMENT
from placement.mutation import mutate_pod
from placement.topology import SMT_LABEL, CPUSet, linux_layout
from tests.oracle.kubeletpeer import KubeletPeer, Listing, Verdict

NODE = "node-0"
GROUP_LABEL = "example.com/kubelet-group"
GIB = 2**30


@dataclass(frozen=True)
class Scenario:
    seed: int
    packages: int
    numa_per_package: int
    cores_per_numa: int
    threads_per_core: int
    policy: str
    scope: str
    options: tuple[str, ...]
    reserved_cpus: str  # reservedSystemCPUs; "" to reserve `reserved_count` the kubelet's way
    reserved_count: int
    prefer_closest: bool
    nrt: bool  # the node publishes a NodeResourceTopology (node-feature-discovery's topology-updater)
    memory_policy: str = "None"  # the Memory Manager's: None or Static (which reserves 1Gi on NUMA node 0)
    memory_per_numa: int = 256 * GIB

    @property
    def numa_nodes(self) -> int:
        return self.packages * self.numa_per_package

    @property
    def cpus(self) -> int:
        return self.numa_nodes * self.cores_per_numa * self.threads_per_core

    @property
    def label(self) -> str:
        return (f"seed {self.seed}: {self.numa_nodes} NUMA ({self.packages} pkg) x {self.cores_per_numa} cores, SMT "
                f"{'on' if self.threads_per_core == 2 else 'off'}, {self.policy}/{self.scope}, "
                f"{','.join(self.options) or 'no options'}{', closest' if self.prefer_closest else ''}, reserved "
                f"{self.reserved_cpus or self.reserved_count}{', NRT' if self.nrt else ''}, Memory Manager "
                f"{self.memory_policy} ({self.memory_per_numa // GIB}Gi per NUMA node)")

    @property
    def reserved_memory(self) -> tuple[int, ...]:
        return (GIB,) if self.memory_policy == "Static" else ()

    def group(self) -> KubeletGroup:
        return KubeletGroup(
            name="oracle", node_selector={GROUP_LABEL: "oracle"}, cpu_manager_policy_options=self.options,
            topology_manager_policy=self.policy, topology_manager_scope=self.scope,  # type: ignore[arg-type]
            topology_manager_policy_options=("prefer-closest-numa-nodes",) if self.prefer_closest else (),
            reserved_system_cpus=self.reserved_cpus, packages=self.packages,
            memory_manager_policy=self.memory_policy,  # type: ignore[arg-type]
            reserved_memory=tuple(str(b) for b in self.reserved_memory))

    def settings(self) -> Settings:
        return Settings(require_amx=False, kubernetes_cpu_policy="kubelet-static",
                        kubelet_node_groups=(self.group(),))


def make_scenario(seed: int) -> Scenario:
    rng = random.Random(seed)
    numa = rng.choice((1, 2, 2, 4, 4, 8))
    packages = 1 if numa == 1 else rng.choice((1, 2)) if numa > 2 else 2
    tpc = rng.choice((1, 2, 2))
    cores = rng.randint(4, 24)
    policy = rng.choice(kub.TOPOLOGY_POLICIES)
    options = tuple(o for o in (kub.FULL_PCPUS_ONLY, kub.DISTRIBUTE_ACROSS_NUMA, kub.STRICT_RESERVATION)
                    if rng.random() < (0.8 if o == kub.FULL_PCPUS_ONLY else 0.25))
    total = numa * cores * tpc
    explicit = rng.random() < 0.4
    count = rng.choice((1, 2, 2, 4)) * (tpc if kub.FULL_PCPUS_ONLY in options else 1)
    reserved = ""
    if explicit:
        # Both threads of the first core(s) of NUMA node 0, as operators write reservedSystemCPUs.
        first = list(range(count // tpc or 1))
        reserved = str(CPUSet.of([c + level * (total // tpc) for c in first for level in range(tpc)]))
    static = rng.random() < 0.3
    return Scenario(seed, packages, numa // packages, cores, tpc, policy, rng.choice((kub.CONTAINER, kub.POD)),
                    options, reserved, count, rng.random() < 0.3 and numa > 2, rng.random() < 0.5,
                    "Static" if static else "None", rng.choice((24, 48, 96)) * GIB if static else 256 * GIB)


def machine_json(s: Scenario) -> dict[str, Any]:
    """The machine as the driver builds cadvisor's MachineInfo: Linux's numbering (linux_layout)."""
    topo = linux_layout([s.cores_per_numa] * s.numa_nodes, s.threads_per_core, "labels")
    m = kub.machine(topo, s.packages, (s.memory_per_numa,) * s.numa_nodes)
    return {"numa": [{"id": n.id, "socket": m.numa_socket[n.id], "memory": s.memory_per_numa,
                      "cores": [list(c.threads) for c in n.cores]} for n in topo.numa_nodes],
            "distances": [list(row) for row in m.distances]}


def kubelet_json(s: Scenario) -> dict[str, Any]:
    return {"reservedSystemCPUs": s.reserved_cpus, "reservedCPUs": str(s.reserved_count),
            "cpuManagerPolicyOptions": {o: "true" for o in s.options},
            "topologyManagerPolicy": s.policy, "topologyManagerScope": s.scope,
            "topologyManagerPolicyOptions": {"prefer-closest-numa-nodes": "true"} if s.prefer_closest else {},
            "memoryManagerPolicy": s.memory_policy,
            "reservedMemory": {str(i): b for i, b in enumerate(s.reserved_memory)}}


def node_object(s: Scenario) -> dict[str, Any]:
    reserved = len(CPUSet.parse(s.reserved_cpus)) if s.reserved_cpus else s.reserved_count
    memory = s.memory_per_numa * s.numa_nodes
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": NODE, "labels": {
                GROUP_LABEL: "oracle", Settings().numa_count_label: str(s.numa_nodes),
                SMT_LABEL: "true" if s.threads_per_core == 2 else "false"}},
            "spec": {}, "status": {"capacity": {"cpu": str(s.cpus), "memory": str(memory)},
                                   "allocatable": {"cpu": str(s.cpus - reserved),
                                                   "memory": str(memory - sum(s.reserved_memory))}}}


def nfd_memory(listing: Listing) -> dict[int, tuple[int, int]]:
    """Per NUMA node, memory allocatable and available as node-feature-discovery's topology-updater computes them
    from podresources (resourcemonitor's updateMemoryAvailable): each container's block taken from its NUMA nodes
    in ascending order, a node with none left skipped. Empty where the Memory Manager lists none (policy None)."""
    available = {m.numa[0]: m.size for m in listing.allocatable_memory if m.type == "memory" and len(m.numa) == 1}
    allocatable = dict(available)
    for pod in listing.pods:
        for c in pod.containers:
            for block in c.memory:
                size = block.size
                for numa in block.numa:
                    if size == 0:
                        break
                    taken = min(size, available.get(numa, 0))
                    available[numa] = available.get(numa, 0) - taken
                    size -= taken
    return {numa: (allocatable[numa], available[numa]) for numa in allocatable}


def nfd_nrt(s: Scenario, free: list[int], reserved: CPUSet, memory: Mapping[int, tuple[int, int]]) -> dict[str, Any]:
    """The NodeResourceTopology node-feature-discovery's topology-updater writes: attributes for the Topology
    Manager, one `node-N` zone per NUMA node whose cpu `allocatable` is its CPUs less the reserved ones and
    `available` that less the exclusive CPUs podresources lists, and its memory (`nfd_memory`) where the Memory
    Manager lists some."""
    topo = linux_layout([s.cores_per_numa] * s.numa_nodes, s.threads_per_core, "labels")
    zones = []
    for n in topo.numa_nodes:
        cap = len(n.cpus)
        alloc = cap - len(reserved & n.cpus)
        resources = [{"name": "cpu", "capacity": str(cap), "allocatable": str(alloc), "available": str(free[n.id])}]
        if n.id in memory:
            resources.append({"name": "memory", "capacity": str(s.memory_per_numa),
                              "allocatable": str(memory[n.id][0]), "available": str(memory[n.id][1])})
        zones.append({"name": f"node-{n.id}", "type": "Node",
                      "costs": [{"name": f"node-{j}", "value": d}
                                for j, d in enumerate(machine_json(s)["distances"][n.id])],
                      "resources": resources})
    return {"apiVersion": "topology.node.k8s.io/v1alpha2", "kind": "NodeResourceTopology",
            "metadata": {"name": NODE},
            "attributes": [{"name": "topologyManagerPolicy", "value": s.policy},
                           {"name": "topologyManagerScope", "value": s.scope}],
            "zones": zones}


def _resources(cpu: str, memory: str) -> dict[str, Any]:
    return {"requests": {"cpu": cpu, "memory": memory}, "limits": {"cpu": cpu, "memory": memory}}


def _created(name: str) -> str:
    """A creationTimestamp in the order the stream makes its pods (m7 after o6), as the apiserver stamps them."""
    digits = "".join(ch for ch in name if ch.isdigit()) or "0"
    return f"2026-12-06T12:{int(digits) // 60 % 60:02d}:{int(digits) % 60:02d}Z"


def model_pod(name: str, tp: int, cpu: int, sidecar: int = 0, init: int = 0, memory_gib: int = 8) -> dict[str, Any]:
    """A model pod as a user writes it (the webhook makes it Guaranteed), with a Guaranteed native sidecar of
    `sidecar` CPUs and a regular init container of `init` CPUs when given."""
    spec: dict[str, Any] = {"containers": [{"name": "vllm", "args": ["--tensor-parallel-size", str(tp)],
                                            "resources": _resources(str(cpu), f"{memory_gib}Gi")}]}
    inits = []
    if init:
        inits.append({"name": "fetch", "resources": _resources(str(init), "1Gi")})
    if sidecar:
        inits.append({"name": "proxy", "restartPolicy": "Always", "resources": _resources(str(sidecar), "1Gi")})
    if inits:
        spec["initContainers"] = inits
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "models", "uid": f"uid-{name}", "creationTimestamp": _created(name),
                         "labels": {"model-manager.io/model": name}},
            "spec": spec, "status": {"phase": "Pending"}}


def other_pod(name: str, kind: str, cpu: int) -> dict[str, Any]:
    """A non-model pod bound to the node by another scheduler: Guaranteed, Burstable or BestEffort."""
    container: dict[str, Any] = {"name": "app"}
    if kind == "Guaranteed":
        container["resources"] = _resources(str(cpu), "1Gi")
    elif kind == "Burstable":
        container["resources"] = {"requests": {"cpu": f"{cpu * 500}m", "memory": "512Mi"}}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "apps", "uid": f"uid-{name}", "creationTimestamp": _created(name)},
            "spec": {"nodeName": NODE, "containers": [container]}, "status": {"phase": "Running"}}


def bound(pod: dict[str, Any], placement: str | None) -> dict[str, Any]:
    meta = pod["metadata"]
    if placement is not None:
        meta = {**meta, "annotations": {**(meta.get("annotations") or {}), PLACEMENT: placement}}
    return {**pod, "metadata": meta, "spec": {**pod["spec"], "nodeName": NODE}, "status": {"phase": "Running"}}


@dataclass
class Tally:
    scenarios: int = 0
    admitted_ok: int = 0
    admitted_rejected: dict[str, int] = field(default_factory=dict)  # by the kubelet's Reason
    refused_ok: int = 0  # refused, and the kubelet would have rejected it too
    refused_needless: int = 0  # refused, but the kubelet would have admitted it
    refused_unasked: int = 0  # refused on a Static Memory Manager node, not asked of the kubelet
    drift: int = 0  # admitted, and a container's CPUs not on the NUMA nodes predicted
    exact: int = 0  # admitted with every container's cpuset as predicted
    problems: list[str] = field(default_factory=list)

    def merge(self, other: Tally) -> None:
        self.scenarios += other.scenarios
        self.admitted_ok += other.admitted_ok
        for reason, n in other.admitted_rejected.items():
            self.admitted_rejected[reason] = self.admitted_rejected.get(reason, 0) + n
        self.refused_ok += other.refused_ok
        self.refused_needless += other.refused_needless
        self.refused_unasked += other.refused_unasked
        self.drift += other.drift
        self.exact += other.exact
        self.problems.extend(other.problems)


def _numa_of(s: Scenario, cpus: CPUSet) -> set[int]:
    total = s.numa_nodes * s.cores_per_numa
    return {(c % total) // s.cores_per_numa for c in cpus}


class KubeletNode:
    """The real managers and a live ledger, fed the same pods in the same order; a model pod the ledger admits is
    bound as /bind binds it (assumed, then the watch's view of it with the placement the Binding wrote)."""

    def __init__(self, peer: KubeletPeer, scenario: Scenario) -> None:
        self.peer, self.s = peer, scenario
        self.settings = scenario.settings()
        self.cluster = ClusterState.from_objects([node_object(scenario)], self.settings)
        self.pods: dict[str, dict[str, Any]] = {}  # name -> the pod as bound
        self.tally = Tally()
        self.free: tuple[frozenset[int], ...] = ()  # the kubelet's free CPUs per NUMA node, after its last answer

    def ledger_reserved(self) -> CPUSet:
        ledger = self.cluster.ledger(NODE)
        assert ledger is not None and ledger.kubelet is not None
        return kub.cpuset(ledger.kubelet.reserved)

    def judge(self, name: str, pod: dict[str, Any], cluster: ClusterState | None = None) -> tuple[Fit, Verdict]:
        """The ledger's verdict on a model pod, and the kubelet's answer to it; kept on both only when the ledger
        admitted it. Drift is counted for the live ledger only: a rebuilt one guesses where pods of unknown
        placement are (the kubelet's choice depended on pods since gone)."""
        live = cluster is None
        cluster = cluster or self.cluster
        mutated = mutate_pod(pod, cluster).pod
        demand = read_model_pod(mutated, self.settings)
        uid = mutated["metadata"]["uid"]
        verdict = AssumeCache(cluster).assume(uid, "models", name, demand, NODE)
        t = self.tally
        if not verdict.ok and self.s.memory_policy == "Static":
            # A pod we refuse never reaches the node; asking the kubelet anyway would change its Static Memory
            # Manager's NUMA groups (a rejected or removed pod's block leaves its NUMA nodes' groups as it set them).
            t.refused_unasked += live
            return verdict, Verdict(False, None, None, {}, self.free)
        answer = self.peer.add(bound(mutated, None))
        self.free = answer.free
        if verdict.ok:
            if not answer.admit:
                t.admitted_rejected[answer.reason] = t.admitted_rejected.get(answer.reason, 0) + 1
                t.problems.append(f"{self.s.label}: {name} admitted by the ledger ({verdict.per_numa}), rejected by "
                                  f"the kubelet: {answer.reason} {answer.message}")
                cluster.drop(uid)
                return verdict, answer
            t.admitted_ok += live
            predicted = dict((n, c) for n, c in (verdict.admitted.cpus.items() if verdict.admitted else ()))
            got = {n: CPUSet(c.cpus) for n, c in answer.containers.items() if c.cpus}
            want = {n: kub.cpuset(m) for n, m in predicted.items()}
            if got == want and live:
                t.exact += 1
            if live and {n: _numa_of(self.s, c) for n, c in got.items()} != \
                    {n: _numa_of(self.s, c) for n, c in want.items()}:
                t.drift += 1
                t.problems.append(f"{self.s.label}: {name} drift: predicted {want}, got {got}")
            placed = bound(mutated, AssumeCache(cluster).placement(uid))
            cluster.apply("Pod", "ADDED", placed)
            if cluster is self.cluster:
                self.pods[name] = placed
        else:
            if answer.admit:
                t.refused_needless += live
                _, self.free = self.peer.remove(uid)
            else:
                t.refused_ok += live
        return verdict, answer

    def add_other(self, name: str, kind: str, cpu: int) -> bool:
        pod = other_pod(name, kind, cpu)
        ledger = self.cluster.ledger(NODE)
        assert ledger is not None and ledger.kubelet is not None and ledger.kstate is not None
        if self.s.memory_policy == "Static" and isinstance(
                kub.admit(ledger.kubelet, ledger.kstate, kub.kubelet_pod(pod["metadata"]["uid"], pod["spec"])),
                kub.Rejected):
            # Another scheduler's pod the kubelet would fail: its partial memory block would leave the Static
            # Memory Manager's NUMA groups changed, which no object shows (docs/design.md); not played.
            return False
        answer = self.peer.add(pod)
        self.free = answer.free
        if not answer.admit:
            return False  # the kubelet failed it: terminal, and no ledger counts it
        self.cluster.apply("Pod", "ADDED", pod)
        self.pods[name] = pod
        return True

    def delete(self, name: str) -> None:
        pod = self.pods.pop(name)
        _, self.free = self.peer.remove(pod["metadata"]["uid"])
        self.cluster.apply("Pod", "DELETED", pod)

    def nrt(self) -> dict[str, Any]:
        memory = nfd_memory(self.peer.podresources())
        return nfd_nrt(self.s, [len(f) for f in self.free], self.ledger_reserved(), memory)

    def rebuilt(self, annotated: bool = True, with_nrt: bool = False) -> ClusterState:
        pods = [pod if annotated else {**pod, "metadata": {**pod["metadata"], "annotations": {
            k: v for k, v in (pod["metadata"].get("annotations") or {}).items() if k != PLACEMENT}}}
            for pod in self.pods.values()]
        return ClusterState.from_objects([node_object(self.s), *pods, *([self.nrt()] if with_nrt else [])],
                                         self.settings)


def play(peer: KubeletPeer, scenario: Scenario, events: int = 24) -> KubeletNode:
    """One random stream on one node: model pods of TP 1/2/4 (whole and odd CPU counts, sidecars, init
    containers), non-model pods of every QoS class, deletes; then ledgers rebuilt from the list (with the placements
    the Bindings wrote, and without them but with the node's NodeResourceTopology) must hold what the live one
    holds, and never admit what the kubelet rejects."""
    rng = random.Random(scenario.seed * 7919)
    node = KubeletNode(peer, scenario)
    s = scenario
    numa_cpus = s.cores_per_numa * s.threads_per_core
    for i in range(events):
        roll = rng.random()
        if roll < 0.2 and node.pods:
            node.delete(rng.choice(sorted(node.pods)))
        elif roll < 0.45:
            kind = rng.choice(("Guaranteed", "Guaranteed", "Burstable", "BestEffort"))
            node.add_other(f"o{i}", kind, rng.randint(1, max(1, numa_cpus // 4)))
        else:
            tp = rng.choice([t for t in (1, 1, 2, 4) if t <= s.numa_nodes])
            cpu = rng.randint(1, max(2, numa_cpus * tp * 5 // 4))
            sidecar = rng.choice((0, 0, 1, 2))
            init = rng.choice((0, 0, 0, 2, numa_cpus))
            memory = rng.choice((4, 8, 16, 32, 64))
            node.judge(f"m{i}", model_pod(f"m{i}", tp, cpu, sidecar, init, memory))
    return node


def play_scenario(seed: int) -> Tally:
    """Scenario `seed` on a fresh peer: the stream, then ledgers rebuilt from the list (a relist, a restart, a
    standby) with the placements the Bindings wrote and the node's NodeResourceTopology holding the same free CPUs
    on every NUMA node as the live one, and every rebuilt ledger (with or without the placements and the
    NodeResourceTopology) judging what comes next as the kubelet does."""
    scenario = make_scenario(seed)
    with KubeletPeer() as peer:
        started = peer.start(machine_json(scenario), kubelet_json(scenario))
        tally = Tally(scenarios=1)
        if not started.ok:
            tally.problems.append(f"{scenario.label}: the kubelet would not start: {started.error}")
            return tally
        node = play(peer, scenario)
        if node.ledger_reserved() != CPUSet(started.reserved):
            tally.problems.append(f"{scenario.label}: the ledger reserves {node.ledger_reserved()}, the kubelet "
                                  f"{CPUSet(started.reserved)}")
        live = node.cluster.ledger(NODE)
        again = node.rebuilt(with_nrt=True).ledger(NODE)
        assert live is not None and live.kubelet is not None and live.kstate is not None
        assert again is not None and again.kubelet is not None and again.kstate is not None
        ours, theirs = kub.free_per_numa(again.kubelet, again.kstate), kub.free_per_numa(live.kubelet, live.kstate)
        if ours != theirs:
            tally.problems.append(f"{scenario.label}: rebuilt with the NRT has free CPUs {ours} where the live ledger "
                                  f"has {theirs}")
        if again.memory_unknown:
            tally.problems.append(f"{scenario.label}: rebuilt with the placements and the NRT, the Memory Manager's "
                                  f"state is taken for unknown ({len(again.memory_unknown)} pods)")
        for annotated, with_nrt in ((True, False), (False, True), (False, False)):
            rebuilt = node.rebuilt(annotated=annotated, with_nrt=with_nrt)
            for i in range(3):
                name = f"after{int(annotated)}{int(with_nrt)}{i}"
                verdict, answer = node.judge(name, model_pod(name, 1, 2 + 6 * i), cluster=rebuilt)
                if verdict.ok and answer.admit:
                    peer.remove(f"uid-{name}")
        tally.merge(node.tally)
        return tally
