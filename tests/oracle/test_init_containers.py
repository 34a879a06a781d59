"""Init containers hold cores only while they run, but must be able to start: the ledger against the real balloons
plugin, run as the kubelet runs a pod (its regular init containers to completion, one after another, then the app
containers)."""

from __future__ import annotations

from typing import Any

from placement.assume import AssumeCache
from placement.cluster import ClusterState
from placement.demand import read_model_pod
from placement.ledger import PLACEMENT
from placement.mutation import mutate_pod
from placement.reasons import INIT_EXCEEDS_NODE, INSUFFICIENT_FREE
from tests.oracle.kubelet import peer_pod
from tests.oracle.peer import BalloonsPeer
from tests.oracle.scenarios import NODE, SETTINGS, Group, Node, node_objects, policy_spec
from tests.oracle.sysfs import NodeShape

SHAPE = NodeShape(packages=1, numa_per_package=4, cores_per_numa=16, threads_per_core=2)
# Issue 39, case 1: 2 packages of one 32-core NUMA node each, SMT off, and a hand-written policy: 2 reserved CPUs,
# plain types per TP that show the hyperthreads, the plugin's own reserved and default types.
ISSUE = Group(seed=39, shape=NodeShape(packages=2, numa_per_package=1, cores_per_numa=32, threads_per_core=1),
              policy="threads")
HAND_WRITTEN = {"reservedResources": {"cpu": "2"},
                "balloonTypes": [{"name": "vllm-balloon-tp1"}, {"name": "vllm-balloon-tp2"}]}


def model_pod(name: str, init_cpu: str) -> dict[str, Any]:
    """A TP=2 model pod whose init container (a weights download, say) asks for `init_cpu`."""
    resources = {"requests": {"cpu": init_cpu, "memory": "1Gi"}, "limits": {"cpu": init_cpu, "memory": "1Gi"}}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "models", "uid": f"uid-{name}",
                         "labels": {"model-manager.io/model": name}},
            "spec": {"initContainers": [{"name": "fetch", "resources": resources}],
                     "containers": [{"name": "vllm", "args": ["--tensor-parallel-size", "2"],
                                     "resources": {"requests": {"cpu": "8", "memory": "8Gi"},
                                                   "limits": {"cpu": "8", "memory": "8Gi"}}}]},
            "status": {"phase": "Pending"}}


def plugin_free(node: BalloonsPeer) -> tuple[int, ...]:
    """Cores per NUMA node no balloon holds a thread of."""
    held = {SHAPE.core_of(cpu) for balloon in node.balloons() for cpu in balloon.cpus}
    return tuple(sum(1 for core in range(n * SHAPE.cores_per_numa, (n + 1) * SHAPE.cores_per_numa)
                     if core not in held) for n in range(SHAPE.numa_nodes))


def test_a_big_init_container_frees_its_cores_when_it_exits_on_the_plugin_and_in_the_ledger() -> None:
    group = Group(seed=21, shape=SHAPE, policy="generated")
    cluster = ClusterState.from_objects(node_objects(group), SETTINGS)
    with BalloonsPeer(SHAPE, policy_spec(group)) as node:
        mutated = mutate_pod(model_pod("big-init", "64"), cluster).pod
        run = peer_pod(mutated)
        peer, [init], [app] = run.pod, run.init, run.containers
        # Bound as /bind binds it: the cores held, the placement recorded on the pod.
        demand = read_model_pod(mutated, SETTINGS)
        assert demand is not None and AssumeCache(cluster).assume("uid-big-init", "models", "big-init", demand, NODE).ok
        meta = {**mutated["metadata"], "annotations": {**mutated["metadata"]["annotations"],
                                                       PLACEMENT: AssumeCache(cluster).placement("uid-big-init")}}
        bound = {**mutated, "metadata": meta, "spec": {**mutated["spec"], "nodeName": NODE}}
        # Initializing: the init container runs, in the shared balloons, and the ledger counts it.
        assert node.create(peer, init).ok
        cluster.apply("Pod", "ADDED", {**bound, "status": {"phase": "Pending", "initContainerStatuses": [
            {"name": "fetch", "state": {"running": {"startedAt": "2026-12-03T20:00:00Z"}}}]}})
        during = cluster.ledger(NODE).free()
        # It exits; the app container starts; the pod turns Running.
        node.remove(peer, "fetch")
        created = node.create(peer, app)
        assert created.ok, created.error
        cluster.apply("Pod", "MODIFIED", {**bound, "status": {"phase": "Running", "initContainerStatuses": [
            {"name": "fetch", "state": {"terminated": {"exitCode": 0}}}]}})
        after = cluster.ledger(NODE).free()
        assert after == plugin_free(node), (after, plugin_free(node))
    # While it ran, its 64 CPUs (32 cores) were not free for models; afterwards they are.
    assert sum(after) - sum(during) >= 32 - 8


def test_an_init_container_the_shared_balloon_cannot_hold_is_refused_where_the_plugin_fails_it() -> None:
    with BalloonsPeer(ISSUE.shape, HAND_WRITTEN) as plugin:
        node = Node(plugin, ISSUE, HAND_WRITTEN)
        # 64 CPUs in `default` on a node of 64, 2 of them reserved: "failed to choose a cpuset for allocating
        # additional 64 CPUs", the pod never starts, on any node of this shape.
        verdict, got = node.add_model("big-init", 1, 18, init=64)
        assert got == {} and (verdict.check, verdict.resolvable) == (INIT_EXCEEDS_NODE, False), (verdict, got)
        assert "init containers (cpu: 64 at once) run in balloon default" in verdict.reason
        # 40 CPUs fit an empty node, not beside a 30-CPU pod in `default`: refused until it leaves.
        assert node.add_system("metrics", "monitoring", 30)
        verdict, got = node.add_model("init-40", 1, 18, init=40)
        assert got == {} and (verdict.check, verdict.resolvable) == (INSUFFICIENT_FREE, True), (verdict, got)
        assert "grow balloon default, where they run before the pod's other containers start, by 40 cores, and " \
               "32 are free" in verdict.reason
        node.delete("metrics")
        verdict, got = node.add_model("init-40-again", 1, 18, init=40)
        assert verdict.ok and dict(verdict.per_numa) == got, (verdict, got)
        assert node.free()[0] == node.free()[1]
