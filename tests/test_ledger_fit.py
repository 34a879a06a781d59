"""Ledger and fit: capacity accounting, the elastic reserved pool, refusals that carry numbers,
scores, and the invariants under any sequence of place / release / assume."""

from __future__ import annotations

import copy
import dataclasses
from collections import Counter
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from placement import fit as fitmod
from placement import kubelet as kub
from placement import reasons
from placement.assume import AssumeCache
from placement.balloons import node_balloons_policy
from placement.balloonspolicy import BalloonsPolicy, BalloonType, parse_balloons_policy
from placement.cluster import ClusterState
from placement.config import Settings
from placement.demand import ModelDemand, ModelIdentity
from placement.ledger import NodeLedger, NodeNRI
from placement.topology import linux_layout, reserved_from_spec, spread_reserved

GIB = 2**30


def generated(cores_per_numa: list[int], tpc: int = 2) -> BalloonsPolicy:
    """The policy `balloons-policy NODE` writes for a node of this shape, reserving one core per NUMA node."""
    topo = linux_layout(cores_per_numa, tpc, "labels")
    return parse_balloons_policy(node_balloons_policy("n1", topo, Settings(nri_deployment_profile="siblings"),
                                                      "kube-system"))


def plain(**extra) -> BalloonsPolicy:
    """A hand-written policy of plain types, as a hand-written setup has them."""
    return BalloonsPolicy("default", "kube-system", "4", tuple(
        BalloonType(f"vllm-balloon-tp{t}", hide_hyperthreads=True, **extra) for t in (1, 2, 4, 8)))


def demand(cpus: int, tp: int = 1, policy: str = "nri-balloons", model: str | None = None) -> ModelDemand:
    return ModelDemand(
        pod=f"llm/{model or 'm'}", identity=ModelIdentity("llm", "model-manager.io/model", model) if model else None,
        container="main", tp=tp, tp_source="test", requested_policy=policy, resolved_policy=policy,
        balloon_type=f"vllm-balloon-tp{tp}", cpu_milli=cpus * 1000, preflight="enforce", require_amx=False,
        node_pin=None, problems=())


def ledger(cores_per_numa: list[int], tpc: int = 2, policy: BalloonsPolicy | None = None,
           numa_memory: tuple[int, ...] = ()) -> NodeLedger:
    """A node of this shape under `policy` (default: its generated one), reserving what the policy says."""
    topo = linux_layout(cores_per_numa, tpc, "labels")
    policy = generated(cores_per_numa, tpc) if policy is None else policy
    reserved = reserved_from_spec(topo, policy.reserved_cpu or "0")
    return NodeLedger("n1", topo, reserved, "test", {}, NodeNRI(policy, "Success"), numa_memory=numa_memory)


def test_capacity_excludes_every_core_a_reserved_thread_touches() -> None:
    topo = linux_layout([24, 24, 24, 24], 2, "labels")
    # 3 CPUs per NUMA: primaries of 2 cores + 1 sibling
    led = NodeLedger("n1", topo, spread_reserved(topo, 12), "test", {}, NodeNRI(None, None))
    assert led.capacity == (22, 22, 22, 22)
    assert led.shared_pool_cpus == 12 + 4  # reserved + the orphan sibling of each half-reserved core


def test_a_balloon_holds_its_request_in_logical_cpus_as_whole_cores() -> None:
    # The plugin sizes a balloon to ceil(request) logical CPUs; hideHyperthreads only pins the container to one
    # thread of each of its cores. cpu: 16 on a 2-way SMT node is 8 cores.
    led = ledger([16, 16])
    result = fitmod.place(led, "a", demand(16), 2, "MostAllocated")
    assert result.ok and result.per_numa == ((0, 8),) and result.footprint.cpus == 16
    assert led.free() == (7, 15)


def test_tp1_goes_to_the_numa_node_with_fewest_balloons_and_tp_n_to_an_aligned_block() -> None:
    led = ledger([16, 16, 16, 16])
    first = fitmod.place(led, "a", demand(12), 2, "MostAllocated")
    second = fitmod.place(led, "b", demand(12), 2, "MostAllocated")
    assert (first.per_numa, second.per_numa) == (((0, 6),), ((1, 6),))  # balance-balloons over vllm-numa-N
    tp2 = fitmod.place(led, "c", demand(16, tp=2), 2, "MostAllocated")
    # A block is counted with its NUMA nodes' balloons: {0,1} holds two already, {2,3} none.
    assert tp2.ok and tp2.per_numa == ((2, 4), (3, 4))
    assert fitmod.place(led, "d", demand(16, tp=2), 2, "MostAllocated").per_numa == ((0, 4), (1, 4))
    assert led.free() == (5, 5, 11, 11)


