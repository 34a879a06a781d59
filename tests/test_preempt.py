"""NUMA-aware preemption. /preempt with the JSON kube-scheduler sends (ExtenderPreemptionArgs in both forms):
the scheduler's victims, chosen by CPUs node-wide, narrowed to the fewest that free the NUMA node the pod then
gets, or replaced by other lower-priority pods of the node where they free the wrong NUMA nodes, honouring
PodDisruptionBudgets, nodes where none do dropped. And our own path for nodes only our filter
refused (the scheduler offers no candidate there): the victims evicted through the Eviction API."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from kubernetes import client

from extender.preempt import Pdb, candidate, read_pdb
from placement.ledger import PLACEMENT, Placed
from placement.victims import Candidate, violations
from server.sources import demo_text, load_objects
from tests.support.extender import Ext, MakeExt, go_json, model_pod, plain_pod
from tests.support.fakeapi import FakeApiServer

Obj = dict[str, Any]

# On cpu-a1 (29 model cores per NUMA node, SMT 2), in creation order the balloons plugin puts a and c on NUMA 0, b
# and d on NUMA 1 (vllm-balloon-tp1 balances its per-NUMA components): 9 cores stay free on each. A TP=1 pod asking
# for 24 cores needs 15 more on one NUMA node. Each carries the placement our /bind recorded on it.
RUNNING = (("low-a", 8, 10), ("low-b", 8, 5), ("low-c", 12, 10), ("low-d", 12, 5))  # name, cores, priority


def running(name: str, cores: int, priority: int, second: int, node: str = "cpu-a1") -> Obj:
    pod = model_pod(name, cpus=2 * cores)
    pod["metadata"]["creationTimestamp"] = f"2026-01-01T00:00:{second:02d}Z"
    numa = (second - 1) % 2
    pod["metadata"].setdefault("annotations", {})[PLACEMENT] = Placed(
        node, ((numa, cores),), ("vllm-balloon-tp1", f"vllm-numa-{numa}")).annotation()
    pod["metadata"]["labels"]["app"] = name
    pod["spec"].update(nodeName=node, priority=priority)
    pod["status"] = {"phase": "Running"}
    return pod


def fleet() -> list[Obj]:
    return load_objects(demo_text()) + [running(n, c, p, i) for i, (n, c, p) in enumerate(RUNNING, 1)]


def preemptor(priority: int = 1000, **spec: Any) -> Obj:
    pod = model_pod("urgent", cpus=48)
    pod["spec"].update(priority=priority, **spec)
    return pod


def meta_args(pod: Obj, victims: dict[str, list[str]]) -> bytes:
    """ExtenderPreemptionArgs with nodeCacheCapable: true: NodeNameToMetaVictims, nil NodeNameToVictims is null."""
    meta = {n: {"Pods": [{"UID": f"uid-{v}"} for v in vs], "NumPDBViolations": 0} for n, vs in victims.items()}
    return f'{{"Pod":{go_json(pod)},"NodeNameToVictims":null,"NodeNameToMetaVictims":{go_json(meta)}}}'.encode()


def chosen(answer: Obj) -> dict[str, list[str]]:
    assert list(answer) == ["NodeNameToMetaVictims"]
    out = {}
    for node, victims in answer["NodeNameToMetaVictims"].items():
        assert victims["NumPDBViolations"] == 0 and victims["Pods"]  # a node kept has at least one victim
        out[node] = sorted(p["UID"].removeprefix("uid-") for p in victims["Pods"])
    return out


def pdb(name: str, app: str, allowed: int, namespace: str = "llm-inference") -> Obj:
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": app}}},
            "status": {"disruptionsAllowed": allowed, "currentHealthy": 1, "desiredHealthy": 1, "expectedPods": 1}}


@pytest.fixture
async def ext(make_ext: MakeExt) -> Ext:
    return await make_ext(fleet())  # type: ignore[no-any-return]


@pytest.fixture
async def connected(make_ext: MakeExt, fake: FakeApiServer, api: client.ApiClient) -> Ext:
    for obj in fleet():
        fake.add(obj["kind"], obj)
    return await make_ext(fleet(), api_client=api)  # type: ignore[no-any-return]


async def test_the_schedulers_victims_are_narrowed_to_the_fewest_on_one_numa_node(ext: Ext) -> None:
    # CPUs node-wide, the scheduler would take all four; the two on either NUMA node are enough.
    answer = await ext.ok("/preempt", meta_args(preemptor(), {"cpu-a1": ["low-a", "low-b", "low-c", "low-d"]}))
    assert chosen(answer) in ({"cpu-a1": ["low-a", "low-c"]}, {"cpu-a1": ["low-b", "low-d"]})


async def test_victims_that_free_cores_on_the_wrong_numa_nodes_drop_the_node(ext: Ext) -> None:
    # low-c and low-d free 24 cores node-wide, 12 on each NUMA node: the pod fits on neither. With no API to
    # read the other pods' priorities, none of them is named instead.
    answer = await ext.ok("/preempt", meta_args(preemptor(), {"cpu-a1": ["low-c", "low-d"], "cpu-a2": []}))
    assert chosen(answer) == {}


async def test_where_the_schedulers_victims_free_the_wrong_numa_nodes_the_right_pods_of_the_node_are_named(
        connected: Ext) -> None:
    # The real kube-scheduler reprieves the longest-running pods first and sends what is left (tests/e2e): here
    # low-c and low-d, 12 cores on each NUMA node. The scheduler evicts whichever pods of the node we name.
    wrong = {"cpu-a1": ["low-c", "low-d"]}
    assert chosen(await connected.ok("/preempt", meta_args(preemptor(), wrong))) == {"cpu-a1": ["low-b", "low-d"]}
    # Only pods of lower priority than the preemptor's are named: none is below 5 (equal is spared).
    assert chosen(await connected.ok("/preempt", meta_args(preemptor(priority=5), wrong))) == {}


def unplaced(name: str, cores: int, second: int) -> Obj:
    """A model pod that ran before model-placement was installed: no placement recorded on it."""
    pod = running(name, cores, 0, second)
    del pod["metadata"]["annotations"][PLACEMENT]
    return pod


@pytest.mark.parametrize("recorded", [False, True])
async def test_among_pods_of_unknown_placement_the_victims_are_those_that_make_room_wherever_they_are(
        make_ext: MakeExt, fake: FakeApiServer, api: client.ApiClient, recorded: bool) -> None:
    """Issue 39, case 3: right after an install into a running cluster no running pod has a recorded placement. Two
    pods of 24 cores run on cpu-a1 (29 model cores per NUMA node); a pod of 24 cores needs one NUMA node to itself.
    Node-wide one victim is enough, and kube-scheduler sends one; which NUMA node it frees is unknown, so both go,
    which empties the node. With their placements recorded (one on each NUMA node), one goes."""
    pods = [running(n, 24, 0, i) if recorded else unplaced(n, 24, i) for i, n in enumerate(("old-a", "old-b"), 1)]
    objects = load_objects(demo_text()) + pods
    for obj in objects:
        fake.add(obj["kind"], obj)
    ext = await make_ext(objects, api_client=api)
    ledger = ext.cluster.ledger("cpu-a1")
    assert ledger is not None and ledger.unsettled == (0 if recorded else 2)
    pod = preemptor()
    pod["metadata"]["uid"] = "uid-urgent"
    answer = chosen(await ext.ok("/preempt", meta_args(pod, {"cpu-a1": ["old-b"]})))
    assert answer == ({"cpu-a1": ["old-b"]} if recorded else {"cpu-a1": ["old-a", "old-b"]})


async def test_the_whole_pods_form_is_answered_with_uids(ext: Ext) -> None:
    pods = {name: running(name, c, p, i) for i, (name, c, p) in enumerate(RUNNING, 1)}
    whole = {"cpu-a1": {"Pods": [pods[n] for n in ("low-a", "low-c")], "NumPDBViolations": 0}}
    body = f'{{"Pod":{go_json(preemptor())},"NodeNameToVictims":{go_json(whole)},"NodeNameToMetaVictims":null}}'
    assert chosen(await ext.ok("/preempt", body.encode())) == {"cpu-a1": ["low-a", "low-c"]}


async def test_a_pod_we_do_not_judge_keeps_the_schedulers_victims(ext: Ext) -> None:
    answer = await ext.ok("/preempt", meta_args(plain_pod(), {"cpu-a1": ["low-a", "low-b"], "cpu-a2": []}))
    assert chosen(answer) == {"cpu-a1": ["low-a", "low-b"]}


async def test_malformed_preemption_args_are_one_sentence(ext: Ext) -> None:
    status, answer = await ext.raw("/preempt", b'{"Pod":{},"NodeNameToMetaVictims":{"cpu-a1":{"Pods":[{}]}}}')
    assert status == 400 and answer == {"error": "ExtenderPreemptionArgs.NodeNameToMetaVictims[cpu-a1].Pods[0] "
                                                 "has no UID"}


async def test_a_pdb_moves_the_choice_to_the_other_numa_node_or_drops_the_node(connected: Ext,
                                                                                fake: FakeApiServer) -> None:
    fake.add("PodDisruptionBudget", pdb("keep-b", "low-b", 0))
    everyone = {"cpu-a1": ["low-a", "low-b", "low-c", "low-d"]}
    assert chosen(await connected.ok("/preempt", meta_args(preemptor(), everyone))) == {"cpu-a1": ["low-a", "low-c"]}
    fake.add("PodDisruptionBudget", pdb("keep-a", "low-a", 0))
    assert chosen(await connected.ok("/preempt", meta_args(preemptor(), everyone))) == {}
    # A budget that allows one disruption allows one victim it covers, not two.
    fake.update("PodDisruptionBudget", pdb("keep-a", "low-a", 1))
    assert chosen(await connected.ok("/preempt", meta_args(preemptor(), everyone))) == {"cpu-a1": ["low-a", "low-c"]}


def test_pdb_coverage_and_violations_count_as_the_scheduler_does() -> None:
    budgets = [read_pdb(pdb("p", "x", 1)), read_pdb({**pdb("any", "x", 0), "spec": {"selector": {}}})]
    pod = running("x", 8, 0, 1)
    pod["metadata"]["labels"]["app"] = "x"
    found = candidate(pod, budgets)
    assert found.pdbs == ("llm-inference/p",)  # an empty selector matches nothing (filterPodsWithPDBViolation)
    two = [found, Candidate("u2", "llm-inference/y", pdbs=("llm-inference/p",))]
    assert violations(two[:1], {"llm-inference/p": 1}) == ()
    assert violations(two, {"llm-inference/p": 1}) == ("llm-inference/p",)
    expr = Pdb("ns/e", "llm-inference", {}, ({"key": "app", "operator": "In", "values": ["x", "z"]},), 0, frozenset())
    assert expr.covers("llm-inference", "x", {"app": "x"}) and not expr.covers("other", "x", {"app": "x"})
    assert not Pdb("ns/d", "llm-inference", {"app": "x"}, (), 0, frozenset({"x"})).covers(
        "llm-inference", "x", {"app": "x"})  # already counted by the apiserver


async def own_path(ext: Ext, pod: Obj, fake: FakeApiServer, caplog: pytest.LogCaptureFixture) -> list[str]:
    """/filter a pod that fits nowhere, the way kube-scheduler does, then wait for our own preemption."""
    caplog.set_level(logging.INFO, logger="model_placement.extender")
    answer = await ext.filter(pod, ["cpu-a1"])
    assert answer["NodeNames"] == [] and list(answer["FailedNodes"]) == ["cpu-a1"]
    for _ in range(60):
        if any(r.getMessage() in ("preempted", "no preemption", "eviction refused") for r in caplog.records):
            break
        await asyncio.sleep(0.05)
    return list(fake.evictions)


async def test_own_path_takes_the_node_with_the_fewest_victims(
        connected: Ext, fake: FakeApiServer, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="model_placement.extender")
    await connected.filter(preemptor(), ["cpu-a1", "cpu-full"])  # cpu-full: one lower-priority pod is enough
    for _ in range(60):
        if fake.evictions:
            break
        await asyncio.sleep(0.05)
    assert fake.evictions == ["llm/qwen-14b-predictor-7f6d5-klmno"]


async def test_own_path_evicts_exactly_the_pods_on_the_numa_node_the_pod_then_gets(
        connected: Ext, fake: FakeApiServer, caplog: pytest.LogCaptureFixture) -> None:
    evicted = await own_path(connected, preemptor(), fake, caplog)
    assert sorted(evicted) == ["llm-inference/low-b", "llm-inference/low-d"]  # NUMA 1, the lower priorities
    assert fake.get("Pod", "low-a", "llm-inference") and fake.get("Pod", "low-c", "llm-inference")
    (line,) = [r for r in caplog.records if r.getMessage() == "preempted"]
    assert line.node == "cpu-a1" and "(NUMA node 1)" in line.reason  # type: ignore[attr-defined]
    # Once the victims are gone (the watch would show it), the next cycle places the pod on that NUMA node.
    for name in ("low-b", "low-d"):
        connected.cluster.apply("Pod", "DELETED", running(name, 8, 0, 0))
    answer = await connected.filter(preemptor(), ["cpu-a1"])
    assert answer["NodeNames"] == ["cpu-a1"]
    ledger = connected.cluster.ledger("cpu-a1")
    assert ledger is not None and ledger.holdings["uid-urgent"].per_numa == ((1, 24),)  # held for it until its bind


async def test_own_path_honours_pdbs_and_says_why_it_does_nothing(
        connected: Ext, fake: FakeApiServer, caplog: pytest.LogCaptureFixture) -> None:
    fake.add("PodDisruptionBudget", pdb("keep-b", "low-b", 0))
    fake.add("PodDisruptionBudget", pdb("keep-c", "low-c", 0))
    assert await own_path(connected, preemptor(), fake, caplog) == []
    (line,) = [r for r in caplog.records if r.getMessage() == "no preemption"]
    assert "PodDisruptionBudget llm-inference/keep-b, llm-inference/keep-c allows no more disruptions" \
        in line.reason  # type: ignore[attr-defined]
    # The pod's next attempt says so, where its owner looks (kube-scheduler's FailedScheduling event).
    answer = await connected.filter(preemptor(), ["cpu-a1"])
    assert answer["FailedNodes"]["cpu-a1"].endswith(
        "; evicting lower-priority pods would make room, but PodDisruptionBudget llm-inference/keep-b, "
        "llm-inference/keep-c allows no more disruptions")
    assert "cpu-a1" not in answer["FailedNodes"]["cpu-a1"]


async def test_own_path_spares_higher_priorities_and_never_preempts_for_a_never_pod(
        connected: Ext, fake: FakeApiServer, caplog: pytest.LogCaptureFixture) -> None:
    assert await own_path(connected, preemptor(priority=5), fake, caplog) == []  # none is below 5: equal is spared
    caplog.clear()
    assert await own_path(connected, preemptor(preemptionPolicy="Never"), fake, caplog) == []


async def test_own_path_stands_aside_when_the_scheduler_preempts_itself(
        connected: Ext, fake: FakeApiServer, caplog: pytest.LogCaptureFixture) -> None:
    pod = preemptor()
    await connected.filter(pod, ["cpu-a1"])
    answer = await connected.ok("/preempt", meta_args(pod, {"cpu-a1": ["low-a", "low-b", "low-c", "low-d"]}))
    assert len(chosen(answer)["cpu-a1"]) == 2
    await asyncio.sleep(1.3)
    assert fake.evictions == []  # kube-scheduler deletes its victims itself


async def test_own_path_stands_aside_for_a_nominated_pod_and_one_that_fits_by_the_time_it_would_evict(
        connected: Ext, fake: FakeApiServer, caplog: pytest.LogCaptureFixture) -> None:
    # kube-scheduler preempted for it (nominatedNodeName) and waits for its victims to go.
    nominated = preemptor()
    nominated["status"] = {"nominatedNodeName": "cpu-a1"}
    await connected.filter(nominated, ["cpu-a1"])
    await asyncio.sleep(1.3)
    assert fake.evictions == []
    # The /filter saw the cluster a moment late: by the time our path would evict, the pod fits without it.
    await connected.filter(preemptor(), ["cpu-a1"])
    for name in ("low-b", "low-d"):
        connected.cluster.apply("Pod", "DELETED", running(name, 8, 0, 0))
    await asyncio.sleep(1.3)
    assert fake.evictions == []


async def test_own_path_evicts_nothing_while_a_pod_it_would_weigh_is_already_gone(
        connected: Ext, fake: FakeApiServer, caplog: pytest.LogCaptureFixture) -> None:
    # The apiserver has deleted low-b; the extender's watch has not shown it yet. Reading it is a 404: its cores
    # are coming free, so nothing is evicted this cycle, and that is no error.
    fake.delete("Pod", "low-b", "llm-inference")
    assert await own_path(connected, preemptor(), fake, caplog) == []
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
    assert [r for r in caplog.records if r.getMessage() == "no preemption"]
