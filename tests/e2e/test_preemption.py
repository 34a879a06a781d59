"""Preemption with the real kube-scheduler: a high-priority model pod on a full pool takes the cores of the fewest
lower-priority pods on the NUMA node it then gets, and a PodDisruptionBudget moves that choice or stops it.

Each test gets a pool of its own: two 2-NUMA nodes (29 model cores per NUMA node) filled by low-priority model pods
running before the test where our extender had placed them (the placement it records on each pod):

    NUMA 0: a (10 cores), b (10), d (9)        NUMA 1: big (20), c (9)

The pods "run" (status Ready, so the disruption controller counts them healthy), `big` the longest. A TP=1 pod of 16
cores fits on neither NUMA node, nor node-wide (12 CPUs free), so kube-scheduler's in-tree filters refuse both nodes
and its own preemption finds the victims: by CPUs node-wide it would reprieve the longest-running first and take c
and d, 9 cores on each NUMA node, which frees neither. The pod must get NUMA node 1 of one node by evicting `big`
alone, or, with `big` protected, NUMA node 0 by evicting two of a, b, d.

A pool of the ROOMY layout (10-core pods, two per NUMA node) leaves 9 cores free on each NUMA node and room
node-wide: kube-scheduler's filters pass, only ours refuses, and its dry run finds no victim; our extender then
evicts the one pod that frees a NUMA node itself (the Eviction API).

A pool of the UNPLACED layout (two 24-core pods per node, running since before the install: no placement recorded)
has a 24-core pod fit nowhere: node-wide one victim is enough, and kube-scheduler sends one; which NUMA node it
frees is unknown, so our /preempt names both pods of the node (issue 39, case 3: it named none, and the pod stayed
Pending).

With no kubelet a deleted pod stays terminating: the tests finish the victims' deletion as the kubelet would once
their containers stopped.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from itertools import count
from typing import Any

import pytest
import yaml

from extender.preempt import WAIT_FOR_SCHEDULER
from placement.ledger import PLACEMENT, Placed
from tests.e2e.cluster import Cluster, node, wait_until
from tests.e2e.fleet import MODEL_NS, POOL, model_pod

LOW_NS = "batch"  # the low-priority pods: not opted in, running before the test
Layout = tuple[tuple[str, int, int], ...]  # role, cores, the NUMA node the ledger puts it on (UNKNOWN: none recorded)
UNKNOWN = -1
# Created in this order (the ledger places them in it), started in the order of START.
FULL: Layout = (("a", 10, 0), ("big", 20, 1), ("b", 10, 0), ("c", 9, 1), ("d", 9, 0))
# 9 cores free on each NUMA node, 48 CPUs node-wide: only our extender refuses the 16-core pod.
ROOMY: Layout = (("a", 10, 0), ("c", 10, 1), ("b", 10, 0), ("d", 10, 1))
UNPLACED: Layout = (("a", 24, UNKNOWN), ("b", 24, UNKNOWN))
START = ("big", "a", "b", "c", "d")
POOLS = count(1)
PRIORITY_CLASSES = """
apiVersion: scheduling.k8s.io/v1
kind: PriorityClass
metadata: {name: low}
value: 100
---
apiVersion: scheduling.k8s.io/v1
kind: PriorityClass
metadata: {name: high}
value: 100000
"""


@dataclass
class Pool:
    name: str
    nodes: list[str]
    before: dict[str, tuple[str, int]] = field(default_factory=dict)  # low pod name -> (node, NUMA node)


def ledger(cluster: Cluster, node_name: str) -> dict[str, Any]:
    status, body = cluster.get_ours("extender", f"/debug/nodes/{node_name}")
    assert status == 200, body
    return json.loads(body)  # type: ignore[no-any-return]


def holders(cluster: Cluster, nodes: list[str]) -> dict[str, tuple[str, int]]:
    """pod name -> (node, NUMA node) as the extender's ledger holds it (every pod here is on one NUMA node, or of
    unknown placement: UNKNOWN)."""
    out = {}
    for name in nodes:
        for numa in ledger(cluster, name)["numa"]:
            for h in numa["held"]:
                out[h["pod"].split("/")[-1]] = (name, UNKNOWN if h.get("placement") == "unknown" else numa["numa"])
    return out


def low_pod(pool: Pool, node_name: str, k: int, kind: str, cores: int, numa: int) -> dict[str, Any]:
    # Bound by name here, but as our extender left them: with the placement its Binding records; or, UNKNOWN, as
    # another scheduler (or ours before the install) did, without.
    placed = {} if numa == UNKNOWN else {
        PLACEMENT: Placed(node_name, ((numa, cores),), ("vllm-balloon-tp1", f"vllm-numa-{numa}")).annotation()}
    pod = model_pod(f"{node_name}-p{k}-{kind}", LOW_NS, tp=1, cpu=str(2 * cores), memory="8Gi",
                    model=f"batch-{kind}", node_name=node_name, annotations=placed)
    pod["metadata"]["labels"].update({"role": kind, "pool": pool.name})
    pod["spec"]["priorityClassName"] = "low"
    return pod


def role(pod_name: str) -> str:
    return pod_name.rsplit("-", 1)[-1]


def mark_running(cluster: Cluster, pod: dict[str, Any], started: str) -> None:
    """What the kubelet would report: Running and Ready since `started`."""
    path = f"/api/v1/namespaces/{LOW_NS}/pods/{pod['metadata']['name']}/status"
    current = cluster.api.get(path)
    current["status"] = {"phase": "Running", "startTime": started, "conditions": [
        {"type": t, "status": "True", "lastTransitionTime": started}
        for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")]}
    cluster.api.call("PUT", path, current)


def low_pods(cluster: Cluster, pool: Pool) -> list[dict[str, Any]]:
    return cluster.pods(LOW_NS, f"pool={pool.name}")


@pytest.fixture(scope="module")
def priority_classes(cluster: Cluster) -> None:
    cluster.kubectl("apply", "-f", "-", input=PRIORITY_CLASSES)
    if not cluster.api.call("GET", f"/api/v1/namespaces/{LOW_NS}", ok=(200, 404)).get("metadata"):
        cluster.create_namespace(LOW_NS, enabled=False)


@pytest.fixture
def pools(cluster: Cluster, priority_classes: None) -> Iterator[Callable[[Layout], Pool]]:
    """Pools of two nodes of their own, filled as `layout` says; removed after the test, with every pod on them,
    so the session's fleet is what the other e2e tests expect."""
    made: list[Pool] = []

    def make(layout: Layout) -> Pool:
        name = f"preempt-{next(POOLS)}"
        p = Pool(name, [f"{name}-{i}" for i in range(2)])
        made.append(p)
        cluster.create_nodes([node(n, numa=2, cores_per_numa=32, labels={POOL: name}) for n in p.nodes])
        wait_until("the pool's nodes in the extender", lambda: all(
            cluster.get_ours("extender", f"/debug/nodes/{n}")[0] == 200 for n in p.nodes), timeout=30)
        for node_name in p.nodes:
            for k, (kind, cores, numa) in enumerate(layout, 1):
                cluster.create_pods([low_pod(p, node_name, k, kind, cores, numa)])
        wait_until("the low pods held by the extender",
                   lambda: len(holders(cluster, p.nodes)) == len(layout) * len(p.nodes), timeout=30)
        base = time.time() - 3600
        for pod in low_pods(cluster, p):
            rank = START.index(pod["metadata"]["labels"]["role"])  # UNPLACED's roles are FULL's
            mark_running(cluster, pod, time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(base + 60 * rank)))
        p.before = holders(cluster, p.nodes)
        for node_name in p.nodes:  # the layout the expectations rest on
            held = {role(n): numa for n, (where, numa) in p.before.items() if where == node_name}
            assert held == {kind: numa for kind, _, numa in layout}, (node_name, held)
        return p

    yield make
    for p in made:
        for path in (f"/api/v1/namespaces/{MODEL_NS}/pods", f"/api/v1/namespaces/{LOW_NS}/pods"):
            cluster.api.call("DELETE", f"{path}?labelSelector=pool%3D{p.name}&gracePeriodSeconds=0")
        cluster.api.call("DELETE", f"/apis/policy/v1/namespaces/{LOW_NS}/poddisruptionbudgets"
                                   f"?labelSelector=pool%3D{p.name}")
        for n in p.nodes:
            cluster.api.call("DELETE", f"/api/v1/nodes/{n}", ok=(200, 404))


