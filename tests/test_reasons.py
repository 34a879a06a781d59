"""Every kind of per-node refusal has its sentence, worded in one place (its `text()` in placement/reasons.py), and its
check id, which the extender's metrics, the explain command and admission key on. The sentences are the ones users
read in kube-scheduler's FailedScheduling summaries, so none names a node or a pod (but binding's own)."""

from __future__ import annotations

import typing

from placement import reasons as r
from placement.fit import Footprint

STATIC = Footprint("kubelet-static", 1, 0, 6, 12, None, True)
SHARED = Footprint("best-effort", 1, 0, 0, 3, None, False)
NO_ROOM = r.NoRoomOnOneNuma("vllm-tp1", 5, None, r.INSUFFICIENT_FREE)

# (refusal, its check, the sentence), one per kind at least.
CASES: list[tuple[r.Reason, str, str]] = [
    (r.TypeCapped("vllm", 8, 12), r.BALLOON_TYPE_CAPPED,
     "balloon type vllm holds at most maxCPUs=8 CPUs and this needs 12"),
    (r.ComponentMissing("tp2", "vllm-numa1"), r.BALLOON_TYPE_MISSING,
     "composite balloon type tp2 names component type vllm-numa1, which the BalloonsPolicy does not define"),
    (r.PreferredNumaMissing("vllm-numa3", 3, 2), r.NOT_NUMA_LOCAL,
     "balloon type vllm-numa3 prefers NUMA node 3, which a node with 2 NUMA nodes lacks"),
    (r.PreferredNumaMissing("vllm-numa1", 1, 1), r.NOT_NUMA_LOCAL,
     "balloon type vllm-numa1 prefers NUMA node 1, which a node with 1 NUMA node lacks"),
    (NO_ROOM, r.INSUFFICIENT_FREE, "balloon type vllm-tp1 needs 5 free cores on one NUMA node"),
    (r.NoRoomOnOneNuma("vllm-numa0", 1, 0, r.NOT_NUMA_LOCAL), r.NOT_NUMA_LOCAL,
     "the balloons policy puts a rank on NUMA node 0 (or, lacking room there, another), which needs 1 free core on "
     "one NUMA node"),
    (r.TpExceedsNuma(4, 2, 1, 2), r.TP_EXCEEDS_NUMA, "TP=4 × PP=2 needs 8 NUMA nodes, one per rank; this node has 2"),
    (r.NoCpu(), r.NO_CPU, "the model container requests no CPU"),
    (r.NoBalloonsPolicy("vllm"), r.BALLOON_TYPE_MISSING,
     "no BalloonsPolicy applies to this node, so balloon type vllm cannot be created here"),
    (r.NriNotRunning("Failure", "kube-system/group.a"), r.NRI_NOT_RUNNING,
     "the NRI balloons plugin reports Failure for BalloonsPolicy kube-system/group.a on this node, so it is not "
     "pinning CPUs here"),
    (r.BalloonTypeUndefined("custom", "", ("vllm", "tp2")), r.BALLOON_TYPE_MISSING,
     "balloon type custom is not defined in the node's own BalloonsPolicy (types there: vllm, tp2)"),
    (r.BalloonTypeUndefined("custom", "kube-system/default", ()), r.BALLOON_TYPE_MISSING,
     "balloon type custom is not defined in BalloonsPolicy kube-system/default (types there: none)"),
    (r.RequestOverShares(288, 256), r.REQUEST_OVER_SHARES,
     "the model container requests 288 CPUs, and the balloons plugin reads a request from its cpu.shares, which "
     "stop at 256 CPUs: the balloon would be smaller than asked; split the model into more pods or request less"),
    (r.ExceedsEmptyNode(NO_ROOM, 4), r.FOOTPRINT_EXCEEDS_NODE,
     "balloon type vllm-tp1 needs 5 free cores on one NUMA node, more than this node has even when empty (at most 4 "
     "model cores on a NUMA node)"),
    (r.MemoryExceedsNuma(2, 1, 1, 200 * 2**30, 3 * 2**29), r.MEMORY_EXCEEDS_NUMA,
     "TP=2 pins 200Gi of memory to each of its 2 NUMA nodes (pinMemory); nodes of this shape have 1.5Gi"),
    (r.TypeSpansFewer("vllm", 1, 2, 1, 1), r.RANKS_SHARE_NUMA,
     "balloon type vllm puts the model on 1 NUMA node but its TP=2 needs 2, one per rank"),
    (r.MaxBalloons("vllm", 2), r.MAX_BALLOONS,
     "maxBalloons=2 vllm balloons already run here; the plugin would put this model into one of them, sharing its "
     "cores"),
    (r.SharesBalloon("vllm"), r.SHARES_BALLOON,
     "balloon type vllm has preferNewBalloons: false and a vllm balloon already runs here: the plugin would put "
     "this model into it, sharing its cores"),
    (r.RanksCrowded(2, 1), r.RANKS_SHARE_NUMA,
     "needs 2 distinct NUMA nodes; with what runs here the plugin would put its ranks on 1"),
    (r.PlacementUnknown(), r.PLACEMENT_UNKNOWN,
     "the balloons plugin may pick NUMA nodes without room for it (model pods here with no recorded placement count "
     "on every NUMA node they could use: bound by another scheduler or before model-placement was installed); "
     "re-create them through this scheduler, or set showContainersInNrt: true in the BalloonsPolicy"),
    (r.KubeletOrder("llm/a"), r.KUBELET_REJECTS,
     "pod llm/a, bound here moments ago, is not yet admitted by the kubelet, and which of the two it admits first "
     "decides their CPUs (or rejects one); judged again once it runs"),
    (r.KubeletFreeing("llm/b"), r.KUBELET_REJECTS,
     "pod llm/b is terminating here, and whether the kubelet has freed its CPUs when this one reaches it decides "
     "this one's CPUs; judged again once it is gone"),
    (r.KubeletSplits("Topology Manager restricted, scope pod", ((0, 12), (3, 4)), ((1, 16),), "1 rank"),
     r.INSUFFICIENT_FREE,
     "the kubelet (Topology Manager restricted, scope pod) would run the model split now (cores NUMA 0: 12, NUMA 3: 4 "
     "for its 1 rank), where with room it keeps each rank on a NUMA node of its own (NUMA 1: 16); a node that aligns "
     "waits for room rather than split it"),
    (r.MemoryPlacementUnknown(2), r.PLACEMENT_UNKNOWN,
     "the kubelet's Static Memory Manager holds memory of 2 pods with no recorded placement, not where they were "
     "replayed (the node's NodeResourceTopology says so): which NUMA nodes it would give this pod is unknown; judged "
     "again when they leave or the NodeResourceTopology agrees. To change: re-create them through this scheduler"),
    (r.PodLeaving((0,), (3,)), r.POD_LEAVING,
     "a pod here is terminating and the balloons plugin may already have removed its balloon, after which it would "
     "put this one on NUMA node 3, not on NUMA node 0; judged again once that pod is gone"),
    (r.PodLeaving((0, 1), ()), r.POD_LEAVING,
     "a pod here is terminating and the balloons plugin may already have removed its balloon, after which it would "
     "put this one on no NUMA node per rank, not on NUMA nodes 0, 1; judged again once that pod is gone"),
    (r.ReservedLent(1, 2), r.RESERVED_LENT,
     "the balloon would need 2 of the reserved cores on NUMA node 1, which the BalloonsPolicy lends (its reserved "
     "balloon type sets no minCPUs), and the plugin may take them from another NUMA node; set minCPUs on the "
     "reserved type to the size of reservedResources"),
    (r.SharedUnseen(0, 3), r.SHARED_UNSEEN,
     "NUMA node 0 has room for it only if the 3 cores the shared balloons took elsewhere are not there, and where "
     "they grew is not known (no NodeResourceTopology export was read, and no type of the BalloonsPolicy prefers a "
     "NUMA node, or the reserved balloon is a CPU count); let the extender read the plugin's NodeResourceTopology, or "
     "use the generated policy"),
    (r.SharedUnseen(1, 2, replayed=True), r.SHARED_UNSEEN,
     "NUMA node 1 has room for it only if the 2 cores the shared balloons took elsewhere are not there, and where "
     "they grew is not known: the extender read the node's pods from a list (a restart, a relist), which does not "
     "say where the pods that came and went since grew and shrank them; it is known again once they shrink back to "
     "their minimum, or let the extender read the plugin's NodeResourceTopology"),
    (r.PackagesUnseen((0,), (1,)), r.SHARED_UNSEEN,
     "the balloons plugin would put it on NUMA node 0 if this node's NUMA nodes sit on one package, or one package "
     "each, and on NUMA node 1 if they sit on two: the shared balloons grew and shrank where the packages decide, and "
     "nothing says which NUMA nodes share one; let the extender read the plugin's NodeResourceTopology"),
    (r.ThreadsUnseen((0,), ()), r.SHARED_UNSEEN,
     "the balloons plugin would put it on NUMA node 0 if the shared balloons held whole cores, and on no NUMA node "
     "per rank as they grew CPU by CPU, container by container: an odd CPU leaves half a core, and the next growth "
     "may go to another NUMA node; let the extender read the plugin's NodeResourceTopology"),
    (r.SidecarsNoRoom(1500, 2, 1), r.INSUFFICIENT_FREE,
     "its other containers (cpu: 1500m together) grow the shared balloon they land in by 2 cores, and beside its "
     "ranks 1 would be free"),
    (r.InitNoRoom(64000, "default", 64, 40), r.INSUFFICIENT_FREE,
     "its init containers (cpu: 64 at once) grow balloon default, where they run before the pod's other containers "
     "start, by 64 cores, and 40 are free"),
    (r.InitExceedsNode(64000, "default", 64, 62), r.INIT_EXCEEDS_NODE,
     "its init containers (cpu: 64 at once) run in balloon default, which would need 64 cores for them, and it can "
     "never grow into more than the 62 cores this node has outside its reserved CPUs; lower the init containers' "
     "CPU requests"),
    (r.NoFreeMemory(48 * 2**30, (0, 2)), r.INSUFFICIENT_FREE_MEMORY,
     "needs 48Gi free memory on each of its NUMA nodes (pinMemory); the plugin would put it on NUMA nodes 0, 2"),
    (r.NoFreeMemory(5 * 2**30, (1,)), r.INSUFFICIENT_FREE_MEMORY,
     "needs 5Gi free memory on each of its NUMA nodes (pinMemory); the plugin would put it on NUMA node 1"),
    (r.KubeletRejects("TopologyAffinityError", "Resources cannot be allocated with Topology locality",
                      "Topology Manager single-numa-node, scope container", 40, (30, 32)), r.KUBELET_REJECTS,
     "the kubelet (Topology Manager single-numa-node, scope container) would fail the pod with TopologyAffinityError: "
     "40 CPUs fit no NUMA node of nodes of this shape, the largest holds 32"),
    (r.KubeletRejects("TopologyAffinityError", "Resources cannot be allocated with Topology locality",
                      "Topology Manager restricted, scope pod", 20, (30, 32), (12, 4)), r.KUBELET_REJECTS,
     "the kubelet (Topology Manager restricted, scope pod) would fail the pod with TopologyAffinityError: 20 CPUs fit "
     "no NUMA node now; free CPUs NUMA 0: 12 of 30, NUMA 1: 4 of 32"),
    (r.KubeletRejects("TopologyAffinityError", "Resources cannot be allocated with Topology locality",
                      "Topology Manager restricted, scope container", 150, (46, 48)), r.KUBELET_REJECTS,
     "the kubelet (Topology Manager restricted, scope container) would fail the pod with TopologyAffinityError: 150 "
     "CPUs are more than the 94 nodes of this shape can ever give"),
    (r.KubeletRejects("SMTAlignmentError", "SMT Alignment Error: requested 3 cpus not multiple cpus per core = 2",
                      "Topology Manager none, scope container", 3, (30, 32)), r.KUBELET_REJECTS,
     "the kubelet (Topology Manager none, scope container) would fail the pod with SMTAlignmentError: SMT Alignment "
     "Error: requested 3 cpus not multiple cpus per core = 2"),
    (r.NotKubeletNode(), r.NOT_KUBELET_NODE,
     "kubelet-static pod, but the NRI balloons plugin pins CPUs on these nodes (set model-manager.io/cpu-policy: "
     "nri-balloons, or schedule it to a kubelet-static node group)"),
    (r.NotPinned("its CPU request is not a whole number"), r.NOT_PINNED,
     "the kubelet's static CPU Manager pins no CPU for the model container: its CPU request is not a whole number"),
    (r.PoolTaken(SHARED), r.INSUFFICIENT_FREE,
     "needs best-effort: 3 CPUs from the shared pool, more than is unclaimed"),
    (r.Unsettled(r.MaxBalloons("vllm", 1)), r.MAX_BALLOONS,
     "maxBalloons=1 vllm balloons already run here; the plugin would put this model into one of them, sharing its "
     "cores (model pods here with no recorded placement count on every NUMA node they could use)"),
    (r.UnknownNode("n7"), r.UNKNOWN_NODE, "node n7 is not known to the extender"),
    (r.AlreadyBound("llm/a", "n7"), r.ALREADY_BOUND, "pod llm/a is already bound to node n7"),
]


def test_every_kind_of_per_node_refusal_has_its_sentence_and_check_id() -> None:
    assert {type(why) for why, _, _ in CASES} == set(typing.get_args(r.Reason))
    for why, check, text in CASES:
        assert (why.check, why.text()) == (check, text), why
