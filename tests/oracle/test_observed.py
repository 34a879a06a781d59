"""Observed beats predicted: the ledger takes the balloons the real plugin exports over its own prediction."""

from __future__ import annotations

from placement.cluster import ClusterState
from tests.oracle.peer import BalloonsPeer, Container, Pod
from tests.oracle.sysfs import NodeShape
from tests.oracle.test_differential import NODE, SETTINGS, Group, exported_nrt, node_objects, policy_spec

BALLOON = "balloon.balloons.resource-policy.nri.io/container.vllm"


def pod_object(name: str, balloon: str, cpu: int) -> dict:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "models", "uid": f"uid-{name}",
                         "labels": {"model-manager.io/model": name},
                         "annotations": {BALLOON: balloon, "cpu-policy.model-manager.io/type": "nri-balloons"}},
            "spec": {"nodeName": NODE, "containers": [{"name": "vllm", "resources": {
                "requests": {"cpu": str(cpu)}, "limits": {"cpu": str(cpu)}}}]},
            "status": {"phase": "Running"}}


def test_exported_balloons_replace_the_prediction_and_flag_a_spread_pod() -> None:
    # A hand-written plain policy on a 2-package node: the plugin picks NUMA nodes by package first, which the
    # ledger cannot know from labels, and a plain type spreads a balloon no NUMA node can hold.
    group = Group(seed=7, shape=NodeShape(packages=2, numa_per_package=2, cores_per_numa=16), policy="plain")
    cluster = ClusterState.from_objects(node_objects(group), SETTINGS)
    with BalloonsPeer(group.shape, policy_spec(group)) as node:
        for name, cpu in (("a", 20), ("b", 40)):
            obj = pod_object(name, "vllm-balloon-tp1", cpu)
            got = node.create(Pod(name, "models", annotations=obj["metadata"]["annotations"]),
                              Container("vllm", cpu=str(cpu), cpu_limit=str(cpu)))
            assert got.ok
            cluster.apply("Pod", "ADDED", obj)
        # 40 CPUs = 20 cores: more than a NUMA node of 16 has, so the plugin spreads it.
        wide = node.create(Pod("wide", "models", annotations={BALLOON: "vllm-balloon-tp1"}),
                           Container("vllm", cpu="40", cpu_limit="40"))
        spans = len({group.shape.numa_of(c) for c in wide.cpus})
        assert wide.ok and spans >= 2
        cluster.apply("Pod", "ADDED", pod_object("wide", "vllm-balloon-tp1", 40))
        cluster.apply("NodeResourceTopology", "ADDED", exported_nrt(node))
        real = {b.containers[0].split("/")[1]: b.cpus for b in node.balloons() if b.containers
                and b.containers[0].startswith("models/")}
    ledger = cluster.ledger(NODE)
    assert ledger is not None
    shape = group.shape
    for uid, holding in ledger.holdings.items():
        name = uid.removeprefix("uid-")
        want = {}
        for core in {shape.core_of(c) for c in real[name]}:
            numa = core // shape.cores_per_numa
            want[numa] = want.get(numa, 0) + 1
        assert holding.observed and dict(holding.per_numa) == want, name
    # The spread pod is reported for what it is, in the ledger's own view (/debug/nodes, report).
    assert f"spans {spans} NUMA nodes for TP=1" in ledger.holdings["uid-wide"].note
    held = [h for numa in ledger.to_json()["numa"] for h in numa["held"] if h["pod"] == "models/wide"]
    assert len(held) == spans and all(h["observed"] and f"spans {spans} NUMA nodes" in h["problem"] for h in held)
    assert not ledger.holdings["uid-a"].note
