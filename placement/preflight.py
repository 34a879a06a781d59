"""Cluster-wide questions about a model pod: which policy it really gets, and whether it can land.

The per-node answer is `fit.fit`; this module only aggregates those answers over the nodes the pod
may use, and turns them into the message an operator reads: what was asked, what is free, what to
change.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from placement import fit as fitmod
from placement import reasons
from placement.cluster import ClusterState, pod_priority
from placement.demand import VALID_TP, ModelDemand
from placement.ledger import NodeLedger
from placement.quantity import QuantityError, memory_bytes
from placement.refusals import (
    LargerThanAnyNode,
    NeverFits,
    NoEligibleNode,
    NoRoomNow,
    NotGuaranteed,
    PodSpecProblems,
    Refusal,
    TooFewNumaNodes,
    TooManyReplicas,
    UnknownBalloonType,
    names,
    render,
)

NRI_FALLBACK = "nri-resolution-failed"
NRI_DISABLED = "nri-disabled"
# Replicas placed one by one, at most. Each copy costs a fit (tens of µs), and the event loop waits: a
# Deployment of a million tiny replicas would hold it for tens of seconds, past the apiserver's timeout.
# Beyond this many the workload is admitted with a note; its pods are still checked one by one as created.
MAX_SIMULATED_REPLICAS = 2_000



@dataclass(frozen=True, slots=True)
class Resolution:
    policy: str
    reason: str | None  # set only when `policy` differs from what was requested
    hide_hyperthreads: bool = True  # of the balloon type found, when the policy is nri-balloons


def resolve_policy(demand: ModelDemand, eligible: Iterable[NodeLedger], nri_enabled: bool) -> Resolution:
    """nri-balloons is honoured only where a BalloonsPolicy defining the balloon type applies to an
    eligible node whose plugin is running; otherwise the model still serves, best-effort."""
    if demand.requested_policy != "nri-balloons":
        return Resolution(demand.requested_policy, None)
    if not nri_enabled:
        return Resolution("best-effort", NRI_DISABLED)
    for ledger in eligible:
        policy = ledger.nri.policy
        btype = policy.balloon_type(demand.balloon_type) if ledger.nri.running and policy is not None else None
        if btype is not None:
            return Resolution("nri-balloons", None, btype.hide_hyperthreads)
    return Resolution("best-effort", NRI_FALLBACK)


def fallback_text(demand: ModelDemand) -> str:
    return (f"runs best-effort without exclusive cores: no eligible node has a running NRI balloons plugin with "
            f"balloon type {demand.balloon_type}.")


@dataclass(frozen=True, slots=True)
class Verdict:
    allowed: bool
    refusal: Refusal | None = None  # why not, when not allowed
    notes: tuple[str, ...] = field(default=())  # admitted, but worth telling (e.g. the best-effort fallback)

    @property
    def check(self) -> str:
        """"fits", or the id of the check that refused."""
        return self.refusal.check if self.refusal is not None else fitmod.FITS

    @property
    def message(self) -> str:
        """The whole explanation; empty when it simply fits."""
        return render(self.refusal) if self.refusal is not None else ""


def _refused(refusal: Refusal, notes: tuple[str, ...] = ()) -> Verdict:
    return Verdict(False, refusal, notes)


def memory_problems(spec: Mapping[str, Any]) -> list[str]:
    """kubelet-static needs a Guaranteed pod: every container and init container needs memory."""
    missing = []
    for section in ("initContainers", "containers"):
        for c in spec.get(section) or ():
            res = c.get("resources") or {}
            values = [(res.get(k) or {}).get("memory") for k in ("requests", "limits")]
            if all(v is None for v in values):
                missing.append(str(c.get("name")))
            else:
                for v in values:
                    if v is not None:
                        try:
                            memory_bytes(v)
                        except QuantityError as exc:
                            missing.append(f"{c.get('name')} ({exc})")
    return missing


def cpu_problems(spec: Mapping[str, Any]) -> list[str]:
    """kubelet-static: a container with no CPU request or limit leaves the whole pod Burstable."""
    return [str(c.get("name")) for section in ("initContainers", "containers") for c in spec.get(section) or ()
            if all(((c.get("resources") or {}).get(k) or {}).get("cpu") is None for k in ("requests", "limits"))]


def rank(fits: Sequence[fitmod.Fit]) -> tuple[fitmod.Fit, ...]:
    return tuple(sorted(fits, key=lambda f: (not f.ok, -f.score, f.node)))


def preflight(
    demand: ModelDemand,
    spec: Mapping[str, Any],
    cluster: ClusterState,
    replicas: int = 1,
    resolution: Resolution | None = None,
) -> Verdict:
    """Can this model (`replicas` copies) be pinned somewhere now? `spec` is the pod spec as it will
    be scheduled (after our mutation), so affinity and the AMX requirement are in it."""
    if demand.problems:
        return _refused(PodSpecProblems(demand.problems))
    resolution = resolution or resolve_policy(demand, cluster.iter_eligible(spec), cluster.settings.nri_enabled)
    resolved = replace(demand, resolved_policy=resolution.policy)
    # A node where one pod fits is eligible and has NUMA nodes enough, which settles every check that reads the
    # nodes before the fits: a single pod is judged up to the first such node by name, not on every node (at
    # 5,000 nodes that was most of a second). Only a refusal, or replicas, needs them all.
    eligible: list[NodeLedger] = []
    fits: list[fitmod.Fit] = []
    for ledger in cluster.iter_eligible(spec):
        eligible.append(ledger)
        fits.append(cluster.fit_admission(resolved, ledger))
        if replicas == 1 and fits[-1].ok:
            break
    found = bool(fits) and fits[-1].ok and replicas == 1
    if not found and resolution.policy in fitmod.EXCLUSIVE_POLICIES:
        # In a fleet of balloons and kubelet-static nodes, the nodes the other agent pins are beside the point of
        # every count and message, once some node runs the pod's own.
        own = [i for i, ledger in enumerate(eligible) if (ledger.kubelet is not None) ==
               (resolution.policy == "kubelet-static")]
        if own and len(own) < len(eligible):
            eligible, fits = [eligible[i] for i in own], [fits[i] for i in own]
    what = f"{demand.pod} (model container {demand.container!r}, {demand.cpus} CPUs, TP={demand.tp})"
    if not eligible:
        return _refused(NoEligibleNode(what, no_eligible_node(cluster, spec)))
    max_numa = max(ledger.topology.numa_count for ledger in eligible)
    if demand.numa_nodes > max_numa:
        return _refused(TooFewNumaNodes(demand.ranks, demand.numa_nodes, tuple(ledger.name for ledger in eligible),
                                        max_numa, _fewer_ranks(demand, max_numa)))
    if resolution.policy == "kubelet-static":
        missing = memory_problems(spec)
        if missing:
            return _refused(NotGuaranteed(demand.pod, tuple(missing), "memory"))
        no_cpu = cpu_problems(spec)
        if no_cpu:
            return _refused(NotGuaranteed(demand.pod, tuple(no_cpu), "cpu"))
    # The type a pod's ranks make (TP x PP x DP-in-pod) is derived, not asked for: only another one was named.
    derived = f"{cluster.settings.nri_balloon_prefix}{demand.numa_nodes}"
    explicit = demand.balloon_type != derived
    notes: tuple[str, ...] = ()
    if demand.requested_policy == "nri-balloons" and resolution.policy != "nri-balloons":
        if explicit and resolution.reason == NRI_FALLBACK:
            if found:
                eligible = cluster.eligible(spec)
            return _refused(UnknownBalloonType(demand.pod, demand.balloon_type,
                                               tuple(ledger.name for ledger in eligible if ledger.nri.running),
                                               derived))
        if resolution.reason == NRI_FALLBACK:
            notes = (f"{demand.pod} {fallback_text(demand)}",)
    if found and resolution.policy == "kubelet-static" and not fitmod.rank_local(resolved, fits[-1]):
        notes = (*notes, *_ranks_note(resolved, fits[-1], spec, cluster))
    if found:
        return Verdict(True, None, notes)
    ranked = rank(fits)
    feasible = [f for f in ranked if f.ok]
    if not feasible:
        preemption = _preemption_room(resolved, pod_priority(spec), eligible, ranked, cluster)
        if preemption:
            return Verdict(True, None, (*notes, preemption))
        return _explain_no_fit(resolved, eligible, ranked, cluster)
    if replicas > 1:
        simulated = min(replicas, MAX_SIMULATED_REPLICAS)
        placed = _simulate_replicas(resolved, eligible, cluster, simulated)
        if placed == simulated < replicas:
            notes = (*notes, f"{demand.pod}: the pre-flight placed the first {simulated:,} of {replicas:,} replicas "
                             "and stopped there; the others are checked one by one as their pods are created.")
        elif placed < replicas:
            footprint = fitmod.nominal_footprint(resolved, _width(eligible, cluster)).describe()
            return _refused(TooManyReplicas(demand.pod, placed, replicas, footprint, len(feasible), len(eligible)),
                            notes)
    return Verdict(True, None, notes)


def _ranks_note(demand: ModelDemand, first: fitmod.Fit, spec: Mapping[str, Any], cluster: ClusterState
                ) -> tuple[str, ...]:
    """A warning when no node the kubelet admits the pod on gives each rank a NUMA node of its own. vLLM's default
    VLLM_CPU_OMP_THREADS_BIND=auto binds rank i to the i-th NUMA node of the container's CPUs, and asserts there are
    at least as many NUMA nodes as ranks (vllm/v1/worker/cpu_worker.py, `_get_autobind_cpu_ids`)."""
    for candidate in cluster.iter_eligible(spec):
        other = cluster.fit_admission(demand, candidate)
        if other.ok and fitmod.rank_local(demand, other):
            return ()
    span = len(first.per_numa)
    ledger = cluster.ledger(first.node)
    agent = ledger.agent() if ledger is not None else "kubelet"
    ranks = demand.rank_count
    if span < demand.numa_nodes:
        effect = (f"its {ranks} share {span} NUMA node{'s' if span > 1 else ''} (the kubelet spans more NUMA nodes "
                  "only for a request larger than one holds), so vLLM's default binding (VLLM_CPU_OMP_THREADS_BIND="
                  "auto, a NUMA node per rank) stops at start with \"No enough allowed NUMA nodes to bind threads\"")
        change = ("use model-manager.io/cpu-policy: nri-balloons (a balloon per rank), or lower the ranks in this pod "
                  "(tensor-parallel-size / data-parallel-size)")
    elif span == demand.numa_nodes:
        cores = reasons.numa_cores(first.per_numa)
        effect = (f"its CPUs span {span} NUMA nodes for {ranks} unevenly (cores {cores}), so vLLM's default binding "
                  "(VLLM_CPU_OMP_THREADS_BIND=auto, all of the i-th NUMA node's CPUs for rank i) gives a rank less "
                  "than its share, and the model runs at that rank's pace")
        change = ("request a multiple of the ranks that each NUMA node can hold, or use model-manager.io/cpu-policy: "
                  "nri-balloons")
    else:
        effect = (f"its CPUs span {span} NUMA nodes for {ranks}, so vLLM's default binding (VLLM_CPU_OMP_THREADS_BIND="
                  "auto) gives each rank the CPUs of one NUMA node and leaves the others idle")
        change = "request at most one NUMA node's CPUs per rank, or use model-manager.io/cpu-policy: nri-balloons"
    return (f"{demand.pod}: under the kubelet's static CPU Manager ({agent}) {effect}, on any node it fits now. "
            f"To change: {change}.",)


def no_eligible_node(cluster: ClusterState, spec: Mapping[str, Any]) -> str:
    """Why kube-scheduler offers the pod no node: each reason with its count, most common first, and what to
    change for the first."""
    misses = cluster.misses(spec)
    if not misses:
        return "the cluster has no nodes."
    counts: dict[str, list[str]] = {}
    for name, miss in misses.items():
        counts.setdefault(miss.reason, []).append(name)
    # A pinned pod: what keeps it off the nodes it is pinned to comes first, the pin itself last.
    ranked = sorted(counts.items(), key=lambda kv: (misses[kv[1][0]].check == "node-pin", -len(kv[1]), kv[0]))
    shown = "; ".join(f"{len(nodes)} {'node' if len(nodes) == 1 else 'nodes'} ({names(nodes)}): {reason}"
                      for reason, nodes in ranked[:3])
    more = f"; {len(ranked) - 3} other reasons" if len(ranked) > 3 else ""
    first = misses[counts[ranked[0][0]][0]]
    return (f"kube-scheduler would offer it none of the {len(misses)} nodes: {shown}{more}. "
            f"To change: {first.change}.")


def _simulate_replicas(demand: ModelDemand, eligible: Sequence[NodeLedger], cluster: ClusterState,
                       replicas: int) -> int:
    """How many copies fit at once, placed one by one on the best-scoring node as the extender would.
    Placing a copy changes only its own node's answer, so only that node is asked again: a heap keeps
    the best (score, name) on top, and the cost stays O((nodes + copies placed) · log nodes) however
    large `replicas` is."""
    scratch = {ledger.name: ledger.scratch(without=demand.identity) for ledger in eligible}
    tpc, strategy = cluster.settings.mm_kubelet_threads_per_core, cluster.settings.scoring_strategy
    heap = []
    for name, ledger in scratch.items():
        result = fitmod.fit(demand, ledger, tpc, strategy)
        if result.ok:
            heap.append((-result.score, name))
    heapq.heapify(heap)
    for n in range(replicas):
        if not heap:
            return n
        _, name = heapq.heappop(heap)
        ledger = scratch[name]
        fitmod.place(ledger, f"replica-{n}", demand, tpc, strategy)
        again = fitmod.fit(demand, ledger, tpc, strategy)
        if again.ok:
            heapq.heappush(heap, (-again.score, name))
    return replicas


def _fewer_ranks(demand: ModelDemand, numa: int) -> str:
    """The change of parallel sizes that fits `numa` NUMA nodes: data and pipeline parallelism first (they only
    cost throughput per pod), tensor parallelism last."""
    sizes = {"data": demand.dp, "pipeline": demand.pp, "tensor": demand.tp}
    for what in ("data", "pipeline", "tensor"):
        while sizes["data"] * sizes["pipeline"] * sizes["tensor"] > numa and sizes[what] > 1:
            sizes[what] //= 2
    changed = [f"{what}-parallel-size {sizes[what]}" for what, was in
               (("tensor", demand.tp), ("pipeline", demand.pp), ("data", demand.dp)) if sizes[what] != was]
    return " and ".join(changed)


def _preemption_room(demand: ModelDemand, priority: int, eligible: Sequence[NodeLedger],
                     ranked: Sequence[fitmod.Fit], cluster: ClusterState) -> str:
    """What a pod that fits nowhere now may still get by preemption: kube-scheduler (and our /preempt) evict
    lower-priority pods for it, so refusing it at admission would take that away. The first node, by name,
    where it fits once every model pod of lower priority is gone; "" when there is none."""
    by_node = {ledger.name: ledger for ledger in eligible}
    for result in sorted((f for f in ranked if f.resolvable), key=lambda f: f.node):
        ledger = by_node[result.node]
        lower = {uid for uid in ledger.holdings
                 if (rec := cluster.pods.get(uid)) is not None and rec.priority < priority}
        if lower and cluster.fit_admission(demand, ledger.scratch(evicted=lower)).ok:
            return (f"{demand.pod} fits on no node now; at priority {priority} it can have the cores of "
                    f"lower-priority model pods by preemption (on {ledger.name}, for one, evicting up to "
                    f"{len(lower)} of them), so it is admitted and waits Pending until the scheduler preempts.")
    return ""


def _explain_no_fit(demand: ModelDemand, eligible: Sequence[NodeLedger], ranked: Sequence[fitmod.Fit],
                    cluster: ClusterState) -> Verdict:
    # Nodes with too few NUMA nodes are beside the point once some node has enough, and so are nodes another agent
    # pins (a balloons pod on kubelet-static nodes, or the reverse) once some node runs the pod's.
    ranked = [f for f in ranked if f.check != reasons.TP_EXCEEDS_NUMA] or list(ranked)
    ranked = [f for f in ranked if not isinstance(f.why, (reasons.NoBalloonsPolicy, reasons.NotKubeletNode))] \
        or list(ranked)
    by_node = {ledger.name: ledger for ledger in eligible}
    eligible = [by_node[f.node] for f in ranked]
    resolvable = [f for f in ranked if f.resolvable]
    fp = fitmod.nominal_footprint(demand, _width(eligible, cluster))
    asked = f"{demand.pod} asks for cpu: {demand.requested_cpu}, that is {fp.describe()}"
    if not resolvable:
        checks = {f.check for f in ranked}
        if checks == {reasons.FOOTPRINT_EXCEEDS_NODE}:
            best = max(eligible, key=lambda ledger: _room_when_empty(ledger, demand))
            wider = demand.numa_nodes * 2
            spreads = wider in VALID_TP and any(ledger.topology.numa_count >= wider for ledger in eligible)
            return _refused(LargerThanAnyNode(asked, len(eligible), demand.numa_nodes, best.name, max(best.capacity),
                                              _largest_request(demand, best, cluster), demand.ranks,
                                              demand.tp * 2 if spreads else None))
        refused = [(f.node, f.why) for f in ranked if f.why is not None]  # every one: it fits on none
        return _refused(NeverFits(asked, tuple(refused[:3]), len(refused) > 3))
    # It could fit an empty node: what is in the way is other pods.
    top = sorted(resolvable, key=lambda f: -sum(by_node[f.node].free()))[:3]
    most_free = tuple((f.node, fitmod.fmt_free(by_node[f.node], by_node[f.node].free())) for f in top)
    return _refused(NoRoomNow(asked, len(eligible), most_free, tuple(dict.fromkeys(f.reason for f in top))))


def _width(eligible: Sequence[NodeLedger], cluster: ClusterState) -> int:
    """The SMT width the eligible nodes share (the webhook keeps a pod on nodes of one width); the fleet's usual
    width when they differ."""
    widths = {ledger.threads_per_core for ledger in eligible}
    return widths.pop() if len(widths) == 1 else cluster.settings.mm_kubelet_threads_per_core


def _largest_request(demand: ModelDemand, ledger: NodeLedger, cluster: ClusterState) -> int:
    """The largest whole `cpu: N`, in the unit the user writes it, that an empty node like `ledger` could hold
    once the webhook has sized it as it sizes this one; 0 when none."""
    room = _room_when_empty(ledger, demand)
    policy = ledger.nri.policy
    btype = policy.balloon_type(demand.balloon_type) if policy is not None else None
    if demand.policy != "nri-balloons" or btype is None:
        return room
    width, mode = ledger.threads_per_core, cluster.settings.nri_cpu_request
    # cpu: N in cores mode on a hide-hyperthreads type is N cores; otherwise N CPUs.
    start = room if mode == "cores" and btype.hide_hyperthreads else room * width
    empty = ledger.scratch(evicted=set(ledger.holdings))
    for cpus in range(start, max(0, start - 64), -1):
        milli = fitmod.balloon_request(replace(demand, requested_milli=0, cpu_milli=cpus * 1000), {}, width,
                                       btype.hide_hyperthreads, mode)
        result = cluster.fit_admission(replace(demand, cpu_milli=milli or cpus * 1000), empty)
        if result.ok or result.resolvable:
            return cpus
    return 0


def _room_when_empty(ledger: NodeLedger, demand: ModelDemand) -> int:
    """The most cores an empty node could give a demand of this shape (kubelet-static: CPUs)."""
    if ledger.topology.numa_count < demand.numa_nodes:
        return 0
    if demand.policy == "kubelet-static":
        return sum(ledger.capacity) * ledger.threads_per_core
    return sorted(ledger.capacity, reverse=True)[demand.numa_nodes - 1] * demand.numa_nodes
