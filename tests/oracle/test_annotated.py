"""Where a pod sits is what the plugin did, whatever the pod's labels or its annotations claim (issue 42).

- The plugin routes a container by its balloon annotation whatever the pod's labels: a pod that is no model pod,
  annotated to a model balloon type, gets a balloon of that type on a NUMA node of its own, and balance-balloons
  counts it. The ledger counts it there too (not in the shared pool), so the next model pod is foreseen where the
  plugin puts it.
- A persisted placement the plugin's export contradicts (a tenant's value on a pod that never passed our /bind) is
  not trusted: the export says where the pod is.
"""

from __future__ import annotations

from typing import Any

from placement import reasons
from placement.cluster import ClusterState
from placement.demand import BALLOON_PREFIX, read_model_pod
from placement.ledger import PLACEMENT, Placed
from placement.mutation import mutate_pod
from tests.oracle.judge import cores_by_numa
from tests.oracle.kubelet import peer_pod, run_pod
from tests.oracle.peer import BalloonsPeer
from tests.oracle.scenarios import NODE, SETTINGS, Group, Node, bound_pod, exported_nrt, model_pod, policy_spec
from tests.oracle.sysfs import NodeShape

# 2 NUMA nodes of 24 cores, SMT on, the generated policy (TP=1: balance-balloons over the per-NUMA types); seed 2
# draws the `siblings` profile: one reserved core per NUMA node, 23 left.
GROUP = Group(seed=2, shape=NodeShape(packages=2, numa_per_package=1, cores_per_numa=24, threads_per_core=2),
              policy="generated")


def ledger_of(cluster: ClusterState) -> Any:
    ledger = cluster.ledger(NODE)
    assert ledger is not None
    return ledger


def test_a_pod_without_a_model_label_is_counted_in_the_model_balloon_its_annotation_names() -> None:
    with BalloonsPeer(GROUP.shape, policy_spec(GROUP)) as plugin:
        node = Node(plugin, GROUP)
        assert node.free() == ((23, 23), (23, 23))
        # The tenant: no model label (no webhook ever sees it), one container annotated to the TP=1 type.
        assert node.add_system("squatter", "tenant", 32, {BALLOON_PREFIX + "agent": "vllm-balloon-tp1"})
        squatter = next(b for b in plugin.balloons() if "tenant/squatter/agent" in b.containers)
        assert squatter.name.startswith("vllm-balloon-tp1[") and cores_by_numa(GROUP.shape, squatter.cpus) == {0: 16}
        # Without the plugin's export nothing says which NUMA node it took: a balloon of its type, of unknown
        # placement, charged wherever it could be, so nothing admitted next can be spread.
        ledger = ledger_of(node.cluster)
        held = ledger.holdings["uid-squatter"]
        assert (held.balloon_type, held.cores, held.unknown) == ("vllm-balloon-tp1", 32, True), held
        assert "uid-squatter" not in ledger.shared
        assert ledger.free() == (7, 7) and node.free()[1] == (7, 23)
        fit, got = node.add_model("early", 1, 8)
        assert isinstance(fit.why, reasons.Unsettled) and got == {1: 8}, (fit.why, got)
        # The export names its container: it is held on NUMA node 0, and balance-balloons' counts are the plugin's.
        node.cluster.apply("NodeResourceTopology", "ADDED", exported_nrt(plugin))
        ledger = ledger_of(node.cluster)
        held = ledger.holdings["uid-squatter"]
        assert held.observed and held.per_numa == ((0, 16),) and ledger.unsettled == 0
        assert ledger.free() == node.free()[1] == (7, 23)
        assert ledger.instances.get("vllm-numa-0") == 1 and not ledger.instances.get("vllm-numa-1")
        # So the next model pod is foreseen where the plugin puts it: on NUMA node 1, whose type has fewer balloons
        # (a ledger that counted the squatter in the shared pool foresaw NUMA node 0).
        fit, got = node.add_model("m", 1, 8)
        assert fit.ok and fit.per_numa == ((1, 8),) and got == {1: 8}, (fit, got)
        assert node.free() == ((7, 15), (7, 15))
        # Rebuilt from a list, with the export with and without its container zones (then the squatter claims the
        # balloon of its type no other pod holds): the same.
        for containers in (True, False):
            rebuilt = ledger_of(node.rebuilt(nrt=exported_nrt(plugin, containers=containers)))
            held = rebuilt.holdings["uid-squatter"]
            assert held.observed and held.per_numa == ((0, 16),), (containers, held)
            assert rebuilt.free() == node.free()[1], containers


