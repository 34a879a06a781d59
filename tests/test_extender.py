"""The scheduler extender over TLS, as kube-scheduler calls it: the exact JSON it sends (both
`nodeCacheCapable` forms, built from the Go types of k8s.io/kube-scheduler/extender/v1), the shape of
every answer key by key, FailedNodes vs FailedAndUnresolvableNodes, malformed bodies, /bind and the race
it exists to prevent, /debug/nodes and the one log line per call."""

from __future__ import annotations

import asyncio
import copy
import json
import logging
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest

from extender.filter import Judge, filter_nodes
from extender.routes import JUDGE
from placement.assume import AssumeCache
from placement.config import Settings
from placement.ledger import PLACEMENT
from server import metrics
from tests.support.extender import (
    DEMO_NODES,
    FILTER_KEYS,
    TP_ANN,
    Ext,
    MakeExt,
    Obj,
    added,
    aligning_nothing,
    args_nodecache,
    args_nodelist,
    bind_args,
    go_json,
    kubelet_static_pod,
    model_pod,
    pair,
    plain_pod,
)
from tests.support.payloads import fixture_json


def demo_nodes(objects: list[Obj]) -> list[Obj]:
    return [o for o in objects if o["kind"] == "Node"]


# ------------------------------------------------------------------------------------------- wire shape


async def test_filter_nodecache_form_answers_nodenames_with_all_five_keys(ext: Ext) -> None:
    pod = model_pod()
    answer = await ext.ok("/filter", args_nodecache(pod, DEMO_NODES))
    assert set(answer) == FILTER_KEYS
    assert answer["Nodes"] is None
    assert answer["NodeNames"] == ["cpu-a1", "cpu-a2", "cpu-b1", "cpu-icx", "cpu-nosmt", "cpu-snc4"]
    # cpu-ks1 and cpu-ks2 pin with the kubelet: no balloon can ever be made there.
    assert set(answer["FailedNodes"]) == {"cpu-full"}
    assert set(answer["FailedAndUnresolvableNodes"]) == {"cpu-ks1", "cpu-ks2"}
    assert answer["Error"] == ""
    # Every candidate is accounted for exactly once, as the scheduler maps them back.
    judged = answer["NodeNames"] + list(answer["FailedNodes"]) + list(answer["FailedAndUnresolvableNodes"])
    assert sorted(judged) == DEMO_NODES


async def test_kubelet_static_pods_go_only_where_the_kubelet_admits_them(ext: Ext) -> None:
    # cpu-ks1: 2 x 64 CPUs, single-numa-node; cpu-ks2: 4 x 24 CPUs (SNC-2), restricted; 2 CPUs reserved on NUMA 0.
    # 40 CPUs fit one NUMA node of cpu-ks1 only: cpu-ks2's kubelet spans two, which ranks below.
    answer = await ext.ok("/filter", args_nodecache(kubelet_static_pod("ks-40", 40), DEMO_NODES))
    assert answer["NodeNames"] == ["cpu-ks1", "cpu-ks2"]
    assert set(answer["FailedAndUnresolvableNodes"]) == set(DEMO_NODES) - {"cpu-ks1", "cpu-ks2"}
    assert "the NRI balloons plugin pins CPUs on these nodes" in answer["FailedAndUnresolvableNodes"]["cpu-a1"]
    scores = {s["Host"]: s["Score"] for s in await ext.ok("/prioritize", args_nodecache(
        kubelet_static_pod("ks-40", 40), ["cpu-ks1", "cpu-ks2"]))}
    assert scores.get("cpu-ks1", 0) > scores.get("cpu-ks2", 0)
    # 70 CPUs: more than any NUMA node of cpu-ks1, whose single-numa-node kubelet would fail the pod on any node of
    # its shape, empty or not (no eviction helps); cpu-ks2's restricted kubelet spans 3 of its NUMA nodes.
    answer = await ext.ok("/filter", args_nodecache(kubelet_static_pod("ks-70", 70), ["cpu-ks1", "cpu-ks2"]))
    assert answer["NodeNames"] == ["cpu-ks2"]
    assert answer["FailedAndUnresolvableNodes"]["cpu-ks1"] == (
        "the kubelet (Topology Manager single-numa-node, scope container) would fail the pod with "
        "TopologyAffinityError: 70 CPUs fit no NUMA node of nodes of this shape, the largest holds 64 (needs "
        "kubelet-static: 70 exclusive CPUs)")
    # ks-40, held on NUMA 0 of cpu-ks1 (its best node) and not yet admitted by the kubelet: another 40 CPUs would
    # take NUMA 0 if they reached the kubelet first, and ks-40 NUMA 1. It waits until ks-40 runs.
    pod = kubelet_static_pod("ks-bound", 40)
    waiting = await ext.ok("/filter", args_nodecache(pod, ["cpu-ks1"]))
    assert waiting["NodeNames"] == []
    assert waiting["FailedNodes"]["cpu-ks1"].startswith(
        "pod llm-inference/ks-40, bound here moments ago, is not yet admitted by the kubelet")
    assert (await ext.ok("/bind", bind_args(kubelet_static_pod("ks-40", 40), "cpu-ks1")))["Error"] == ""
    ran = kubelet_static_pod("ks-40", 40)
    ran["metadata"]["annotations"][PLACEMENT] = AssumeCache(ext.cluster).placement("uid-ks-40")
    ext.cluster.apply("Pod", "MODIFIED", {**ran, "spec": {**ran["spec"], "nodeName": "cpu-ks1"},
                                          "status": {"phase": "Running"}})
    # Bound where the extender says, the pod's placement records each container's CPUs as the kubelet takes them:
    # the lowest-id NUMA node that fits (NUMA 1: ks-40 runs on NUMA 0), its lowest free whole cores.
    assert (await ext.ok("/filter", args_nodecache(pod, ["cpu-ks1"])))["NodeNames"] == ["cpu-ks1"]
    assert (await ext.ok("/bind", bind_args(pod, "cpu-ks1")))["Error"] == ""
    placed = ext.cluster.pods["uid-ks-bound"].placed
    assert placed is not None and [(name, str(cpus)) for name, cpus in placed.cpus] == [("main", "32-51,96-115")]
    # 30 more fit no single NUMA node now (22 and 24 CPUs free): the kubelet would fail it, until a pod leaves.
    answer = await ext.ok("/filter", args_nodecache(kubelet_static_pod("ks-next", 30), ["cpu-ks1"]))
    assert answer["FailedNodes"]["cpu-ks1"].startswith(
        "the kubelet (Topology Manager single-numa-node, scope container) would fail the pod with "
        "TopologyAffinityError: 30 CPUs fit no NUMA node now; free CPUs NUMA 0: 22 of 62, NUMA 1: 24 of 64")


