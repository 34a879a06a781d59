"""Pods a controller creates, with the real kube-controller-manager: a Deployment scaled while its node is full gets
its new replica admitted to wait Pending, not refused into the ReplicaSet controller's doubling backoff, and the
scheduler binds it as soon as room appears; a person's pod of the same shape is still refused at once."""

from __future__ import annotations

import json
import time
from typing import Any

import yaml

from extender.waiting import CONDITION
from placement.ledger import PLACEMENT, Placed
from tests.e2e.cluster import Cluster, node, wait_until
from tests.e2e.fleet import MODEL_NS, PLACED_NS, POOL, model_deployment, model_pod

NODE = "ctl-0"
NAME = "ctl-scaler"
MESSAGE = "cpu-policy.model-manager.io/message"


def test_a_deployment_scaled_while_full_gets_its_replica_bound_as_soon_as_room_appears(cluster: Cluster) -> None:
    # One node of its own (pool `ctl`): 29 model cores per NUMA node; a running 20-core model leaves 9 on one.
    cluster.create_nodes([node(NODE, numa=2, cores_per_numa=32, labels={POOL: "ctl"})])
    # Bound by name, as our extender would have bound it: with the placement its Binding records (NUMA node 0).
    placed = Placed(NODE, ((0, 20),), ("vllm-balloon-tp1", "vllm-numa-0")).annotation()
    cluster.create_pods([model_pod("ctl-blocker", PLACED_NS, tp=1, cpu="40", node_name=NODE,
                                   annotations={PLACEMENT: placed})])
    deployment = model_deployment(NAME, MODEL_NS, 1)  # 16 cores, TP=1
    deployment["spec"]["template"]["spec"]["nodeSelector"] = {POOL: "ctl"}
    timeline: dict[str, Any] = {}
    try:
        cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(deployment))

        def replicas() -> list[dict[str, Any]]:
            return cluster.pods(MODEL_NS, f"app={NAME}")

        wait_until("the first replica bound", lambda: [p for p in replicas() if p["spec"].get("nodeName")],
                   timeout=90)
        # The second replica's 16 cores fit neither NUMA node (9 and 13 free).
        started = time.monotonic()
        cluster.kubectl("-n", MODEL_NS, "scale", "deployment", NAME, "--replicas=2")
        waiting = wait_until("the second replica created", lambda: [
            p for p in replicas() if not p["spec"].get("nodeName")], timeout=60, every=0.05)[0]
        timeline["created_after_scale_s"] = round(time.monotonic() - started, 2)
        note = waiting["metadata"]["annotations"][MESSAGE]
        assert "none of the 1 eligible nodes has that free now" in note, note
        assert "it waits Pending and is bound as soon as room appears" in note, note

        def unschedulable() -> dict[str, Any] | None:
            pod = cluster.api.get(f"/api/v1/namespaces/{MODEL_NS}/pods/{waiting['metadata']['name']}")
            return next((c for c in pod["status"].get("conditions", ())
                         if c["type"] == "PodScheduled" and c["status"] == "False"), None)

        condition = wait_until("PodScheduled=False from our extender", unschedulable, timeout=60)
        timeline["unschedulable_after_scale_s"] = round(time.monotonic() - started, 2)
        assert condition["reason"] == "Unschedulable", condition
        # The ReplicaSet controller was never refused a create: no FailedCreate, so no backoff.
        events = cluster.kubectl_json("-n", MODEL_NS, "get", "events", "--field-selector", "reason=FailedCreate")
        assert not [e for e in events["items"] if e["involvedObject"]["name"].startswith(NAME)], events["items"]

        # A person's pod of the same shape hears the numbers at once.
        bare = model_pod("ctl-by-hand", MODEL_NS, tp=1, cpu="16", memory="96Gi", node_selector={POOL: "ctl"})
        done = cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(bare), check=False)
        assert done.returncode != 0, done.stdout
        assert 'admission webhook "pods.validate.model-placement.io" denied the request' in done.stderr
        assert "none of the 1 eligible nodes has that free now" in done.stderr, done.stderr

        # Room appears: the running model leaves. The scheduler's queue, not the controller's backoff, places it.
        freed = time.monotonic()
        cluster.kubectl("-n", PLACED_NS, "delete", "pod", "ctl-blocker", "--grace-period=0", "--force")
        bound = wait_until("the waiting replica bound", lambda: cluster.api.get(
            f"/api/v1/namespaces/{MODEL_NS}/pods/{waiting['metadata']['name']}")["spec"].get("nodeName"),
            timeout=60, every=0.05)
        timeline["bound_after_room_s"] = round(time.monotonic() - freed, 2)
        assert bound == NODE
        # Whether the scheduler retried before our watch showed the room, so that our extender had to ask again.
        status = cluster.api.get(f"/api/v1/namespaces/{MODEL_NS}/pods/{waiting['metadata']['name']}")["status"]
        timeline["extender_asked_retry"] = any(c["type"] == CONDITION for c in status.get("conditions", ()))
        print("timeline:", json.dumps(timeline))
        (cluster.root / "issue23-timeline.json").write_text(json.dumps(timeline, indent=2))
    finally:
        cluster.delete_deployment(MODEL_NS, NAME, f"app={NAME}")
        cluster.kubectl("-n", PLACED_NS, "delete", "pod", "ctl-blocker", "--grace-period=0", "--force",
                        check=False)
        cluster.kubectl("delete", "node", NODE, "--wait=false", check=False)


