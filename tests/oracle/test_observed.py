"""Observed beats predicted: the ledger takes the balloons the real plugin exports over its own prediction."""

from __future__ import annotations

from placement.assume import AssumeCache
from placement.cluster import ClusterState
from placement.demand import read_model_pod
from placement.mutation import mutate_pod
from tests.oracle.judge import cores_by_numa
from tests.oracle.kubelet import peer_pod, run_pod
from tests.oracle.peer import BalloonsPeer, Container, Pod
from tests.oracle.scenarios import (
    NODE,
    SETTINGS,
    Group,
    Node,
    bound_pod,
    exported_nrt,
    model_pod,
    node_objects,
    policy_spec,
)
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


def test_two_pods_bound_back_to_back_that_the_kubelet_starts_in_the_other_order_are_held_where_they_run() -> None:
    """The 30-node balloons fleet (bench/bench_fleet.py, seed 7): two pods bound to one node 7 ms apart, each
    placed by /bind on the NUMA node balance-balloons would give it next; the kubelet started the second first, so
    the plugin gave each the other's NUMA node. The export's update came while both were Pending, and the ledger
    kept its prediction (each claimed the other's balloon, the one on its own NUMA node), 4 cores off on each NUMA
    node, until the next pod there failed. Once they run, the export says where they are."""
    group = Group(seed=2, shape=NodeShape(packages=2, numa_per_package=2, cores_per_numa=16, threads_per_core=1),
                  policy="generated")
    cluster = ClusterState.from_objects(node_objects(group), SETTINGS)
    with BalloonsPeer(group.shape, policy_spec(group)) as plugin:
        bound = {}
        for name, cores in (("x", 8), ("y", 4)):
            pod = mutate_pod(model_pod(name, 1, cores), cluster).pod
            demand = read_model_pod(pod, SETTINGS)
            assert demand is not None
            assert AssumeCache(cluster).assume(f"uid-{name}", "models", name, demand, NODE).ok
            bound[name] = bound_pod(pod, AssumeCache(cluster).placement(f"uid-{name}"))
            bound[name]["status"] = {"phase": "Pending"}
            cluster.apply("Pod", "MODIFIED", bound[name])
        predicted = cluster.ledger(NODE)
        assert predicted is not None
        assert {n: predicted.holdings[f"uid-{n}"].per_numa for n in bound} == {"x": ((0, 8),), "y": ((1, 4),)}
        got = {}
        for name in ("y", "x"):  # the kubelet starts y first
            run = peer_pod(bound[name])
            assert run_pod(plugin, run)["vllm"].ok
            got[name] = next(b.cpus for b in plugin.balloons() if f"models/{name}/vllm" in b.containers)
        cluster.apply("NodeResourceTopology", "ADDED", exported_nrt(plugin, containers=False))
        assert cluster.ledger(NODE) is not None  # rebuilt from the export while both are Pending
        for name in ("y", "x"):
            running = {"phase": "Running", "startTime": "2026-12-06T17:58:38Z"}
            cluster.apply("Pod", "MODIFIED", {**bound[name], "status": running})
        ledger = cluster.ledger(NODE)
        assert ledger is not None
        held = {n: ledger.holdings[f"uid-{n}"].per_numa for n in bound}
        assert held == {n: tuple(sorted(cores_by_numa(group.shape, got[n]).items())) for n in bound}, held
        assert held == {"x": ((1, 8),), "y": ((0, 4),)}


def test_a_pod_bound_but_not_started_takes_no_running_pods_balloon_on_a_rebuild() -> None:
    """The same fleet, after the fix above: a pod just bound (Pending, its balloon not made yet) sorted first in a
    rebuild (same creation second, its name first) and took the balloon of another size that a running pod held on
    its NUMA node; that pod then took a third pod's balloon on the other NUMA node, which was counted twice and the
    first NUMA node's cores not at all."""
    group = Group(seed=2, shape=NodeShape(packages=2, numa_per_package=2, cores_per_numa=16, threads_per_core=1),
                  policy="generated")
    with BalloonsPeer(group.shape, policy_spec(group)) as plugin:
        node = Node(plugin, group)
        for name, numa in (("w", 0), ("x", 1), ("y", 2), ("z", 3)):
            fit, got = node.add_model(name, 1, 8)
            assert fit.ok and got == {numa: 8}, (name, fit, got)
        pod = mutate_pod(model_pod("a", 1, 4), node.cluster).pod
        demand = read_model_pod(pod, SETTINGS)
        assert demand is not None and AssumeCache(node.cluster).assume("uid-a", "models", "a", demand, NODE).ok
        pending = {**bound_pod(pod, AssumeCache(node.cluster).placement("uid-a")), "status": {"phase": "Pending"}}
        rebuilt = ClusterState.from_objects([*node_objects(group), *(p for p, _ in node.pods.values()), pending,
                                             exported_nrt(plugin, containers=False)], SETTINGS)
        ledger = rebuilt.ledger(NODE)
        assert ledger is not None
        held = {h.pod.removeprefix("models/"): h.per_numa for h in ledger.holdings.values()}
        assert held == {"a": ((0, 4),), "w": ((0, 8),), "x": ((1, 8),), "y": ((2, 8),), "z": ((3, 8),)}, held
