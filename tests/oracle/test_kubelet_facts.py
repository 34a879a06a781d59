"""The kubelet's CPU, Topology and Memory Managers (v1.35.4, tests/peers/kube's `kubelet`) as they really place and
reject pods: the facts of docs' reference on kubelet-static, each asserted on what the real code answered.

Machine of most scenarios: 2 packages x 1 NUMA node x 8 cores x SMT2 = 32 CPUs, Linux numbering (NUMA0 holds
0-7 and 16-23, NUMA1 8-15 and 24-31), reservedSystemCPUs 0,16 (both threads of core 0).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from placement.topology import CPUSet
from tests.oracle.kubeletpeer import GIB, KubeletPeer, Started, Verdict, container, v1_pod
from tests.oracle.sysfs import NodeShape

SHAPE = NodeShape(packages=2, numa_per_package=1, cores_per_numa=8, threads_per_core=2)
NUMA0 = frozenset([*range(0, 8), *range(16, 24)])
NUMA1 = frozenset([*range(8, 16), *range(24, 32)])
POLICIES = ["none", "best-effort", "restricted", "single-numa-node"]


def cpus(text: str) -> frozenset[int]:
    return CPUSet.parse(text).cpus


@pytest.fixture
def kubelet() -> Iterator[KubeletPeer]:
    with KubeletPeer() as peer:
        yield peer


def node(kubelet: KubeletPeer, shape: NodeShape = SHAPE, **settings: Any) -> KubeletPeer:
    started = kubelet.start(shape, {"reservedSystemCPUs": "0,16", **settings})
    assert started.ok, started.error
    return kubelet


def add(kubelet: KubeletPeer, name: str, *cpu: int, **kw: Any) -> Verdict:
    """A Guaranteed pod of one container per CPU count (named a, b, ...)."""
    return kubelet.add(v1_pod(name, *(container("abcdefgh"[i], n) for i, n in enumerate(cpu)), **kw))


def free_counts(verdict: Verdict) -> tuple[int, ...]:
    return tuple(len(f) for f in verdict.free)


# --- start-up (reference 2.2, 2.3, 3) ---

def test_the_static_policy_will_not_start_without_a_cpu_reservation(kubelet: KubeletPeer) -> None:
    # The reference quotes NewManager's "requires systemreserved.cpu + kubereserved.cpu to be greater than zero";
    # the kubelet never gets there: GetNodeAllocatableReservation leaves a zero reservation out of its list.
    started = kubelet.start(SHAPE, {"reservedSystemCPUs": "", "reservedCPUs": 0})
    assert not started.ok
    assert started.error == ("failed to run Kubelet: [cpumanager] unable to determine reserved CPU resources "
                             "for static policy")


def test_a_cpu_reservation_takes_the_lowest_whole_core(kubelet: KubeletPeer) -> None:
    started = kubelet.start(SHAPE, {"reservedCPUs": "1500m"})
    assert started.ok
    assert started.reserved == {0, 16}  # ceil(1.5) = 2 CPUs: both threads of core 0
    assert started.allocatable == frozenset(range(32)) - {0, 16}


def test_an_alpha_option_needs_its_gate(kubelet: KubeletPeer) -> None:
    started = kubelet.start(SHAPE, {"reservedSystemCPUs": "0,16", "featureGates": {},
                                    "cpuManagerPolicyOptions": {"align-by-socket": "true"}})
    assert started == Started(False, 'failed to run Kubelet: new static policy error: CPU Manager Policy '
                                           'Alpha-level Options not enabled, but option "align-by-socket" provided')


def test_an_alpha_option_is_refused_with_single_numa_node_even_with_its_gate(kubelet: KubeletPeer) -> None:
    started = kubelet.start(SHAPE, {"reservedSystemCPUs": "0,16", "topologyManagerPolicy": "single-numa-node",
                                    "cpuManagerPolicyOptions": {"align-by-socket": "true"}})
    assert started.error == ("failed to run Kubelet: new static policy error: Topolgy manager single-numa-node policy "
                             "is incompatible with CPUManager align-by-socket policy option")  # sic


def test_more_than_eight_numa_nodes_need_max_allowable_numa_nodes() -> None:
    sixteen = NodeShape(packages=2, numa_per_package=8, cores_per_numa=2, threads_per_core=1)
    with KubeletPeer() as kubelet:
        started = kubelet.start(sixteen, {"reservedSystemCPUs": "0", "topologyManagerPolicy": "best-effort"})
        assert started.error == "failed to run Kubelet: unsupported on machines with more than 8 NUMA Nodes"
    with KubeletPeer() as kubelet:
        assert kubelet.start(sixteen, {"reservedSystemCPUs": "0", "topologyManagerPolicy": "best-effort",
                                       "topologyManagerPolicyOptions": {"max-allowable-numa-nodes": "16"}}).ok
    with KubeletPeer() as kubelet:  # policy none never looks at NUMA nodes
        assert kubelet.start(sixteen, {"reservedSystemCPUs": "0"}).ok


# --- SMT (reference 2.4) ---

def test_full_pcpus_only_rejects_an_odd_request(kubelet: KubeletPeer) -> None:
    got = add(node(kubelet, cpuManagerPolicyOptions={"full-pcpus-only": "true"}), "odd", 3)
    assert (got.admit, got.reason) == (False, "SMTAlignmentError")
    assert got.message == "Pod was rejected: SMT Alignment Error: requested 3 cpus not multiple cpus per core = 2"


def test_full_pcpus_only_counts_the_siblings_of_reserved_cpus_as_taken(kubelet: KubeletPeer) -> None:
    # Reserved is the single thread 0: its sibling 16 stays in the pool but is no whole core.
    kubelet.start(SHAPE, {"reservedSystemCPUs": "0", "cpuManagerPolicyOptions": {"full-pcpus-only": "true"}})
    assert add(kubelet, "big", 30).admit
    got = add(kubelet, "pair", 2)
    assert got.free == (frozenset({16}), frozenset())
    assert (got.admit, got.reason) == (False, "SMTAlignmentError")
    assert got.message == ("Pod was rejected: SMT Alignment Error: not enough free physical CPUs: "
                           "available physical CPUs = 0, requested CPUs = 2, CPUs per core = 2")


def test_without_full_pcpus_only_an_odd_request_takes_a_lone_thread(kubelet: KubeletPeer) -> None:
    got = add(node(kubelet), "odd", 3)
    assert got.admit
    placed = got.containers["a"].cpus
    assert placed == {1, 2, 17}  # core 1 whole, one thread of core 2
    assert 18 in got.free[0]  # its sibling stays free for another container


# --- allocation order and NUMA choice (reference 2.6, 3, 5.6) ---

@pytest.mark.parametrize("policy", POLICIES)
def test_case_b_small_pod_after_a_big_one(kubelet: KubeletPeer, policy: str) -> None:
    node(kubelet, topologyManagerPolicy=policy)
    first = add(kubelet, "twelve", 12)
    assert first.containers["a"].cpus <= NUMA0 and free_counts(first) == (2, 16)
    four = add(kubelet, "four", 4)
    if policy == "none":  # no hint: best fit from the fullest NUMA node first, across the boundary
        assert four.containers["a"].cpus == cpus("7-8,23-24")
    else:
        assert four.containers["a"].cpus == cpus("8-9,24-25")
    fourteen = add(kubelet, "fourteen", 14)
    if policy == "none":
        assert fourteen.admit and fourteen.containers["a"].cpus == cpus("9-15,25-31")
    elif policy == "best-effort":  # fits one NUMA node by capacity, not by what is free: spills
        assert fourteen.admit and fourteen.containers["a"].cpus == cpus("7,10-15,23,26-31")
    else:
        assert (fourteen.admit, fourteen.reason) == (False, "TopologyAffinityError")
        assert fourteen.message == "Pod was rejected: Resources cannot be allocated with Topology locality"
        assert free_counts(fourteen) == (2, 12)  # nothing of it stays allocated


@pytest.mark.parametrize("policy", POLICIES)
def test_case_j_lowest_id_numa_node_against_fullest_first(kubelet: KubeletPeer, policy: str) -> None:
    node(kubelet, topologyManagerPolicy=policy)
    assert add(kubelet, "a", 14).containers["a"].cpus == NUMA0 - {0, 16}
    assert add(kubelet, "b", 12).containers["a"].cpus <= NUMA1
    removed, free = kubelet.remove("uid-default-a")
    assert removed and tuple(len(f) for f in free) == (14, 4)
    four = add(kubelet, "four", 4)
    if policy == "none":
        assert four.containers["a"].cpus == cpus("14-15,30-31")  # NUMA1: the fullest first
    else:
        assert four.containers["a"].cpus == cpus("1-2,17-18")  # NUMA0: the lowest id that fits
    big = add(kubelet, "seventeen", 17)  # more than a NUMA node holds, 14 free in all
    assert not big.admit
    shortage = ("Pod was rejected: Allocate failed due to not enough cpus available to satisfy request: {}, "
                "which is unexpected")
    if policy == "none":
        assert (big.reason, big.message) == ("UnexpectedAdmissionError", shortage.format("requested=17, available=14"))
    elif policy == "best-effort":  # the 14 aligned CPUs taken first, then 3 more that are not there
        assert (big.reason, big.message) == ("UnexpectedAdmissionError", shortage.format("requested=3, available=0"))
    else:
        assert big.reason == "TopologyAffinityError"
    assert sum(free_counts(big)) == 14  # its partial allocation released


@pytest.mark.parametrize("policy", ["restricted", "single-numa-node"])
def test_case_c_lowest_id_not_the_exact_fit(kubelet: KubeletPeer, policy: str) -> None:
    node(kubelet, topologyManagerPolicy=policy)
    add(kubelet, "x", 4)
    assert free_counts(add(kubelet, "y", 12)) == (10, 4)
    assert add(kubelet, "four", 4).containers["a"].cpus == cpus("3-4,19-20")


def test_none_splits_a_pod_that_one_numa_node_could_hold(kubelet: KubeletPeer) -> None:
    node(kubelet)
    add(kubelet, "twelve", 12)
    placed = add(kubelet, "four", 4).containers["a"].cpus
    assert placed & NUMA0 and placed & NUMA1


def test_single_numa_node_always_rejects_more_than_a_numa_node_holds(kubelet: KubeletPeer) -> None:
    got = add(node(kubelet, topologyManagerPolicy="single-numa-node"), "wide", 17)
    assert (got.admit, got.reason) == (False, "TopologyAffinityError")
    assert free_counts(got) == (14, 16)


def test_restricted_admits_a_pod_wider_than_a_numa_node_across_two(kubelet: KubeletPeer) -> None:
    got = add(node(kubelet, topologyManagerPolicy="restricted"), "wide", 17)
    assert got.admit and got.containers["a"].cpus & NUMA0 and got.containers["a"].cpus & NUMA1


# --- scopes (reference 3) ---

def test_container_scope_places_each_container_on_its_own(kubelet: KubeletPeer) -> None:
    node(kubelet, topologyManagerPolicy="restricted", topologyManagerScope="container")
    add(kubelet, "first", 4)  # NUMA0 10 free, NUMA1 16
    got = add(kubelet, "two", 6, 6)
    assert got.admit
    assert got.containers["a"].cpus <= NUMA0 and got.containers["b"].cpus <= NUMA1


def test_pod_scope_places_the_whole_pod_on_one_numa_node(kubelet: KubeletPeer) -> None:
    node(kubelet, topologyManagerPolicy="restricted", topologyManagerScope="pod")
    add(kubelet, "first", 4)
    got = add(kubelet, "two", 6, 6)
    assert got.admit
    assert got.containers["a"].cpus | got.containers["b"].cpus <= NUMA1


def test_single_numa_node_pod_scope_rejects_what_container_scope_splits() -> None:
    for scope, admitted in (("container", True), ("pod", False)):
        with KubeletPeer() as kubelet:
            got = add(node(kubelet, topologyManagerPolicy="single-numa-node", topologyManagerScope=scope),
                      "ten-ten", 10, 10)
            assert got.admit is admitted, scope
            if admitted:
                assert got.containers["a"].cpus <= NUMA0 and got.containers["b"].cpus <= NUMA1
            else:
                assert got.reason == "TopologyAffinityError"


def test_pod_scope_sizes_the_pod_with_its_sidecars(kubelet: KubeletPeer) -> None:
    # 12-CPU model + 4-CPU native sidecar = 16 > the 14 NUMA0 can give and all 16 NUMA1 has: one NUMA node by
    # capacity, so restricted wants exactly that, and NUMA1 takes the pod.
    node(kubelet, topologyManagerPolicy="restricted", topologyManagerScope="pod")
    got = kubelet.add(v1_pod("m", container("vllm", 12), init=[container("proxy", 4, sidecar=True)]))
    assert got.admit
    assert got.containers["vllm"].cpus | got.containers["proxy"].cpus == NUMA1
    assert add(kubelet, "next", 1).containers["a"].cpus <= NUMA0


# --- init containers and sidecars (reference 2.7) ---

def test_init_container_cpus_are_reused_by_the_app_and_held_for_the_pod(kubelet: KubeletPeer) -> None:
    node(kubelet)
    got = kubelet.add(v1_pod("p", container("app", 2), init=[container("init", 4)]))
    assert got.admit
    assert got.containers["app"].cpus < got.containers["init"].cpus and len(got.containers["init"].cpus) == 4
    assert free_counts(got) == (10, 16)  # max(init, app) = 4 held while the pod runs


def test_init_cpus_can_leak_beyond_the_pods_request() -> None:
    # kubernetes/kubernetes#112228: reuse is allowed, not preferred.
    ten = NodeShape(packages=1, numa_per_package=1, cores_per_numa=10, threads_per_core=2)
    with KubeletPeer() as kubelet:
        kubelet.start(ten, {"reservedSystemCPUs": "0"})
        got = kubelet.add(v1_pod("p", container("app", 2), init=[container("init", 1)]))
        assert got.containers["init"].cpus == {10}  # the lone sibling of reserved CPU 0
        assert got.containers["app"].cpus == {1, 11}
        assert len(got.free[0]) == 19 - 3  # 3 CPUs held where the scheduler counts 2


def test_sidecar_cpus_are_not_reused_and_podresources_lists_sidecars_not_init(kubelet: KubeletPeer) -> None:
    node(kubelet)
    got = kubelet.add(v1_pod("p", container("app", 2),
                             init=[container("init", 2), container("proxy", 2, sidecar=True)]))
    assert got.admit
    assert not got.containers["proxy"].cpus & got.containers["app"].cpus
    listing = kubelet.podresources()
    assert [c.name for c in listing.pods[0].containers] == ["proxy", "app"]
    assert listing.allocatable_cpus == tuple(sorted(set(range(32)) - {0, 16}))


# --- the predicate handler after the Topology Manager (reference 1) ---

def test_strict_cpu_reservation_empties_the_shared_pool_and_the_fit_check_refuses_more(kubelet: KubeletPeer) -> None:
    node(kubelet, cpuManagerPolicyOptions={"strict-cpu-reservation": "true"})
    assert add(kubelet, "all", 30).admit
    shared = kubelet.add(v1_pod("shared", container("a", "500m")))
    # The reference saw this pod admitted, with no fit check in its driver; the kubelet's predicate refuses it.
    assert (shared.admit, shared.reason) == (False, "OutOfcpu")
    assert shared.message == ("Pod was rejected: Node didn't have enough resource: cpu, requested: 500, used: 30000, "
                              "capacity: 30000")


def test_the_topology_manager_answers_before_the_fit_check(kubelet: KubeletPeer) -> None:
    node(kubelet, cpuManagerPolicyOptions={"full-pcpus-only": "true"})
    assert add(kubelet, "all", 30).admit
    got = add(kubelet, "more", 2)
    assert got.reason == "SMTAlignmentError"  # not OutOfcpu, although 32 > 30 allocatable


def test_a_burstable_pod_is_refused_by_the_fit_check_only(kubelet: KubeletPeer) -> None:
    node(kubelet)
    assert add(kubelet, "g", 28).admit
    got = kubelet.add(v1_pod("b", container("a", 4, limits=False)))
    assert (got.admit, got.reason) == (False, "OutOfcpu")
    assert got.message == ("Pod was rejected: Node didn't have enough resource: cpu, requested: 4000, used: 28000, "
                           "capacity: 30000")
    assert kubelet.add(v1_pod("b2", container("a", 2, limits=False))).containers["a"].cpus == frozenset()


# --- the Memory Manager (reference 4) ---

@pytest.mark.parametrize("policy", ["best-effort", "restricted", "single-numa-node"])
def test_memory_manager_rejects_with_unexpected_admission_error(kubelet: KubeletPeer, policy: str) -> None:
    node(kubelet, topologyManagerPolicy=policy, memoryManagerPolicy="Static", reservedMemory={"0": GIB, "1": GIB})
    first = kubelet.add(v1_pod("m60", container("a", 2, "60Gi")))
    assert first.containers["a"].memory_numa == (0,)
    assert kubelet.add(v1_pod("m10", container("a", 2, "10Gi"))).containers["a"].memory_numa == (1,)
    again = kubelet.add(v1_pod("m60b", container("a", 2, "60Gi")))
    assert (again.admit, again.reason) == (False, "UnexpectedAdmissionError")
    # No NUMA mask can hold it now, so the Memory Manager's hints are empty ("no preference"): the Topology Manager
    # admits on the CPU hint and the memory allocation then fails, whatever the policy.
    assert again.message == ("Pod was rejected: Allocate failed due to [memorymanager] failed to find NUMA nodes to "
                             "extend the current topology hint, which is unexpected")
    assert free_counts(again) == (12, 14)  # its CPUs released
    listing = kubelet.podresources()
    assert [m.numa for m in listing.allocatable_memory] == [(0,), (1,)]
    assert [[m.numa for m in c.memory] for p in listing.pods for c in p.containers] == [[(0,)], [(1,)]]


def test_static_memory_manager_needs_reserved_memory(kubelet: KubeletPeer) -> None:
    started = kubelet.start(SHAPE, {"reservedSystemCPUs": "0,16", "memoryManagerPolicy": "Static"})
    assert started.error == "failed to run Kubelet: [memorymanager] you should specify the system reserved memory"


# --- the protocol ---

def test_a_bad_line_is_answered_and_the_node_goes_on(kubelet: KubeletPeer) -> None:
    node(kubelet)
    assert kubelet.send({"op": "resize"}) == {"error": 'unknown op "resize" (add, remove, podresources)'}
    no_uid = {"metadata": {"name": "x"}, "spec": {"containers": [{"name": "a"}]}}
    assert "uid" in kubelet.send({"op": "add", "pod": no_uid})["error"]
    assert kubelet.remove("nobody") == (False, (NUMA0 - {0, 16}, NUMA1))
    assert add(kubelet, "ok", 2).admit