# The pods KServe's controllers render (tests/fixtures, written from kserve/kserve's config/llmisvcconfig templates
# and its InferenceService predictor), each with the NUMA nodes and cores per rank it must be pinned on.
KSERVE_PODS = {  # fixture -> (name here, NUMA nodes, cores per NUMA node)
    "ar-pod-llmisvc-decode.json": ("qwen3-8b-kserve-e2e", 2, 8),  # TP=2 in bash -c eval, a native routing sidecar
    "ar-pod-llmisvc-prefill.json": ("qwen3-8b-prefill-e2e", 2, 8),
    "ar-pod-llmisvc-lws-worker.json": ("qwen3-8b-lws-worker-e2e", 4, 4),  # 2 local DP ranks x TP=2
    "ar-pod-kserve-rs.json": ("llama3-8b-predictor-e2e", 1, 16),  # an InferenceService predictor, TP=1
}


def test_kserve_llm_workload_pods_are_placed_and_the_router_is_left_alone(cluster: Cluster) -> None:
    """Pods shaped as KServe renders them, created through the real apiserver: the LLMInferenceService decode and
    prefill pods, a LeaderWorkerSet worker (its own ranks) and an InferenceService predictor are each pinned on one
    NUMA node per rank and bound by our extender; the router-scheduler pod is not touched. Without their owners (no
    KServe controller here) they are a person's pods."""
    from tests.conftest import fixture_json
    from tests.e2e.test_placement import debug_node, held_numa

    sent = {**{f: name for f, (name, _, _) in KSERVE_PODS.items()},
            "ar-pod-llmisvc-router-scheduler.json": "qwen3-8b-router-e2e"}
    for fixture, name in sent.items():
        pod = fixture_json(fixture)["request"]["object"]
        meta = pod["metadata"]
        meta.pop("ownerReferences", None), meta.pop("generateName", None)
        meta["name"] = name
        pod["spec"]["serviceAccountName"] = "default"
        cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(pod))
    try:
        for fixture, (name, numa_nodes, cores) in KSERVE_PODS.items():
            placed = wait_until(f"{name} bound", lambda name=name: (p := cluster.api.get(
                f"/api/v1/namespaces/{MODEL_NS}/pods/{name}"))["spec"].get("nodeName") and p, timeout=90)
            ann = placed["metadata"]["annotations"]
            assert ann["cpu-policy.model-manager.io/numa-nodes"] == str(numa_nodes), (fixture, ann)
            assert placed["spec"]["schedulerName"] == "model-placement-scheduler", fixture
            # One NUMA node per rank, each with the rank's cores, as the extender's ledger holds it.
            held = held_numa(debug_node(cluster, placed["spec"]["nodeName"]))[f"{MODEL_NS}/{name}"]
            assert len({numa for numa, _ in held}) == numa_nodes and all(c == cores for _, c in held), (fixture, held)
        stored = cluster.api.get(f"/api/v1/namespaces/{MODEL_NS}/pods/qwen3-8b-router-e2e")
        assert not any(k.startswith("cpu-policy.model-manager.io/") for k in stored["metadata"]["annotations"])
        assert stored["spec"]["schedulerName"] == "default-scheduler"
    finally:
        cluster.kubectl("-n", MODEL_NS, "delete", "pod", *sent.values(), "--grace-period=0", "--force", check=False)