def planted(node: Node, name: str, cpu: int, placement: str) -> dict[int, int]:
    """A model pod a tenant created already bound (spec.nodeName: it never passes our /bind) with a placement
    annotation of their own: it runs where the plugin puts it, which is returned."""
    pod = mutate_pod(model_pod(name, 1, cpu), node.cluster).pod
    demand = read_model_pod(pod, SETTINGS)
    run = peer_pod(pod)
    assert run_pod(node.plugin, run)[demand.container].ok
    balloon = next(b for b in node.plugin.balloons() if f"models/{name}/{demand.container}" in b.containers)
    bound = bound_pod(pod, placement)
    node.cluster.apply("Pod", "ADDED", bound)
    node.pods[name] = (bound, run)
    return cores_by_numa(GROUP.shape, balloon.cpus)


def test_a_persisted_placement_the_export_contradicts_is_not_trusted() -> None:
    with BalloonsPeer(GROUP.shape, policy_spec(GROUP)) as plugin:
        node = Node(plugin, GROUP)
        fit, got = node.add_model("a", 1, 8)
        assert fit.ok and got == {0: 8}
        # The value: the pod's own cores, on NUMA node 0, where the plugin did not put it.
        lie = Placed(NODE, ((0, 16),), ("vllm-balloon-tp1", "vllm-numa-0")).annotation()
        assert planted(node, "planted", 16, lie) == {1: 16}
        # Without an export the persisted placement is all a ledger has (the install lets nobody but our extender
        # write it); a value that disagrees with the pod's request or balloon type is no placement at all.
        pod = node.pods["planted"][0]
        for text in (Placed(NODE, ((0, 15),), ("vllm-balloon-tp1", "vllm-numa-0")).annotation(),
                     Placed(NODE, ((0, 16),), ("vllm-balloon-tp2", "vllm-numa-0")).annotation(),
                     Placed(NODE, ((0, 16),), ("vllm-balloon-tp1", "no-such-type")).annotation(),
                     Placed("node-9", ((0, 16),), ("vllm-balloon-tp1", "vllm-numa-0")).annotation()):
            rebuilt = node.rebuilt()
            rebuilt.apply("Pod", "MODIFIED", {**pod, "metadata": {**pod["metadata"], "annotations": {
                **pod["metadata"]["annotations"], PLACEMENT: text}}})
            assert ledger_of(rebuilt).holdings["uid-planted"].unknown, text
        # The export, with or without container zones, says where it runs: that is where it is held.
        for containers in (True, False):
            rebuilt = ledger_of(node.rebuilt(nrt=exported_nrt(plugin, containers=containers)))
            held = rebuilt.holdings["uid-planted"]
            assert held.observed and held.per_numa == ((1, 16),), (containers, held)
            assert rebuilt.free() == node.free()[1] == (15, 7), containers
        # A pod bound but not started yet may have no balloon yet: where the export shows none on its NUMA nodes,
        # its placement holds, and a started pod's lie does not take its place.
        node.cluster.apply("NodeResourceTopology", "ADDED", exported_nrt(plugin, containers=False))
        before_late = exported_nrt(plugin, containers=False)
        fit, got = node.add_model("late", 1, 4)
        assert fit.ok and fit.per_numa == ((0, 4),) and got == {0: 4}, (fit, got)
        late = node.pods["late"][0]
        node.pods["late"] = ({**late, "status": {"phase": "Pending"}}, node.pods["late"][1])
        stale = ledger_of(node.rebuilt(nrt=before_late))
        assert stale.holdings["uid-planted"].per_numa == ((1, 16),)
        held = stale.holdings["uid-late"]
        assert held.per_numa == ((0, 4),) and not held.unknown and not held.observed, held
        assert stale.free() == node.free()[1] == (11, 7)
