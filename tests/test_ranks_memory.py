"""Ranks beyond TP (pipeline and in-pod data parallelism) and memory per NUMA node, through the webhook over
HTTPS with real AdmissionReview bodies, and the ledger the extender asks."""

from __future__ import annotations

from typing import Any

from placement.balloons import node_balloons_policy
from placement.cluster import ClusterState
from placement.config import Settings
from placement.demand import read_model_pod
from placement.topology import linux_layout
from tests.support.webhook import AMX, MakeWebhook, Obj, admitted, refused, review

NUMA = "cpu-policy.model-manager.io/numa-nodes"


def node(name: str, numa: int, cores: int = 32, memory_gib_per_numa: int = 256) -> Obj:
    cpus = str(numa * cores * 2)
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {
                AMX["key"]: "true", "feature.node.kubernetes.io/cpu-hardware_multithreading": "true",
                "feature.node.kubernetes.io/memory-numa.node_count": str(numa)}},
            "spec": {}, "status": {"capacity": {"cpu": cpus, "memory": f"{numa * memory_gib_per_numa}Gi"},
                                   "allocatable": {"cpu": cpus, "memory": f"{numa * memory_gib_per_numa}Gi"}}}


def policy(name: str, numa: int, cores: int = 32) -> Obj:
    out = node_balloons_policy(name, linux_layout([cores] * numa, 2, "labels"), Settings(), "kube-system")
    out["status"] = {"nodes": {name: {"status": "Success", "generation": 1}}}
    return out


def pod(args: list[str], cpu: str = "8", memory: str = "64Gi", uid: str = "ranks") -> Obj:
    sent = review("ar-pod-kubectl-run.json", uid=uid)
    container = sent["request"]["object"]["spec"]["containers"][0]
    container["args"] = ["--model", "/models/llama", *args]
    container["resources"] = {"requests": {"cpu": cpu, "memory": memory}, "limits": {"cpu": cpu, "memory": memory}}
    return sent


def running(name: str, on: str, memory: str, tp: int = 2) -> Obj:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "llm", "uid": f"uid-{name}",
                         "creationTimestamp": "2026-12-01T00:00:00Z",
                         "labels": {"model-manager.io/model": name},
                         "annotations": {"cpu-policy.model-manager.io/type": "nri-balloons",
                                         "balloon.balloons.resource-policy.nri.io/container.main":
                                             f"vllm-balloon-tp{tp}"}},
            "spec": {"nodeName": on, "containers": [{"name": "main", "args": ["-tp", str(tp)], "resources": {
                "requests": {"cpu": "8", "memory": memory}, "limits": {"cpu": "8", "memory": memory}}}]},
            "status": {"phase": "Running"}}


def roomy_and_busy() -> list[Obj]:
    """Two 2-NUMA nodes under one policy (one class of node for the extender's memo); "busy" runs a
    non-model pod that requests 300Gi of memory and next to no CPU."""
    hog = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "cache", "namespace": "data", "uid": "uid-cache", "labels": {"app": "cache"}},
           "spec": {"nodeName": "busy", "containers": [{"name": "redis", "resources": {
               "requests": {"cpu": "100m", "memory": "300Gi"}}}]}, "status": {"phase": "Running"}}
    shared = policy("roomy", 2)
    shared["metadata"]["name"] = "default"
    shared["status"]["nodes"]["busy"] = shared["status"]["nodes"]["roomy"]
    return [node("roomy", 2), node("busy", 2), shared, hog]


def numa_nodes_on(objects: list[Obj], mutated: dict[str, Any], node_name: str) -> tuple[int, ...]:
    state = ClusterState.from_objects(objects, Settings())
    fit = state.fit(read_model_pod(mutated, state.settings), state.ledger(node_name))  # type: ignore[arg-type]
    assert fit.ok, fit.reason
    return tuple(n for n, _ in fit.per_numa)


async def test_tp2_pp2_needs_four_numa_nodes_refused_on_two_placed_on_four(make_webhook: MakeWebhook) -> None:
    args = ["--tensor-parallel-size", "2", "--pipeline-parallel-size", "2"]
    two_numa = [node("a", 2), policy("a", 2), node("b", 2), policy("b", 2)]
    refused(await admitted(await make_webhook(two_numa), pod(args)),
            "TP=2 × PP=2 needs a node with at least 4 NUMA nodes, one per rank; the 2 eligible nodes have at most 2",
            "Use pipeline-parallel-size 1, or add a node with ≥4 NUMA nodes")
    fleet = [*two_numa, node("snc", 4), policy("snc", 4)]
    answer = await admitted(await make_webhook(fleet), pod(args, uid="ranks-4"))
    assert answer.allowed, answer.message
    mutated = (await (await make_webhook(fleet)).mutate(pod(args, uid="ranks-m"))).pod
    annotations = mutated["metadata"]["annotations"]
    assert annotations[NUMA] == "4" and annotations[
        "balloon.balloons.resource-policy.nri.io/container.llama3"] == "vllm-balloon-tp4"
    assert numa_nodes_on(fleet, mutated, "snc") == (0, 1, 2, 3)