def created(pod: Obj, seconds_ago: float) -> Obj:
    stamp = datetime.now(UTC) - timedelta(seconds=seconds_ago)
    pod["metadata"]["creationTimestamp"] = stamp.strftime("%Y-%m-%dT%H:%M:%SZ")
    return pod


async def run_on(ext: Ext, pod: Obj, node: str) -> None:
    """`pod` filtered, bound to `node` and seen Running there, its placement recorded as /bind records it."""
    assert (await ext.ok("/filter", args_nodecache(pod, [node])))["NodeNames"] == [node]
    assert (await ext.ok("/bind", bind_args(pod, node)))["Error"] == ""
    ran = copy.deepcopy(pod)
    ran["metadata"]["annotations"][PLACEMENT] = AssumeCache(ext.cluster).placement(pod["metadata"]["uid"])
    ext.cluster.apply("Pod", "MODIFIED", {**ran, "spec": {**ran["spec"], "nodeName": node},
                                          "status": {"phase": "Running"}})


async def test_a_pod_that_only_a_non_aligning_node_would_split_waits_for_one_that_keeps_it_local(
        make_ext: MakeExt, demo_objects: list[Obj]) -> None:
    async def filled(settings: Settings | None = None) -> Ext:
        # cpu-ks2 (4 NUMA nodes of 24 CPUs) under best-effort runs 30 CPUs over two of them; cpu-ks1 (2 x 64 CPUs,
        # single-numa-node) holds them on one once a pod leaves: two of 40 leave it 22 and 24 CPUs free.
        ext = await make_ext(aligning_nothing(demo_objects, "cpu-ks2"), settings)
        for name in ("ks-a", "ks-b"):
            await run_on(ext, kubelet_static_pod(name, 40), "cpu-ks1")
        return ext

    both = ["cpu-ks1", "cpu-ks2"]
    ext = await filled()
    young = created(kubelet_static_pod("ks-30", 30), seconds_ago=20)
    answer = await ext.ok("/filter", args_nodecache(young, both))
    assert answer["NodeNames"] == []
    assert answer["FailedNodes"]["cpu-ks1"].startswith("the kubelet (Topology Manager single-numa-node")
    said = answer["FailedAndUnresolvableNodes"]["cpu-ks2"]
    assert said.startswith("would run the model split: its 1 rank would not get a NUMA node of its own with a "
                           "whole share here (the kubelet does not align it so); nodes that keep each rank on its own "
                           "NUMA node are full now, so it waits for one until "), said
    assert "Z, 100 s more (`split_wait_seconds`), then runs split" in said or "Z, 101 s more" in said, said
    # kube-scheduler sends no node short of CPUs in all: cpu-ks1, which could hold it once a pod leaves, still counts.
    alone = await ext.ok("/filter", args_nodecache(created(kubelet_static_pod("ks-30-b", 30), seconds_ago=0),
                                                     ["cpu-ks2"]))
    assert alone["NodeNames"] == [] and alone["FailedAndUnresolvableNodes"]["cpu-ks2"].startswith("would run the model")
    # A pod that no aligning node could hold even empty (70 CPUs: more than a NUMA node of cpu-ks1) never waits.
    big = created(kubelet_static_pod("ks-70", 70), seconds_ago=0)
    assert (await ext.ok("/filter", args_nodecache(big, ["cpu-ks2"])))["NodeNames"] == ["cpu-ks2"]
    # Its wait over, a pod runs split where a node has room: a model that runs slowly rather than not at all.
    old = created(kubelet_static_pod("ks-30-old", 30), seconds_ago=121)
    assert (await (await filled()).ok("/filter", args_nodecache(old, both)))["NodeNames"] == ["cpu-ks2"]
    # Nor does any pod wait where the operator set no wait.
    eager = await filled(Settings(split_wait_seconds=0))
    assert (await eager.ok("/filter", args_nodecache(young, both)))["NodeNames"] == ["cpu-ks2"]


