"""Judged by the node agents of a mixed fleet: model pods applied with kubectl run on kubelet-static virtual nodes
(tests/e2e/vnode.py, `KubeletStaticNode`: the real kubelet v1.35.4's CPU, Topology and Memory Managers admit and pin
each pod, node-feature-discovery's real topology-updater writes each node's NodeResourceTopology from their
podresources) and on a balloons virtual node (`VirtualNode`: the real balloons plugin), all in one pool.

Four kubelet-static nodes of 2 NUMA nodes x 4 cores x 2 threads (NUMA node 0: CPUs 0-3,8-11; node 1: 4-7,12-15),
static CPU Manager with full-pcpus-only and kubeReserved cpu 2 (the kubelet reserves core 0: CPUs 0,8), Memory
Manager None, one per Topology Manager policy, both scopes: ks-snn single-numa-node (container), ks-restricted
restricted (pod), ks-besteffort best-effort (pod), ks-none none (container). They carry the default node group's
label (`model-manager.io/cpu-manager=static`, which names no Topology Manager policy: each node's NRT tells it).
Beside them ks-balloons, 2 packages x 32 cores under the session's `default` BalloonsPolicy. Every node is tainted
so that only the pods here go there; the pods meant for the kubelet say so (`model-manager.io/cpu-policy:
kubelet-static`), the others are the default nri-balloons pods.

Processes: 3 per kubelet-static node (the kubelet's managers, podresources, NFD's updater) and the balloons plugin.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from placement.config import KUBELET_STATIC_LABEL
from placement.demand import ANN_POLICY, OUT_TYPE
from placement.ledger import PLACEMENT
from placement.topology import CPUSet
from tests.e2e.cluster import Cluster, wait_until
from tests.e2e.fleet import KSERVE_DEPLOYMENT, MODEL_NS, PLACED_NS, POOL, model_deployment, model_pod
from tests.e2e.nrt import node_resource_topology
from tests.e2e.test_placement import debug_node
from tests.e2e.vnode import KubeletStandIn, start_fleet, start_kubelet_fleet, stop_fleet
from tests.oracle.sysfs import NodeShape

POOL_NAME = "mixed"
TAINT = {"key": "e2e.model-placement.io/mixed", "value": "true", "effect": "NoSchedule"}
MARK = "e2e.model-placement.io/mixed"  # every pod this file creates
AMX = {"feature.node.kubernetes.io/cpu-security.amx.enabled": "true"}
SHAPE = NodeShape(packages=2, cores_per_numa=4, threads_per_core=2, memory_gib_per_numa=32)
KUBELET = {"apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
           "cpuManagerPolicy": "static", "cpuManagerPolicyOptions": {"full-pcpus-only": "true"},
           "kubeReserved": {"cpu": "2"}, "memoryManagerPolicy": "None"}
NODES = {
    "ks-snn": {**KUBELET, "topologyManagerPolicy": "single-numa-node", "topologyManagerScope": "container"},
    "ks-restricted": {**KUBELET, "topologyManagerPolicy": "restricted", "topologyManagerScope": "pod"},
    "ks-besteffort": {**KUBELET, "topologyManagerPolicy": "best-effort", "topologyManagerScope": "pod"},
    "ks-none": {**KUBELET, "topologyManagerPolicy": "none", "topologyManagerScope": "container"},
}
ALIGNING = ("ks-snn", "ks-restricted")  # the policies that reject what they cannot align
BALLOONS = "ks-balloons"
BALLOONS_SHAPE = NodeShape(packages=2, cores_per_numa=32, memory_gib_per_numa=256)
FIGURES: dict[str, Any] = {}


class Fleet:
    def __init__(self, nodes: list[KubeletStandIn], failed: dict[str, str]) -> None:
        self.nodes = {n.name: n for n in nodes}
        self.failed = failed  # every pod a kubelet-static node's record showed Failed: its reason and message


@pytest.fixture(scope="module")
def mixed(cluster: Cluster) -> Iterator[Fleet]:
    failed: dict[str, str] = {}

    def on_record(record: dict[str, Any]) -> None:
        failed.update({f"{record['node']}: {key}": f"{p['reason']}: {p['message']}"
                       for key, p in record["pods"].items() if p["phase"] == "Failed"})

    started = time.monotonic()
    labels = {POOL: POOL_NAME, **AMX}
    nodes: list[KubeletStandIn] = []
    try:
        nodes += start_kubelet_fleet(cluster, [(name, SHAPE, config, {**labels, KUBELET_STATIC_LABEL: "static"})
                                               for name, config in NODES.items()], taints=[TAINT], on_record=on_record)
        nodes += start_fleet(cluster, [(BALLOONS, BALLOONS_SHAPE, labels)], taints=[TAINT])
        fleet = Fleet(nodes, failed)
        wait_until("each kubelet-static node's NodeResourceTopology",
                   lambda: all(node_resource_topology(cluster, n) for n in NODES), timeout=60)
        FIGURES["fleet_start_s"] = round(time.monotonic() - started, 2)
        yield fleet
    finally:
        print("mixed fleet figures:", json.dumps(FIGURES))
        for ns in (MODEL_NS, PLACED_NS):
            cluster.kubectl("-n", ns, "delete", "deployment", "-l", MARK, "--wait=false", check=False)
            cluster.kubectl("-n", ns, "delete", "pods", "-l", MARK, "--grace-period=0", "--force", check=False)
        stop_fleet(cluster, nodes)
        cluster.kubectl("delete", "noderesourcetopologies", *NODES, BALLOONS, check=False)


def _ours(obj: dict[str, Any], *, kubelet: bool = True, nodes: tuple[str, ...] = ()) -> dict[str, Any]:
    """The object, made to go to the mixed pool (to `nodes` only, if given), marked as ours; `kubelet`: a pod meant
    for the kubelet-static nodes, as its user marks it."""
    labels = [obj["metadata"].setdefault("labels", {})]
    meta, spec = obj["metadata"], obj["spec"]
    if obj["kind"] == "Deployment":
        meta, spec = spec["template"]["metadata"], spec["template"]["spec"]
        labels.append(meta["labels"])
    for each in labels:
        each[MARK] = "true"
    if kubelet:
        meta.setdefault("annotations", {})[ANN_POLICY] = "kubelet-static"
    if not spec.get("nodeName"):
        spec["nodeSelector"] = {POOL: POOL_NAME}
    spec["tolerations"] = [{**TAINT, "operator": "Equal"}]
    if nodes:
        spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": list(nodes)}]}]}}}
    return obj


def _apply(cluster: Cluster, *objects: dict[str, Any]) -> None:
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(objects))


def _running(cluster: Cluster, namespace: str, selector: str) -> dict[str, Any]:
    return wait_until(f"a pod {selector} Running", lambda: next((
        p for p in cluster.pods(namespace, selector) if p["status"].get("phase") == "Running"), None), timeout=60,
        every=0.1)


def _pinned_as_annotated(fleet: Fleet, pod: dict[str, Any]) -> dict[str, frozenset[int]]:
    """Each container's exclusive CPUs on its kubelet-static node, asserted to be those the pod's placement
    annotation names (the others run in the shared pool)."""
    meta = pod["metadata"]
    assert pod["spec"]["nodeName"] in NODES, (meta["name"], pod["spec"]["nodeName"])
    annotated = json.loads(meta["annotations"][PLACEMENT])["cpus"]
    ran = fleet.nodes[pod["spec"]["nodeName"]].record()["pods"][f"{meta['namespace']}/{meta['name']}"]
    got = {name: CPUSet.parse(c["cpuset"]).cpus for name, c in ran["containers"].items() if c["cpuset"]}
    assert got == {name: CPUSet.parse(cpus).cpus for name, cpus in annotated.items()}, meta["name"]
    return got


def _numa(cpus: frozenset[int]) -> set[int]:
    return {SHAPE.numa_of(c) for c in cpus}


def _zones_cpu(cluster: Cluster, name: str) -> dict[int, dict[str, str]]:
    """The node's NRT cpu resource per NUMA node."""
    nrt = node_resource_topology(cluster, name)
    assert nrt is not None, name
    return {int(z["name"].removeprefix("node-")): {r["name"]: r for r in z["resources"]}["cpu"] for z in nrt["zones"]}


