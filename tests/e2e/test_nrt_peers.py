"""The field's NUMA-aware pipeline on kubelet-static nodes, each piece the real one (tests/e2e/nrt.py): the
kubelet's podresources API serving a node's CPU and memory manager state, node-feature-discovery's topology-updater
v0.19.0 writing the node's NodeResourceTopology from it, and kube-scheduler with scheduler-plugins'
NodeResourceTopologyMatch (v0.35.4-devel) placing Guaranteed pods from those NRTs.

Three nodes of 2 NUMA nodes x 8 cores x 2 threads (NUMA node 0: CPUs 0-7,16-23; node 1: 8-15,24-31), kubelet
static CPU manager with reservedSystemCPUs 0,16 and Topology Manager single-numa-node, container scope:
- nrt-full: 12 exclusive CPUs taken on each NUMA node, so 2 and 4 left: a 6-CPU container fits no NUMA node,
  though the node has 6 free CPUs in all (stock kube-scheduler would bind it and the kubelet reject it);
- nrt-room: 4 taken on NUMA node 0 and 1 GiB of a Burstable pod's memory that NFD must not count;
- nrt-nomem: nothing taken, but the memory manager's policy is None, so podresources reports no memory per NUMA
  node and NFD's NRT has none.
The pods holding CPUs exist in the apiserver (NFD looks each one up for its QoS), Running, bound by no scheduler
(foreign to the NRT scheduler). The nodes are tainted so that no other test's pod lands there.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any

import pytest

from tests.e2e.cluster import Cluster, node, wait_until
from tests.e2e.nrt import (
    SCHEDULER_NAME,
    PodResources,
    TopologyUpdaters,
    install_topology_updaters,
    node_resource_topology,
    pods_fingerprint,
    start_nrt_scheduler,
)
from tests.oracle.sysfs import NodeShape
from tests.peers.build import module_source

NS = "nrt"
TAINT = {"key": "e2e.model-placement.io/nrt", "value": "true", "effect": "NoSchedule"}
POOL = "e2e.model-placement.io/nrt-pool"
SHAPE = NodeShape(packages=2, numa_per_package=1, cores_per_numa=8, threads_per_core=2, memory_gib_per_numa=64)
GI = 2**30
ALLOCATABLE_CPUS = [c for c in range(SHAPE.cpus) if c not in (0, 16)]
KUBELET = {"apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
           "cpuManagerPolicy": "static", "reservedSystemCPUs": "0,16", "topologyManagerPolicy": "single-numa-node",
           "topologyManagerScope": "container", "memoryManagerPolicy": "Static",
           # the memory manager's rule: reservedMemory adds up to systemReserved + kubeReserved + evictionHard
           "systemReserved": {"memory": "924Mi"}, "evictionHard": {"memory.available": "100Mi"},
           "reservedMemory": [{"numaNode": 0, "limits": {"memory": "1Gi"}}]}
# The memory manager's allocatable memory per NUMA node: each node's, less reservedMemory on node 0.
ALLOCATABLE_MEMORY = {0: 63 * GI, 1: 64 * GI}
MEMORY = [{"type": "memory", "size": size, "numa": numa} for numa, size in ALLOCATABLE_MEMORY.items()]


@dataclass
class Held:
    """A pod holding exclusive CPUs (and memory) on a node, as the kubelet's managers gave them."""

    name: str
    cpus: list[int]
    numa: int
    guaranteed: bool = True

    def pod(self, node_name: str) -> dict[str, Any]:
        quantity = {"cpu": str(len(self.cpus)), "memory": f"{len(self.cpus)}Gi"}
        resources = {"requests": quantity, "limits": quantity} if self.guaranteed else {"requests": quantity}
        return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": self.name, "namespace": NS},
                "spec": {"nodeName": node_name, "tolerations": [TAINT],
                         "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                                         "resources": resources}]}}

    def podresources(self) -> dict[str, Any]:
        # A Burstable container gets neither exclusive CPUs nor a memory manager block; the blocks are listed
        # here anyway to show that NFD ignores whatever a non-Guaranteed pod reports.
        return {"namespace": NS, "name": self.name, "containers": [{
            "name": "main", "cpu_ids": self.cpus if self.guaranteed else [],
            "memory": [{"type": "memory", "size": len(self.cpus) * GI, "numa": self.numa}]}]}


NODES: dict[str, tuple[list[Held], dict[str, Any]]] = {
    "nrt-full": ([Held("full-0", [1, 2, 3, 4, 5, 6, 17, 18, 19, 20, 21, 22], 0),
                  Held("full-1", [8, 9, 10, 11, 12, 13, 24, 25, 26, 27, 28, 29], 1)], KUBELET),
    "nrt-room": ([Held("room-0", [1, 2, 17, 18], 0), Held("room-burstable", [3], 0, guaranteed=False)], KUBELET),
    "nrt-nomem": ([], {**KUBELET, "memoryManagerPolicy": "None", "reservedMemory": []}),
}


def state(held: list[Held], kubelet: dict[str, Any]) -> dict[str, Any]:
    """What the kubelet driver's `podresources` op answers for this node."""
    memory = MEMORY if kubelet["memoryManagerPolicy"] == "Static" else []
    pods = [h.podresources() for h in held]
    if not memory:
        for p in pods:
            for c in p["containers"]:
                c["memory"] = []
    return {"allocatable": {"cpu_ids": ALLOCATABLE_CPUS, "memory": memory}, "pods": pods}


@dataclass
class Fleet:
    updaters: TopologyUpdaters
    podresources: dict[str, PodResources]
    namespace_uid: str
    figures: dict[str, float]


@pytest.fixture(scope="module")
def fleet(cluster: Cluster) -> Iterator[Fleet]:
    cluster.create_namespace(NS, enabled=False)
    started = time.monotonic()
    updaters = install_topology_updaters(cluster, update_interval="1s")
    figures = {"install_s": round(time.monotonic() - started, 2)}
    serving: dict[str, PodResources] = {}
    names = list(NODES)
    try:
        for name, (held, kubelet) in NODES.items():
            n = node(name, numa=SHAPE.numa_nodes, cores_per_numa=SHAPE.cores_per_numa, labels={POOL: "true"},
                     memory_gi=SHAPE.memory_gib_per_numa * SHAPE.numa_nodes)
            n["spec"]["taints"] = [TAINT]
            cluster.create_nodes([n])
            for h in held:
                cluster.api.call("POST", f"/api/v1/namespaces/{NS}/pods", h.pod(name))
                cluster.api.call("PATCH", f"/api/v1/namespaces/{NS}/pods/{h.name}/status",
                                 {"status": {"phase": "Running"}},
                                 content_type="application/strategic-merge-patch+json")
            socket = cluster.root / "nrt" / f"{name}.sock"
            socket.parent.mkdir(exist_ok=True)
            serving[name] = PodResources(socket, cluster.logs / f"podresources-{name}.log")
            serving[name].set(state(held, kubelet))
            updaters.start(name, SHAPE, kubelet, socket)
        started = time.monotonic()
        wait_until("every node's NodeResourceTopology",
                   lambda: all(node_resource_topology(cluster, n) for n in names), timeout=60)
        figures["first_nrt_s"] = round(time.monotonic() - started, 2)
        uid = cluster.api.get("/api/v1/namespaces/node-feature-discovery")["metadata"]["uid"]
        yield Fleet(updaters, serving, uid, figures)
    finally:
        print("nrt figures:", figures)
        for name in names:
            comp = cluster.components.pop(f"nfd-topology-updater-{name}", None)
            if comp is not None:
                comp.stop()
            if name in serving:
                serving[name].close()
        cluster.kubectl("-n", NS, "delete", "pods", "--all", "--grace-period=0", "--force", check=False)
        cluster.kubectl("delete", "noderesourcetopologies", *names, check=False)
        cluster.kubectl("delete", "nodes", *names, check=False)


def _zones(nrt: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Zones by name, each with its resources by name: NFD builds both from Go maps, in no fixed order."""
    return {z["name"]: {**z, "resources": {r["name"]: r for r in z["resources"]}} for z in nrt["zones"]}


def _resource(name: str, capacity: int, allocatable: int, available: int) -> dict[str, Any]:
    return {"name": name, "capacity": str(capacity), "allocatable": str(allocatable), "available": str(available)}


def _expected_zones(memory: bool, cpu_taken: tuple[int, int], memory_taken: tuple[int, int]) -> dict[str, Any]:
    costs = {0: [{"name": "node-0", "value": 10}, {"name": "node-1", "value": 21}],
             1: [{"name": "node-0", "value": 21}, {"name": "node-1", "value": 10}]}
    allocatable_cpus = {0: 14, 1: 16}  # 16 per NUMA node, less the reserved 0 and 16 on node 0
    zones = {}
    for numa in (0, 1):
        resources = {"cpu": _resource("cpu", 16, allocatable_cpus[numa], allocatable_cpus[numa] - cpu_taken[numa])}
        if memory:
            # capacity: the NUMA node's MemTotal in sysfs; allocatable: the memory manager's block
            allocatable = ALLOCATABLE_MEMORY[numa]
            resources["memory"] = _resource("memory", 64 * GI, allocatable, allocatable - memory_taken[numa] * GI)
        zones[f"node-{numa}"] = {"name": f"node-{numa}", "type": "Node", "costs": costs[numa], "resources": resources}
    return zones


def test_topology_updater_writes_what_the_kubelet_reports(cluster: Cluster, fleet: Fleet) -> None:
    """NFD's NRT for each node, field for field, from the podresources state, the kubelet configuration file
    and the sysfs: exclusive CPUs and memory blocks of Guaranteed pods only, capacity = allocatable + the
    reserved CPUs of that NUMA node, the Topology Manager's policy and scope verbatim, and the fingerprint of
    every pod podresources lists (Burstable ones too). Then pods leave: the next NRT follows, except that once
    none is left the fingerprint of the last pod set stays."""
    owner = [{"apiVersion": "v1", "kind": "Namespace", "name": "node-feature-discovery", "uid": fleet.namespace_uid}]
    expected = {
        "nrt-full": _expected_zones(True, (12, 12), (12, 12)),
        "nrt-room": _expected_zones(True, (4, 0), (4, 0)),
        "nrt-nomem": _expected_zones(False, (0, 0), (0, 0)),
    }
    for name, (held, _kubelet) in NODES.items():
        nrt = node_resource_topology(cluster, name)
        assert nrt is not None
        attributes = [{"name": "topologyManagerPolicy", "value": "single-numa-node"},
                      {"name": "topologyManagerScope", "value": "container"}]
        if held:  # NFD v0.19.0 publishes no fingerprint for a node with no pods at all
            attributes.append({"name": "nodeTopologyPodsFingerprint",
                               "value": pods_fingerprint([(NS, h.name) for h in held])})
        got = {k: v for k, v in nrt.items() if k not in ("metadata", "zones")}
        assert got == {"apiVersion": "topology.node.k8s.io/v1alpha2", "kind": "NodeResourceTopology",
                       "topologyPolicies": ["SingleNUMANodeContainerLevel"], "attributes": attributes}, name
        assert nrt["metadata"]["ownerReferences"] == owner
        # v0.19.0 writes by create and update (server-side apply came after it, unreleased)
        assert {(m["manager"], m["operation"]) for m in nrt["metadata"]["managedFields"]} == {
            ("nfd-topology-updater", "Update")}
        assert _zones(nrt) == expected[name], name

    # room-0 (4 CPUs, 4 GiB on NUMA node 0) ends: the kubelet stops listing it.
    room_0, burstable = NODES["nrt-room"][0]
    started = time.monotonic()
    after = _next_nrt(cluster, fleet, "nrt-room", [burstable])
    fleet.figures["update_s"] = round(time.monotonic() - started, 2)
    assert _zones(after) == _expected_zones(True, (0, 0), (0, 0))
    assert after["attributes"][-1] == {"name": "nodeTopologyPodsFingerprint",
                                       "value": pods_fingerprint([(NS, burstable.name)])}
    # Back, then every pod ends: the kubelet lists none, and NFD v0.19.0 keeps the last fingerprint it wrote
    # (it adds one only when podresources lists a pod, and an update keeps the attributes it does not set), so
    # the NRT names a pod set the node no longer runs.
    _next_nrt(cluster, fleet, "nrt-room", [room_0, burstable])
    emptied = _next_nrt(cluster, fleet, "nrt-room", [])
    assert _zones(emptied) == _expected_zones(True, (0, 0), (0, 0))
    assert emptied["attributes"][-1] == {"name": "nodeTopologyPodsFingerprint",
                                         "value": pods_fingerprint([(NS, room_0.name), (NS, burstable.name)])}
    fleet.podresources["nrt-room"].set(state(NODES["nrt-room"][0], KUBELET))
    wait_until("nrt-room's NRT with room-0 again",
               lambda: _zones(node_resource_topology(cluster, "nrt-room") or {"zones": []}) == expected["nrt-room"],
               timeout=30)


def _next_nrt(cluster: Cluster, fleet: Fleet, name: str, held: list[Held]) -> dict[str, Any]:
    """The node's NRT once NFD has written it again after the kubelet's state became `held`."""
    before = node_resource_topology(cluster, name)
    assert before is not None
    fleet.podresources[name].set(state(held, NODES[name][1]))
    return wait_until(f"{name}'s NRT after its pods became {[h.name for h in held]}", lambda: (
        (n := node_resource_topology(cluster, name))
        and n["metadata"]["resourceVersion"] != before["metadata"]["resourceVersion"] and n), timeout=30)


def test_pods_fingerprint_is_podfingerprints() -> None:
    """`pods_fingerprint` signs a pod set as podfingerprint v0.3.0 (what NFD and the scheduler link) does, on
    that module's own golden files."""
    testdata = module_source("nrt", "github.com/k8stopologyawareschedwg/podfingerprint") / "testdata"
    cases = sorted(testdata.glob("*.txt"))
    assert len(cases) >= 6
    for case in cases:
        pods = [(line.split()[0], line.split()[1]) for line in case.read_text().splitlines() if line.strip()]
        assert pods_fingerprint(pods) == case.with_suffix(".sign").read_text().strip(), case.name


def _pod(name: str, nodes: list[str], prefer: str | None = None) -> dict[str, Any]:
    """A Guaranteed pod of 6 exclusive CPUs and 6 GiB for the NRT scheduler, allowed on `nodes`."""
    quantity = {"cpu": "6", "memory": "6Gi"}
    affinity: dict[str, Any] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In",
                                                     "values": nodes}]}]}}}
    if prefer:
        affinity["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"] = [{"weight": 100, "preference": {
            "matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": [prefer]}]}}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS},
            "spec": {"schedulerName": SCHEDULER_NAME, "tolerations": [TAINT], "affinity": affinity,
                     "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                                     "resources": {"requests": quantity, "limits": quantity}}]}}


def _unschedulable(cluster: Cluster, name: str) -> dict[str, Any] | None:
    verdict = _scheduled(cluster, name)
    return verdict if verdict and verdict["status"] == "False" else None


def _scheduled(cluster: Cluster, name: str) -> dict[str, Any] | None:
    pod = cluster.api.get(f"/api/v1/namespaces/{NS}/pods/{name}")
    for cond in pod["status"].get("conditions", []):
        if cond["type"] == "PodScheduled":
            return {"status": cond["status"], "reason": cond.get("reason"), "message": cond.get("message", ""),
                    "node": pod["spec"].get("nodeName")}
    return None


def _flushed(log: str) -> set[str]:
    """The nodes whose cached NRT the scheduler's resync replaced (its `"flushing" node=...` lines, at -v=2)."""
    return {m.group(1) for m in re.finditer(r'"flushing".* node="([^"]+)"', log)}


def test_nrt_scheduler_binds_where_a_numa_node_has_room(cluster: Cluster, fleet: Fleet) -> None:
    """The scheduler's cache takes NFD's NRTs once their pod fingerprints match the Running pods it sees (the
    nodes hold foreign pods with exclusive CPUs, so until then they are "invalid node topology data"); then a
    6-CPU Guaranteed container is filtered off nrt-full (no NUMA node has 6 free) and off nrt-nomem (its NRT has
    no memory per NUMA node, and the plugin requires every requested resource in one zone: scheduler-plugins#249,
    so a node whose kubelet runs the memory manager's None policy takes no Guaranteed pod at all), and bound to
    nrt-room, even when its affinity prefers nrt-full."""
    started = time.monotonic()
    scheduler = start_nrt_scheduler(cluster)
    try:
        # Resync every 5 s: the foreign-pod marks on nrt-full and nrt-room clear once NFD's fingerprint matches.
        wait_until("the NRT scheduler to flush nrt-full and nrt-room", lambda: _flushed(scheduler.log.read_text(
            errors="replace")) >= {"nrt-full", "nrt-room"}, timeout=60)
        fleet.figures["resync_s"] = round(time.monotonic() - started, 2)
        cluster.create_pods([_pod("on-full", ["nrt-full"]), _pod("on-nomem", ["nrt-nomem"])])
        for name in ("on-full", "on-nomem"):
            verdict = wait_until(f"{name} unschedulable", partial(_unschedulable, cluster, name), timeout=60)
            assert verdict["reason"] == "Unschedulable"
            # the one node its affinity allows, refused by the plugin's Filter (the others fail earlier filters)
            assert re.match(r"0/\d+ nodes are available: (.*, )?1 cannot align container[,.]", verdict["message"]), \
                verdict
        started = time.monotonic()
        cluster.create_pods([_pod("anywhere", ["nrt-full", "nrt-room", "nrt-nomem"], prefer="nrt-full")])
        bound = wait_until("anywhere bound", lambda: (
            (s := _scheduled(cluster, "anywhere")) and s["status"] == "True" and s), timeout=60)
        fleet.figures["bind_s"] = round(time.monotonic() - started, 2)
        assert bound["node"] == "nrt-room"
        # Why the plugin refused each node, from its own log: CPUs on nrt-full, memory on nrt-nomem.
        refused = set(re.findall(r'"cannot align container" pod="nrt/([^"]+)".* node="([^"]+)".* reason="([^"]+)"',
                                 scheduler.log.read_text(errors="replace")))
        assert refused == {("on-full", "nrt-full", "cpu"), ("on-nomem", "nrt-nomem", "memory"),
                           ("anywhere", "nrt-full", "cpu"), ("anywhere", "nrt-nomem", "memory")}
    finally:
        cluster.components.pop("nrt-scheduler", scheduler).stop()
