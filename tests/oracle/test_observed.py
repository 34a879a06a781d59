"""Observed beats predicted: the ledger takes the balloons the real plugin exports over its own prediction."""

from __future__ import annotations

from placement.cluster import ClusterState
from tests.oracle.peer import BalloonsPeer, Container, Pod
from tests.oracle.scenarios import NODE, SETTINGS, Group, exported_nrt, node_objects, policy_spec
from tests.oracle.sysfs import NodeShape

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


def test_a_pod_whose_balloon_the_export_showed_first_is_held_where_the_plugin_put_it() -> None:
    """The plugin's agent can write the NRT before the extender's pod watch delivers the pod bound to the node
    (seen in tests/e2e: a KServe pod stayed predicted, not observed, until another pod moved the NRT). The pod's
    own event must then take the exported balloon, not the prediction."""
    group = Group(seed=7, shape=NodeShape(packages=2, numa_per_package=2, cores_per_numa=16), policy="plain")
    cluster = ClusterState.from_objects(node_objects(group), SETTINGS)
    assert cluster.ledger(NODE) is not None  # built before either event, as a running extender has it
    with BalloonsPeer(group.shape, policy_spec(group)) as node:
        obj = pod_object("late", "vllm-balloon-tp1", 20)
        got = node.create(Pod("late", "models", annotations=obj["metadata"]["annotations"]),
                          Container("vllm", cpu="20", cpu_limit="20"))
        assert got.ok
        cluster.apply("NodeResourceTopology", "ADDED", exported_nrt(node))
        assert cluster.ledger(NODE) is not None  # rebuilt from the export (a /filter or the warm-up reads it)
        cluster.apply("Pod", "ADDED", obj)
    ledger = cluster.ledger(NODE)
    assert ledger is not None
    want: dict[int, int] = {}
    for core in {group.shape.core_of(c) for c in got.cpus}:
        numa = core // group.shape.cores_per_numa
        want[numa] = want.get(numa, 0) + 1
    holding = ledger.holdings["uid-late"]
    assert holding.observed and dict(holding.per_numa) == want, holding