def _failed(cluster: Cluster, namespace: str, selector: str) -> list[dict[str, Any]]:
    return [p for p in cluster.pods(namespace, selector) if p["status"].get("phase") == "Failed"]


def test_each_topology_manager_policy_is_announced_and_a_pod_bound_past_the_scheduler_is_rejected(
        cluster: Cluster, mixed: Fleet) -> None:
    """NFD's updater announces each node's Topology Manager policy, scope and reserved CPUs; a pod bound past the
    scheduler the kubelet cannot align is rejected as kubelet v1.35 rejects it; a bare 10-CPU model pod (more than a
    NUMA node holds) allowed on ks-snn and ks-restricted is bound only where the NRT says `restricted` and runs on
    the CPUs its placement annotation names."""
    for name, config in NODES.items():
        nrt = node_resource_topology(cluster, name)
        assert nrt is not None
        attributes = {a["name"]: a["value"] for a in nrt["attributes"]}
        assert (attributes["topologyManagerPolicy"], attributes["topologyManagerScope"]) == (
            config["topologyManagerPolicy"], config["topologyManagerScope"]), name
        assert {z: (c["capacity"], c["allocatable"]) for z, c in _zones_cpu(cluster, name).items()} == {
            0: ("8", "6"), 1: ("8", "8")}, name

    # Bound by name past every scheduler: 10 CPUs fit no NUMA node, so single-numa-node rejects it.
    pod = _ours(model_pod("ks-unaligned", PLACED_NS, tp=1, cpu="10", memory="8Gi", node_name="ks-snn"),
                kubelet=False)
    cluster.api.call("POST", f"/api/v1/namespaces/{PLACED_NS}/pods", pod)
    status = wait_until("ks-unaligned rejected", lambda: (s := cluster.api.get(
        f"/api/v1/namespaces/{PLACED_NS}/pods/ks-unaligned")["status"]).get("phase") == "Failed" and s, timeout=30)
    assert status["reason"] == "TopologyAffinityError"
    assert status["message"].startswith("Pod was rejected: "), status
    assert mixed.failed == {f"ks-snn: {PLACED_NS}/ks-unaligned": f"TopologyAffinityError: {status['message']}"}
    cluster.kubectl("-n", PLACED_NS, "delete", "pod", "ks-unaligned", "--grace-period=0", "--force")
    wait_until("ks-unaligned gone from ks-snn", lambda: f"{PLACED_NS}/ks-unaligned" not in
               mixed.nodes["ks-snn"].record()["pods"], timeout=30)
    mixed.failed.clear()

    started = time.monotonic()
    _apply(cluster, _ours(model_pod("ks-split", MODEL_NS, tp=1, cpu="10", memory="8Gi"), nodes=ALIGNING))
    split = _running(cluster, MODEL_NS, "model-manager.io/model=ks-split")
    FIGURES["bare_running_s"] = round(time.monotonic() - started, 2)
    assert split["spec"]["nodeName"] == "ks-restricted"
    assert _numa(_pinned_as_annotated(mixed, split)["main"]) == {0, 1}