@pytest.fixture
def pool(pools: Callable[[Layout], Pool]) -> Pool:
    return pools(FULL)


def urgent(pool: Pool, name: str, cores: int = 16) -> dict[str, Any]:
    pod = model_pod(name, MODEL_NS, tp=1, cpu=str(cores), memory="32Gi", node_selector={POOL: pool.name})
    pod["metadata"]["labels"]["pool"] = pool.name
    pod["spec"]["priorityClassName"] = "high"
    return pod


def finish_terminating(cluster: Cluster, pool: Pool) -> list[dict[str, Any]]:
    """The low pods being deleted, and their deletion finished as a kubelet would (force, grace 0)."""
    leaving = [p for p in low_pods(cluster, pool) if p["metadata"].get("deletionTimestamp")]
    for p in leaving:
        cluster.api.call("DELETE", f"/api/v1/namespaces/{LOW_NS}/pods/{p['metadata']['name']}?gracePeriodSeconds=0",
                         ok=(200, 404))
    return leaving


@dataclass
class Preempted:
    pod: dict[str, Any]  # the preemptor, bound
    victims: list[dict[str, Any]]  # as they were when the deletion started
    nominated: str
    record: dict[str, Any]


def extender_lines(cluster: Cluster, since: int, verb: str, pod: str) -> list[dict[str, Any]]:
    """The extender's log lines of `verb` about `pod` (namespace/name): other pods of the session (another test's
    pod that stays Pending) have lines of their own in between."""
    lines = cluster.components["extender"].log.read_text(errors="replace").splitlines()[since:]
    out = []
    for line in lines:
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if obj.get("verb") == verb and obj.get("pod") == pod:
            out.append(obj)
    return out


