"""A terminating pod whose containers the kubelet has already removed, while its object is still listed: the real
plugin has dropped its balloon, so balance-balloons counts one instance fewer than a ledger that still holds the
pod. The 100-node fleet benchmark (bench/bench_fleet.py) caught the ledger foreseeing the next TP=1 balloon on a NUMA
node with room while the plugin chose the one with the fewest instances, lacked room there and split the balloon
over two NUMA nodes. The ledger now treats a terminating pod's node as unsettled: a balloon is admitted there only if
it fits whichever NUMA node the plugin picks."""

from __future__ import annotations

from tests.oracle.peer import BalloonsPeer
from tests.oracle.scenarios import NODE, Group, Node, policy_spec
from tests.oracle.sysfs import NodeShape

# 4 NUMA nodes of 16 cores on 2 packages, SMT off; seed 2 draws the `siblings` profile: one reserved core per NUMA
# node, 15 left.
GROUP = Group(seed=2, shape=NodeShape(packages=2, numa_per_package=2, cores_per_numa=16, threads_per_core=1),
              policy="generated")


def test_a_pod_whose_containers_are_gone_does_not_steer_the_next_balloon() -> None:
    with BalloonsPeer(GROUP.shape, policy_spec(GROUP)) as plugin:
        node = Node(plugin, GROUP)
        assert node.free() == ((15,) * 4, (15,) * 4)
        # balance-balloons: the NUMA type with the fewest balloons, on a tie the first listed
        for name, cores, numa in (("a", 3, 0), ("b", 11, 1), ("c", 11, 2), ("e", 9, 3),
                                  ("f", 2, 0), ("g", 2, 1), ("h", 2, 2), ("leaving", 2, 3)):
            fit, got = node.add_model(name, 1, cores)
            assert fit.ok and got == {numa: cores}, (name, fit, got)
        assert node.free() == ((10, 2, 2, 4), (10, 2, 2, 4))
        node.leave("leaving")  # NUMA node 3's type has one balloon on the plugin, two in a ledger that counts its
        fit, got = node.add_model("d", 1, 8)
        # The plugin took the type with the fewest balloons, NUMA node 3's, where 6 cores are free: it split.
        assert len(got) == 2, got
        # The ledger cannot know whether the terminating pod's balloon is still there: it refuses, until it is gone.
        assert not fit.ok and fit.resolvable, (fit.check, fit.per_numa)
        node.delete("leaving")  # gone from the list too: the ledger counts what the plugin counts again
        ledger = node.cluster.ledger(NODE)
        assert ledger is not None and ledger.unsettled == 0 and node.free() == ((10, 2, 2, 6), (10, 2, 2, 6))
        fit, got = node.add_model("d2", 1, 8)
        assert not fit.ok and fit.check == "balloon-not-numa-local" and len(got) == 2, (fit.check, got)
