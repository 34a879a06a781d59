"""Model pods the webhook resolves to best-effort (no eligible node's policy has their balloon type): the real
balloons plugin serves every container of theirs from the shared balloon their namespace routes them to, `default`
under a hand-written policy, with their whole request, init containers first (issue 39, case 2). The ledger holds
them there, and admits one only where that balloon can grow for it.

A fallback pod that takes the shared balloons' last free cores is admitted: it takes exactly its request, as a
non-model pod of that request would, and kube-scheduler places the pods that come after it by the node's
allocatable CPU. A non-model pod that then finds no core fails on the plugin, here as it would after any other pod
(docs/design.md, "Pods without cores of their own")."""

from __future__ import annotations

from placement.demand import read_model_pod
from placement.fit import Fit
from placement.mutation import mutate_pod
from placement.reasons import INIT_EXCEEDS_NODE, INSUFFICIENT_FREE
from tests.oracle.kubelet import peer_pod, run_pod
from tests.oracle.peer import BalloonsPeer
from tests.oracle.scenarios import NODE, SETTINGS, Group, Node, bound_pod, model_pod
from tests.oracle.sysfs import NodeShape

# The issue's node: 2 packages of two 24-core NUMA nodes, SMT off; a policy with types for TP 1 and 2 only.
ISSUE = Group(seed=39, shape=NodeShape(packages=2, numa_per_package=2, cores_per_numa=24, threads_per_core=1),
              policy="threads", lacking=(4,))
SPEC = {"reservedResources": {"cpu": "2"},
        "balloonTypes": [{"name": "vllm-balloon-tp1"}, {"name": "vllm-balloon-tp2"}]}


def add_fallback(node: Node, name: str, cpu: int, init: int | None = None) -> tuple[Fit, bool]:
    """A TP=4 model pod: the ledger's verdict, and whether the plugin runs all its containers in `default`. Kept on
    both only when the ledger admits it."""
    mutated = mutate_pod(model_pod(name, 4, cpu, init), node.cluster).pod
    demand = read_model_pod(mutated, SETTINGS)
    assert demand.policy == "best-effort", demand.policy
    verdict = node.cluster.fit(demand, node.cluster.ledger(NODE))  # type: ignore[arg-type]
    run = peer_pod(mutated)
    ran = all(got.ok for got in run_pod(node.plugin, run).values())
    if ran:
        [balloon] = [b for b in node.plugin.balloons() if f"models/{name}/vllm" in b.containers]
        assert balloon.type == "default", balloon
    if verdict.ok:
        node.cluster.apply("Pod", "ADDED", bound_pod(mutated))
        node.pods[name] = (bound_pod(mutated), run)
    else:
        node.plugin.remove_pod(run.pod)
    return verdict, ran


def test_fallback_pods_are_held_in_the_default_balloon_and_admitted_only_where_it_can_grow() -> None:
    with BalloonsPeer(ISSUE.shape, SPEC) as plugin:
        node = Node(plugin, ISSUE, SPEC)
        # 94 CPUs are not reserved; `default` grows into them alone (the ledger had counted the 2 reserved CPUs too).
        verdict, ran = add_fallback(node, "too-big", 95)
        assert not ran and (verdict.check, verdict.resolvable) == (INSUFFICIENT_FREE, True), verdict
        verdict, ran = add_fallback(node, "huge-init", 8, init=96)
        assert not ran and (verdict.check, verdict.resolvable) == (INIT_EXCEEDS_NODE, False), verdict
        verdict, ran = add_fallback(node, "a", 64)
        assert ran and verdict.ok, verdict
        verdict, ran = add_fallback(node, "b", 43)  # 64 + 43 CPUs in one `default` balloon: more than 94
        assert not ran and verdict.check == INSUFFICIENT_FREE, verdict
        verdict, ran = add_fallback(node, "init", 8, init=40)  # its init container first: 64 + 40
        assert not ran and verdict.check == INSUFFICIENT_FREE, verdict
        verdict, ran = add_fallback(node, "c", 26)
        assert ran and verdict.ok, verdict
        ledger, real = node.free()
        assert sum(ledger) == sum(real) == 4, (ledger, real)
        # The shared balloon's last free cores: a 2-CPU pod in another namespace still runs, and a fallback pod of
        # 3 CPUs is refused where the plugin fails it.
        assert node.add_system("p7", "ingress", 2)
        verdict, ran = add_fallback(node, "d", 3)
        assert not ran and verdict.check == INSUFFICIENT_FREE, verdict
        verdict, ran = add_fallback(node, "e", 2)
        assert ran and verdict.ok, verdict
        assert sum(node.free()[0]) == sum(node.free()[1]) == 0