def log_length(cluster: Cluster, which: str) -> int:
    return len(cluster.components[which].log.read_text(errors="replace").splitlines())


def preempt_and_bind(cluster: Cluster, pool: Pool, name: str, cores: int = 16) -> Preempted:
    since = {w: log_length(cluster, w) for w in ("extender", "kube-scheduler")}
    # It fits nowhere now: admission lets it through because it can preempt, and says so to kubectl.
    applied = cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(urgent(pool, name, cores)))
    assert "it can have the cores of lower-priority model pods" in applied.stderr, applied.stderr

    def victims() -> tuple[list[dict[str, Any]], str] | None:
        me = cluster.kubectl_json("-n", MODEL_NS, "get", "pod", name)
        leaving = [p for p in low_pods(cluster, pool) if p["metadata"].get("deletionTimestamp")]
        nominated = me["status"].get("nominatedNodeName", "")
        return (leaving, nominated) if leaving else None

    leaving, nominated = wait_until(f"victims of {name} terminating", victims, timeout=60, every=0.5)
    time.sleep(1)  # a preemption deletes its victims one call each: let the last land
    leaving = finish_terminating(cluster, pool)
    me = cluster.kubectl_json("-n", MODEL_NS, "get", "pod", name)
    nominated = me["status"].get("nominatedNodeName", "") or nominated

    def bound() -> dict[str, Any] | None:
        finish_terminating(cluster, pool)  # a later cycle may preempt more: let it, and see it in the end
        got = cluster.kubectl_json("-n", MODEL_NS, "get", "pod", name)
        return got if got["spec"].get("nodeName") else None

    pod = wait_until(f"{name} bound after its victims left", bound, timeout=60, every=0.5)
    # Our own path acts WAIT_FOR_SCHEDULER after a /filter that found no room: long enough for one that was
    # started before the bind to show (it once evicted two more pods for the bound pod).
    time.sleep(WAIT_FOR_SCHEDULER + 1)
    events = cluster.kubectl_json("-n", LOW_NS, "get", "events")["items"]
    own_events = cluster.kubectl_json("-n", MODEL_NS, "get", "events", "--field-selector",
                                      f"involvedObject.name={name}")["items"]
    scheduler_log = cluster.components["kube-scheduler"].log.read_text(errors="replace").splitlines()[
        since["kube-scheduler"]:]
    record = {
        "preemptor": name, "nominatedNodeName": nominated, "bound_to": pod["spec"]["nodeName"],
        "victims": [{"name": v["metadata"]["name"], "node": v["spec"]["nodeName"],
                     "numa": pool.before[v["metadata"]["name"]][1],
                     "disruption": [c for c in v["status"].get("conditions", []) if c["type"] == "DisruptionTarget"]}
                    for v in leaving],
        "victim_events": [f"{e['reason']}: {e['message']} (from {e.get('reportingComponent') or e['source']})"
                          for e in events if e["involvedObject"]["name"] in {v["metadata"]["name"] for v in leaving}],
        "preemptor_events": [f"{e['reason']}: {e['message']}" for e in own_events],
        "extender_preempt_lines": extender_lines(cluster, since["extender"], "preempt", f"{MODEL_NS}/{name}"),
        "scheduler_preemption_lines": [line for line in scheduler_log if "reempt" in line][:20],
    }
    (cluster.root / f"preemption-{name}.json").write_text(json.dumps(record, indent=2))
    print(json.dumps(record, indent=2))
    return Preempted(pod, leaving, nominated, record)