async def test_tp2_dp2_likewise(make_webhook: MakeWebhook) -> None:
    args = ["-tp", "2", "--data-parallel-size=2"]
    refused(await admitted(await make_webhook([node("a", 2), policy("a", 2)]), pod(args)),
            "TP=2 × DP=2 needs a node with at least 4 NUMA nodes", "Use data-parallel-size 1")
    fleet = [node("snc", 4), policy("snc", 4)]
    mutated = (await (await make_webhook(fleet)).mutate(pod(args, uid="dp-m"))).pod
    assert mutated["metadata"]["annotations"][NUMA] == "4"
    assert numa_nodes_on(fleet, mutated, "snc") == (0, 1, 2, 3)


async def test_rank_counts_that_no_balloon_spans_are_refused_by_name(make_webhook: MakeWebhook) -> None:
    wh = await make_webhook([node("snc", 4), policy("snc", 4)])
    refused(await admitted(wh, pod(["-tp", "2", "-pp", "3"])), "TP=2 × PP=3 makes 6 ranks")


async def test_memory_per_numa_node_never_and_now(make_webhook: MakeWebhook) -> None:
    # Two nodes of 2 NUMA nodes x 256Gi; on `busy` a TP=2 model pins 120Gi to each NUMA node already.
    fleet = [node("roomy", 2), policy("roomy", 2), node("busy", 2), policy("busy", 2),
             running("other", "busy", "240Gi")]
    wh = await make_webhook(fleet)
    refused(await admitted(wh, pod(["-tp", "2"], memory="600Gi", uid="mem-600")),
            "TP=2 pins 300Gi of memory to each of its 2 NUMA nodes (pinMemory); nodes of this shape have 256Gi")
    sent = pod(["-tp", "2"], memory="400Gi", uid="mem-400")
    assert (await admitted(wh, sent)).allowed
    state = ClusterState.from_objects(fleet, Settings())
    demand = read_model_pod((await wh.mutate(sent)).pod, state.settings)
    roomy, busy = (state.fit(demand, state.ledger(n)) for n in ("roomy", "busy"))  # type: ignore[arg-type]
    assert roomy.ok and roomy.memory == 200 * 2**30
    assert not busy.ok and busy.check == "insufficient-free-memory" and busy.resolvable
    assert "needs 200Gi free memory on each of its NUMA nodes" in busy.reason
    assert state.ledger("busy").free_memory() == (136 * 2**30, 136 * 2**30)  # type: ignore[union-attr]


def test_the_extender_tells_apart_nodes_that_differ_only_in_free_memory() -> None:
    from extender.filter import Judge

    state = ClusterState.from_objects(roomy_and_busy(), Settings())
    assert state.ledger("roomy").free() == state.ledger("busy").free()  # type: ignore[union-attr]
    model = running("new", "", "400Gi")
    model["spec"].pop("nodeName")
    judge = Judge(state)
    roomy, busy = judge.verdicts(judge.read_pod(model), ["roomy", "busy"])
    assert roomy is not None and roomy.ok
    assert busy is not None and not busy.ok and "200Gi free memory" in busy.message


def test_the_extender_packs_numa_memory_as_it_packs_cores() -> None:
    """Two nodes with the same free cores; one already holds 300Gi of memory. MostAllocated packs, so the model
    scores higher where its pinned memory fills the node more, and a node whose memory it would fill is not
    ranked as a node whose memory is untouched."""
    from extender.filter import Judge
    from extender.score import rank

    state = ClusterState.from_objects(roomy_and_busy(), Settings())
    assert state.ledger("roomy").free() == state.ledger("busy").free()  # type: ignore[union-attr]
    model = running("new", "", "40Gi")
    model["spec"].pop("nodeName")
    judge = Judge(state)
    scores, best = rank(judge, judge.read_pod(model), ["roomy", "busy"])
    # 8 of 64 cores either way; memory 40 of 512Gi on roomy, 340 of 512Gi on busy: (0.125 + 0.08) / 2 and
    # (0.125 + 0.66) / 2, no sliver left, so on the upper part of the scale, 5 + round(5 x value): 5 + 0 and 5 + 2.
    assert scores == [5, 7] and best == "busy"
