"""Ranks and memory nodes on the real plugin: each rank's cores on its own NUMA node, memory pinned to exactly
the NUMA nodes the ledger accounts memory on."""

from __future__ import annotations

import pytest

from placement.cluster import ClusterState
from placement.demand import read_model_pod
from placement.mutation import mutate_pod
from tests.oracle.kubelet import peer_pod
from tests.oracle.peer import BalloonsPeer
from tests.oracle.scenarios import NODE, SETTINGS, Group, model_pod, node_objects, policy_spec
from tests.oracle.sysfs import NodeShape

SNC2 = Group(seed=3, shape=NodeShape(packages=2, numa_per_package=2, cores_per_numa=24), policy="generated")


@pytest.mark.parametrize("args", [["--tensor-parallel-size", "2", "--pipeline-parallel-size", "2"],
                                  ["-tp", "2", "--data-parallel-size=2"], ["-tp", "2"], ["-tp", "4"]])
def test_every_rank_gets_its_own_numa_node_and_memory_follows_it(args: list[str]) -> None:
    cluster = ClusterState.from_objects(node_objects(SNC2), SETTINGS)
    pod = model_pod("ranks", 1, 16)
    pod["spec"]["containers"][0]["args"] = args
    mutated = mutate_pod(pod, cluster).pod
    demand = read_model_pod(mutated, SETTINGS)
    fit = cluster.fit(demand, cluster.ledger(NODE))  # type: ignore[arg-type]
    assert fit.ok and len(fit.per_numa) == demand.numa_nodes
    run = peer_pod(mutated)
    peer, [container] = run.pod, run.containers
    with BalloonsPeer(SNC2.shape, policy_spec(SNC2)) as node:
        got = node.create(peer, container)
    assert got.ok, got.error
    shape = SNC2.shape
    cores = {shape.core_of(c) for c in got.cpus}
    by_numa = {numa: sum(1 for core in cores if core // shape.cores_per_numa == numa) for numa, _ in fit.per_numa}
    # hideHyperthreads: one thread of each core; the ledger's cores per NUMA node, on the ledger's NUMA nodes.
    assert by_numa == dict(fit.per_numa) and len(got.cpus) == len(cores)
    assert got.mems == {numa for numa, _ in fit.per_numa}