async def test_filter_nodelist_form_answers_the_passing_node_objects(ext: Ext, demo_objects: list[Obj]) -> None:
    nodes = demo_nodes(demo_objects)
    answer = await ext.ok("/filter", args_nodelist(model_pod(), nodes))
    assert set(answer) == FILTER_KEYS
    assert answer["NodeNames"] is None
    assert set(answer["Nodes"]) == {"metadata", "items"}
    # cpu-ks1 and cpu-ks2 pin with the kubelet: no balloon of any type can be made there.
    passed = [n for n in nodes if n["metadata"]["name"] not in ("cpu-full", "cpu-ks1", "cpu-ks2")]
    assert answer["Nodes"]["items"] == passed  # the full objects, unchanged, in the order sent
    assert list(answer["FailedNodes"]) == ["cpu-full"] and answer["Error"] == ""


async def test_scheduling_fields_of_the_wrong_type_are_read_as_absent_not_a_500(ext: Ext) -> None:
    """The fuzzer's `tolerations: true` was a 500 (a bool is not iterable); the apiserver never sends one, but
    the extender answers every candidate all the same."""
    baseline = (await ext.filter(model_pod(), DEMO_NODES))["NodeNames"]
    required = "requiredDuringSchedulingIgnoredDuringExecution"
    for i, (field, value) in enumerate((("tolerations", True), ("nodeSelector", "gpu"), ("affinity", []),
                                        ("affinity", {"nodeAffinity": {required: {"nodeSelectorTerms": True}}}))):
        pod = model_pod(uid=f"wrong-type-{i}")  # a pod of its own: the extender keeps what it read of a uid
        pod["spec"][field] = value
        status, answer = await ext.raw("/filter", args_nodecache(pod, DEMO_NODES))
        assert status == 200 and answer["Error"] == "", (field, value, answer)
        judged = answer["NodeNames"] + list(answer["FailedNodes"]) + list(answer["FailedAndUnresolvableNodes"])
        assert sorted(judged) == DEMO_NODES, (field, value, answer)
        # As if the field were absent; required terms that are not a list match no node, as an empty list does.
        assert answer["NodeNames"] == ([] if i == 3 else baseline), (field, value, answer)


async def test_filter_fixture_payloads_as_shipped(ext: Ext) -> None:
    for name, form in (("extender-args-nodecache.json", "NodeNames"), ("extender-args-nodelist.json", "Nodes")):
        body = json.dumps(fixture_json(name)).encode()
        answer = await ext.ok("/filter", body)
        assert set(answer) == FILTER_KEYS and answer["Error"] == ""
        other = "Nodes" if form == "NodeNames" else "NodeNames"
        assert answer[form] is not None and answer[other] is None
        # worker-1/worker-2 are not in the demo ledger: failed with that reason, never an Error
        assert set(answer["FailedAndUnresolvableNodes"]) == {"worker-1", "worker-2"}
        assert all("not known to the extender" in m for m in answer["FailedAndUnresolvableNodes"].values())


async def test_prioritize_lists_the_nodes_above_the_lowest_score_as_a_bare_list(ext: Ext) -> None:
    pod = model_pod(tp=2, cpus=16)
    names = [*DEMO_NODES, "ghost"]
    # The configured strategy's score from the core's fit (asked before /prioritize holds the best node).
    from placement.demand import read_model_pod

    demand = read_model_pod(pod, ext.cluster.settings)
    fits = {name: ext.cluster.fit(demand, ext.cluster.ledger(name)) for name in DEMO_NODES}  # type: ignore[arg-type]
    first = await ext.ok("/prioritize", args_nodecache(pod, names))
    assert isinstance(first, list) and first
    for entry in first:
        assert list(entry) == ["Host", "Score"]
        assert type(entry["Score"]) is int and 1 <= entry["Score"] <= 10  # a node at 0 is left out
    scores = added(first, names)
    assert scores["ghost"] == 0 and scores["cpu-full"] == 0  # unknown, and does not fit: the lowest, 0
    assert scores["cpu-a2"] > scores["cpu-a1"]  # MostAllocated: pack the half-used node
    for name, fit in fits.items():
        assert scores[name] == (fit.score if fit.ok else 0)
    # Without the nodes at 0 every score is lowered by the lowest one: the same order, the same gaps.
    fitting = [n for n in DEMO_NODES if fits[n].ok]
    floor = min(fits[n].score for n in fitting)
    assert await ext.prioritize(pod, fitting) == {n: fits[n].score - floor for n in fitting}
    # Deterministic: asking again for the same pod moves its own hold, it does not compete with it.
    assert await ext.ok("/prioritize", args_nodecache(pod, names)) == first
    assert await ext.ok("/prioritize", args_nodelist(pod, [{"metadata": {"name": n}} for n in names])) == first


