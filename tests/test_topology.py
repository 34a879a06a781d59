"""CPUSet, the three topology sources, reserved cpusets and BalloonsPolicy selection."""

from __future__ import annotations

import pytest
import yaml

from placement.balloonspolicy import parse_balloons_policy, policy_for_node
from placement.topology import (
    CPUSet,
    CPUSetError,
    linux_layout,
    node_topology,
    profile_reserved,
    reserved_from_spec,
    spread_reserved,
)
from tests.support.payloads import fixture_text

NUMA_LABEL = "feature.node.kubernetes.io/memory-numa.node_count"
SMT_LABEL = "feature.node.kubernetes.io/cpu-hardware_multithreading"


@pytest.mark.parametrize("text,ids,canonical", [
    ("0-3,8,10-11", {0, 1, 2, 3, 8, 10, 11}, "0-3,8,10-11"),
    ("8, 0-1 ,2", {0, 1, 2, 8}, "0-2,8"),
    ("", set(), ""),
    ("5", {5}, "5"),
])
def test_cpuset_parses_and_prints_linux_lists(text: str, ids: set[int], canonical: str) -> None:
    cpus = CPUSet.parse(text)
    assert set(cpus) == ids
    assert str(cpus) == canonical
    assert CPUSet.parse(str(cpus)) == cpus


@pytest.mark.parametrize("bad,words", [("0-", "0-"), ("a,b", "'a'"), ("7-3", "backwards"), ("1,,2", "''"),
                                       ("99999999", "beyond")])
def test_cpuset_rejects_bad_strings_with_a_clear_error(bad: str, words: str) -> None:
    with pytest.raises(CPUSetError) as err:
        CPUSet.parse(bad)
    assert bad in str(err.value) and words in str(err.value)


def test_seed_example_standard_profile_on_4_numa_96_cores() -> None:
    # NUMA i = cores 24i..24i+23, siblings at +96: the seed's own example, exactly.
    topo = linux_layout([24, 24, 24, 24], 2, "labels")
    assert topo.numa_nodes[1].cores[0].threads == (24, 120)
    reserved = profile_reserved(topo, "standard")
    assert reserved == CPUSet.parse("0,1,24,25,48,49,72,73,96,120,144,168")


def test_reserved_is_spread_evenly_and_balanced_between_threads() -> None:
    topo = linux_layout([32, 32], 2, "labels")
    assert spread_reserved(topo, 8) == CPUSet.parse("0,1,32,33,64,65,96,97")  # 2 whole cores per NUMA node
    assert spread_reserved(topo, 5) == CPUSet.parse("0,1,32,64,96")  # remainder to NUMA 0
    assert profile_reserved(topo, "siblings") == CPUSet.parse("0,32,64,96")  # one physical core per NUMA
    nosmt = linux_layout([32, 32], 1, "labels")
    assert profile_reserved(nosmt, "minimal") == CPUSet.parse("0-3,32-35")


def test_topology_from_node_resource_topology_beats_labels() -> None:
    nrt = yaml.safe_load(fixture_text("nrt-nfd.yaml"))
    labels = {NUMA_LABEL: "4", SMT_LABEL: "true"}
    topo, note = node_topology("worker-1", labels, "128", nrt, NUMA_LABEL, 2)
    assert topo.source == "nrt" and topo.numa_count == 2
    assert str(topo.numa_nodes[0].cpus) == "0-31,64-95"  # lscpu's NUMA node0 CPU(s)
    assert str(topo.numa_nodes[1].cpus) == "32-63,96-127"
    assert "NodeResourceTopology" in note


def test_topology_from_labels_and_capacity() -> None:
    topo, _ = node_topology("n", {NUMA_LABEL: "4", SMT_LABEL: "true"}, "192", None, NUMA_LABEL, 2)
    assert (topo.source, topo.numa_count, topo.threads_per_core) == ("labels", 4, 2)
    assert [len(n.cores) for n in topo.numa_nodes] == [24, 24, 24, 24]
    nosmt, _ = node_topology("n", {NUMA_LABEL: "2", SMT_LABEL: "false"}, "64", None, NUMA_LABEL, 2)
    assert nosmt.threads_per_core == 1 and str(nosmt.numa_nodes[1].cpus) == "32-63"


def test_topology_falls_back_to_one_numa_node_and_says_so() -> None:
    topo, note = node_topology("lonely", {SMT_LABEL: "true"}, "64", None, NUMA_LABEL, 2)
    assert topo.source == "single-numa" and topo.numa_count == 1 and len(topo.cpus) == 64
    assert "lonely" in note and "one NUMA node" in note


def test_the_balloons_nrt_is_not_mistaken_for_numa_zones() -> None:
    nrt = yaml.safe_load(fixture_text("nrt-balloons.yaml"))
    topo, _ = node_topology("worker-1", {NUMA_LABEL: "2", SMT_LABEL: "true"}, "128", nrt, NUMA_LABEL, 2)
    assert topo.source == "labels"


def test_reserved_from_balloons_policy_forms() -> None:
    topo = linux_layout([32, 32], 2, "labels")
    policy = parse_balloons_policy(yaml.safe_load(fixture_text("balloonspolicy-node.yaml")))
    assert reserved_from_spec(topo, policy.reserved_cpu) == CPUSet.parse("0,1,32,33,64,96")
    assert reserved_from_spec(topo, "2000m") == CPUSet.parse("0,64")  # as the balloons plugin takes it
    assert reserved_from_spec(topo, "exclude-cpuset:2-127") == CPUSet.parse("0-1")
    assert [t.name for t in policy.balloon_types] == ["reserved", "vllm-balloon-tp1", "vllm-balloon-tp2"]
    tp1 = policy.balloon_type("vllm-balloon-tp1")
    assert tp1 is not None and tp1.hide_hyperthreads and tp1.max_balloons == 2


def test_policy_precedence_node_then_group_then_default() -> None:
    def pol(name: str):
        return parse_balloons_policy({"metadata": {"name": name, "namespace": "kube-system"},
                                      "spec": {"reservedResources": {"cpu": "2"}}})
    policies = [pol("default"), pol("group.big"), pol("node.n1")]
    assert policy_for_node(policies, "n1", {"config.nri/group": "big"}).name == "node.n1"
    assert policy_for_node(policies, "n2", {"config.nri/group": "big"}).name == "group.big"
    assert policy_for_node(policies, "n3", {}).name == "default"
    # A node in a group with no policy does not fall back to default.
    assert policy_for_node(policies, "n4", {"config.nri/group": "small"}) is None