def test_refusal_names_the_class_not_the_node_and_is_resolvable_when_other_pods_hold_the_cores() -> None:
    led = ledger([16, 16])
    fitmod.place(led, "a", demand(20), 2, "MostAllocated")  # 10 cores on NUMA 0
    result = fitmod.fit(demand(24), led, 2, "MostAllocated")
    # vllm-numa-1 has fewer instances, so this one goes to NUMA 1, where it fits.
    assert result.ok and result.per_numa == ((1, 12),)
    fitmod.place(led, "b", demand(24), 2, "MostAllocated")
    again = fitmod.fit(demand(24), led, 2, "MostAllocated")  # NUMA 0's turn: 5 free, 12 needed
    assert not again.ok and again.check == reasons.INSUFFICIENT_FREE and again.resolvable
    assert "the balloons policy puts a rank on NUMA node 0 (or, lacking room there, another), which needs 12 free " \
        "cores on one NUMA node" in again.reason
    assert "vllm-numa" not in again.reason  # the generated policy's component types are not the user's words
    assert "n1" not in again.reason and "llm/" not in again.reason


def test_unresolvable_refusals() -> None:
    led = ledger([16, 16])
    tp4 = fitmod.fit(demand(8, tp=4), led, 2, "MostAllocated")
    assert (tp4.check, tp4.resolvable) == (reasons.TP_EXCEEDS_NUMA, False) and "this node has 2" in tp4.reason
    huge = fitmod.fit(demand(80, tp=2), led, 2, "MostAllocated")
    assert (huge.check, huge.resolvable) == (reasons.FOOTPRINT_EXCEEDS_NODE, False)
    assert "at most 15 model cores on a NUMA node" in huge.reason
    other = replace(demand(4), balloon_type="custom")
    missing = fitmod.fit(other, led, 2, "MostAllocated")
    assert (missing.check, missing.resolvable) == (reasons.BALLOON_TYPE_MISSING, False) and "custom" in missing.reason
    broken = ledger([16, 16])
    broken.nri = NodeNRI(broken.nri.policy, "Failure")
    failed = fitmod.fit(demand(4), broken, 2, "MostAllocated")
    assert (failed.check, failed.resolvable) == (reasons.NRI_NOT_RUNNING, False) and "Failure" in failed.reason


def test_a_plain_type_puts_every_rank_on_one_numa_node_so_tp2_is_refused() -> None:
    led = ledger([16, 16], policy=plain())
    one = fitmod.fit(demand(8), led, 2, "MostAllocated")
    assert one.ok and one.per_numa == ((0, 4),)
    tp2 = fitmod.fit(demand(16, tp=2), led, 2, "MostAllocated")
    assert (tp2.check, tp2.resolvable) == (reasons.RANKS_SHARE_NUMA, False)
    assert "puts the model on 1 NUMA node but its TP=2 needs 2" in tp2.reason


def test_max_balloons_is_resolvable_and_max_cpus_is_compared_with_the_request() -> None:
    led = ledger([16, 16], policy=plain(max_balloons=1))
    assert fitmod.place(led, "a", demand(2), 2, "MostAllocated").ok
    second = fitmod.fit(demand(2), led, 2, "MostAllocated")
    assert (second.check, second.resolvable) == (reasons.MAX_BALLOONS, True)
    capped = ledger([16, 16], policy=plain(max_cpus=8))
    assert fitmod.fit(demand(8), capped, 2, "MostAllocated").ok  # 8 CPUs = 4 cores: maxCPUs counts CPUs
    over = fitmod.fit(demand(9), capped, 2, "MostAllocated")
    assert (over.check, over.resolvable) == (reasons.BALLOON_TYPE_CAPPED, False) and "maxCPUs=8" in over.reason


def test_a_model_at_max_balloons_waits_for_its_own_pod_to_go_like_any_other() -> None:
    led = ledger([16, 16], policy=plain(max_balloons=1))
    assert fitmod.place(led, "a", demand(2, model="m"), 2, "MostAllocated").ok
    for model in ("m", "other"):  # a new replica of the same model is a new balloon too
        assert fitmod.fit(demand(2, model=model), led, 2, "MostAllocated").check == reasons.MAX_BALLOONS
    assert fitmod.fit(demand(2, model="m"), led.scratch(evicted={"a"}), 2, "MostAllocated").ok
    led.release("a")
    assert fitmod.fit(demand(2, model="other"), led, 2, "MostAllocated").ok