async def test_scoring_strategy_is_the_configured_one(make_ext: MakeExt, demo_objects: list[Obj]) -> None:
    most = await make_ext(demo_objects)
    least = await make_ext(demo_objects, Settings(scoring_strategy="LeastAllocated"))
    pod = model_pod(tp=2, cpus=16)
    m = await most.prioritize(pod, ["cpu-a1", "cpu-a2"])
    n = await least.prioritize(pod, ["cpu-a1", "cpu-a2"])
    assert m["cpu-a2"] > m["cpu-a1"] and n["cpu-a1"] > n["cpu-a2"]


async def test_keys_are_matched_case_insensitively_as_go_does(ext: Ext) -> None:
    pod = model_pod()
    lower = f'{{"pod":{go_json(pod)},"nodes":null,"nodenames":["cpu-a1","cpu-full"]}}'.encode()
    answer = await ext.ok("/filter", lower)
    assert answer["NodeNames"] == ["cpu-a1"] and list(answer["FailedNodes"]) == ["cpu-full"]
    mixed = f'{{"POD":{go_json(pod)},"nodeNames":["cpu-a1"]}}'.encode()  # absent Nodes decodes as nil
    assert (await ext.ok("/filter", mixed))["NodeNames"] == ["cpu-a1"]
    # The compatibility test of extender/v1 lowercases the whole document: NodeList too.
    whole = args_nodelist(pod, [{"metadata": {"name": "cpu-a1"}}]).decode().lower().encode()
    assert (await ext.ok("/filter", whole))["Nodes"]["items"][0]["metadata"]["name"] == "cpu-a1"
    scored = await ext.ok("/prioritize", lower)  # cpu-full: 0, left out
    assert [(e["Host"], e["Score"] > 0) for e in scored] == [("cpu-a1", True)], scored
    bind = bind_args(pod, "cpu-a1").decode().replace("PodName", "podname").replace("PodUID", "poduid")
    assert (await ext.ok("/bind", bind.replace('"Node"', '"node"').encode())) == {"Error": ""}


# ------------------------------------------------------------------------------------------- verdicts


async def test_each_refusal_goes_to_the_list_that_matches_what_preemption_can_do(
        make_ext: MakeExt, demo_objects: list[Obj]) -> None:
    objects = copy.deepcopy(demo_objects)
    for obj in objects:  # the NRI plugin reports Failure on cpu-nosmt
        if obj["kind"] == "BalloonsPolicy" and obj["metadata"]["name"] == "node.cpu-nosmt":
            obj["status"]["nodes"]["cpu-nosmt"]["status"] = "Failure"
    ext = await make_ext(objects)
    cases = [
        # (pod, node, list, check phrase)
        (model_pod("case-tp4", tp=4, cpus=32), "cpu-a1", "FailedAndUnresolvableNodes", "TP=4 needs 4 NUMA nodes"),
        (model_pod("case-huge", tp=1, cpus=80), "cpu-a1", "FailedAndUnresolvableNodes", "even when empty"),
        (model_pod("case-odd-type", tp=2, cpus=16, balloon="vllm-balloon-tp4"), "cpu-b1", "FailedAndUnresolvableNodes",
         "balloon type vllm-balloon-tp4 is not defined"),
        (model_pod("case-nri-down", tp=1, cpus=8), "cpu-nosmt", "FailedAndUnresolvableNodes", "reports Failure"),
        (model_pod("case-too-big-now", tp=1, cpus=8), "cpu-full", "FailedNodes", "needs 4 free cores"),
        (model_pod("case-fits", tp=4, cpus=16), "cpu-snc4", None, ""),
    ]
    for pod, node, where, phrase in cases:
        answer = await ext.filter(pod, [node])
        if where is None:
            assert answer["NodeNames"] == [node], answer
            continue
        assert answer["NodeNames"] == [], answer
        other = "FailedNodes" if where == "FailedAndUnresolvableNodes" else "FailedAndUnresolvableNodes"
        assert list(answer[where]) == [node] and answer[other] == {}, answer
        message = answer[where][node]
        assert phrase in message, message
        # Never names the node (kube-scheduler counts identical reasons into its summary), but the demand; a
        # refusal eviction could change carries the number of its class, the fix, and where the per-node numbers
        # are: the pod's name only there, the same for every node of the call.
        # (A BalloonsPolicy of the node's own is named node.NAME: the policy, quoted by its name.)
        assert node not in message.replace(f"/node.{node}", ""), message
        assert "CPUs" in message or "cores" in message
        assert ("the most any such node has free" in message) == (where == "FailedNodes"), message
        explain = f"`model-placement explain llm-inference/{pod['metadata']['name']}` lists every node"
        assert message.replace(explain, "").count(pod["metadata"]["name"]) == 0, message
        waits = explain in message and "wait for free cores or lower cpu" in message
        assert waits == (where == "FailedNodes"), message


async def test_model_pod_with_unreadable_spec_is_unresolvable_everywhere_with_the_reason(ext: Ext) -> None:
    pod = model_pod("bad-tp")
    pod["metadata"]["annotations"][TP_ANN] = "three"
    answer = await ext.filter(pod, DEMO_NODES)
    assert answer["NodeNames"] == [] and answer["FailedNodes"] == {} and answer["Error"] == ""
    messages = set(answer["FailedAndUnresolvableNodes"].values())
    assert set(answer["FailedAndUnresolvableNodes"]) == set(DEMO_NODES) and len(messages) == 1
    (message,) = messages
    assert "the pod cannot be placed until its spec is fixed" in message and "'three'" in message
    assert await ext.ok("/prioritize", args_nodecache(pod, DEMO_NODES)) == []  # no preference: every node at 0