def numa_of(cluster: Cluster, pod: dict[str, Any]) -> list[int]:
    held = holders(cluster, [pod["spec"]["nodeName"]])
    return [numa for name, (_, numa) in held.items() if name == pod["metadata"]["name"]]


def assert_only(cluster: Cluster, pool: Pool, done: Preempted, expected: set[str]) -> None:
    """The victims are exactly `expected` (role names) on the preemptor's node and NUMA node, nothing else
    on that node or the other one was touched, and the ledger holds no core twice."""
    where = done.pod["spec"]["nodeName"]
    numa = numa_of(cluster, done.pod)
    assert len(numa) == 1, numa
    names = {v["metadata"]["name"] for v in done.victims}
    assert {role(n) for n in names} == expected, names
    assert all(pool.before[n] == (where, numa[0]) for n in names), (names, where, numa, pool.before)
    untouched = {n for n in pool.before if n not in names}
    left = {p["metadata"]["name"] for p in low_pods(cluster, pool) if not p["metadata"].get("deletionTimestamp")}
    assert left == untouched, (left, untouched)
    for n in pool.nodes:
        for zone in ledger(cluster, n)["numa"]:
            assert sum(h["cores"] for h in zone["held"]) <= zone["capacity"], (n, zone)


def by_the_scheduler_through_our_preempt(done: Preempted) -> None:
    """kube-scheduler deleted the victims (its DisruptionTarget reason), on the node it nominated, after our
    /preempt answered for that node."""
    assert done.nominated == done.pod["spec"]["nodeName"]
    assert [c["reason"] for v in done.record["victims"] for c in v["disruption"]] \
        == ["PreemptionByScheduler"] * len(done.victims)
    assert [line["decision"] for line in done.record["extender_preempt_lines"]] == ["narrowed"]


def test_high_priority_pod_preempts_the_fewest_pods_on_the_numa_node_it_gets(cluster: Cluster, pool: Pool) -> None:
    done = preempt_and_bind(cluster, pool, f"urgent-{pool.name}")
    assert_only(cluster, pool, done, {"big"})
    assert numa_of(cluster, done.pod) == [1]
    by_the_scheduler_through_our_preempt(done)


def test_a_pdb_moves_preemption_to_the_numa_node_it_does_not_protect(cluster: Cluster, pool: Pool) -> None:
    big = sum(1 for n in pool.before if role(n) == "big")
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump({
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": f"keep-big-{pool.name}", "namespace": LOW_NS, "labels": {"pool": pool.name}},
        "spec": {"minAvailable": big, "selector": {"matchLabels": {"role": "big", "pool": pool.name}}}}))
    wait_until("the PDB counting its pods healthy", lambda: cluster.kubectl_json(
        "-n", LOW_NS, "get", "pdb", f"keep-big-{pool.name}").get("status", {}).get("currentHealthy") == big,
        timeout=60)
    done = preempt_and_bind(cluster, pool, f"urgent-{pool.name}")
    assert numa_of(cluster, done.pod) == [0]
    roles = {role(v["metadata"]["name"]) for v in done.victims}
    assert len(roles) == 2 and roles <= {"a", "b", "d"}, roles
    assert_only(cluster, pool, done, roles)
    by_the_scheduler_through_our_preempt(done)