def test_shared_containers_take_model_cores_only_where_their_balloon_grows() -> None:
    # The generated policy's reserved balloon holds the reserved cpuset (4 CPUs here) and grows past it.
    led = ledger([16, 16])
    led.set_shared("node-exporter", 3000, "reserved")
    assert led.elastic_cores == 0 and led.free() == (15, 15)
    led.set_shared("fluentd", 6000, "reserved")  # 9 CPUs in all: 5 beyond -> 3 cores, from the last NUMA node
    assert led.elastic_cores == 3 and led.free() == (15, 12)
    led.drop_shared("fluentd")
    # A plain policy's reserved balloon grows: 9 CPUs, 4 of them reserved, 5 beyond -> 3 cores.
    elastic = ledger([16, 16], policy=plain())  # reservedResources.cpu: "4", whole cores here
    elastic.set_shared("fluentd", 9000, "reserved")
    assert elastic.elastic_cores == 3 and sum(elastic.free()) == 27
    # The default balloon holds at least one CPU, even for best-effort containers.
    elastic.set_shared("sidecar", 0, "default")
    assert elastic.elastic_cores == 4
    elastic.drop_shared("fluentd")
    elastic.drop_shared("sidecar")
    assert elastic.free() == (14, 16)  # the plugin reserves a CPU count as the first cores: 2 of NUMA node 0


def test_a_model_pod_whose_sidecars_find_no_core_to_grow_into_is_refused() -> None:
    """The plugin fails a sidecar its balloon cannot grow for: a model that leaves no core beside its ranks for its
    own sidecars is refused, with the numbers; the same model without them fits (the oracle found this: the plugin
    ran the ranks and failed the sidecar)."""
    led = ledger([16, 16])
    led.set_shared("exporter", 4000, "reserved")  # the reserved cpuset's 4 CPUs, full
    for numa, cores in ((0, 15), (1, 14)):
        led.hold(fitmod.Holding(f"uid-{numa}", f"llm/other-{numa}", None, "vllm-balloon-tp1", ((numa, cores),)))
    assert led.free() == (0, 1)
    bare = demand(2)  # 1 core (hideHyperthreads, cpu: N as cores: 2 CPUs = 1 core with the request as written)
    assert fitmod.fit(bare, led, 2, "MostAllocated").ok
    with_sidecar = replace(bare, shared_milli=1000, namespace="llm")
    refused = fitmod.fit(with_sidecar, led, 2, "MostAllocated")
    assert not refused.ok and refused.resolvable and refused.check == reasons.INSUFFICIENT_FREE
    assert refused.reason == ("its other containers (cpu: 1 together) grow the shared balloon they land in by 1 "
                              "core, and beside its ranks 0 would be free"), refused.reason


def test_scores_by_strategy() -> None:
    led = ledger([16, 16])
    fitmod.place(led, "a", demand(20), 2, "MostAllocated")
    d = demand(10)
    most = fitmod.fit(d, led, 2, "MostAllocated").score
    least = fitmod.fit(d, led, 2, "LeastAllocated").score
    # 15 of 30 cores used either way (0.5), and no sliver left: 5 + 0..5 for placements that leave none
    assert most == 8 and least == 8
    fresh = ledger([16, 16])
    assert fitmod.fit(d, fresh, 2, "MostAllocated").score < most  # packing prefers the used node
    assert fitmod.fit(d, fresh, 2, "LeastAllocated").score > least
    assert fitmod.fit(demand(60, tp=2), fresh, 2, "BalancedAllocation").score == 10


def kubelet_ledger(cores_per_numa: list[int], topology_policy: str, tpc: int = 2) -> NodeLedger:
    """A kubelet-static node of this shape: 2 CPUs reserved (the lowest core), full-pcpus-only."""
    topo = linux_layout(cores_per_numa, tpc, "labels")
    node = kub.kubelet_node(kub.machine(topo, len(cores_per_numa), ()),
                            kub.KubeletConfig(topology_policy=topology_policy, topology_scope=kub.CONTAINER,
                                              reserved_count=2))
    return NodeLedger("n1", topo, kub.cpuset(node.reserved), "test", {}, NodeNRI(None, None), kubelet=node)


def kubelet_demand(cpus: int, tp: int = 1) -> ModelDemand:
    spec = {"containers": [{"name": "main", "resources": {"limits": {"cpu": str(cpus), "memory": "8Gi"}}}]}
    return dataclasses.replace(demand(cpus, tp, policy="kubelet-static"), kpod=kub.kubelet_pod("", spec))