async def test_non_model_pod_passes_every_node_untouched(ext: Ext, demo_objects: list[Obj]) -> None:
    names = [*DEMO_NODES, "not-in-the-ledger"]
    answer = await ext.filter(plain_pod(), names)
    assert answer == {"Nodes": None, "NodeNames": names, "FailedNodes": {}, "FailedAndUnresolvableNodes": {},
                      "Error": ""}
    nodes = demo_nodes(demo_objects)
    listed = await ext.ok("/filter", args_nodelist(plain_pod(), nodes))
    assert listed["Nodes"] == {"metadata": {}, "items": nodes} and listed["NodeNames"] is None
    assert await ext.ok("/prioritize", args_nodecache(plain_pod(), names)) == []


async def test_unknown_node_is_a_failed_node_not_an_error(ext: Ext) -> None:
    answer = await ext.filter(model_pod(), ["cpu-a1", "node-from-the-future"])
    assert answer["Error"] == "" and answer["NodeNames"] == ["cpu-a1"]
    assert answer["FailedAndUnresolvableNodes"] == {
        "node-from-the-future": "not known to the extender (not in its cache yet, or deleted)"}


async def test_filter_and_prioritize_metrics_and_one_log_line_per_call(ext: Ext,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    before = {o: metrics.FILTER_NODES.labels(o)._value.get() for o in ("passed", "failed", "unresolvable")}
    caplog.set_level(logging.INFO, logger="model_placement.extender")
    await ext.filter(model_pod(tp=4, cpus=16), DEMO_NODES)
    after = {o: metrics.FILTER_NODES.labels(o)._value.get() - before[o] for o in before}
    assert after == {"passed": 1, "failed": 0, "unresolvable": 8}  # only cpu-snc4 has 4 NUMA nodes and a balloon
    (line,) = [r for r in caplog.records if r.name == "model_placement.extender"]
    assert line.verb == "filter" and line.pod == "llm-inference/qwen3-0-6b-predictor-7d9f8c6b5-x2k9q"  # type: ignore[attr-defined]
    assert (line.nodes_in, line.nodes_out, line.decision) == (9, 1, "fits")  # type: ignore[attr-defined]
    assert len(line.first_reasons) == 3 and line.first_reasons[0].startswith("cpu-a1: ")  # type: ignore[attr-defined]
    # Each demo node has a BalloonsPolicy of its own (node.NAME), so each is a shape of its own: seven fits.
    assert line.duration_ms >= 0 and "TP=4" in line.demand and line.count == 9  # type: ignore[attr-defined]
    assert "(NUMA 0: 29/29, NUMA 1: 29/29 free cores)" in line.first_reasons[0]  # type: ignore[attr-defined]
    caplog.clear()
    caplog.set_level(logging.DEBUG, logger="model_placement.extender")
    await ext.filter(model_pod(tp=4, cpus=16), DEMO_NODES)
    (again,) = [r for r in caplog.records if r.levelno == logging.INFO]
    assert again.count == 0  # type: ignore[attr-defined]  # a replica, nothing changed: nothing to compute
    debug = [r for r in caplog.records if r.levelno == logging.DEBUG]
    assert sorted(r.node for r in debug) == sorted(set(DEMO_NODES) - {"cpu-snc4"})  # type: ignore[attr-defined]


async def test_between_requests_the_server_judges_the_nodes_a_model_was_not_asked_about(
        ext: Ext, caplog: pytest.LogCaptureFixture) -> None:
    """kube-scheduler samples candidates: a replica is asked about nodes its model never met. The server
    judges those while idle, so the replica's /filter computes nothing and answers the same."""
    caplog.set_level(logging.INFO, logger="model_placement.extender")
    await ext.filter(model_pod("llama-0", tp=2, cpus=16), ["cpu-a1", "cpu-a2"])  # two fit: nothing held
    judge = ext.served.app[JUDGE]
    for _ in range(200):  # the app's background task warms; this only waits for it
        if all(m.untold == [] for m in judge._memos.values()):
            break
        await asyncio.sleep(0.01)
    assert all(m.untold == [] for m in judge._memos.values())
    caplog.clear()
    warm = await ext.filter(model_pod("llama-1", tp=2, cpus=16), DEMO_NODES)
    (line,) = [r for r in caplog.records if r.name == "model_placement.extender"]
    assert line.count == 0  # type: ignore[attr-defined]
    fresh = Judge(ext.cluster)  # a judge that never warmed answers the same
    out = filter_nodes(fresh, fresh.read_pod(model_pod("llama-1", tp=2, cpus=16)), DEMO_NODES)
    assert warm["NodeNames"] == out.passed and warm["FailedNodes"] == out.failed
    assert warm["FailedAndUnresolvableNodes"] == out.unresolvable


# ------------------------------------------------------------------------------------------- bad input


MALFORMED: list[tuple[str, bytes, str | None, str]] = [
    ("bad JSON", b'{"Pod": {', "application/json", "not valid JSON"),
    ("empty", b"", "application/json", "empty"),
    ("not an object", b'[{"Pod": {}}]', "application/json", "must be a JSON object"),
    ("missing Pod", b'{"Nodes": null, "NodeNames": ["cpu-a1"]}', "application/json", "has no Pod"),
    ("Pod not an object", b'{"Pod": "p", "NodeNames": []}', "application/json", "Pod must be a v1.Pod"),
    ("Nodes wrong type", b'{"Pod": {}, "Nodes": ["cpu-a1"], "NodeNames": null}', "application/json", "Nodes must be"),
    ("items wrong type", b'{"Pod": {}, "Nodes": {"items": {}}}', "application/json", "items must be a list"),
    ("item without name", b'{"Pod": {}, "Nodes": {"items": [{"metadata": []}]}}', "application/json", "items[0]"),
    ("NodeNames wrong type", b'{"Pod": {}, "NodeNames": "cpu-a1"}', "application/json", "NodeNames must be"),
    ("no candidates", b'{"Pod": {}, "Nodes": null, "NodeNames": null}', "application/json", "neither"),
    ("metadata wrong type", b'{"Pod": {"metadata": 7}, "NodeNames": []}', "application/json", "metadata must be"),
    ("labels wrong type", b'{"Pod": {"metadata": {"labels": [1]}}, "NodeNames": []}', "application/json", "labels"),
    ("wrong Content-Type", args_nodecache(plain_pod(), ["cpu-a1"]), "text/plain",
     "Content-Type must be application/json"),
    ("form Content-Type", b"Pod=x", "application/x-www-form-urlencoded", "Content-Type"),
]


@pytest.mark.parametrize("verb", ["filter", "prioritize"])
async def test_malformed_bodies_are_400_with_a_message_and_the_server_keeps_serving(ext: Ext, verb: str) -> None:
    for label, body, ctype, phrase in MALFORMED:
        status, answer = await ext.raw(f"/{verb}", body, ctype)
        assert status == 400, label
        assert list(answer) == ["error"] and phrase in answer["error"], (label, answer)
    assert (await ext.filter(model_pod(), ["cpu-a1"]))["NodeNames"] == ["cpu-a1"]


async def test_model_pod_spec_of_the_wrong_shape_is_400_not_500(ext: Ext) -> None:
    pod = model_pod()
    pod["spec"]["containers"][0]["resources"] = ["cpu", "8"]
    status, answer = await ext.raw("/filter", args_nodecache(pod, ["cpu-a1"]))
    assert status == 400 and "not a readable v1.Pod" in answer["error"]


@pytest.mark.parametrize("body, phrase", [
    (b'{"PodName": "p", "PodNamespace": "ns", "PodUID": "u"}', "has no Node"),
    (b'{"PodName": "p", "PodNamespace": "ns", "Node": "cpu-a1"}', "has no PodUID"),
    (b'{"PodName": 5, "PodNamespace": "ns", "PodUID": "u", "Node": "cpu-a1"}', "PodName must be a string"),
    (b'"bind"', "must be a JSON object"),
    (b"{", "not valid JSON"),
])
async def test_malformed_bind_is_400(ext: Ext, body: bytes, phrase: str) -> None:
    status, answer = await ext.raw("/bind", body)
    assert status == 400 and phrase in answer["error"]


async def test_body_limit_is_enforced_with_and_without_content_length(make_ext: MakeExt,
                                                                      demo_objects: list[Obj]) -> None:
    ext = await make_ext(demo_objects, extender_body_limit=4096)
    big = args_nodecache(model_pod(), [f"node-{i:05d}" for i in range(1000)])
    status, answer = await ext.raw("/filter", big)
    assert status == 400 and "exceeds the limit of 4096 bytes" in answer["error"]

    async def chunks() -> AsyncIterator[bytes]:
        for i in range(0, len(big), 1000):
            yield big[i:i + 1000]

    async with ext.session.post(ext.served.url + "/filter", data=chunks(), headers={"Content-Type": "application/json"},
                                **ext.served.request_kwargs()) as resp:  # type: ignore[arg-type]
        assert resp.status == 400 and "exceeds the limit" in (await resp.json())["error"]
    assert (await ext.filter(model_pod(), ["cpu-a1"]))["NodeNames"] == ["cpu-a1"]


def test_default_body_limit_holds_a_full_5000_node_nodelist() -> None:
    from server.app import EXTENDER_BODY_LIMIT

    node = copy.deepcopy(fixture_json("extender-args-nodelist.json")["Nodes"]["items"][0])
    # kubelet reports up to 50 images (nodeStatusMaxImages), by digest and by tag: most of a Node's size
    node["status"]["images"] = [{"names": [f"registry.example.com/team-{i}/image-{i}@sha256:{'a' * 64}",
                                           f"registry.example.com/team-{i}/image-{i}:v1.2.3"],
                                 "sizeBytes": 123456789} for i in range(50)]
    body = args_nodelist(model_pod(), [node] * 5000)
    assert len(body) < EXTENDER_BODY_LIMIT


# ------------------------------------------------------------------------------------------- bind




async def test_back_to_back_the_second_pod_never_gets_the_node(ext: Ext) -> None:
    a, b = pair()
    assert (await ext.filter(a, ["cpu-a1"]))["NodeNames"] == ["cpu-a1"]  # each fits alone
    # kube-scheduler binds asynchronously: b's cycle may come before a's /bind. a's only feasible node is held
    # for it meanwhile, so b is not promised the same cores.
    answer = await ext.filter(b, ["cpu-a1"])
    assert answer["NodeNames"] == [] and "the most any such node has free there is 9" in answer["FailedNodes"]["cpu-a1"]
    assert await ext.bind(a, "cpu-a1") == ""
    answer = await ext.filter(b, ["cpu-a1"])  # the watch has not shown the binding: only the assumption
    assert answer["NodeNames"] == [] and "the most any such node has free there is 9" in answer["FailedNodes"]["cpu-a1"]
    assert await ext.prioritize(b, ["cpu-a1"]) == {"cpu-a1": 0}
    error = await ext.bind(b, "cpu-a1")  # a scheduler that binds anyway is refused
    assert "needs 20 free cores" in error
    holders = [h.pod for h in ext.cluster.ledger("cpu-a1").holdings.values()]  # type: ignore[union-attr]
    assert holders == ["llm-inference/first"]


async def test_concurrent_filter_and_bind_promise_the_cores_once(ext: Ext) -> None:
    a, b = pair()
    answers = await asyncio.gather(ext.filter(a, ["cpu-a1"]), ext.filter(b, ["cpu-a1"]))
    assert sorted(len(x["NodeNames"]) for x in answers) == [0, 1]  # the first one answered holds the node
    errors = await asyncio.gather(ext.bind(a, "cpu-a1"), ext.bind(b, "cpu-a1"))
    assert sorted(bool(e) for e in errors) == [False, True], errors
    ledger = ext.cluster.ledger("cpu-a1")
    assert ledger is not None and len(ledger.holdings) == 1 and min(ledger.free()) >= 0
    assert ledger.free() == (9, 9)


async def test_many_concurrent_pods_never_overcommit(ext: Ext) -> None:
    pods = [model_pod(f"p{i}", tp=1, cpus=8) for i in range(24)]  # 8 cores each; a handful of nodes
    names = ["cpu-a1", "cpu-a2", "cpu-full", "cpu-snc4"]
    filtered = await asyncio.gather(*(ext.filter(p, names) for p in pods))
    binds = await asyncio.gather(*(ext.bind(p, (f["NodeNames"] or names)[0]) for p, f in zip(pods, filtered)))
    bound = sum(1 for e in binds if not e)
    ours = {p["metadata"]["uid"] for p in pods}
    held = 0
    for name in names:
        ledger = ext.cluster.ledger(name)
        assert ledger is not None
        for numa, capacity in enumerate(ledger.capacity):
            taken = sum(c for h in ledger.holdings.values() for n, c in h.per_numa if n == numa)
            assert taken <= capacity
        held += sum(1 for h in ledger.holdings.values() if h.uid in ours)
    assert held == bound and 0 < bound < len(pods)
    assert all("free cores" in e for e in binds if e)


async def test_bind_refusals_are_error_answers(ext: Ext) -> None:
    pod = model_pod()
    await ext.filter(pod, ["cpu-a1"])
    assert "node cpu-zz is not known to the extender" in await ext.bind(pod, "cpu-zz")
    assert await ext.bind(pod, "cpu-a1") == ""
    assert "is already bound to node cpu-a1" in await ext.bind(pod, "cpu-a1")
    assert "is already bound to node cpu-a1" in await ext.bind(pod, "cpu-a2")
    # A running pod of the demo fleet (the watch shows its node).
    running = {"metadata": {"name": "llama3-8b-predictor-6c9f7-abcde", "namespace": "llm",
                            "uid": "demo-0016-llama3-8b-predictor-6c9f7-abcde"}}
    assert "is already bound to node cpu-a2" in await ext.bind(running, "cpu-a1")
    # Never seen at /filter, and no API to read it from in snapshot mode.
    assert "was not seen at /filter" in await ext.bind(model_pod("stranger"), "cpu-a1")
    # A uid that /filter saw under another name.
    other = model_pod("other")
    await ext.filter(other, ["cpu-a1"])
    impostor = model_pod("impostor", uid=other["metadata"]["uid"])
    assert "which /filter saw as pod" in await ext.bind(impostor, "cpu-a1")


async def test_bind_of_a_non_model_pod_in_snapshot_mode_touches_no_cores(ext: Ext) -> None:
    pod = plain_pod()
    await ext.filter(pod, ["cpu-a1"])
    before = ext.cluster.ledger("cpu-a1").free()  # type: ignore[union-attr]
    assert await ext.bind(pod, "cpu-a1") == ""
    assert ext.cluster.ledger("cpu-a1").free() == before  # type: ignore[union-attr]


# ------------------------------------------------------------------------------------------- debug


async def test_debug_nodes_shows_the_ledger_with_assumed_pods(ext: Ext) -> None:
    status, everything = await ext.get("/debug/nodes")
    assert status == 200 and [n["node"] for n in everything["nodes"]] == DEMO_NODES
    pod = model_pod(tp=2, cpus=32)  # 8 cores on each of 2 NUMA nodes
    await ext.filter(pod, ["cpu-a1"])
    assert await ext.bind(pod, "cpu-a1") == ""
    status, node = await ext.get("/debug/nodes/cpu-a1")
    assert status == 200 and node == ext.cluster.ledger("cpu-a1").to_json()  # type: ignore[union-attr]
    held = [h for numa in node["numa"] for h in numa["held"]]
    # A snapshot has no watch to confirm the binding: the extender's own bind is the record.
    assert [(h["pod"], h["cores"], h["assumed"]) for h in held] == [
        ("llm-inference/qwen3-0-6b-predictor-7d9f8c6b5-x2k9q", 8, False)] * 2
    assert [numa["free"] for numa in node["numa"]] == [21, 21]
    status, missing = await ext.get("/debug/nodes/nope")
    assert status == 404 and missing == {"error": "node nope is not known to the extender"}


async def test_a_thousand_nodes_of_three_shapes_refuse_in_a_few_sentences_that_name_no_node(
        make_ext: MakeExt) -> None:
    """kube-scheduler counts identical reasons into "0/1000 nodes are available: 640 <reason>, …": with a reason
    per node its summary would be ~90 KB of sentences, and the event (cut at 1,024 characters) five nodes."""
    from tests.support.fakeapi import balloons_policy_obj, node_obj
    from tests.support.placed import bound_by_us

    shapes = [(2, 128), (2, 512), (4, 192)]  # (NUMA nodes, CPUs): 32, 128 and 24 cores per NUMA node (SMT 2)
    objects: list[Obj] = [balloons_policy_obj()]
    for i in range(1000):
        numa, cpus = shapes[i % 3]
        objects.append(node_obj(f"worker-{i:04d}", cpus=cpus, numa=numa))
        if i % 3 == 1:  # the big nodes run models, some more than others: none has 50 cores left on a NUMA node
            for k, cores in enumerate((100, 100, 30 + i % 40)):
                pod = model_pod(f"running-{i}-{k}", cpus=2 * cores)
                pod["spec"]["nodeName"] = f"worker-{i:04d}"
                pod["metadata"]["creationTimestamp"] = f"2026-01-01T00:00:{k:02d}Z"
                pod["status"] = {"phase": "Running"}
                objects.append(pod)
    ext = await make_ext(bound_by_us(objects))
    names = [f"worker-{i:04d}" for i in range(1000)]
    answer = await ext.filter(model_pod("big-model", cpus=100), names)  # 50 cores on one NUMA node
    assert answer["NodeNames"] == [] and answer["Error"] == ""
    reasons = {**answer["FailedNodes"], **answer["FailedAndUnresolvableNodes"]}
    assert sorted(reasons) == names
    distinct = set(reasons.values())
    assert len(distinct) <= 6, distinct
    assert not any(n in text for n in names for text in distinct)
    assert not any("big-model" in text.replace("`model-placement explain llm-inference/big-model`", "")
                   for text in distinct)
    # Each class of refusal says what it needs and, when eviction could help, the most any of its nodes has.
    resolvable = set(answer["FailedNodes"].values())
    assert resolvable and all("needs 50 free cores" in t and "the most any such node has free" in t
                              for t in resolvable)
    most = max(max(ext.cluster.ledger(n).free()) for n in answer["FailedNodes"])  # type: ignore[union-attr]
    assert any(f" is {most}; wait for free cores" in t for t in resolvable)
    summary = ", ".join(f"{list(reasons.values()).count(t)} {t}" for t in sorted(distinct))
    assert len(f"0/1000 nodes are available: {summary}.") < 1024, summary


async def test_a_rank_short_of_its_share_ranks_as_a_split(ext: Ext) -> None:
    """vLLM binds rank i to every CPU of the i-th NUMA node it has: a TP=2 pod of 40 CPUs that cpu-ks2's restricted
    kubelet spreads over two NUMA nodes of 24 CPUs (2 reserved on NUMA 0) gives one rank fewer than its 20, and TP
    runs at its slowest rank's pace. Counted local until the fleet benchmark named such pods (6 + 10 cores for TP=2
    of 16 on a pod-scope node); cpu-ks1, whose kubelet keeps it on one NUMA node, now ranks above it."""
    pod = kubelet_static_pod("ks-tp2", 40)
    pod["metadata"]["annotations"][TP_ANN] = "2"
    both = ["cpu-ks1", "cpu-ks2"]
    assert (await ext.ok("/filter", args_nodecache(pod, both)))["NodeNames"] == both
    scores = {s["Host"]: s["Score"] for s in await ext.ok("/prioritize", args_nodecache(pod, both))}
    assert scores.get("cpu-ks1", 0) > scores.get("cpu-ks2", 0), scores
    # With cpu-ks1 full for now (it and another pod of 40 leave 22 and 24 CPUs), the next waits as a split does.
    await run_on(ext, pod, "cpu-ks1")
    await run_on(ext, kubelet_static_pod("ks-a", 40), "cpu-ks1")
    young = created(kubelet_static_pod("ks-tp2-young", 40), seconds_ago=0)
    young["metadata"]["annotations"][TP_ANN] = "2"
    answer = await ext.ok("/filter", args_nodecache(young, both))
    assert answer["NodeNames"] == []
    assert answer["FailedAndUnresolvableNodes"]["cpu-ks2"].startswith(
        "would run the model split: its 2 ranks would not each get a NUMA node of its own with a whole share here"), \
        answer
