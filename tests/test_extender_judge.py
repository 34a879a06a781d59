"""The extender's verdict memo never disagrees with the core: for every node and demand, what the Judge
answers (fits or not, which list, the score, the exact message of the class, which the answer completes with
the class's number) is what `cluster.fit` on that node's own ledger says, before and after the ledgers change,
for replicas that share verdicts and for every policy."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from extender.filter import MAX_DEMANDS, UNKNOWN_NODE, Judge, explain, filter_nodes
from extender.score import prioritize
from placement.assume import AssumeCache
from placement.cluster import ClusterState
from placement.config import Settings
from placement.demand import read_model_pod
from server.sources import demo_text, load_objects

Obj = dict[str, Any]


def pod(name: str, *, tp: int = 1, cpus: int = 8, policy: str | None = "nri-balloons", balloon: str | None = None,
        model: str = "llama") -> Obj:
    annotations = {"cpu-policy.model-manager.io/tensor-parallel-size": str(tp)}
    if policy:
        annotations["model-manager.io/cpu-policy"] = policy
    if balloon:
        annotations["model-manager.io/nri-balloon"] = balloon
    return {"metadata": {"name": name, "namespace": "llm", "uid": f"uid-{name}", "resourceVersion": "1",
                         "labels": {"model-manager.io/model": model}, "annotations": annotations},
            "spec": {"containers": [{"name": "main", "resources": {"requests": {"cpu": str(cpus)}}}]}}


def fleet() -> list[Obj]:
    objects = load_objects(demo_text())
    for obj in objects:  # one node whose NRI plugin is down
        if obj["kind"] == "BalloonsPolicy" and obj["metadata"]["name"] == "node.cpu-icx":
            obj["status"]["nodes"]["cpu-icx"]["status"] = "Failure"
    return objects


def expected(cluster: ClusterState, p: Obj, name: str) -> tuple[bool, bool, int, str]:
    demand = read_model_pod(p, cluster.settings)
    ledger = cluster.ledger(name)
    assert ledger is not None
    fit = cluster.fit(demand, ledger)
    if fit.ok:
        return True, True, fit.score, ""
    return False, fit.resolvable, 0, explain(demand, fit)


def judged(judge: Judge, p: Obj, names: list[str]) -> dict[str, tuple[bool, bool, int, str]]:
    ref = judge.read_pod(p)
    out = filter_nodes(judge, ref, names)
    scores = dict(zip(names, prioritize(judge, ref, names)))
    result = {}
    for name in names:
        if name in out.passed:
            result[name] = (True, True, scores[name], "")
        elif name in out.failed:
            message, number = out.failed[name].split("; wait for free cores")[0].rsplit(
                "; the most any such node has free", 1)
            assert any(word.isdigit() for word in number.split())
            result[name] = (False, True, scores[name], message)
        else:
            result[name] = (False, False, scores[name], out.unresolvable[name])
    return result


DEMANDS = [
    dict(tp=tp, cpus=per * tp, policy=policy, balloon=balloon)
    for tp in (1, 2, 4, 8)
    for per in (1, 4, 8, 16, 30)
    for policy, balloon in (("nri-balloons", None), ("nri-balloons", "vllm-balloon-tp2"), ("nri-balloons", "nope"),
                            ("kubelet-static", None), ("best-effort", None))
]


def check_all(cluster: ClusterState, judge: Judge, tag: str, demands: list[dict[str, Any]] = DEMANDS) -> None:
    names = sorted(cluster.nodes)
    for i, d in enumerate(demands):
        for replica in ("a", "b"):  # the second replica shares the first one's verdicts
            p = pod(f"{tag}-{i}-{replica}", **d)  # type: ignore[arg-type]
            got = judged(judge, p, names)
            for name in names:
                assert got[name] == expected(cluster, p, name), (d, name)


def test_verdicts_equal_direct_fit_for_every_node_demand_and_policy() -> None:
    for strategy in ("MostAllocated", "LeastAllocated", "BalancedAllocation"):
        settings = Settings(scoring_strategy=strategy)
        cluster = ClusterState.from_objects(fleet(), settings)
        check_all(cluster, Judge(cluster), strategy)


@pytest.mark.parametrize("half", [0, 1])
def test_verdicts_follow_the_ledger_as_it_changes(half: int) -> None:
    # Half the demands at a time: fewer than the Judge keeps memos for, so each round reuses the last one's verdicts.
    demands = DEMANDS[half::2]
    assert len(demands) < MAX_DEMANDS
    cluster = ClusterState.from_objects(fleet(), Settings())
    judge = Judge(cluster)
    check_all(cluster, judge, "before", demands)
    # Assumed pods (our own binds), on nodes with maxBalloons (cpu-b1) and elsewhere; a shared-pool hog.
    # cpu-b1: now at maxBalloons
    for i, (node, tp, cpus) in enumerate([("cpu-b1", 1, 4), ("cpu-a1", 2, 16), ("cpu-snc4", 1, 6)]):
        p = pod(f"held-{i}", tp=tp, cpus=cpus)
        demand = read_model_pod(p, cluster.settings)
        assert demand is not None and AssumeCache(cluster).assume(f"uid-held-{i}", "llm", f"held-{i}", demand, node).ok
    cluster.apply("Pod", "ADDED", {"metadata": {"name": "hog", "namespace": "x", "uid": "hog"},
                                   "spec": {"nodeName": "cpu-nosmt",
                                            "containers": [{"name": "c", "resources": {"requests": {"cpu": "30"}}}]},
                                   "status": {"phase": "Running"}})
    check_all(cluster, judge, "after", demands)
    AssumeCache(cluster).forget("uid-held-1")
    check_all(cluster, judge, "forgotten", demands)


def test_verdicts_follow_node_deletions_policy_changes_and_a_journal_that_forgot() -> None:
    """A verdict is kept until the cluster's stamp journal says its node changed; a node deleted, a policy replaced
    (every node at once) and more changes than the journal remembers must each show in the next answer."""
    cluster = ClusterState.from_objects(fleet(), Settings())
    judge = Judge(cluster)
    check_all(cluster, judge, "before")
    gone = next(o for o in fleet() if o["kind"] == "Node" and o["metadata"]["name"] == "cpu-a2")
    cluster.apply("Node", "DELETED", gone)
    ref = judge.read_pod(pod("after-delete", tp=1, cpus=8))
    out = filter_nodes(judge, ref, ["cpu-a1", "cpu-a2"])
    assert out.unresolvable == {"cpu-a2": UNKNOWN_NODE} and "cpu-a2" not in out.passed
    policy = next(o for o in fleet() if o["kind"] == "BalloonsPolicy" and o["metadata"]["name"] == "node.cpu-a1")
    policy["status"]["nodes"]["cpu-a1"]["status"] = "Failure"
    cluster.apply("BalloonsPolicy", "MODIFIED", policy)
    check_all(cluster, judge, "policy")
    assert not filter_nodes(judge, judge.read_pod(pod("nri-down", tp=1, cpus=8)), ["cpu-a1"]).passed
    # Fewer demands than the Judge keeps memos for, so the second ask reuses the first one's verdicts.
    probes = [dict(tp=tp, cpus=cpus * tp) for tp in (1, 2) for cpus in (4, 8, 14)]
    names = sorted(cluster.nodes)
    for i, d in enumerate(probes):
        judged(judge, pod(f"probe-{i}-a", **d), names)  # type: ignore[arg-type]
    held = read_model_pod(pod("held", tp=2, cpus=16), cluster.settings)
    assert AssumeCache(cluster).assume("uid-held", "llm", "held", held, "cpu-b1").ok
    for _ in range(70_000):  # other ledgers' changes push cpu-b1's out of the journal
        cluster.stamps.take("elsewhere")
    for i, d in enumerate(probes):
        p = pod(f"probe-{i}-b", **d)  # type: ignore[arg-type]
        assert judged(judge, p, names) == {n: expected(cluster, p, n) for n in names}, d


def test_each_cluster_keeps_its_own_journal() -> None:
    """Two states in one process (the CLI's and a test's, two servers' in a benchmark): a change to one
    drops no verdict the other's Judge holds."""
    mine, other = (ClusterState.from_objects(fleet(), Settings()) for _ in range(2))
    for state in (mine, other):
        state.ledger("cpu-b1")
    before = other.stamps.taken
    held = read_model_pod(pod("held", tp=2, cpus=16), mine.settings)
    assert AssumeCache(mine).assume("uid-held", "llm", "held", held, "cpu-b1").ok
    assert mine.stamps.changed_since(before) is not None and other.stamps.taken == before


def test_warming_judges_every_node_a_model_was_not_asked_about() -> None:
    cluster = ClusterState.from_objects(fleet(), Settings())
    judge = Judge(cluster)
    judged(judge, pod("seen", tp=1, cpus=8), ["cpu-a1"])
    assert judge.warm(0)  # a zero budget: one node judged, more remain
    while judge.warm(0):
        pass
    asked = judge.fits_asked
    replica = pod("replica", tp=1, cpus=8)
    got = judged(judge, replica, sorted(cluster.nodes))
    assert judge.fits_asked == asked  # every verdict was ready
    for name in cluster.nodes:
        assert got[name] == expected(cluster, replica, name)


def test_replicas_share_verdicts_and_messages_that_name_no_pod() -> None:
    cluster = ClusterState.from_objects(fleet(), Settings())
    judge = Judge(cluster)
    a = judged(judge, pod("replica-a", tp=1, cpus=8), ["cpu-full"])["cpu-full"]
    b = judged(judge, pod("replica-b", tp=1, cpus=8), ["cpu-full"])["cpu-full"]
    assert a == b and "needs 4 free cores" in a[3] and "replica" not in a[3] and "cpu-full" not in a[3]
    assert len(judge._memos) == 1  # one demand, asked twice


@hsettings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["cpu-a1", "cpu-a2", "cpu-b1", "cpu-full", "cpu-nosmt", "cpu-snc4"]),
                          st.sampled_from([1, 2, 4]), st.integers(1, 20), st.booleans()), max_size=12))