def test_kubelet_static_follows_the_topology_manager_policy() -> None:
    # 2 NUMA nodes of 16 cores x 2 threads; CPUs 0 and 32 reserved. 20 CPUs fit one NUMA node: the lowest id.
    for policy in ("single-numa-node", "restricted", "best-effort"):
        led = kubelet_ledger([16, 16], policy)
        one = fitmod.place(led, "a", kubelet_demand(20), 2, "MostAllocated")
        assert one.ok and one.per_numa == ((0, 10),), policy
    # 40 CPUs are more than one NUMA node holds: single-numa-node always fails it, never a node to offer...
    snn = fitmod.fit(kubelet_demand(40), kubelet_ledger([16, 16], "single-numa-node"), 2, "MostAllocated")
    assert not snn.ok and not snn.resolvable and snn.why is not None and "TopologyAffinityError" in snn.reason
    # ...restricted spans the two, and a TP=1 model split over two NUMA nodes ranks below every local placement.
    split = fitmod.fit(kubelet_demand(40), kubelet_ledger([16, 16], "restricted"), 2, "MostAllocated")
    assert split.ok and split.split and split.score == 0 and len(split.per_numa) == 2
    # vLLM binds rank i to all of the i-th NUMA node's CPUs: a NUMA node must hold whole ranks' shares. TP=4 of 40
    # CPUs (5 cores a rank) on 4 NUMA nodes of 8 cores: the kubelet gives 4 + 8 + 8 cores on 3 NUMA nodes, which
    # hold 0 + 1 + 1 shares: split (ranked 0), not ranks sharing NUMA nodes (1).
    uneven = fitmod.fit(kubelet_demand(40, tp=4), kubelet_ledger([8, 8, 8, 8], "restricted"), 2, "MostAllocated")
    assert uneven.ok and uneven.split and uneven.score == 0, uneven
    # TP=2 of 16 CPUs on one NUMA node: its ranks share it with a whole share each (1), neither split nor local.
    packed = fitmod.fit(kubelet_demand(16, tp=2), kubelet_ledger([16, 16], "restricted"), 2, "MostAllocated")
    assert packed.ok and not packed.split and packed.score == 1, packed
    # NUMA 0 holds 20 of its 30 free CPUs: a second 20 fits only NUMA 1, and a third no single NUMA node now.
    led = kubelet_ledger([16, 16], "single-numa-node")
    fitmod.place(led, "a", kubelet_demand(20), 2, "MostAllocated")
    second = fitmod.place(led, "b", kubelet_demand(20), 2, "MostAllocated")
    assert second.per_numa == ((1, 10),)
    third = fitmod.fit(kubelet_demand(20), led, 2, "MostAllocated")
    assert not third.ok and third.resolvable and "fit no NUMA node now" in third.reason


def test_a_node_that_aligns_waits_for_room_rather_than_split_the_model_under_pod_scope() -> None:
    """Pod scope aligns the pod, not the model container: a model of 6 CPUs with a sidecar of 4 spans two NUMA
    nodes of 8 (CPUs 0 and 1 reserved), and the kubelet gives the model 6 on NUMA 0 while it is free, 5 + 1 once
    other pods hold a CPU there and 3 on NUMA 1. Restricted waits for room (the fleet benchmark's avoidable split on
    a restricted node of pod scope, 12 + 4 cores for TP=1 of 16); best-effort runs it split, ranked last."""
    def node(policy: str) -> NodeLedger:
        topo = linux_layout([8, 8], 1, "labels")
        config = kub.KubeletConfig(topology_policy=policy, topology_scope=kub.POD, reserved_count=2)
        kubelet = kub.kubelet_node(kub.machine(topo, 2, ()), config)
        return NodeLedger("n1", topo, kub.cpuset(kubelet.reserved), "test", {}, NodeNRI(None, None), kubelet=kubelet)

    spec = {"containers": [{"name": "main", "resources": {"limits": {"cpu": "6", "memory": "8Gi"}}},
                           {"name": "sidecar", "resources": {"limits": {"cpu": "4", "memory": "1Gi"}}}]}
    model = dataclasses.replace(demand(6, 1, policy="kubelet-static"), kpod=kub.kubelet_pod("", spec))
    for policy in ("restricted", "best-effort"):
        led = node(policy)
        assert fitmod.fit(model, led, 1, "MostAllocated").per_numa == ((0, 6),), policy
        for uid, cpus in (("a", 5), ("b", 3), ("c", 1)):
            fitmod.place(led, uid, kubelet_demand(cpus), 1, "MostAllocated")
        led.release("a")
        now = fitmod.fit(model, led, 1, "MostAllocated")
        if policy == "restricted":
            assert not now.ok and now.resolvable and now.check == "insufficient-free", now
            assert now.reason == ("the kubelet (Topology Manager restricted, scope pod) would run the model split now "
                                  "(cores NUMA 0: 5, NUMA 1: 1 for its 1 rank), where with room it keeps each rank on "
                                  "a NUMA node of its own (NUMA 0: 6); a node that aligns waits for room rather than "
                                  "split it")
        else:
            assert now.ok and now.split and now.score == 0 and now.per_numa == ((0, 5), (1, 1)), now


# -- property: any sequence of place / release / assume ---------------------------------------------

ops = st.lists(st.tuples(st.sampled_from(["place", "assume", "release", "shared"]),
                         st.integers(0, 7), st.integers(1, 40), st.sampled_from([1, 2, 4, 8]),
                         st.sampled_from(["nri-balloons", "kubelet-static", "best-effort"])),
               max_size=40)