def test_a_pdb_protecting_every_victim_leaves_the_pod_pending_and_says_why(cluster: Cluster, pool: Pool) -> None:
    budget = f"keep-all-{pool.name}"
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump({
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": budget, "namespace": LOW_NS, "labels": {"pool": pool.name}},
        "spec": {"minAvailable": len(pool.before), "selector": {"matchLabels": {"pool": pool.name}}}}))
    wait_until("the PDB counting its pods healthy", lambda: cluster.kubectl_json(
        "-n", LOW_NS, "get", "pdb", budget).get("status", {}).get("currentHealthy") == len(pool.before), timeout=60)
    name = f"urgent-{pool.name}"
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(urgent(pool, name)))

    def events() -> dict[str, str] | None:
        got = {e["reason"]: e["message"] for e in cluster.kubectl_json(
            "-n", MODEL_NS, "get", "events", "--field-selector", f"involvedObject.name={name}")["items"]}
        return got if {"FailedScheduling", "PreemptionBlocked"} <= set(got) else None

    said = wait_until(f"{name}'s FailedScheduling and PreemptionBlocked events", events, timeout=60, every=0.5)
    me = cluster.kubectl_json("-n", MODEL_NS, "get", "pod", name)
    condition = next(c for c in me["status"]["conditions"] if c["type"] == "PodScheduled")
    describe = cluster.kubectl("-n", MODEL_NS, "describe", "pod", name).stdout
    record = {"events": said, "condition": condition, "describe_events": describe.split("Events:", 1)[-1]}
    (cluster.root / f"preemption-{name}.json").write_text(json.dumps(record, indent=2))
    print(json.dumps(record, indent=2))
    assert not me["spec"].get("nodeName") and condition["status"] == "False"
    assert "preemption: no candidate node for preemption" in condition["message"]
    assert said["PreemptionBlocked"] == (
        "cannot preempt for this pod: evicting lower-priority pods would make room, but PodDisruptionBudget "
        f"{LOW_NS}/{budget} allows no more disruptions")
    assert "PreemptionBlocked" in describe and budget in describe
    assert not [p["metadata"]["name"] for p in low_pods(cluster, pool) if p["metadata"].get("deletionTimestamp")]


def test_where_only_our_filter_refuses_our_extender_evicts_the_fewest_itself(
        cluster: Cluster, pools: Callable[[Layout], Pool]) -> None:
    # Node-wide there is room, so kube-scheduler's dry run reprieves every pod and offers no candidate ("expected
    # at least one victim pod"): our own path evicts, through the Eviction API.
    pool = pools(ROOMY)
    done = preempt_and_bind(cluster, pool, f"urgent-{pool.name}")
    assert len(done.victims) == 1, done.victims
    assert_only(cluster, pool, done, {role(done.victims[0]["metadata"]["name"])})
    assert [c["reason"] for c in done.record["victims"][0]["disruption"]] == ["EvictionByEvictionAPI"]
    assert [line["decision"] for line in done.record["extender_preempt_lines"] if line["msg"] == "preempted"] \
        == ["evicted"]


def test_among_pods_of_unknown_placement_the_scheduler_evicts_the_two_our_preempt_names(
        cluster: Cluster, pools: Callable[[Layout], Pool]) -> None:
    pool = pools(UNPLACED)
    done = preempt_and_bind(cluster, pool, f"urgent-{pool.name}", cores=24)
    where = done.pod["spec"]["nodeName"]
    names = {v["metadata"]["name"] for v in done.victims}
    assert {role(n) for n in names} == {"a", "b"} and all(pool.before[n][0] == where for n in names), names
    left = {p["metadata"]["name"] for p in low_pods(cluster, pool) if not p["metadata"].get("deletionTimestamp")}
    assert left == {n for n in pool.before if n not in names}, left  # the other node untouched
    assert len(numa_of(cluster, done.pod)) == 1
    by_the_scheduler_through_our_preempt(done)
