"""Ledger and fit: capacity accounting, the elastic reserved pool, refusals that carry numbers,
scores, and the invariants under any sequence of place / release / assume."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
from hypothesis import given, settings as hsettings, strategies as st

from placement import fit as fitmod
from placement.cluster import ClusterState
from placement.config import Settings
from placement.demand import ModelDemand, ModelIdentity
from placement.ledger import NodeLedger, NodeNRI
from placement.topology import BalloonType, BalloonsPolicy, linux_layout, spread_reserved

POLICY = BalloonsPolicy("default", "kube-system", "4", tuple(
    BalloonType(f"vllm-balloon-tp{t}", hide_hyperthreads=True) for t in (1, 2, 4, 8)))


def demand(cpus: int, tp: int = 1, policy: str = "nri-balloons", model: str | None = None) -> ModelDemand:
    return ModelDemand(
        pod=f"llm/{model or 'm'}", identity=ModelIdentity("llm", "model-manager.io/model", model) if model else None,
        container="main", tp=tp, tp_source="test", requested_policy=policy, resolved_policy=policy,
        balloon_type=f"vllm-balloon-tp{tp}", cpu_milli=cpus * 1000, preflight="enforce", require_amx=False,
        node_pin=None, problems=())


def ledger(cores_per_numa: list[int], tpc: int = 2, reserved: int = 4, policy: BalloonsPolicy | None = POLICY) -> NodeLedger:
    topo = linux_layout(cores_per_numa, tpc, "labels")
    return NodeLedger("n1", topo, spread_reserved(topo, reserved), "test", {}, NodeNRI(policy, "Success"))


def test_capacity_excludes_every_core_a_reserved_thread_touches() -> None:
    led = ledger([24, 24, 24, 24], reserved=12)  # 3 CPUs per NUMA: primaries of 2 cores + 1 sibling
    assert led.capacity == (22, 22, 22, 22)
    assert led.shared_pool_cpus == 12 + 4  # reserved + the orphan sibling of each half-reserved core


def test_balloon_is_split_evenly_over_tp_numa_nodes_with_most_free() -> None:
    led = ledger([16, 16, 16, 16])
    first = fitmod.place(led, "a", demand(12, tp=1), 2, "MostAllocated")
    assert first.ok and first.per_numa == ((0, 12),)
    second = fitmod.place(led, "b", demand(16, tp=2), 2, "MostAllocated")
    # NUMA 0 has 3 free; the two emptiest are 1 and 2 (ties to the lowest id).
    assert second.ok and second.per_numa == ((1, 8), (2, 8))
    assert led.free() == (3, 7, 7, 15)


def test_refusal_names_demand_and_free_per_numa_node() -> None:
    led = ledger([16, 16])
    fitmod.place(led, "a", demand(10, tp=1), 2, "MostAllocated")
    result = fitmod.fit(demand(20, tp=2), led, 2, "MostAllocated")
    assert not result.ok and result.check == fitmod.INSUFFICIENT_FREE and result.resolvable
    assert "2 NUMA nodes × 10 cores (40 CPUs)" in result.reason
    assert "NUMA 0: 5/15" in result.reason and "NUMA 1: 15/15" in result.reason


def test_unresolvable_refusals() -> None:
    led = ledger([16, 16])
    tp4 = fitmod.fit(demand(8, tp=4), led, 2, "MostAllocated")
    assert (tp4.check, tp4.resolvable) == (fitmod.TP_EXCEEDS_NUMA, False) and "has 2" in tp4.reason
    huge = fitmod.fit(demand(40, tp=2), led, 2, "MostAllocated")
    assert (huge.check, huge.resolvable) == (fitmod.FOOTPRINT_EXCEEDS_NODE, False)
    assert "at most 15 model cores per NUMA node" in huge.reason
    other = replace(demand(4), balloon_type="custom")
    missing = fitmod.fit(other, led, 2, "MostAllocated")
    assert (missing.check, missing.resolvable) == (fitmod.BALLOON_TYPE_MISSING, False) and "custom" in missing.reason
    broken = ledger([16, 16])
    broken.nri = NodeNRI(POLICY, "Failure")
    failed = fitmod.fit(demand(4), broken, 2, "MostAllocated")
    assert (failed.check, failed.resolvable) == (fitmod.NRI_NOT_RUNNING, False) and "Failure" in failed.reason


def test_max_balloons_is_resolvable() -> None:
    capped = BalloonsPolicy("default", "kube-system", "4", (BalloonType("vllm-balloon-tp1", True, max_balloons=1),))
    led = ledger([16, 16], policy=capped)
    assert fitmod.place(led, "a", demand(2), 2, "MostAllocated").ok
    second = fitmod.fit(demand(2), led, 2, "MostAllocated")
    assert (second.check, second.resolvable) == (fitmod.MAX_BALLOONS, True)


def test_elastic_reserved_pool_eats_model_cores() -> None:
    led = ledger([16, 16], reserved=4)  # 4 reserved CPUs = 2 whole cores, no orphan siblings
    assert led.shared_pool_cpus == 4 and led.free() == (15, 15)
    led.set_shared("fluentd", 9000)  # 5 CPUs beyond the pool -> 3 cores
    assert led.elastic_cores == 3 and sum(led.free()) == 27
    led.drop_shared("fluentd")
    assert led.free() == (15, 15)


def test_scores_by_strategy() -> None:
    led = ledger([16, 16])
    fitmod.place(led, "a", demand(10), 2, "MostAllocated")
    d = demand(5)
    most = fitmod.fit(d, led, 2, "MostAllocated").score
    least = fitmod.fit(d, led, 2, "LeastAllocated").score
    assert most == 5 and least == 5  # 15 of 30 used either way
    fresh = ledger([16, 16])
    assert fitmod.fit(d, fresh, 2, "MostAllocated").score < most  # packing prefers the used node
    assert fitmod.fit(d, fresh, 2, "LeastAllocated").score > least
    assert fitmod.fit(demand(30, tp=2), fresh, 2, "BalancedAllocation").score == 10


def test_kubelet_static_prefers_one_numa_node_then_spreads() -> None:
    led = ledger([16, 16])
    one = fitmod.place(led, "a", demand(20, policy="kubelet-static"), 2, "MostAllocated")
    assert one.per_numa == ((0, 10),)
    spread = fitmod.fit(demand(40, policy="kubelet-static"), led, 2, "MostAllocated")
    assert spread.ok and sum(c for _, c in spread.per_numa) == 20 and len(spread.per_numa) == 2


# -- property: any sequence of place / release / assume ---------------------------------------------

ops = st.lists(st.tuples(st.sampled_from(["place", "assume", "release", "shared"]),
                         st.integers(0, 7), st.integers(1, 40), st.sampled_from([1, 2, 4, 8]),
                         st.sampled_from(["nri-balloons", "kubelet-static", "best-effort"])),
               max_size=40)
shapes = st.tuples(st.sampled_from([1, 2, 4, 8]), st.integers(2, 24), st.sampled_from([1, 2]), st.integers(0, 16))


@hsettings(max_examples=300, deadline=None)
@given(shape=shapes, sequence=ops)
def test_free_never_negative_and_fit_agrees_with_place(shape, sequence) -> None:
    numa, cores, tpc, reserved = shape
    led = ledger([cores] * numa, tpc=tpc, reserved=reserved)
    empty = ledger([cores] * numa, tpc=tpc, reserved=reserved)
    now = 0.0
    for op, slot, cpus, tp, policy in sequence:
        uid = f"pod-{slot}"
        stamp, before = led.stamp, (dict(led.holdings), dict(led.shared))
        if op == "release":
            led.release(uid)
            led.drop_shared(uid)
        elif op == "shared":
            led.set_shared(uid, cpus * 500)
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
                    assert len(result.per_numa) == tp  # TP distinct NUMA nodes
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
        if (led.holdings, led.shared) != before:
            assert led.stamp != stamp  # what the extender remembers of the node is no longer taken as true
        now += 1


def test_cluster_events_release_terminated_and_deleted_pods(demo: ClusterState, demo_objects) -> None:
    led = demo.ledger("cpu-a2")
    assert led.free() == (13, 29)
    pod = copy.deepcopy(next(o for o in demo_objects if o["metadata"].get("name", "").startswith("llama3-8b-predictor-6c9f7-abcde")))
    pod["status"]["phase"] = "Succeeded"
    demo.apply("Pod", "MODIFIED", pod)
    assert demo.ledger("cpu-a2").free() == (29, 29)
    pod["status"]["phase"] = "Running"
    demo.apply("Pod", "MODIFIED", pod)
    assert demo.ledger("cpu-a2").free() == (13, 29)
    demo.apply("Pod", "DELETED", pod)
    assert demo.ledger("cpu-a2").free() == (29, 29)


def test_node_that_disappears_drops_its_ledger(demo: ClusterState, demo_objects) -> None:
    node = next(o for o in demo_objects if o["kind"] == "Node" and o["metadata"]["name"] == "cpu-icx")
    demo.apply("Node", "DELETED", node)
    assert demo.ledger("cpu-icx") is None and "cpu-icx" not in [l.name for l in demo.ledgers()]


def test_assumed_pod_is_held_until_confirmed_or_expired(demo_objects) -> None:
    clock = [100.0]
    state = ClusterState(Settings(assume_ttl_seconds=30), clock=lambda: clock[0])
    for kind in ("Node", "Pod", "BalloonsPolicy", "NodeResourceTopology"):
        state.replace(kind, [o for o in demo_objects if o["kind"] == kind])
    d = replace(demand(20), pod="llm/new")
    assert state.assume("uid-new", "llm", "new", d, "cpu-a1").ok
    assert sum(state.ledger("cpu-a1").free()) == 58 - 20
    # A second pod that would fit alone does not fit beside the assumed one on the same NUMA nodes.
    second = state.fit(replace(demand(20), pod="llm/second"), state.ledger("cpu-a1"))
    assert second.ok and second.per_numa == ((1, 20),)
    # The watch shows an unrelated update before the binding: still held.
    state.apply("Pod", "MODIFIED", {"metadata": {"uid": "uid-new", "name": "new", "namespace": "llm",
                                                 "labels": {"model-manager.io/model": "m"}},
                                    "spec": {"containers": [{"name": "main", "resources": {"requests": {"cpu": "20"}}}]},
                                    "status": {"phase": "Pending"}})
    assert sum(state.ledger("cpu-a1").free()) == 58 - 20
    clock[0] += 31
    assert [r.uid for r in state.expire_assumed()] == ["uid-new"]
    assert sum(state.ledger("cpu-a1").free()) == 58


def test_assumed_pod_survives_a_relist_that_shows_it_unbound_until_confirmed(demo_objects) -> None:
    state = ClusterState(Settings(), clock=lambda: 100.0)
    for kind in ("Node", "Pod", "BalloonsPolicy", "NodeResourceTopology"):
        state.replace(kind, [o for o in demo_objects if o["kind"] == kind])
    assert state.assume("uid-new", "llm", "new", replace(demand(20), pod="llm/new"), "cpu-a1").ok
    unbound = {"metadata": {"uid": "uid-new", "name": "new", "namespace": "llm", "labels": {"model-manager.io/model": "m"}},
               "spec": {"containers": [{"name": "main", "resources": {"requests": {"cpu": "20"}}}]},
               "status": {"phase": "Pending"}}
    state.replace("Pod", [o for o in demo_objects if o["kind"] == "Pod"] + [unbound])
    rec = state.pods["uid-new"]
    assert (rec.node, rec.assumed_at, rec.model.cpu_milli) == ("cpu-a1", 100.0, 20_000)
    assert sum(state.ledger("cpu-a1").free()) == 58 - 20
    with pytest.raises(AttributeError):  # records are shared with the ledgers: never changed in place
        rec.node = "cpu-a2"  # type: ignore[misc]
    assert state.confirm("uid-new")
    assert state.pods["uid-new"].assumed_at is None and state.pods["uid-new"].node == "cpu-a1"
    assert sum(state.ledger("cpu-a1").free()) == 58 - 20
    assert state.expire_assumed(ttl=0) == []

def test_a_models_own_pods_count_as_free_for_admission_only(demo: ClusterState) -> None:
    led = demo.ledger("cpu-full")
    again = replace(demand(22, model="qwen-14b"), identity=ModelIdentity("llm", "serving.kserve.io/inferenceservice", "qwen-14b"))
    assert not demo.fit(again, led).ok  # the scheduler: the cores are held now
    assert demo.fit_admission(again, led).ok  # admission: rolling the same model is not refused