shapes = st.tuples(st.sampled_from([1, 2, 4, 8]), st.integers(2, 24), st.sampled_from([1, 2]), st.booleans())


@hsettings(max_examples=300, deadline=None)
@given(shape=shapes, sequence=ops)
def test_free_never_negative_and_fit_agrees_with_place(shape, sequence) -> None:
    numa, cores, tpc, hand_written = shape
    policy = plain() if hand_written else None
    led = ledger([cores] * numa, tpc=tpc, policy=policy)
    empty = ledger([cores] * numa, tpc=tpc, policy=policy)
    now = 0.0
    for op, slot, cpus, tp, policy in sequence:
        uid = f"pod-{slot}"
        stamp, before = led.stamps.taken, (dict(led.holdings), dict(led.shared))
        if op == "release":
            led.release(uid)
            led.drop_shared(uid)
        elif op == "shared":
            led.set_shared(uid, cpus * 500, "reserved")
        elif uid not in led.holdings and uid not in led.shared:
            d = demand(cpus, tp=tp, policy=policy)
            before_free = led.free()
            predicted = fitmod.fit(d, led, 2, "MostAllocated")
            result = fitmod.place(led, uid, d, 2, "MostAllocated", assumed_at=now if op == "assume" else None)
            assert result == predicted  # fit says yes exactly when place succeeds
            if not predicted.resolvable:  # decided by the demand and the node's shape, not by what it holds
                assert fitmod.fit(d, empty, 2, "MostAllocated") == predicted
            if result.ok and result.footprint and result.footprint.exclusive:
                assert uid in led.holdings and led.holdings[uid].cores == result.footprint.cores
                if policy == "nri-balloons":
                    assert len(result.per_numa) == tp  # one NUMA node per rank
            elif not result.ok:
                assert uid not in led.holdings and led.free() == before_free
        free = led.free()
        assert all(f >= 0 for f in free)
        assert all(f <= cap for f, cap in zip(free, led.capacity))
        held = [0] * numa
        for h in led.holdings.values():
            for n, c in h.per_numa:
                held[n] += c
        assert all(h <= cap for h, cap in zip(held, led.capacity))  # nothing promised twice
        if not led.shared:  # what the ledger keeps as holdings change is what its holdings add up to
            assert free == tuple(cap - h for cap, h in zip(led.capacity, held))
        balloons = Counter(t for h in led.holdings.values() for t in h.types)
        assert led.instance_key == tuple(sorted(balloons.items()))
        assert all(led.count_balloons(t) == sum(1 for h in led.holdings.values() if h.balloon_type == t)
                   for t in balloons)
        if (led.holdings, led.shared) != before:
            # what the extender remembers of the node is no longer taken as true
            assert led.name in (led.stamps.changed_since(stamp) or ())
        now += 1


def test_cluster_events_release_terminated_and_deleted_pods(demo: ClusterState, demo_objects) -> None:
    led = demo.ledger("cpu-a2")
    assert led.free() == (13, 29)
    pod = copy.deepcopy(next(o for o in demo_objects
                             if o["metadata"].get("name", "").startswith("llama3-8b-predictor-6c9f7-abcde")))
    pod["status"]["phase"] = "Succeeded"
    demo.apply("Pod", "MODIFIED", pod)
    assert demo.ledger("cpu-a2").free() == (29, 29)
    pod["status"]["phase"] = "Running"
    demo.apply("Pod", "MODIFIED", pod)
    assert demo.ledger("cpu-a2").free() == (13, 29)
    demo.apply("Pod", "DELETED", pod)
    assert demo.ledger("cpu-a2").free() == (29, 29)


