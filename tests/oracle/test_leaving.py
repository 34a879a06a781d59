"""A terminating pod whose containers the kubelet has already removed, while its object is still listed: the real
plugin has dropped its balloon, so balance-balloons counts one instance fewer than a ledger that still holds the
pod. The 100-node fleet benchmark (bench/bench_fleet.py) caught the ledger foreseeing the next TP=1 balloon on a NUMA
node with room while the plugin chose the one with the fewest instances, lacked room there and split the balloon
over two NUMA nodes. The ledger now forecasts such a node twice, with and without the terminating pods' balloons and
cores: a balloon is admitted there only where both forecasts agree, and held where they put it."""

from __future__ import annotations

from tests.oracle.peer import BalloonsPeer
from tests.oracle.scenarios import NODE, Group, Node, exported_nrt, policy_spec
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
        assert (fit.check, fit.resolvable) == ("pod-terminating", True), (fit.check, fit.per_numa)
        assert "after which it would put this one on no NUMA node per rank, not on NUMA node 0" in fit.reason
        # The same from a ledger rebuilt from a list (a relist, a restart, a standby extender), with and without the
        # plugin's export.
        for rebuilt in (node.rebuilt(), node.rebuilt(nrt=exported_nrt(plugin)),
                        node.rebuilt(nrt=exported_nrt(plugin, containers=False))):
            fit, got = node.add_model("d", 1, 8, cluster=rebuilt)
            assert len(got) == 2 and fit.check == "pod-terminating", (fit.check, fit.per_numa, got)
        node.delete("leaving")  # gone from the list too: the ledger counts what the plugin counts again
        ledger = node.cluster.ledger(NODE)
        assert ledger is not None and ledger.unsettled == 0 and node.free() == ((10, 2, 2, 6), (10, 2, 2, 6))
        fit, got = node.add_model("d2", 1, 8)
        assert not fit.ok and fit.check == "balloon-not-numa-local" and len(got) == 2, (fit.check, got)


def test_a_terminating_pod_that_does_not_change_the_forecast_does_not_hold_back_the_next_pod() -> None:
    with BalloonsPeer(GROUP.shape, policy_spec(GROUP)) as plugin:
        node = Node(plugin, GROUP)
        for name, numa in (("a", 0), ("b", 1), ("c", 2), ("e", 3), ("f", 0), ("g", 1), ("h", 2), ("i", 3)):
            fit, got = node.add_model(name, 1, 2)
            assert fit.ok and got == {numa: 2}, (name, fit, got)
        for name in ("f", "g", "h"):
            node.delete(name)
        node.leave("i")  # balloons per NUMA type 1, 1, 1 and 2 with it, 1 without: NUMA node 0's type either way
        fit, got = node.add_model("d", 1, 4)
        assert fit.ok and fit.per_numa == ((0, 4),) and got == {0: 4}, (fit, got)
        ledger = node.cluster.ledger(NODE)
        assert ledger is not None and ledger.unsettled == 0 and ledger.leaving == 1
        held = next(h for h in ledger.holdings.values() if h.pod.endswith("/d"))
        assert not held.unknown and held.per_numa == ((0, 4),)  # a known placement, persisted by the binding
        node.delete("i")
        assert ledger.leaving == 0 and node.free()[0] == node.free()[1]


def test_a_terminating_pod_whose_balloon_is_gone_takes_no_other_pods_balloon_on_a_rebuild() -> None:
    """The 30-node balloons fleet (bench/bench_fleet.py, seed 7) caught this: a pod is deleted, the kubelet removes
    its containers and the plugin its balloon and export, and the export's update rebuilds the ledger while the pod
    is still listed. Not finding its balloon where its placement says, the terminating pod took another started
    pod's balloon of the same type and size on another NUMA node; that pod, held where its own placement says, did
    not fit beside it and was clamped to nothing; once the terminating pod was gone, its cores read as free on a
    NUMA node the plugin had full, and the next pod admitted there failed ("no suitable balloon instance")."""
    with BalloonsPeer(GROUP.shape, policy_spec(GROUP)) as plugin:
        node = Node(plugin, GROUP)
        for name, cores, numa in (("a", 11, 0), ("b", 11, 1), ("c", 15, 2), ("d", 15, 3), ("l", 4, 0), ("p", 4, 1)):
            fit, got = node.add_model(name, 1, cores)
            assert fit.ok and got == {numa: cores}, (name, fit, got)
        node.leave("l")
        node.cluster = node.rebuilt(nrt=exported_nrt(plugin, containers=False))
        ledger = node.cluster.ledger(NODE)
        assert ledger is not None
        held = {h.pod.removeprefix("models/"): h.per_numa for h in ledger.holdings.values()}
        assert held["p"] == ((1, 4),) and held["l"] == ((0, 4),), held
        node.delete("l")
        assert node.free() == ((4, 0, 0, 0), (4, 0, 0, 0))
        for name in ("q", "q2"):
            fit, got = node.add_model(name, 1, 4)
            assert fit.ok == bool(got) and (not got or got == dict(fit.per_numa)), (name, fit.check, fit.per_numa, got)