def test_random_binds_and_releases_never_make_the_memo_disagree(ops: list[tuple[str, int, int, bool]]) -> None:
    cluster = ClusterState.from_objects(copy.deepcopy(FLEET), Settings())
    judge = Judge(cluster)
    names = sorted(cluster.nodes)
    probes = [pod(f"probe-{tp}-{c}", tp=tp, cpus=c * tp) for tp in (1, 2, 4) for c in (2, 8, 14)]
    for i, (node, tp, per, release) in enumerate(ops):
        p = pod(f"op-{i}", tp=tp, cpus=per * tp)
        AssumeCache(cluster).assume(f"uid-op-{i}", "llm", f"op-{i}", read_model_pod(p, cluster.settings), node)
        if release and i:
            AssumeCache(cluster).forget(f"uid-op-{i - 1}")
        for probe in probes:
            got = judged(judge, probe, names)
            assert all(got[n] == expected(cluster, probe, n) for n in names)


FLEET = fleet()


def test_nodes_alike_but_for_free_memory_are_each_told_their_own_fit() -> None:
    """Nodes of one shape holding the same model cores, whose other pods hold different memory: a demand's plan is
    made once for them all and finished per node, and a plan that refuses is told to every one of them as one
    verdict (issue 39: a new model's first /filter of 500 nodes shared it for 91 of 442 nodes judged). Each answer
    must still be that node's own fit, and the nodes must have shared plans for this to test anything."""
    twins = [f"twin-{k}" for k in range(4)]
    objects: list[Obj] = [{
        "apiVersion": "config.nri/v1alpha1", "kind": "BalloonsPolicy",
        "metadata": {"name": "default", "namespace": "kube-system"},
        "spec": {"reservedResources": {"cpu": "8"}, "pinCPU": True, "pinMemory": True,
                 "balloonTypes": [{"name": "reserved", "namespaces": ["kube-system"]},
                                  {"name": "vllm-balloon-tp1", "hideHyperthreads": True, "preferNewBalloons": True}]},
        "status": {"nodes": {name: {"status": "Success", "generation": 1} for name in twins}}}]
    for k, name in enumerate(twins):
        objects.append({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {
            "feature.node.kubernetes.io/memory-numa.node_count": "2",
            "feature.node.kubernetes.io/cpu-hardware_multithreading": "true"}},
            "status": {"capacity": {"cpu": "96", "memory": "512Gi"}, "allocatable": {"cpu": "96", "memory": "500Gi"}}})
        objects.append({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"cache-{k}", "namespace": "apps",
                                                                        "uid": f"uid-cache-{k}"},
                        "spec": {"nodeName": name, "containers": [{"name": "app", "resources": {
                            "requests": {"cpu": "100m", "memory": f"{121 - 40 * k}Gi"}}}]},
                        "status": {"phase": "Running"}})
    cluster = ClusterState.from_objects(objects, Settings())
    held = read_model_pod(pod("held", tp=1, cpus=36), cluster.settings)
    for name in twins:
        assert AssumeCache(cluster).assume(f"uid-held-{name}", "llm", f"held-{name}", held, name).ok
    ledgers = [cluster.ledger(name) for name in twins]
    assert len({ledger.free() for ledger in ledgers if ledger}) == 1
    assert len({ledger.free_memory() for ledger in ledgers if ledger}) == len(twins)
    judge = Judge(cluster)
    for i, (cpus, memory) in enumerate(((24, "64Gi"), (24, "200Gi"), (40, "64Gi"))):  # fits; short of memory; no room
        p = pod(f"new-{i}", tp=1, cpus=cpus)
        p["spec"]["containers"][0]["resources"]["requests"]["memory"] = memory
        asked = judge.fits_asked
        got = judged(judge, p, twins)
        assert all(got[name] == expected(cluster, p, name) for name in twins), got
        fits = [got[name][0] for name in twins]
        if i == 1:  # the first node asked is short of memory, the others have enough
            assert fits == [False, True, True, True]
        if i == 2:
            assert not any(fits) and judge.fits_asked - asked == 1  # one plan, one verdict
