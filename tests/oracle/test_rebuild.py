"""A ledger rebuilt from a pod list holds every pod where the real balloons plugin put it.

The plugin's placement depends on the order of creates and deletes, which no list carries: after TP=2 `a`, TP=2 `b`,
delete `a`, TP=2 `c`, TP=1 `t`, a ledger that replays the survivors in creation order puts `b` where `a` was.
The extender persists each pod's placement when it binds it (the Binding's annotations land on the pod), and a
rebuild reads that back; a pod without one (bound by another scheduler, or before the install) is counted on every
NUMA node it could be on, so that nothing admitted next can be spread."""

from __future__ import annotations

from typing import Any

from placement.assume import AssumeCache
from placement.cluster import ClusterState
from placement.demand import read_model_pod
from placement.ledger import PLACEMENT
from placement.mutation import mutate_pod
from tests.oracle.kubelet import peer_pod, run_pod
from tests.oracle.peer import BalloonsPeer
from tests.oracle.sysfs import NodeShape
from tests.oracle.test_differential import (
    NODE,
    SETTINGS,
    Group,
    cores_by_numa,
    exported_nrt,
    node_objects,
    policy_spec,
)

SHAPE = NodeShape(packages=1, numa_per_package=4, cores_per_numa=16, threads_per_core=2)
GROUP = Group(seed=21, shape=SHAPE, policy="generated")


def model_pod(name: str, tp: int, cpu: int) -> dict[str, Any]:
    resources = {"requests": {"cpu": str(cpu), "memory": "8Gi"}, "limits": {"cpu": str(cpu), "memory": "8Gi"}}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "models", "uid": f"uid-{name}",
                         "labels": {"model-manager.io/model": name}},
            "spec": {"containers": [{"name": "vllm", "args": ["--tensor-parallel-size", str(tp)],
                                     "resources": resources}]},
            "status": {"phase": "Pending"}}


class Node:
    """The plugin and a live ledger, pods bound as the extender binds them."""

    def __init__(self, plugin: BalloonsPeer) -> None:
        self.plugin = plugin
        self.cluster = ClusterState.from_objects(node_objects(GROUP), SETTINGS)
        self.bound: dict[str, dict[str, Any]] = {}
        self.runs: dict[str, Any] = {}

    def create(self, name: str, tp: int, cpu: int, cluster: ClusterState | None = None) -> tuple[Any, dict[int, int]]:
        """The ledger's verdict and where the plugin put the pod's cores (it stays on both when admitted)."""
        cluster = cluster or self.cluster
        mutated = mutate_pod(model_pod(name, tp, cpu), cluster).pod
        demand = read_model_pod(mutated, SETTINGS)
        assert demand is not None
        verdict = cluster.fit(demand, cluster.ledger(NODE))  # type: ignore[arg-type]
        run = peer_pod(mutated)
        created = run_pod(self.plugin, run)[demand.container]
        assert created.ok, created.error
        where = cores_by_numa(SHAPE, next(b.cpus for b in self.plugin.balloons()
                                          if f"models/{name}/{demand.container}" in b.containers))
        if verdict.ok:
            uid = mutated["metadata"]["uid"]
            assert AssumeCache(cluster).assume(uid, "models", name, demand, NODE).ok
            meta = {**mutated["metadata"], "annotations": {**mutated["metadata"]["annotations"],
                                                           PLACEMENT: AssumeCache(cluster).placement(uid)}}
            self.bound[name] = {**mutated, "metadata": meta, "spec": {**mutated["spec"], "nodeName": NODE},
                                "status": {"phase": "Running"}}
            self.runs[name] = run.pod
            cluster.apply("Pod", "ADDED", self.bound[name])
        else:
            self.plugin.remove_pod(run.pod)
        return verdict, where

    def delete(self, name: str) -> None:
        self.plugin.remove_pod(self.runs.pop(name))
        self.cluster.apply("Pod", "DELETED", self.bound.pop(name))

    def rebuilt(self, annotated: bool = True, nrt: dict[str, Any] | None = None) -> ClusterState:
        pods = [pod if annotated else {**pod, "metadata": {**pod["metadata"], "annotations": {
            k: v for k, v in pod["metadata"]["annotations"].items() if k != PLACEMENT}}} for pod in self.bound.values()]
        return ClusterState.from_objects([*node_objects(GROUP), *pods, *([nrt] if nrt else [])], SETTINGS)