def test_our_ledger_reads_the_nrt_the_updater_wrote(cluster: Cluster, mixed: Fleet) -> None:
    """Pods bound by name (no webhook, no scheduler of ours) take CPUs on ks-besteffort: 6 (all of NUMA node 0's
    allocatable), then 4 (NUMA node 1, node 0 being full); the first ends. Replayed alone, the second would be
    guessed on NUMA node 0; the extender's ledger, rebuilt when the NRT changes, shows each NUMA node's free CPUs as
    the NRT NFD's updater wrote from the kubelet's podresources (node 0: 6, node 1: 4; with the NRT left unread,
    kubelet.reconcile removed, it showed 1 and 4 free cores and this test failed), and the next model pod, 6 CPUs,
    is placed on NUMA node 0 accordingly and runs on exactly the CPUs its placement annotation names."""
    node = "ks-besteffort"
    first = _ours(model_pod("ks-foreign-6", PLACED_NS, tp=1, cpu="6", memory="4Gi", node_name=node), kubelet=False)
    second = _ours(model_pod("ks-foreign-4", PLACED_NS, tp=1, cpu="4", memory="4Gi", node_name=node), kubelet=False)
    kubelet = mixed.nodes[node]
    for pod, numa in ((first, 0), (second, 1)):
        cluster.api.call("POST", f"/api/v1/namespaces/{PLACED_NS}/pods", pod)
        key = f"{PLACED_NS}/{pod['metadata']['name']}"
        ran = wait_until(f"{key} Running on {node}", lambda k=key: (r := kubelet.record()["pods"].get(k)) and
                         r["phase"] == "Running" and r, timeout=30)
        assert _numa(CPUSet.parse(ran["containers"]["main"]["cpuset"]).cpus) == {numa}, ran
    cluster.kubectl("-n", PLACED_NS, "delete", "pod", "ks-foreign-6", "--grace-period=0", "--force")
    started = time.monotonic()
    available = wait_until(f"{node}'s NRT without ks-foreign-6", lambda: (z := {
        n: int(c["available"]) for n, c in _zones_cpu(cluster, node).items()}) == {0: 6, 1: 4} and z, timeout=30)
    FIGURES["nrt_update_s"] = round(time.monotonic() - started, 2)
    seen: list[Any] = []

    def agrees() -> bool:
        seen[:] = [{n["numa"]: n["free"] for n in debug_node(cluster, node)["numa"]}]
        return seen[0] == {numa: cpus // SHAPE.threads_per_core for numa, cpus in available.items()}

    try:
        wait_until(f"the extender's ledger of {node} to show the NRT's available CPUs", agrees, timeout=30)
    except AssertionError as late:
        raise AssertionError(f"{late}; free cores per NUMA node in the ledger: {seen}, the NRT's CPUs: {available}") \
            from None
    FIGURES["ledger_follows_nrt_s"] = round(time.monotonic() - started, 2)

    _apply(cluster, _ours(model_pod("ks-after-nrt", MODEL_NS, tp=1, cpu="6", memory="4Gi"), nodes=(node,)))
    placed = _running(cluster, MODEL_NS, "model-manager.io/model=ks-after-nrt")
    assert placed["spec"]["nodeName"] == node
    assert _numa(_pinned_as_annotated(mixed, placed)["main"]) == {0}
    assert mixed.failed == {}


def _kserve_predictor(name: str, replicas: int) -> dict[str, Any]:
    """An InferenceService's predictor as KServe's controllers make it (tests/e2e/fleet.py's raw-deployment
    Deployment), sized for these nodes, with a Knative queue-proxy beside the kserve-container (Serverless mode):
    a sidecar in the shared pool, requests cpu 25m and memory 50Mi, limits 1 CPU and 200Mi (the webhook makes them
    equal so that the pod stays Guaranteed)."""
    deployment = yaml.safe_load(KSERVE_DEPLOYMENT)
    deployment["metadata"]["name"] = f"{name}-predictor"
    deployment["metadata"]["labels"]["serving.kserve.io/inferenceservice"] = name
    deployment["spec"]["replicas"] = replicas
    template = deployment["spec"]["template"]
    template["metadata"]["labels"].update({"app": f"isvc.{name}-predictor", "serving.kserve.io/inferenceservice": name})
    deployment["spec"]["selector"]["matchLabels"] = {"app": f"isvc.{name}-predictor"}
    model = template["spec"]["containers"][0]
    model["resources"] = {"requests": {"cpu": "4", "memory": "8Gi"}, "limits": {"cpu": "4", "memory": "8Gi"}}
    template["spec"]["containers"].append({
        "name": "queue-proxy", "image": "gcr.io/knative-releases/knative.dev/serving/cmd/queue:v1.16.0",
        "ports": [{"name": "http-queueadm", "containerPort": 8022}, {"name": "queue-port", "containerPort": 8012}],
        "env": [{"name": "SERVING_SERVICE", "value": f"{name}-predictor"}, {"name": "USER_PORT", "value": "8080"}],
        "resources": {"requests": {"cpu": "25m", "memory": "50Mi"}, "limits": {"cpu": "1", "memory": "200Mi"}}})
    return deployment


def test_a_mixed_fleet_runs_each_pod_on_its_own_kind_of_node_and_a_deployment_past_the_room_never_fails(
        cluster: Cluster, mixed: Fleet) -> None:
    """Applied together: a default (nri-balloons) model pod lands on the balloons node and runs on one NUMA node;
    a KServe InferenceService predictor (kserve-container and a queue-proxy sidecar) and a bare pod meant for the
    kubelet land on kubelet-static nodes and run NUMA-local on exactly the CPUs their placement annotation names.
    Then a Deployment of 4-CPU replicas scaled past the room: each Running replica runs where annotated, the rest
    wait Pending, and the kubelet's own NRTs show that no node had room for one more; no pod is ever Failed.
    The same replicas bound by name to ks-snn (stock scheduling past our extender) are rejected by its kubelet
    and replaced by the ReplicaSet controller, Failed after Failed: the loop we prevent."""
    started = time.monotonic()
    balloons = _ours(model_pod("mx-balloons", MODEL_NS, tp=1, cpu="16", memory="32Gi"), kubelet=False)
    _apply(cluster, balloons, _ours(_kserve_predictor("mx-kserve", 1)),
           _ours(model_pod("mx-bare", MODEL_NS, tp=1, cpu="4", memory="8Gi")))
    on_balloons = _running(cluster, MODEL_NS, "model-manager.io/model=mx-balloons")
    kserve = _running(cluster, MODEL_NS, "app=isvc.mx-kserve-predictor")
    bare = _running(cluster, MODEL_NS, "model-manager.io/model=mx-bare")
    FIGURES["mixed_running_s"] = round(time.monotonic() - started, 2)
    assert on_balloons["spec"]["nodeName"] == BALLOONS
    assert [p["metadata"]["annotations"][OUT_TYPE] for p in (on_balloons, kserve, bare)] == [
        "nri-balloons", "kubelet-static", "kubelet-static"]
    ran = mixed.nodes[BALLOONS].record()["pods"][f"{MODEL_NS}/mx-balloons"]["containers"]["main"]
    assert {BALLOONS_SHAPE.numa_of(c) for c in CPUSet.parse(ran["cpuset"]).cpus} == {int(ran["mems"])}, ran
    assert kserve["spec"]["containers"][1]["resources"]["limits"] == {"cpu": "25m", "memory": "50Mi"}
    for pod, container in ((kserve, "kserve-container"), (bare, "main")):
        pinned = _pinned_as_annotated(mixed, pod)
        assert set(pinned) == {container} and len(_numa(pinned[container])) == 1, (pod["metadata"]["name"], pinned)

    # Created with 12 replicas, it would be refused at once (only 6 fit): scaling is never checked.
    _apply(cluster, _ours(model_deployment("ks-deploy", MODEL_NS, 1, cpu="4", memory="8Gi")))
    _running(cluster, MODEL_NS, "app=ks-deploy")
    started = time.monotonic()
    cluster.kubectl("-n", MODEL_NS, "scale", "deployment", "ks-deploy", "--replicas=12")

    def settled() -> list[dict[str, Any]] | None:
        pods = cluster.pods(MODEL_NS, "app=ks-deploy")
        unschedulable = [p for p in pods if any(c["type"] == "PodScheduled" and c["status"] == "False"
                                                for c in p["status"].get("conditions", []))]
        running = [p for p in pods if p["status"].get("phase") == "Running"]
        return running if len(pods) == 12 and len(running) + len(unschedulable) == 12 and unschedulable else None

    running = wait_until("ks-deploy's 12 replicas Running or unschedulable", settled, timeout=120)
    FIGURES["scaled_settled_s"] = round(time.monotonic() - started, 2)
    FIGURES["replicas_running"] = len(running)
    for p in running:
        cpus = _pinned_as_annotated(mixed, p)["main"]
        if p["spec"]["nodeName"] in ALIGNING:
            assert len(_numa(cpus)) == 1, p["metadata"]["name"]
    # No room was left: by each kubelet's own account (its NRT), no NUMA node of an aligning node has 4 free CPUs,
    # and no other node has 4 in all, unless the replicas left say they wait for a node that keeps them local
    # (`split_wait_seconds`): there the kubelet would split them (ks-none's [2, 8] free CPUs: it takes from the
    # NUMA node with fewest free first), and the aligning nodes are full now, not for good.
    free: dict[str, list[int]] = {}

    def full() -> bool:  # the NRTs follow within NFD's update interval (1 s); CPUs are only taken meanwhile
        free.update({n: [int(c["available"]) for c in _zones_cpu(cluster, n).values()] for n in NODES})
        waiting = any("(`split_wait_seconds`)" in c.get("message", "") for p in cluster.pods(MODEL_NS, "app=ks-deploy")
                      for c in p["status"].get("conditions", []) if c["type"] == "PodScheduled")
        return all(max(cpus) < 4 if n in ALIGNING else sum(cpus) < 4 or waiting for n, cpus in free.items())

    try:
        wait_until("every kubelet-static node's NRT to show no room for a replica", full, timeout=30)
    finally:
        FIGURES["free_cpus_at_the_end"] = free

    # Stock scheduling past our extender: the same replicas bound by name to ks-snn, which ours filled.
    stock = model_deployment("ks-stock", PLACED_NS, 1, cpu="4", memory="8Gi")
    stock["spec"]["template"]["spec"]["nodeName"] = "ks-snn"
    started = time.monotonic()
    _apply(cluster, _ours(stock, kubelet=False))
    try:
        rejected = wait_until("3 of ks-stock's pods Failed", lambda: len(
            f := _failed(cluster, PLACED_NS, "app=ks-stock")) >= 3 and f, timeout=60, every=0.1)
        FIGURES["stock_three_failed_s"] = round(time.monotonic() - started, 2)
    finally:
        cluster.kubectl("-n", PLACED_NS, "scale", "deployment", "ks-stock", "--replicas=0")
    assert len({p["metadata"]["name"] for p in rejected}) == len(rejected)
    reasons = {(p["status"]["reason"], p["status"]["message"].split(":")[0]) for p in rejected}
    FIGURES["stock_rejections"] = sorted(reasons)
    kubelet_reasons = ("TopologyAffinityError", "UnexpectedAdmissionError")
    assert reasons <= {(reason, "Pod was rejected") for reason in kubelet_reasons}, reasons
    assert all(k.startswith("ks-snn: placed/ks-stock-") for k in mixed.failed), mixed.failed
    # Ours, over the same time: its Pending replicas were never bound, so none was ever Failed.
    assert not _failed(cluster, MODEL_NS, MARK)
    assert len(cluster.pods(MODEL_NS, "app=ks-deploy")) == 12
    for vnode in mixed.nodes.values():
        assert vnode.errors == [], vnode.name
