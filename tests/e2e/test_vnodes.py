"""Judged by the node: model pods applied with kubectl run on virtual nodes (tests/e2e/vnode.py), each the real
balloons plugin whose own agent reads its BalloonsPolicy from the apiserver and writes NodeResourceTopology back.

Four nodes of mixed shapes: 2 packages x 32 cores (the `default` policy), one package split in 4 NUMA nodes and
2 packages of 2 sub-NUMA clusters (both `group.snc4`), and 2 x 24 cores with SMT off (its own `node.<name>`
policy). They are tainted so that only the pods here, which tolerate it, go there. Their policies list each
container in the plugin's NodeResourceTopology (showContainersInNrt), the way the ledger learns which balloon holds
which pod.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from placement.balloons import node_balloons_policy
from placement.config import Settings
from placement.topology import CPUSet, linux_layout
from tests.e2e.cluster import Cluster, wait_until
from tests.e2e.fleet import MODEL_NS, PLACED_NS, POOL, model_deployment, model_pod
from tests.e2e.test_placement import debug_node
from tests.e2e.vnode import VirtualNode, start_fleet, stop_fleet
from tests.oracle.peer import BALLOON_KEY
from tests.oracle.sysfs import NodeShape

POOL_NAME = "virtual"
TAINT = {"key": "e2e.model-placement.io/virtual", "value": "true", "effect": "NoSchedule"}
MARK = "e2e.model-placement.io/vnodes"  # every pod this file creates
AMX = {"feature.node.kubernetes.io/cpu-security.amx.enabled": "true"}
NOSMT = "vn-nosmt"
NODES = [
    ("vn-xeon2", NodeShape(packages=2, cores_per_numa=32, memory_gib_per_numa=256), {}),
    ("vn-snc4", NodeShape(packages=1, numa_per_package=4, cores_per_numa=16, memory_gib_per_numa=128),
     {"config.nri/group": "snc4"}),
    ("vn-snc2x2", NodeShape(packages=2, numa_per_package=2, cores_per_numa=16, memory_gib_per_numa=128),
     {"config.nri/group": "snc4"}),
    (NOSMT, NodeShape(packages=2, cores_per_numa=24, threads_per_core=1, memory_gib_per_numa=256), {}),
]
SHARED_POLICIES = ("default", "group.snc4")  # the session's policies the nodes above use besides their own
FIGURES: dict[str, Any] = {}


@pytest.fixture(scope="module")
def vnodes(cluster: Cluster) -> Iterator[dict[str, VirtualNode]]:
    nosmt = next(shape for name, shape, _ in NODES if name == NOSMT)
    policy = node_balloons_policy(NOSMT, linux_layout([nosmt.cores_per_numa] * nosmt.numa_nodes, 1, "labels"),
                                  Settings(), "kube-system")
    policy["spec"]["showContainersInNrt"] = True
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(policy))
    for shared in SHARED_POLICIES:
        _show_containers(cluster, shared, True)
    started = time.monotonic()
    fleet = start_fleet(cluster, [(name, shape, {POOL: POOL_NAME, **AMX, **labels}) for name, shape, labels in NODES],
                        taints=[TAINT])
    FIGURES["fleet_start_s"] = round(time.monotonic() - started, 2)
    try:
        yield {v.name: v for v in fleet}
    finally:
        FIGURES["plugin_restarts"] = {v.name: v.refusals for v in fleet if v.refusals}
        FIGURES["plugin_rss_mib"] = {v.name: round(v.rss_bytes() / 2**20, 1) for v in fleet
                                     if v.peer and v.peer.proc.poll() is None}
        print("vnode figures:", json.dumps(FIGURES))
        (cluster.root / "vnode-figures.json").write_text(json.dumps(FIGURES, indent=2))
        cluster.kubectl("-n", MODEL_NS, "delete", "deployment,pods", "-l", MARK, "--wait=false", check=False)
        cluster.kubectl("-n", PLACED_NS, "delete", "pods", "-l", MARK, "--grace-period=0", "--force", check=False)
        stop_fleet(cluster, fleet)
        cluster.kubectl("-n", "kube-system", "delete", "balloonspolicy", f"node.{NOSMT}", check=False)
        for shared in SHARED_POLICIES:
            _show_containers(cluster, shared, None)


def _show_containers(cluster: Cluster, policy: str, show: bool | None) -> None:
    cluster.kubectl("-n", "kube-system", "patch", "balloonspolicy", policy, "--type=merge",
                    "-p", json.dumps({"spec": {"showContainersInNrt": show}}))


def _virtual(pod: dict[str, Any]) -> dict[str, Any]:
    """The pod, made to go to the virtual pool and marked as ours."""
    pod["metadata"].setdefault("labels", {})[MARK] = "true"
    spec = pod["spec"]["template"]["spec"] if pod["kind"] == "Deployment" else pod["spec"]
    if pod["kind"] == "Deployment":
        pod["metadata"].setdefault("labels", {})[MARK] = "true"
        pod["spec"]["template"]["metadata"]["labels"][MARK] = "true"
    spec["nodeSelector"] = {POOL: POOL_NAME}
    spec["tolerations"] = [{**TAINT, "operator": "Equal"}]
    return pod


def _kserve(fixture: str, name: str) -> dict[str, Any]:
    from tests.conftest import fixture_json

    pod = fixture_json(fixture)["request"]["object"]
    pod["metadata"].pop("ownerReferences", None), pod["metadata"].pop("generateName", None)
    pod["metadata"]["name"] = name
    pod["spec"]["serviceAccountName"] = "default"
    return pod


def workloads() -> list[dict[str, Any]]:
    """Seven model pods: bare ones of 1, 2 and 4 ranks, a Deployment of 2 replicas, a KServe LLMInferenceService
    decode pod (TP=2, a native routing sidecar) and a LeaderWorkerSet worker (2 local ranks x TP=2)."""
    objects = [model_pod("vn-bare-tp1", MODEL_NS, tp=1, cpu="16"), model_pod("vn-bare-tp2", MODEL_NS, tp=2, cpu="16"),
               model_pod("vn-bare-tp4", MODEL_NS, tp=4, cpu="16"),
               model_deployment("vn-deploy", MODEL_NS, 2, cpu="8", memory="32Gi"),
               _kserve("ar-pod-llmisvc-decode.json", "vn-kserve-decode"),
               _kserve("ar-pod-llmisvc-lws-worker.json", "vn-lws-worker")]
    return [_virtual(o) for o in objects]


def _pods(cluster: Cluster) -> list[dict[str, Any]]:
    return cluster.pods(MODEL_NS, MARK)


def _core_of(shape: NodeShape, cpus: frozenset[int]) -> set[int]:
    return {shape.core_of(c) for c in cpus}


def test_model_pods_applied_with_kubectl_run_pinned_one_numa_node_per_rank_as_the_plugin_placed_them(
        cluster: Cluster, vnodes: dict[str, VirtualNode]) -> None:
    """Every model pod, bare, from a Deployment or KServe-shaped, ends Running on a virtual node where the plugin
    pinned each rank to whole cores of a NUMA node of its own, shared with no other container, its memory on those
    NUMA nodes; our extender's ledger holds each as the plugin's NodeResourceTopology shows it."""
    applied = time.monotonic()
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(workloads()))
    expected = 7

    def all_running() -> list[dict[str, Any]] | None:
        pods = _pods(cluster)
        return pods if len(pods) == expected and all(p["status"].get("phase") == "Running" for p in pods) else None

    pods = wait_until("the 7 model pods Running", all_running, timeout=120, every=0.05)
    FIGURES["all_running_after_apply_s"] = round(time.monotonic() - applied, 2)
    for vnode in vnodes.values():
        assert not vnode.errors, (vnode.name, vnode.errors)

    for pod in pods:
        meta, node = pod["metadata"], pod["spec"]["nodeName"]
        key, shape = f"{MODEL_NS}/{meta['name']}", vnodes[node].shape
        ranks = int(meta["annotations"]["cpu-policy.model-manager.io/numa-nodes"])
        record = vnodes[node].record()["pods"]
        name = "main" if "main" in record[key]["containers"] else "kserve-container"
        model = record[key]["containers"][name]
        cpus = CPUSet.parse(model["cpuset"]).cpus
        per_numa: dict[int, set[int]] = {}
        for cpu in cpus:
            per_numa.setdefault(shape.numa_of(cpu), set()).add(shape.core_of(cpu))
        assert len(per_numa) == ranks, (key, node, model)
        assert len({len(cores) for cores in per_numa.values()}) == 1, (key, node, model)  # each rank alike
        assert CPUSet.parse(model["mems"]).cpus == set(per_numa), (key, node, model)
        others = {c for other, entry in record.items() for ctr, p in entry["containers"].items()
                  if (other, ctr) != (key, name) for c in _core_of(shape, CPUSet.parse(p["cpuset"]).cpus)}
        assert not _core_of(shape, cpus) & others, (key, node, "shares a core")

        # Observed placement: the extender's ledger holds the pod where the plugin's exported balloons say.
        seen: list[Any] = []

        def held(node: str = node, key: str = key, seen: list[Any] = seen) -> list[dict[str, Any]] | None:
            ledger = debug_node(cluster, node)
            got = [{"numa": n["numa"], **h} for n in ledger["numa"] for h in n["held"] if h["pod"] == key]
            seen[:] = [got or ledger]
            # The plugin exports its balloons as they settle: a holding is judged once the export agrees.
            return got if got and all(h["observed"] and "problem" not in h for h in got) else None

        try:
            holding = wait_until(f"{key} observed in the extender's ledger, with no problem", held, timeout=30)
        except AssertionError as late:
            raise AssertionError(f"{late}; the ledger last held {seen}; the plugin's NRT: "
                                 f"{cluster.kubectl_json('get', 'noderesourcetopologies', node)['zones']}") from None
        assert {h["numa"]: h["cores"] for h in holding} == {n: len(c) for n, c in per_numa.items()}, (key, holding)

    # The agent's own work: each node's NodeResourceTopology holds the plugin's balloons (the model pods' ones
    # seen above), and every policy in force reports each of its nodes as applied.
    for name in vnodes:
        nrt = cluster.api.get(f"/apis/topology.node.k8s.io/v1alpha2/noderesourcetopologies/{name}")
        assert any(z["type"] == "balloon" and z["name"] == "reserved[0]" for z in nrt["zones"]), nrt["zones"]
        FIGURES.setdefault("nrt_writers", {})[name] = sorted({f["manager"] for f in nrt["metadata"]["managedFields"]})
    statuses = {n: s["status"] for p in cluster.kubectl_json("-n", "kube-system", "get", "balloonspolicies")["items"]
                for n, s in (p.get("status", {}).get("nodes") or {}).items() if n in vnodes}
    assert statuses == dict.fromkeys(vnodes, "Success"), statuses

    # Deleted with kubectl: the kubelet stand-in removes the containers from the plugin and finishes the delete.
    cluster.kubectl("-n", MODEL_NS, "delete", "pod", "vn-bare-tp1", "vn-bare-tp4", "--wait=true", timeout=60)
    for pod in pods:
        if pod["metadata"]["name"] in ("vn-bare-tp1", "vn-bare-tp4"):
            assert f"{MODEL_NS}/{pod['metadata']['name']}" not in vnodes[pod["spec"]["nodeName"]].record()["pods"]


def test_a_pod_the_plugin_refuses_waits_in_create_container_error_and_runs_once_fixed(
        cluster: Cluster, vnodes: dict[str, VirtualNode]) -> None:
    """A pod put on a node by hand (no scheduler, no webhook) naming a balloon type the node's policy lacks: the
    user sees what kubelet v1.35 shows for a refused CreateContainer (Pending, the container waiting in
    CreateContainerError with the plugin's words, a Warning event `Failed`), the kubelet stand-in tries again after
    its back-off, and a new pod whose annotation names a type the policy has runs (the install refuses the change on
    the existing pod)."""
    name, key = "vn-unknown-type", f"{PLACED_NS}/vn-unknown-type"
    pod = model_pod(name, PLACED_NS, tp=1, cpu="4", node_name="vn-xeon2",
                    annotations={f"{BALLOON_KEY}/container.main": "no-such-balloon"})
    pod["spec"]["tolerations"] = [{**TAINT, "operator": "Equal"}]
    pod["metadata"]["labels"][MARK] = "true"
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(pod))

    def waiting() -> dict[str, Any] | None:
        got = cluster.api.get(f"/api/v1/namespaces/{PLACED_NS}/pods/{name}")
        states = [c["state"] for c in got["status"].get("containerStatuses") or ()]
        return got if states and "waiting" in states[0] else None

    refused = wait_until("the container waiting", waiting, timeout=30)["status"]
    assert refused["phase"] == "Pending", refused
    state = refused["containerStatuses"][0]["state"]["waiting"]
    assert state["reason"] == "CreateContainerError" and "no-such-balloon" in state["message"], state
    assert not state["message"].startswith("rpc error"), state  # the kubelet shows the status's message
    shown = cluster.kubectl("-n", PLACED_NS, "get", "pod", name, "--no-headers").stdout
    assert "CreateContainerError" in shown, shown
    events = cluster.kubectl_json("-n", PLACED_NS, "get", "events", "--field-selector",
                                  f"involvedObject.name={name},type=Warning")["items"]
    assert [e for e in events if e["reason"] == "Failed" and e["message"].startswith("Error: ")
            and "no-such-balloon" in e["message"]], events
    recorded = vnodes["vn-xeon2"].record()["pods"][key]
    assert recorded["phase"] == "Pending" and not recorded["containers"], recorded  # nothing of it on the node

    wait_until("a second attempt after the back-off", lambda: vnodes["vn-xeon2"].record()["pods"][key]["attempts"] >= 2,
               timeout=30, every=0.5)
    # The fix is a new pod: the runtime reads the annotation when it makes the pod's sandbox, and the install
    # refuses to change it on an existing pod (model-placement counts the pod's cores by it).
    fixed = cluster.kubectl("-n", PLACED_NS, "annotate", "pod", name, "--overwrite",
                            f"{BALLOON_KEY}/container.main=vllm-balloon-tp1", check=False)
    assert fixed.returncode != 0 and "model-placement-owned-annotations" in fixed.stderr, fixed.stderr
    cluster.kubectl("-n", PLACED_NS, "delete", "pod", name, "--wait=true", timeout=60)
    pod["metadata"]["annotations"][f"{BALLOON_KEY}/container.main"] = "vllm-balloon-tp1"
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(pod))
    running = wait_until("the pod Running once fixed", lambda: (p := cluster.api.get(
        f"/api/v1/namespaces/{PLACED_NS}/pods/{name}"))["status"].get("phase") == "Running" and p, timeout=30)
    assert running["status"]["containerStatuses"][0]["state"].get("running"), running["status"]
    placed = vnodes["vn-xeon2"].record()["pods"][key]
    assert placed["phase"] == "Running" and placed["containers"]["main"]["cpuset"], placed