def churn(node: Node) -> dict[str, dict[int, int]]:
    where = {}
    for name, tp, cpu in (("a", 2, 16), ("b", 2, 16)):
        verdict, where[name] = node.create(name, tp, cpu)
        assert verdict.ok and dict(verdict.per_numa) == where[name], (verdict, where[name])
    node.delete("a")
    for name, tp, cpu in (("c", 2, 16), ("t", 1, 4)):
        verdict, where[name] = node.create(name, tp, cpu)
        assert verdict.ok and dict(verdict.per_numa) == where[name], (verdict, where[name])
    return where


def held(cluster: ClusterState) -> dict[str, dict[int, int]]:
    ledger = cluster.ledger(NODE)
    assert ledger is not None
    return {h.pod.rsplit("/", 1)[1]: dict(h.per_numa) for h in ledger.holdings.values()}


def test_a_rebuilt_ledger_holds_each_pod_where_the_plugin_put_it_and_admits_nothing_it_spreads() -> None:
    with BalloonsPeer(SHAPE, policy_spec(GROUP)) as plugin:
        node = Node(plugin)
        where = churn(node)
        # After the churn `b` is not where a replay of b, c, t in creation order would put it.
        replayed = ClusterState.from_objects(node_objects(GROUP), SETTINGS)
        for name in ("b", "c", "t"):
            pod = node.bound[name]
            fresh = read_model_pod(pod, SETTINGS)
            assert fresh is not None
            assert AssumeCache(replayed).assume(f"replay-{name}", "models", name, fresh, NODE).ok
        assert dict(replayed.ledger(NODE).holdings["replay-b"].per_numa) != where["b"]  # type: ignore[union-attr]

        rebuilt = node.rebuilt()
        assert held(rebuilt) == {name: where[name] for name in ("b", "c", "t")}
        assert rebuilt.ledger(NODE).free() == node.cluster.ledger(NODE).free()  # type: ignore[union-attr]
        # What the rebuilt ledger admits next runs on the plugin where it said, one NUMA node per rank.
        for name, tp, cpu in (("d", 2, 16), ("e", 1, 8), ("f", 2, 8)):
            verdict, got = node.create(name, tp, cpu, rebuilt)
            if verdict.ok:
                assert dict(verdict.per_numa) == got, (name, verdict.per_numa, got)


def test_pods_of_unknown_placement_are_found_by_their_balloons_in_the_exported_topology() -> None:
    """Without container zones (showContainersInNrt off) the plugin still exports each balloon, named by its type:
    a pod of unknown placement is held where a balloon of its type that no other pod claims is."""
    with BalloonsPeer(SHAPE, policy_spec(GROUP)) as plugin:
        node = Node(plugin)
        where = churn(node)
        nrt = exported_nrt(plugin, containers=False)
        live = {name: where[name] for name in ("b", "c", "t")}
        for annotated in (True, False):
            rebuilt = node.rebuilt(annotated, nrt)
            assert rebuilt.ledger(NODE).unsettled == 0  # type: ignore[union-attr]
            assert rebuilt.ledger(NODE).free() == node.cluster.ledger(NODE).free()  # type: ignore[union-attr]
            # By type alone, b and c (same type, same size) may swap balloons: what is taken is the same.
            assert (held(rebuilt) if annotated else sorted(map(sorted, held(rebuilt).values()))) == \
                (live if annotated else sorted(map(sorted, live.values())))
        for name, tp, cpu in (("d", 2, 8), ("e", 1, 4), ("f", 1, 2)):
            verdict, got = node.create(name, tp, cpu, rebuilt)
            assert verdict.ok, verdict.reason
            assert dict(verdict.per_numa) == got, (name, verdict.per_numa, got)


def test_pods_of_unknown_placement_are_counted_so_that_nothing_admitted_is_spread() -> None:
    """Nothing exported either: each is counted on every NUMA node it could be on, and the refusal says why."""
    with BalloonsPeer(SHAPE, policy_spec(GROUP)) as plugin:
        node = Node(plugin)
        churn(node)
        node.delete("c")
        unknown = node.rebuilt(annotated=False)
        ledger = unknown.ledger(NODE)
        assert ledger is not None and ledger.unsettled == 2
        admitted = 0
        for name, tp, cpu in (("d", 2, 16), ("e", 1, 8), ("f", 2, 8), ("g", 1, 2), ("h", 2, 4)):
            verdict, got = node.create(name, tp, cpu, unknown)
            if verdict.ok:
                admitted += 1
                assert len(got) == tp, (name, got)  # one NUMA node per rank, wherever the plugin chose
            else:
                assert "with no recorded placement count on every NUMA node" in verdict.reason, verdict.reason
        assert admitted
