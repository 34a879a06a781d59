"""Judged by the kubelet: model pods applied with kubectl run on kubelet-static virtual nodes (tests/e2e/vnode.py,
`KubeletStaticNode`): the real kubelet v1.35.4's CPU, Topology and Memory Managers admit and pin each pod, and
node-feature-discovery's real topology-updater writes each node's NodeResourceTopology from their podresources.

Two nodes of 2 NUMA nodes x 4 cores x 2 threads (NUMA node 0: CPUs 0-3,8-11; node 1: 4-7,12-15), static CPU
Manager with full-pcpus-only and kubeReserved cpu 2 (the kubelet reserves core 0: CPUs 0,8), Memory Manager None;
ks-snn runs the Topology Manager's single-numa-node policy (container scope), ks-restricted restricted (pod
scope). Labelled kubelet-static (`model-manager.io/cpu-manager=static`, the default node group, which names no
Topology Manager policy: each node's NRT tells it) and tainted so that only the pods here go there.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from placement.config import KUBELET_STATIC_LABEL
from placement.ledger import PLACEMENT
from placement.topology import CPUSet
from tests.e2e.cluster import Cluster, wait_until
from tests.e2e.fleet import MODEL_NS, PLACED_NS, POOL, model_deployment, model_pod
from tests.e2e.nrt import node_resource_topology
from tests.e2e.vnode import KubeletStaticNode, start_kubelet_fleet, stop_fleet
from tests.oracle.sysfs import NodeShape

POOL_NAME = "kubelet-static"
TAINT = {"key": "e2e.model-placement.io/kubelet-static", "value": "true", "effect": "NoSchedule"}
MARK = "e2e.model-placement.io/kubelet-static"  # every pod this file creates
AMX = {"feature.node.kubernetes.io/cpu-security.amx.enabled": "true"}
SHAPE = NodeShape(packages=2, cores_per_numa=4, threads_per_core=2, memory_gib_per_numa=32)
KUBELET = {"apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
           "cpuManagerPolicy": "static", "cpuManagerPolicyOptions": {"full-pcpus-only": "true"},
           "kubeReserved": {"cpu": "2"}, "memoryManagerPolicy": "None"}
NODES = {
    "ks-snn": {**KUBELET, "topologyManagerPolicy": "single-numa-node", "topologyManagerScope": "container"},
    "ks-restricted": {**KUBELET, "topologyManagerPolicy": "restricted", "topologyManagerScope": "pod"},
}
FIGURES: dict[str, Any] = {}


class Fleet:
    def __init__(self, nodes: list[KubeletStaticNode]) -> None:
        self.nodes = {n.name: n for n in nodes}
        self.failed: dict[str, str] = {}  # every pod a node's record showed Failed: its reason and message


@pytest.fixture(scope="module")
def kstatic(cluster: Cluster) -> Iterator[Fleet]:
    failed: dict[str, str] = {}

    def on_record(record: dict[str, Any]) -> None:
        failed.update({f"{record['node']}: {key}": f"{p['reason']}: {p['message']}"
                       for key, p in record["pods"].items() if p["phase"] == "Failed"})

    started = time.monotonic()
    labels = {POOL: POOL_NAME, KUBELET_STATIC_LABEL: "static", **AMX}
    nodes = start_kubelet_fleet(cluster, [(name, SHAPE, config, labels) for name, config in NODES.items()],
                                taints=[TAINT], on_record=on_record)
    fleet = Fleet(nodes)
    fleet.failed = failed
    try:
        wait_until("each kubelet-static node's NodeResourceTopology",
                   lambda: all(node_resource_topology(cluster, n) for n in NODES), timeout=60)
        FIGURES["fleet_start_s"] = round(time.monotonic() - started, 2)
        yield fleet
    finally:
        print("kubelet-static figures:", json.dumps(FIGURES))
        cluster.kubectl("-n", MODEL_NS, "delete", "deployment,pods", "-l", MARK, "--wait=false", check=False)
        cluster.kubectl("-n", PLACED_NS, "delete", "pods", "-l", MARK, "--grace-period=0", "--force", check=False)
        stop_fleet(cluster, nodes)
        cluster.kubectl("delete", "noderesourcetopologies", *NODES, check=False)


def _ours(obj: dict[str, Any]) -> dict[str, Any]:
    """The object, made to go to the kubelet-static pool and marked as ours."""
    obj["metadata"].setdefault("labels", {})[MARK] = "true"
    spec = obj["spec"]
    if obj["kind"] == "Deployment":
        spec["template"]["metadata"]["labels"][MARK] = "true"
        spec = spec["template"]["spec"]
    spec["nodeSelector"] = {POOL: POOL_NAME}
    spec["tolerations"] = [{**TAINT, "operator": "Equal"}]
    return obj


def _apply(cluster: Cluster, obj: dict[str, Any]) -> None:
    cluster.kubectl("apply", "-f", "-", input=json.dumps(obj))


def _pinned_as_annotated(fleet: Fleet, pod: dict[str, Any]) -> dict[str, frozenset[int]]:
    """Each container's exclusive CPUs on its node, asserted to be those the pod's placement annotation names."""
    meta = pod["metadata"]
    annotated = json.loads(meta["annotations"][PLACEMENT])["cpus"]
    ran = fleet.nodes[pod["spec"]["nodeName"]].record()["pods"][f"{meta['namespace']}/{meta['name']}"]
    got = {name: CPUSet.parse(c["cpuset"]).cpus for name, c in ran["containers"].items()}
    assert got == {name: CPUSet.parse(cpus).cpus for name, cpus in annotated.items()}, meta["name"]
    return got


def _numa(cpus: frozenset[int]) -> set[int]:
    return {SHAPE.numa_of(c) for c in cpus}


def test_kubelet_static_nodes_run_model_pods_where_the_ledger_put_them(cluster: Cluster, kstatic: Fleet) -> None:
    """NFD's updater announces each node's Topology Manager policy and reserved CPUs; a pod bound past the
    scheduler the kubelet cannot align is rejected as kubelet v1.35 rejects it; a bare 10-CPU model pod (more than
    a NUMA node holds) is bound only where the NRT says `restricted` (the default would refuse it) and runs on the
    CPUs its placement annotation names; a Deployment's replicas each run exactly where annotated, and scaled past
    the room its extra replicas stay Pending: no pod is ever Failed."""
    for name, config in NODES.items():
        nrt = node_resource_topology(cluster, name)
        assert nrt is not None
        attributes = {a["name"]: a["value"] for a in nrt["attributes"]}
        assert (attributes["topologyManagerPolicy"], attributes["topologyManagerScope"]) == (
            config["topologyManagerPolicy"], config["topologyManagerScope"]), name
        cpus = {z["name"]: {r["name"]: r for r in z["resources"]}["cpu"] for z in nrt["zones"]}
        assert {z: (c["capacity"], c["allocatable"]) for z, c in cpus.items()} == {
            "node-0": ("8", "6"), "node-1": ("8", "8")}, name

    # Bound by name past every scheduler: 10 CPUs fit no NUMA node, so single-numa-node rejects it.
    pod = _ours(model_pod("ks-unaligned", PLACED_NS, tp=1, cpu="10", memory="8Gi", node_name="ks-snn"))
    cluster.api.call("POST", f"/api/v1/namespaces/{PLACED_NS}/pods", pod)
    status = wait_until("ks-unaligned rejected", lambda: (s := cluster.api.get(
        f"/api/v1/namespaces/{PLACED_NS}/pods/ks-unaligned")["status"]).get("phase") == "Failed" and s, timeout=30)
    assert status["reason"] == "TopologyAffinityError"
    assert status["message"].startswith("Pod was rejected: "), status
    assert kstatic.failed == {f"ks-snn: {PLACED_NS}/ks-unaligned": f"TopologyAffinityError: {status['message']}"}
    cluster.kubectl("-n", PLACED_NS, "delete", "pod", "ks-unaligned", "--grace-period=0", "--force")
    wait_until("ks-unaligned gone from ks-snn", lambda: f"{PLACED_NS}/ks-unaligned" not in
               kstatic.nodes["ks-snn"].record()["pods"], timeout=30)
    kstatic.failed.clear()

    started = time.monotonic()
    _apply(cluster, _ours(model_pod("ks-split", MODEL_NS, tp=1, cpu="10", memory="8Gi")))
    split = wait_until("ks-split Running", lambda: next(
        (p for p in cluster.pods(MODEL_NS, "model-manager.io/model=ks-split")
         if p["status"].get("phase") == "Running"), None),
        timeout=60)
    FIGURES["bare_running_s"] = round(time.monotonic() - started, 2)
    assert split["spec"]["nodeName"] == "ks-restricted"
    assert _numa(_pinned_as_annotated(kstatic, split)["main"]) == {0, 1}

    started = time.monotonic()
    _apply(cluster, _ours(model_deployment("ks-deploy", MODEL_NS, 1, cpu="4", memory="8Gi")))
    wait_until("ks-deploy's replica Running", lambda: [p for p in cluster.pods(MODEL_NS, "app=ks-deploy")
                                                       if p["status"].get("phase") == "Running"], timeout=60)
    FIGURES["deployment_running_s"] = round(time.monotonic() - started, 2)
    started = time.monotonic()
    cluster.kubectl("-n", MODEL_NS, "scale", "deployment", "ks-deploy", "--replicas=6")

    def settled() -> list[dict[str, Any]] | None:
        pods = cluster.pods(MODEL_NS, "app=ks-deploy")
        unschedulable = [p for p in pods if any(c["type"] == "PodScheduled" and c["status"] == "False"
                                                for c in p["status"].get("conditions", []))]
        running = [p for p in pods if p["status"].get("phase") == "Running"]
        return running if len(pods) == 6 and len(running) + len(unschedulable) == 6 and unschedulable else None

    running = wait_until("ks-deploy's 6 replicas Running or unschedulable", settled, timeout=90)
    FIGURES["scaled_settled_s"] = round(time.monotonic() - started, 2)
    FIGURES["replicas_running"] = len(running)
    # ks-snn holds 3 (6 free CPUs on NUMA node 0, 8 on node 1); ks-restricted 1: the kubelet gave ks-split the
    # whole free NUMA node 1 and one core of node 0, which keeps 2 whole cores.
    assert len(running) == 4
    assert sorted(p["spec"]["nodeName"] for p in running) == ["ks-restricted"] + ["ks-snn"] * 3
    for p in running:
        assert len(_numa(_pinned_as_annotated(kstatic, p)["main"])) == 1, p["metadata"]["name"]
    time.sleep(2)  # what a kubelet would still reject shows within its sync; none may
    assert kstatic.failed == {}
    assert not [p["metadata"]["name"] for p in cluster.pods(MODEL_NS, MARK) if p["status"].get("phase") == "Failed"]
    for node in kstatic.nodes.values():
        assert node.errors == [], node.name
