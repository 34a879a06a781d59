"""A BalloonsPolicy whose reserved type sets no minCPUs lends the reserved cpuset to every other balloon
(BalloonsPolicy.lends_reserved): the reserved balloon starts empty, and the reserved CPUs are free CPUs that other
balloons take last. Once a balloon needs some of them the plugin's device hints no longer keep it together, and
held to the real plugin it may take them on another NUMA node than the rest of the balloon. The ledger counts lent
cores where the plugin's choices do (a NUMA node has room when it has them) and refuses a balloon that would need
them (reserved-cpus-lent): the plugin sometimes runs such a balloon NUMA-locally, and that refusal is the price."""

from __future__ import annotations

from placement.cluster import ClusterState
from placement.mutation import mutate_pod
from placement.reasons import RESERVED_LENT
from tests.oracle.judge import cores_by_numa
from tests.oracle.kubelet import peer_pod, run_pod
from tests.oracle.peer import BalloonsPeer
from tests.oracle.scenarios import NODE, SETTINGS, Node, make_group, model_pod, node_objects, policy_spec

# 2 packages x 1 NUMA node x 17 cores, SMT on, 2 reserved cores on each NUMA node; the elastic policy: the
# generated types, the reserved type without minCPUs.
GROUP = make_group(1087)


def test_the_plugin_may_take_lent_reserved_cores_from_another_numa_node() -> None:
    shape = GROUP.shape
    cluster = ClusterState.from_objects(node_objects(GROUP), SETTINGS)
    with BalloonsPeer(shape, policy_spec(GROUP)) as plugin:
        assert [b.cpus for b in plugin.balloons() if b.type == "reserved"] == [frozenset()]  # it starts empty
        placed = {}
        for name, tp, cores in (("a", 1, 9), ("b", 2, 14), ("c", 1, 1), ("d", 1, 8)):
            run = peer_pod(mutate_pod(model_pod(name, tp, cores), cluster).pod)
            assert run_pod(plugin, run)["vllm"].ok
            [cpus] = [b.cpus for b in plugin.balloons() if f"models/{name}/vllm" in b.containers]
            placed[name] = dict(cores_by_numa(shape, cpus))
    # a: 9 of NUMA node 0's 15 unreserved cores; b: 7 on each, so one of NUMA node 0's lent reserved cores.
    assert placed["a"] == {0: 9} and placed["b"] == {0: 7, 1: 7} and placed["c"] == {1: 1}
    # d's 8 cores: NUMA node 1 holds 7 unreserved and 2 lent ones free, yet the 8th comes from NUMA node 0.
    assert placed["d"] == {0: 1, 1: 7}, placed


def test_the_ledger_refuses_a_balloon_that_would_need_lent_reserved_cores() -> None:
    shape = GROUP.shape
    with BalloonsPeer(shape, policy_spec(GROUP)) as plugin:
        node = Node(plugin, GROUP)
        ledger = node.cluster.ledger(NODE)
        assert ledger is not None and ledger.lends_reserved and ledger.capacity == (17, 17)
        for name, tp, cores, where in (("a", 1, 9, {0: 9}), ("b", 2, 12, {0: 6, 1: 6}), ("c", 1, 1, {1: 1})):
            verdict, got = node.add_model(name, tp, cores)
            assert verdict.ok and dict(verdict.per_numa) == got == where, (name, verdict, got)
        # NUMA node 0: its 15 unreserved cores held, its 2 reserved ones lent; NUMA node 1: 8 free and 2 lent.
        assert ledger.free() == (2, 10) and ledger.unlent_free() == (0, 8)
        verdict, _ = node.add_model("d", 1, 9)
    assert not verdict.ok and verdict.check == RESERVED_LENT, verdict
    assert verdict.reason == ("the balloon would need 1 of the reserved cores on NUMA node 1, which the "
                              "BalloonsPolicy lends (its reserved balloon type sets no minCPUs), and the plugin may "
                              "take them from another NUMA node; set minCPUs on the reserved type to the size of "
                              "reservedResources")
