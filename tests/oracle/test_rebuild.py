"""A ledger rebuilt from a pod list holds every pod where the real balloons plugin put it.

The plugin's placement depends on the order of creates and deletes, which no list carries: after TP=2 `a`, TP=2 `b`,
delete `a`, TP=2 `c`, TP=1 `t`, a ledger that replays the survivors in creation order puts `b` where `a` was.
The extender persists each pod's placement when it binds it (the Binding's annotations land on the pod), and a
rebuild reads that back; a pod without one (bound by another scheduler, or before the install) is counted on every
NUMA node it could be on, so that nothing admitted next can be spread."""

from __future__ import annotations

from placement.assume import AssumeCache
from placement.cluster import ClusterState
from placement.demand import read_model_pod
from tests.oracle.peer import BalloonsPeer
from tests.oracle.scenarios import NODE, SETTINGS, Group, Node, exported_nrt, node_objects, policy_spec
from tests.oracle.sysfs import NodeShape

SHAPE = NodeShape(packages=1, numa_per_package=4, cores_per_numa=16, threads_per_core=2)
GROUP = Group(seed=21, shape=SHAPE, policy="generated")


def churn(node: Node) -> dict[str, dict[int, int]]:
    where = {}
    for name, tp, cpu in (("a", 2, 16), ("b", 2, 16)):
        verdict, where[name] = node.add_model(name, tp, cpu)
        assert verdict.ok and dict(verdict.per_numa) == where[name], (verdict, where[name])
    node.delete("a")
    for name, tp, cpu in (("c", 2, 16), ("t", 1, 4)):
        verdict, where[name] = node.add_model(name, tp, cpu)
        assert verdict.ok and dict(verdict.per_numa) == where[name], (verdict, where[name])
    return where


def held(cluster: ClusterState) -> dict[str, dict[int, int]]:
    ledger = cluster.ledger(NODE)
    assert ledger is not None
    return {h.pod.rsplit("/", 1)[1]: dict(h.per_numa) for h in ledger.holdings.values()}


def test_a_rebuilt_ledger_holds_each_pod_where_the_plugin_put_it_and_admits_nothing_it_spreads() -> None:
    with BalloonsPeer(SHAPE, policy_spec(GROUP)) as plugin:
        node = Node(plugin, GROUP)
        where = churn(node)
        # After the churn `b` is not where a replay of b, c, t in creation order would put it.
        replayed = ClusterState.from_objects(node_objects(GROUP), SETTINGS)
        for name in ("b", "c", "t"):
            pod = node.pods[name][0]
            fresh = read_model_pod(pod, SETTINGS)
            assert fresh is not None
            assert AssumeCache(replayed).assume(f"replay-{name}", "models", name, fresh, NODE).ok
        assert dict(replayed.ledger(NODE).holdings["replay-b"].per_numa) != where["b"]  # type: ignore[union-attr]

        rebuilt = node.rebuilt()
        assert held(rebuilt) == {name: where[name] for name in ("b", "c", "t")}
        assert rebuilt.ledger(NODE).free() == node.cluster.ledger(NODE).free()  # type: ignore[union-attr]
        # What the rebuilt ledger admits next runs on the plugin where it said, one NUMA node per rank.
        for name, tp, cpu in (("d", 2, 16), ("e", 1, 8), ("f", 2, 8)):
            verdict, got = node.add_model(name, tp, cpu, rebuilt)
            if verdict.ok:
                assert dict(verdict.per_numa) == got, (name, verdict.per_numa, got)


def test_pods_of_unknown_placement_are_found_by_their_balloons_in_the_exported_topology() -> None:
    """Without container zones (showContainersInNrt off) the plugin still exports each balloon, named by its type:
    a pod of unknown placement is held where a balloon of its type that no other pod claims is."""
    with BalloonsPeer(SHAPE, policy_spec(GROUP)) as plugin:
        node = Node(plugin, GROUP)
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
            verdict, got = node.add_model(name, tp, cpu, rebuilt)
            assert verdict.ok, verdict.reason
            assert dict(verdict.per_numa) == got, (name, verdict.per_numa, got)


def test_pods_of_unknown_placement_are_counted_so_that_nothing_admitted_is_spread() -> None:
    """Nothing exported either: each is counted on every NUMA node it could be on, and the refusal says why."""
    with BalloonsPeer(SHAPE, policy_spec(GROUP)) as plugin:
        node = Node(plugin, GROUP)
        churn(node)
        node.delete("c")
        unknown = node.rebuilt(annotated=False)
        ledger = unknown.ledger(NODE)
        assert ledger is not None and ledger.unsettled == 2
        admitted = 0
        for name, tp, cpu in (("d", 2, 16), ("e", 1, 8), ("f", 2, 8), ("g", 1, 2), ("h", 2, 4)):
            verdict, got = node.add_model(name, tp, cpu, unknown)
            if verdict.ok:
                admitted += 1
                assert len(got) == tp, (name, got)  # one NUMA node per rank, wherever the plugin chose
            else:
                assert "with no recorded placement count on every NUMA node" in verdict.reason, verdict.reason
        assert admitted


def test_a_rebuilt_ledger_admits_no_balloon_where_shared_balloons_may_have_grown_in_a_history_it_cannot_see() -> None:
    """System pods of 15, 15, 11, 13, 9 and 11 CPUs, two of them deleted on the way (the second and the first), on 2
    packages of one 20-core NUMA node, SMT on, the generated policy: the plugin grew and shrank the reserved balloon
    so that it holds 36 CPUs beyond its cpuset on NUMA node 1 and none on NUMA node 0 (free cores 15 and 2). The live
    ledger followed it there. A ledger rebuilt from the list replays the four that are left in creation order and
    grows the balloon on NUMA node 0 (17 and 0 free): it would admit a TP=1 pod of 16 cores on NUMA node 0, which the
    plugin runs 15 + 1. Where the shared balloons grew is a guess there, and the pod must fit wherever they are."""
    shape = NodeShape(packages=2, numa_per_package=1, cores_per_numa=20, threads_per_core=2)
    group = Group(seed=1, shape=shape, policy="generated")
    with BalloonsPeer(shape, policy_spec(group)) as plugin:
        node = Node(plugin, group)
        for name, cpu in (("s0", 15), ("s1", 15)):
            assert node.add_system(name, "kube-system", cpu)
        node.delete("s1")
        for name, cpu in (("s3", 11), ("s4", 13), ("s5", 9), ("s6", 11)):
            assert node.add_system(name, "kube-system", cpu)
        node.delete("s0")
        live, plugin = node.free()
        # The live ledger in whole cores per pod holds a core too few (16, 2); in CPUs, as the plugin grows it, agrees.
        assert plugin == (15, 2) and live == (16, 2)
        assert node.cluster.ledger(NODE).free_threads() == plugin  # type: ignore[union-attr]
        rebuilt = node.rebuilt()
        ledger = rebuilt.ledger(NODE)
        assert ledger is not None and ledger.free()[0] > 15  # the replay: on the other NUMA node
        verdict, got = node.add_model("t", 1, 16, rebuilt)
        assert got == {0: 15, 1: 1}  # the plugin spreads it
        assert not verdict.ok and "shared balloons took elsewhere" in verdict.reason, verdict.reason
        assert "read the node's pods from a list" in verdict.reason