def test_pods_the_plugins_export_does_not_show_yet_still_grow_the_shared_balloons(demo: ClusterState,
                                                                                    demo_objects) -> None:
    """cpu-full's plugin exports where its balloons are. A pod bound since still takes its cores, and one gone gives
    them back where the balloon shrinks: the webhook's replica count and the extender's next verdicts must not wait
    for the plugin's next export, nor a balloon grown and shrunk back to its exported size lose where it moved."""
    fluentd = next(o for o in demo_objects if o["metadata"].get("name") == "fluentd-heavy-cpu-full")
    assert demo.ledger("cpu-full").free() == (3, 1)
    pods = []
    for i, free in enumerate([(3, 0), (2, 0), (1, 0)]):  # a core for each 2-CPU pod
        pod = copy.deepcopy(fluentd)
        pod["metadata"].update(name=f"fluent-bit-{i}", uid=f"uid-fluent-bit-{i}")
        pod["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "2"}, "limits": {"cpu": "2"}}
        demo.apply("Pod", "ADDED", pod)
        pods.append(pod)
        assert demo.ledger("cpu-full").free() == free
    for pod, free in zip(pods, [(2, 0), (3, 0), (3, 1)]):
        demo.apply("Pod", "DELETED", pod)
        assert demo.ledger("cpu-full").free() == free


def test_node_that_disappears_drops_its_ledger(demo: ClusterState, demo_objects) -> None:
    node = next(o for o in demo_objects if o["kind"] == "Node" and o["metadata"]["name"] == "cpu-icx")
    demo.apply("Node", "DELETED", node)
    assert demo.ledger("cpu-icx") is None and "cpu-icx" not in [ledger.name for ledger in demo.ledgers()]


def test_assumed_pod_is_held_until_confirmed_or_expired(demo_objects) -> None:
    clock = [100.0]
    state = ClusterState(Settings(assume_ttl_seconds=30), clock=lambda: clock[0])
    for kind in ("Node", "Pod", "BalloonsPolicy", "NodeResourceTopology"):
        state.replace(kind, [o for o in demo_objects if o["kind"] == kind])
    d = replace(demand(20), pod="llm/new")
    assert AssumeCache(state).assume("uid-new", "llm", "new", d, "cpu-a1").ok
    assert sum(state.ledger("cpu-a1").free()) == 58 - 10
    # The next balloon goes to the other NUMA node, as the plugin would put it beside the assumed one.
    second = state.fit(replace(demand(20), pod="llm/second"), state.ledger("cpu-a1"))
    assert second.ok and second.per_numa == ((1, 10),)
    # The watch shows an unrelated update before the binding: still held.
    state.apply("Pod", "MODIFIED", {"metadata": {"uid": "uid-new", "name": "new", "namespace": "llm",
                                                 "labels": {"model-manager.io/model": "m"}},
                                    "spec": {"containers": [{"name": "main",
                                                             "resources": {"requests": {"cpu": "20"}}}]},
                                    "status": {"phase": "Pending"}})
    assert sum(state.ledger("cpu-a1").free()) == 58 - 10
    clock[0] += 31
    assert [r.uid for r in AssumeCache(state).expire()] == ["uid-new"]
    assert sum(state.ledger("cpu-a1").free()) == 58


def test_assumed_pod_survives_a_relist_that_shows_it_unbound_until_confirmed(demo_objects) -> None:
    state = ClusterState(Settings(), clock=lambda: 100.0)
    for kind in ("Node", "Pod", "BalloonsPolicy", "NodeResourceTopology"):
        state.replace(kind, [o for o in demo_objects if o["kind"] == kind])
    assert AssumeCache(state).assume("uid-new", "llm", "new", replace(demand(20), pod="llm/new"), "cpu-a1").ok
    unbound = {"metadata": {"uid": "uid-new", "name": "new", "namespace": "llm",
                            "labels": {"model-manager.io/model": "m"}},
               "spec": {"containers": [{"name": "main", "resources": {"requests": {"cpu": "20"}}}]},
               "status": {"phase": "Pending"}}
    state.replace("Pod", [o for o in demo_objects if o["kind"] == "Pod"] + [unbound])
    rec = state.pods["uid-new"]
    assert (rec.node, rec.assumed_at, rec.model.cpu_milli) == ("cpu-a1", 100.0, 20_000)
    assert sum(state.ledger("cpu-a1").free()) == 58 - 10
    with pytest.raises(AttributeError):  # records are shared with the ledgers: never changed in place
        rec.node = "cpu-a2"  # type: ignore[misc]
    assert AssumeCache(state).confirm("uid-new")
    assert state.pods["uid-new"].assumed_at is None and state.pods["uid-new"].node == "cpu-a1"
    assert sum(state.ledger("cpu-a1").free()) == 58 - 10
    assert AssumeCache(state).expire(ttl=0) == []

def test_only_the_cores_of_a_models_pod_being_deleted_count_as_free_for_its_replacement(
        demo: ClusterState, demo_objects: list[dict[str, Any]]) -> None:
    """2→3 replicas is judged like 1→2: a new replica needs new cores, whatever its model already runs. Only a pod
    replacing one that is being deleted (maxSurge 0, a re-created pod) may count what that pod frees, and the
    scheduler binds it once the cores are really free."""
    led = demo.ledger("cpu-full")
    again = replace(demand(22, model="qwen-14b"), identity=ModelIdentity("llm", "serving.kserve.io/inferenceservice",
                                                                         "qwen-14b"))
    assert not demo.fit(again, led).ok and not demo.fit_admission(again, led).ok  # a third replica: no room
    old = next(o for o in demo_objects if o["kind"] == "Pod" and o["spec"].get("nodeName") == "cpu-full"
               and (o["metadata"].get("labels") or {}).get("serving.kserve.io/inferenceservice") == "qwen-14b")
    old = {**old, "metadata": {**old["metadata"], "deletionTimestamp": "2026-12-03T20:00:00Z"}}
    demo.apply("Pod", "MODIFIED", old)
    led = demo.ledger("cpu-full")
    assert demo.fit_admission(again, led).ok  # its replacement is admitted
    assert not demo.fit(again, led).ok  # and bound once the old pod is gone
    other = replace(again, identity=ModelIdentity("llm", "serving.kserve.io/inferenceservice", "other"))
    assert not demo.fit_admission(other, led).ok  # another model waits for the cores like everyone
    demo.apply("Pod", "DELETED", old)
    assert demo.fit(again, demo.ledger("cpu-full")).ok


def test_refusals_no_eviction_changes_say_so_and_name_no_node() -> None:
    # A plain type too big for any NUMA node would be spread by the plugin: that is a never, not a not-now.
    huge = fitmod.fit(demand(40), ledger([16, 16], policy=plain()), 2, "MostAllocated")
    assert (huge.check, huge.resolvable) == (reasons.FOOTPRINT_EXCEEDS_NODE, False) and "even when empty" in huge.reason
    # A node's own policy (node.<name>) is named without the node's name.
    own = ledger([16, 16])
    own.nri = NodeNRI(replace(own.nri.policy, name="node.n1"), "Success")
    missing = fitmod.fit(replace(demand(4), balloon_type="custom"), own, 2, "MostAllocated")
    assert "the node's own BalloonsPolicy" in missing.reason and "n1" not in missing.reason


def test_a_policy_outside_the_plugins_namespace_configures_nothing(demo_objects) -> None:
    moved = copy.deepcopy([o for o in demo_objects if o["kind"] != "BalloonsPolicy" or
                           o["metadata"]["name"] != "node.cpu-a1"])
    stray = copy.deepcopy(next(o for o in demo_objects if o.get("metadata", {}).get("name") == "node.cpu-a1"))
    stray["metadata"]["namespace"] = "default"
    state = ClusterState.from_objects([*moved, stray], Settings())
    assert state.ledger("cpu-a1").nri.policy is None  # the plugin on cpu-a1 reads only kube-system
    elsewhere = ClusterState.from_objects([*moved, stray], Settings(nri_config_namespace="default"))
    assert elsewhere.ledger("cpu-a1").nri.policy is not None


def test_a_request_past_what_cpu_shares_carry_is_refused() -> None:
    # The real plugin gave a 288-CPU TP=8 request a 256-CPU balloon (tests/oracle/test_differential, 8 NUMA nodes).
    led = ledger([40] * 8)
    assert fitmod.fit(demand(256, tp=8), led, 2, "MostAllocated").ok
    over = fitmod.fit(demand(288, tp=8), led, 2, "MostAllocated")
    assert (over.check, over.resolvable) == (reasons.REQUEST_OVER_SHARES, False) and "256 CPUs" in over.reason


def test_a_placement_that_leaves_a_sliver_of_a_numa_node_scores_below_any_that_does_not() -> None:
    """Packing prefers the fuller node, but not when it leaves a NUMA node with 1-3 free cores, which no rank
    takes: those strand. Any placement that leaves none, on however empty a node, outranks one that does (the
    fleet benchmark's ours arm stranded 332 cores before slivers were scored down, 201-236 while a sliver only
    halved the score, 156 with slivers on 0..4 and the rest on 5..10)."""
    d = demand(12)  # 6 cores, one NUMA node

    def node_with_free(free: int) -> NodeLedger:
        led = ledger([16, 16])
        for numa in (0, 1):
            taken = led.free()[numa] - free
            led.hold(fitmod.Holding(f"uid-{numa}", f"llm/other-{numa}", None, "vllm-balloon-tp1", ((numa, taken),)))
        assert led.free() == (free, free)
        return led

    sliver, roomy = fitmod.fit(d, node_with_free(7), 2, "MostAllocated"), fitmod.fit(d, node_with_free(10), 2,
                                                                                       "MostAllocated")
    assert sliver.ok and roomy.ok and sliver.per_numa == roomy.per_numa == ((0, 6),)
    assert sliver.score < roomy.score, (sliver.score, roomy.score)  # 1 core left behind against 4
    exact = fitmod.fit(d, node_with_free(6), 2, "MostAllocated")
    assert exact.score > roomy.score, (exact.score, roomy.score)  # filling a NUMA node whole is no sliver
    empty = fitmod.fit(d, ledger([16, 16]), 2, "MostAllocated")
    assert empty.per_numa == ((0, 6),) and empty.score > sliver.score, (empty.score, sliver.score)
    assert sliver.score < 5 <= empty.score  # 0..4 against 5..10


# -- the extender's memo key: what fit reads ----------------------------------------------------------


def _apply(led: NodeLedger, op: str, slot: int, cpus: int, tp: int) -> None:
    uid = f"pod-{slot}"
    if op == "release":
        led.release(uid)
        led.drop_shared(uid)
    elif op == "shared":
        led.set_shared(uid, cpus * 250, "reserved")
    elif op == "unknown" and uid not in led.holdings:
        led.hold(fitmod.Holding(uid, f"llm/{uid}", None, None, ((slot % len(led.capacity), 1),), unknown=True))
    elif uid not in led.holdings and uid not in led.shared:
        # Pods that pin memory, of several sizes, so that ledgers alike in cores differ in free memory.
        fitmod.place(led, uid, replace(demand(cpus, tp=tp), memory_bytes=slot % 3 * 8 * GIB), 2, "MostAllocated")


key_ops = st.lists(st.tuples(st.sampled_from(["place", "release", "shared", "unknown"]), st.integers(0, 5),
                             st.integers(1, 24), st.sampled_from([1, 2])), max_size=12)


@hsettings(max_examples=300, deadline=None)
@given(common=key_ops, extra=key_ops, cpus=st.integers(1, 24), tp=st.sampled_from([1, 2]),
       sidecar=st.sampled_from([0, 500, 3000]), memory=st.sampled_from([0, 2 * GIB, 20 * GIB]))
def test_ledgers_alike_to_the_keys_get_the_same_plan_and_fit(common, extra, cpus, tp, sidecar, memory) -> None:
    """The extender answers every node of a class with one `plan`, finished per class of free memory: two ledgers
    of one shape whose `plan_key` is equal must get the same plan, which `finish` completes into each one's own
    `fit`, and with `fit_key` equal the same answer, or a node would be told another's verdict."""
    policy = generated([8, 8], 2)
    a, b = (ledger([8, 8], policy=policy, numa_memory=(32 * GIB, 32 * GIB)) for _ in range(2))
    for step in common:
        _apply(a, *step)
        _apply(b, *step)
    for step in extra:
        _apply(b, *step)
    d = replace(demand(cpus, tp=tp), shared_milli=sidecar, namespace="llm", memory_bytes=memory)
    assert fitmod.shape_key(a) == fitmod.shape_key(b)
    if fitmod.plan_key(d, a) == fitmod.plan_key(d, b):
        planned = fitmod.plan(d, a, 2, "MostAllocated")
        assert fitmod.finish(planned, b, "MostAllocated") == fitmod.fit(d, b, 2, "MostAllocated")
        if fitmod.fit_key(d, a) == fitmod.fit_key(d, b):
            assert fitmod.fit(d, a, 2, "MostAllocated") == fitmod.fit(d, b, 2, "MostAllocated")


def test_a_sidecar_s_room_is_part_of_the_memo_key() -> None:
    """Two nodes with the same free cores, one of whose reserved balloon is full: a model with a sidecar fits one
    and not the other, so their keys differ (the extender's key once lacked it and could tell both the same)."""
    def node(exporter: bool) -> NodeLedger:
        led = ledger([16, 16])
        if exporter:
            led.set_shared("exporter", 4000, "reserved")  # the reserved cpuset's 4 CPUs: no core taken
        for numa, cores in ((0, 15), (1, 14)):
            led.hold(fitmod.Holding(f"uid-{numa}", f"llm/other-{numa}", None, "vllm-balloon-tp1", ((numa, cores),)))
        return led

    full, roomy = node(True), node(False)
    assert full.free() == roomy.free() == (0, 1)
    with_sidecar = replace(demand(2), shared_milli=1000, namespace="llm")
    assert not fitmod.fit(with_sidecar, full, 2, "MostAllocated").ok
    assert fitmod.fit(with_sidecar, roomy, 2, "MostAllocated").ok
    assert fitmod.fit_key(with_sidecar, full) != fitmod.fit_key(with_sidecar, roomy)


def test_a_pod_of_unknown_placement_is_part_of_the_memo_key() -> None:
    """Two nodes holding the same cores, one of them for a pod whose placement is unknown: refusals there say
    so and fits are marked unknown, so their keys differ."""
    def node(unknown: bool) -> NodeLedger:
        led = ledger([16, 16])
        led.hold(fitmod.Holding("uid-x", "llm/x", None, None, ((0, 1),), unknown=unknown))
        led.hold(fitmod.Holding("uid-y", "llm/y", None, None, ((0, 4), (1, 5))))  # no NUMA node left whole
        return led

    settled, unsettled = node(False), node(True)
    assert settled.free() == unsettled.free() and settled.instance_key == unsettled.instance_key
    too_big = demand(2 * (max(settled.free()) + 1))  # a core more than any NUMA node has free: refused for now
    assert fitmod.fit(too_big, settled, 2, "MostAllocated").resolvable
    assert fitmod.fit(too_big, settled, 2, "MostAllocated") != fitmod.fit(too_big, unsettled, 2, "MostAllocated")
    assert fitmod.fit_key(too_big, settled) != fitmod.fit_key(too_big, unsettled)

