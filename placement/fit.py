"""Fit and score a model demand on one node, and say why not (placement/reasons.py words it for users).

`fit` is the one question both the webhook's pre-flight and the extender's filter ask, of the same
ledger; `place` is `fit` followed by `hold`, so the two can never disagree.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, NamedTuple

from placement import kubelet as kub
from placement import nri, reasons
from placement.balloonspolicy import BalloonsPolicy, BalloonType
from placement.demand import MAX_REQUEST_MILLI, OUT_REQUESTED, ModelDemand, round_up
from placement.ledger import Holding, NodeLedger
from placement.quantity import QuantityError, cpu_milli
from placement.topology import CPUSet

EXCLUSIVE_POLICIES = ("nri-balloons", "kubelet-static")

FITS = "fits"  # the check id of a fit; a refusal's are in placement/reasons.py


@dataclass(frozen=True, slots=True)
class Footprint:
    """What a demand costs on a given node."""

    policy: str
    numa_nodes: int  # distinct NUMA nodes it spans (nri-balloons: one per rank)
    cores_per_numa: int  # nri-balloons: the most on any of them; kubelet-static: 0 (spread as needed)
    cores: int  # physical cores in total
    cpus: int  # logical CPUs the node agent holds for it
    balloon_type: str | None
    exclusive: bool

    def describe(self) -> str:
        if self.policy == "nri-balloons":
            numa = f"{self.numa_nodes} NUMA node{'s' if self.numa_nodes > 1 else ''}"
            per = f"{self.cores_per_numa} core{'s' if self.cores_per_numa != 1 else ''}"
            return f"balloon {self.balloon_type}: {per} on each of {numa} ({self.cpus} CPUs)" if self.numa_nodes > 1 \
                else f"balloon {self.balloon_type}: {per} on {numa} ({self.cpus} CPUs)"
        if self.policy == "kubelet-static":
            return f"kubelet-static: {self.cpus} exclusive CPUs"
        return f"best-effort: {self.cpus} CPUs from the shared pool"


class Fit(NamedTuple):
    # A named tuple, not a frozen dataclass: the extender builds thousands per demand, and a frozen
    # dataclass costs three times as much to build.
    node: str
    why: reasons.Reason | None  # None when it fits
    resolvable: bool  # could evicting pods make it fit?
    per_numa: tuple[tuple[int, int], ...] = ()
    score: int = 0
    footprint: Footprint | None = None
    types: tuple[str, ...] = ()  # nri-balloons: the balloon types it instantiates
    memory: int = 0  # nri-balloons with pinMemory: bytes on each of its NUMA nodes
    # The node holds a pod of unknown placement: `per_numa` is a guess (it fits wherever the plugin puts it), so it
    # will be held as unknown too.
    unknown: bool = False
    admitted: kub.Admitted | None = None  # kubelet-static: what the kubelet gives each container, and its state after
    split: bool = False  # kubelet-static: its CPUs span more NUMA nodes than ranks, or a rank is short of its share

    @property
    def ok(self) -> bool:
        return self.why is None

    @property
    def check(self) -> str:
        return FITS if self.why is None else self.why.check

    @property
    def reason(self) -> str:
        """Empty when it fits. Rendered when read, not when refused: most fits are asked for their verdict alone
        (preflight reads the reasons of a few nodes of thousands, the victim search none)."""
        return "" if self.why is None else self.why.text()


def fmt_free(ledger: NodeLedger, free: tuple[int, ...]) -> str:
    return ", ".join(f"NUMA {i}: {f}/{cap}" for i, (f, cap) in enumerate(zip(free, ledger.capacity))) \
        + " free cores"


def _balloon_type(demand: ModelDemand, ledger: NodeLedger) -> BalloonType | None:
    policy = ledger.nri.policy
    return policy.balloon_type(demand.balloon_type) if policy is not None else None


@lru_cache(maxsize=4096)
def _balloon_footprint(balloon_type: str, per_numa: tuple[tuple[int, int], ...], cpus: int) -> Footprint:
    # Memoised: a fit builds two (the empty node's and this node's), and a frozen dataclass costs microseconds.
    cores = sum(c for _, c in per_numa)
    per = max((c for _, c in per_numa), default=0)
    return Footprint("nri-balloons", len(per_numa), per, cores, cpus, balloon_type, True)


@lru_cache(maxsize=4096)
def _footprint(policy: str, cpus: int, node_tpc: int, kubelet_tpc: int) -> Footprint:
    if policy == "kubelet-static":
        cores = math.ceil(round_up(cpus, kubelet_tpc) / node_tpc)
        return Footprint(policy, 1, 0, cores, cores * node_tpc, None, True)
    return Footprint(policy, 1, 0, 0, cpus, None, False)


def footprint(demand: ModelDemand, ledger: NodeLedger, threads_per_core: int) -> Footprint | None:
    """The demand's cost on this node, empty; None where no balloon of its type can be made there.
    `threads_per_core` is the cluster's SMT width for kubelet-static rounding; the node's own width decides how
    many threads a core is."""
    if demand.policy != "nri-balloons":
        return _footprint(demand.policy, demand.cpus, ledger.threads_per_core, threads_per_core)
    policy = ledger.nri.policy
    btype = _balloon_type(demand, ledger)
    if btype is None or policy is None:  # a type only with a policy
        return None
    plan = nri.plan_empty(policy, btype, demand.cpu_milli, ledger.capacity, ledger.threads_per_core)
    if not isinstance(plan, nri.Plan):
        return None
    return _balloon_footprint(demand.balloon_type, plan.per_numa, plan.cpus)


def nominal_footprint(demand: ModelDemand, threads_per_core: int) -> Footprint:
    """What the demand asks for on a node of the cluster's usual SMT width, whatever any node holds: its ranks'
    whole cores, one NUMA node each. For messages about a demand no node can take."""
    if demand.policy != "nri-balloons":
        return _footprint(demand.policy, demand.cpus, threads_per_core, threads_per_core)
    span = demand.numa_nodes
    per = math.ceil(math.ceil(demand.cpus / span) / threads_per_core)
    return Footprint("nri-balloons", span, per, per * span, demand.cpus, demand.balloon_type, True)


def nominal_cpus(demand: ModelDemand, threads_per_core: int) -> int:
    """The logical CPUs the node agent holds for the model container, on a node of the cluster's usual SMT
    width: what the webhook annotates. A balloon holds ceil(request); kubelet-static whole cores."""
    if demand.policy == "kubelet-static":
        return round_up(demand.cpus, threads_per_core)
    return demand.cpus


def balloon_request(demand: ModelDemand, annotations: Mapping[str, Any], tpc: int, hide_hyperthreads: bool,
                    mode: str) -> int | None:
    """The model container's CPU request in millicores under the balloons plugin, which gives a balloon
    ceil(request) logical CPUs split evenly over its ranks' NUMA nodes: whole cores on each, so no rank shares a
    core. On a hide-hyperthreads type in `cores` mode the user's cpu: N is N cores for N threads (N × SMT width
    CPUs); otherwise the request, rounded up. The user's own figure is kept in `requested-cpu`, so a second
    mutation starts from it and never doubles twice. None: no request to size from."""
    original = demand.cpu_milli
    if annotations.get(OUT_REQUESTED) is not None:
        try:
            original = cpu_milli(annotations[OUT_REQUESTED])
        except QuantityError:
            return None
    if original <= 0:
        return None
    span = demand.numa_nodes
    cores = math.ceil(math.ceil(original / 1000) / (1 if hide_hyperthreads and mode == "cores" else tpc))
    return round_up(cores, span) * tpc * 1000


def _refuse(node: str, why: reasons.Reason, resolvable: bool, fp: Footprint | None = None) -> Fit:
    return Fit(node, why, resolvable, footprint=fp)


def fit(demand: ModelDemand, ledger: NodeLedger, threads_per_core: int, strategy: str) -> Fit:
    """Does the demand fit this node now, with what it holds now?

    A refusal no eviction can change (`resolvable=False`) is decided before what the node holds is
    read: by the demand and the node's shape and policy alone. The extender shares such refusals between
    nodes of one shape. No reason names the node or the pod."""
    return finish(plan(demand, ledger, threads_per_core, strategy), ledger, strategy)


def plan(demand: ModelDemand, ledger: NodeLedger, threads_per_core: int, strategy: str) -> Fit:
    """`fit` short of the node's free NUMA memory: where the demand's cores go, or why they cannot. It reads what
    `shape_key` and `plan_key` hold, so nodes alike in those share one plan, and `finish` completes it per node.
    Every vLLM pod pins memory, and its free memory is what sets most nodes of a fleet apart (4,005 classes of 5,000
    nodes by `fit_key`, 794 by `plan_key`). A plan that fits with `memory` set is not yet checked nor scored."""
    return _fit(demand, ledger, threads_per_core, strategy)


def finish(planned: Fit, ledger: NodeLedger, strategy: str) -> Fit:
    """`plan`'s answer for this node (of the same `shape_key` and `plan_key` as the one planned on): its ranks'
    memory checked against what the node has free on their NUMA nodes, and scored with it."""
    result = planned
    memory = planned.memory
    if planned.why is None and memory:
        per_numa = planned.per_numa
        memory_after = list(ledger.free_memory())
        for i, _ in per_numa:
            if memory_after[i] < memory:
                short = reasons.NoFreeMemory(memory, tuple(i for i, _ in per_numa))
                result = _refuse(ledger.name, short, True, planned.footprint)
                break
            memory_after[i] -= memory
        else:
            after = list(ledger.free())
            for i, cores in per_numa:
                after[i] -= cores
            # Built whole: `_replace` maps a dict over every field, twice the cost (a new model's first /filter of
            # 500 nodes finishes about 450 plans).
            return Fit._make((ledger.name, *planned[1:4], _score(ledger, after, strategy, memory_after), *planned[5:]))
    why = result.why
    if ledger.unsettled and why is not None and result.resolvable and not isinstance(why, reasons.PlacementUnknown):
        return result._replace(why=reasons.Unsettled(why))
    return result


def shape_key(ledger: NodeLedger) -> tuple[Any, ...]:
    """What `fit` reads of a node that only a rebuild changes: its shape, its policy and the plugin's state."""
    nri_state = ledger.nri
    return (ledger.capacity, ledger.threads_per_core, id(nri_state.policy), nri_state.status, len(ledger.reserved),
            ledger.shared_pool_cpus, ledger.numa_memory, id(ledger.kubelet))


def plan_key(demand: ModelDemand, ledger: NodeLedger) -> tuple[Any, ...]:
    """Everything else `plan(demand, ledger)` reads, which the ledger's holdings change. Two ledgers with equal
    `shape_key` and `plan_key` get the same plan, and with equal `fit_key` too the same answer
    (tests/test_ledger_fit.py holds this to `fit` itself), so the extender answers nodes of one class with one
    `plan` and one `finish`. Kept here, beside `fit`, so that a new input is added to both."""
    key: tuple[Any, ...] = (ledger.free(), ledger.unsettled > 0, ledger.lends_reserved and ledger.unlent_free(),
                            ledger.guessed, ledger.free_paired(), ledger.free_threads())
    if demand.policy == "nri-balloons":
        btype = _balloon_type(demand, ledger)
        # Whose next balloon depends on how many there are: maxBalloons, or filled before a new one is made.
        if btype is not None and (btype.max_balloons > 0 or not btype.prefer_new_balloons):
            key += (ledger.count_balloons(btype.name),)
        key += (ledger.instance_key,  # balance-balloons picks the component type with the fewest instances
                ledger.leaving_key())
        if demand.shared_milli:
            key += (ledger.shared_growth(demand.namespace, demand.shared_milli),)
    elif demand.policy == "kubelet-static" and ledger.kstate is not None:
        # The kubelet's answer depends on which CPUs are free, not only how many, and on what its predicate sums.
        state = ledger.kstate
        key += (state.default, state.used,
                None if state.memory is None else (state.memory.free, state.memory.count, state.memory.cells),
                bool(ledger.memory_unknown), tuple(ledger.kubelet_pending), tuple(ledger.kubelet_leaving))
    elif demand.policy not in EXCLUSIVE_POLICIES:
        key += (ledger.shared_milli,
                ledger.shared_growth(demand.namespace, demand.unpinned_milli + demand.shared_milli, containers=True))
    if demand.init_milli:
        key += (ledger.shared_growth(demand.namespace, demand.init_milli),
                ledger.layout_key() if ledger.follows_resizes else ())
    return key


def memory_key(demand: ModelDemand, ledger: NodeLedger) -> tuple[Any, ...]:
    """What `finish` reads beyond `plan_key`: the node's free memory per NUMA node, when the demand pins memory."""
    return (ledger.free_memory(),) if demand.memory_bytes and demand.policy == "nri-balloons" else ()


def fit_key(demand: ModelDemand, ledger: NodeLedger) -> tuple[Any, ...]:
    """`plan_key` and `memory_key`: what `fit(demand, ledger)` reads beyond `shape_key`."""
    return plan_key(demand, ledger) + memory_key(demand, ledger)


def _fit(demand: ModelDemand, ledger: NodeLedger, threads_per_core: int, strategy: str) -> Fit:
    node = ledger.name
    numa_count = len(ledger.capacity)
    span = demand.numa_nodes
    if span > numa_count:
        return _refuse(node, reasons.TpExceedsNuma(demand.tp, demand.pp, demand.dp, numa_count), False)
    policy = demand.policy
    if policy == "nri-balloons":
        return _fit_balloon(demand, ledger, node, strategy)
    fp = _footprint(policy, demand.cpus, ledger.threads_per_core, threads_per_core)
    if fp.exclusive and fp.cores == 0:
        return _refuse(node, reasons.NoCpu(), False, fp)
    if policy == "kubelet-static":
        return _fit_kubelet(demand, ledger, node, fp, strategy)
    if ledger.kubelet is not None and ledger.kstate is not None and demand.kpod is not None:
        # The shared pool of a kubelet-static node: what the kubelet's resource predicate allows.
        answer = kub.admit(ledger.kubelet, ledger.kstate, demand.kpod)
        if isinstance(answer, kub.Rejected):
            return _refuse(node, reasons.PoolTaken(fp), True, fp)
        return Fit(node, None, True, (), _score(ledger, list(ledger.free()), strategy), fp, admitted=answer)
    free = ledger.free()
    if ledger.nri.policy is not None and ledger.nri.running:
        return _fit_shared_balloon(demand, ledger, node, fp, free, strategy)
    return _fit_shared(ledger, node, fp, free, strategy)


def _nri_refusal(demand: ModelDemand, ledger: NodeLedger, node: str) -> Fit:
    policy = ledger.nri.policy
    if policy is None:
        return _refuse(node, reasons.NoBalloonsPolicy(demand.balloon_type), False)
    named = "" if policy.name == f"node.{ledger.name}" else f"{policy.namespace}/{policy.name}"
    if not ledger.nri.running:
        return _refuse(node, reasons.NriNotRunning(ledger.nri.status, named), False)
    known = tuple(t.name for t in policy.balloon_types)
    return _refuse(node, reasons.BalloonTypeUndefined(demand.balloon_type, named, known), False)


def _score(ledger: NodeLedger, free_after: list[int], strategy: str, memory_after: list[int] | None = None) -> int:
    """0..10 by the configured strategy over the node's model cores, and, when the model pins memory, over its
    NUMA memory too, weighted equally as NodeResourcesFit weighs cpu and memory: a node whose memory the model
    would fill is not a better pack than one whose cores it fills."""
    total = ledger.capacity_total
    if total == 0:
        return 0
    value = _strategy_value(free_after, ledger.capacity, total, strategy)
    if memory_after is not None:
        value = (value + _strategy_value(memory_after, ledger.numa_memory, ledger.memory_total, strategy)) / 2
    # A placement that leaves no sliver outranks every one that does: 5..10 against 0..4, the strategy ordering each.
    if _leaves_a_sliver(ledger.free(), free_after):
        return max(0, min(4, math.floor(value * 4 + 0.5)))
    return 5 + max(0, min(5, math.floor(value * 5 + 0.5)))


# A NUMA node left with fewer free cores than this holds no rank of a CPU vLLM model we have seen deployed: those
# cores stay idle until a neighbour leaves. In the 100-node fleet (bench/bench_fleet.py) packing that ignored
# slivers stranded 332 cores, halving a sliver's score 201-236, ranking every sliver below every placement that
# leaves none 156.
SLIVER_CORES = 4


def _leaves_a_sliver(before: Sequence[int], after: Sequence[int]) -> bool:
    return any(0 < a < SLIVER_CORES and a != b for b, a in zip(before, after))


def _strategy_value(free_after: Sequence[int], capacity: Sequence[int], total: int, strategy: str) -> float:
    if strategy == "BalancedAllocation":
        fractions = [1 - f / c for f, c in zip(free_after, capacity) if c > 0]
        return 1 - (max(fractions) - min(fractions)) if fractions else 0.0
    used = total - sum(free_after)
    # MostAllocated packs, so whole NUMA nodes stay free for large models.
    return (total - used) / total if strategy == "LeastAllocated" else used / total


class _Empty(NamedTuple):
    """A demand's balloon on an empty node of one shape and policy, where it fits: what no eviction changes."""

    footprint: Footprint
    step: nri.Step  # the plan `nri.place` walks on the node as it is
    # `nri.variants(step)`, for a node of unknown placements: looked up here, not hashed (a tree of balloon types)
    # for each such node (400 hashes of a new model's first /filter of 500 nodes on the synthetic fleet)
    variants: tuple[nri.Step, ...]
    memory: int  # bytes on each of its NUMA nodes (pinMemory), 0 when not checked


class _NeverFits(NamedTuple):
    why: reasons.Reason
    footprint: Footprint | None


@lru_cache(maxsize=4096)
def _on_empty(policy: BalloonsPolicy, name: str, milli: int, capacity: tuple[int, ...], tpc: int,
              numa_memory: tuple[int, ...], memory_bytes: int, tp: int, pp: int, dp: int) -> _Empty | _NeverFits:
    # Memoised: a fleet has a few shapes and policies, and every node of one answers the same; the key is what
    # the answer reads (a demand or a ledger would hash more, and differ per pod and per node).
    empty = nri.plan_empty(policy, policy.known_type(name), milli, capacity, tpc)
    if not isinstance(empty, nri.Plan):
        if isinstance(empty, (reasons.NoRoomOnOneNuma, reasons.PreferredNumaMissing)):
            return _NeverFits(reasons.ExceedsEmptyNode(empty, max(capacity)), None)
        return _NeverFits(empty, None)
    fp = _balloon_footprint(name, empty.per_numa, empty.cpus)
    span = tp * pp * dp
    memory = 0
    if policy.pin_memory and numa_memory and memory_bytes:
        memory = -(-memory_bytes // span)
        room = sorted(numa_memory, reverse=True)[span - 1]
        if memory > room:
            return _NeverFits(reasons.MemoryExceedsNuma(tp, pp, dp, memory, room), fp)
    if fp.numa_nodes != span:
        return _NeverFits(reasons.TypeSpansFewer(name, fp.numa_nodes, tp, pp, dp), fp)
    step = nri.compile_type(policy, name, milli, tpc)
    return _Empty(fp, step, nri.variants(step), memory)


def _fit_balloon(demand: ModelDemand, ledger: NodeLedger, node: str, strategy: str) -> Fit:
    btype = _balloon_type(demand, ledger)
    policy = ledger.nri.policy
    if btype is None or policy is None or not ledger.nri.running:  # a type only with a policy
        return _nri_refusal(demand, ledger, node)
    milli = demand.cpu_milli
    if milli == 0:
        return _refuse(node, reasons.NoCpu(), False)
    if milli > MAX_REQUEST_MILLI:
        return _refuse(node, reasons.RequestOverShares(demand.cpus, MAX_REQUEST_MILLI // 1000), False)
    empty = _on_empty(policy, btype.name, milli, ledger.capacity, ledger.threads_per_core, ledger.numa_memory,
                      demand.memory_bytes, demand.tp, demand.pp, demand.dp)
    if isinstance(empty, _NeverFits):
        return _refuse(node, empty.why, False, empty.footprint)
    fp = empty.footprint
    never = _init_never_fits(demand, ledger)
    if never is not None:
        return _refuse(node, never, False, fp)
    if btype.max_balloons > 0 and ledger.count_balloons(btype.name) >= btype.max_balloons:
        return _refuse(node, reasons.MaxBalloons(btype.name, btype.max_balloons), True, fp)
    if not btype.prefer_new_balloons and ledger.count_balloons(btype.name):
        # Existing balloons of the type are filled (and inflated) before a new one is made (allocateBalloonOfDef).
        return _refuse(node, reasons.SharesBalloon(btype.name), True, fp)
    free = ledger.free()
    no_room = _init_no_room(demand, ledger, free)
    if no_room is not None:
        return _refuse(node, no_room, True, fp)
    if demand.init_milli and ledger.follows_resizes:
        # Its init containers run first, in a shared balloon that grows for them and shrinks back: its balloon is
        # made where that leaves cores free.
        ledger = ledger.after_init(demand.namespace, demand.init_milli)
        free = ledger.free()
    unlent = ledger.unlent_free() if ledger.lends_reserved else None
    placed = nri.place(policy, empty.step, free, ledger.instances, unlent)
    if not isinstance(placed, nri.Plan):
        return _refuse(node, placed, True, fp)
    fp = _balloon_footprint(btype.name, placed.per_numa, placed.cpus)
    span = fp.numa_nodes
    if span != demand.numa_nodes:
        return _refuse(node, reasons.RanksCrowded(demand.numa_nodes, span), True, fp)
    if ledger.guessed:
        # Where the shared balloons grew is a guess: the balloon must fit wherever they are.
        unsure = sum(ledger.guessed)
        for i, cores in placed.per_numa:
            elsewhere = unsure - ledger.guessed[i]
            if elsewhere and cores + elsewhere > (unlent or free)[i]:
                return _refuse(node, reasons.SharedUnseen(i, elsewhere, ledger.replayed), True, fp)
    # The shared balloons as they may sit instead: their NUMA nodes on two packages, their growth counted in CPUs.
    for other_free, unlent_in, unseen in ((ledger.free_paired(), ledger.unlent_paired, reasons.PackagesUnseen),
                                          (ledger.free_threads(), ledger.unlent_threads, reasons.ThreadsUnseen)):
        if other_free is not None:
            instead = _elsewhere(policy, empty.step, other_free, ledger.instances,
                                 unlent_in(other_free) if unlent is not None else None, placed)
            if instead is not None:
                return _refuse(node, unseen(tuple(n for n, _ in placed.per_numa), instead), True, fp)
    if ledger.leaving:
        # Terminating pods' cores stay held, but the plugin may already have freed them and dropped their balloons,
        # which changes the counts balance-balloons reads and the NUMA node the plugin picks: both must agree.
        settled = ledger.without_leaving()
        instead = _elsewhere(policy, empty.step, settled.free(), settled.instances,
                             settled.unlent_free() if unlent is not None else None, placed)
        if instead is not None:
            return _refuse(node, reasons.PodLeaving(tuple(n for n, _ in placed.per_numa), instead), True, fp)
    if unlent is not None:
        # The plugin takes lent reserved CPUs last and, once it needs some, by hints that may pick them on another
        # NUMA node than the rest of the balloon (the oracle saw 7 cores on one and the 8th on the other).
        short = [(i, cores - unlent[i]) for i, cores in placed.per_numa if cores > unlent[i]]
        if short:
            return _refuse(node, reasons.ReservedLent(*short[0]), True, fp)
    if ledger.unsettled:
        # The instance counts balance-balloons reads are unknown: whichever balloon the plugin makes must fit.
        for variant in empty.variants:
            other = nri.place(policy, variant, free, unlent=unlent)
            if not isinstance(other, nri.Plan) or len(other.per_numa) != span:
                return _refuse(node, reasons.PlacementUnknown(), True, fp)
    after = list(free)
    for i, cores in placed.per_numa:
        after[i] -= cores
    grows = ledger.shared_growth(demand.namespace, demand.shared_milli)
    if grows > sum(after):
        # The plugin fails a container its balloon cannot grow for: the sidecars would not start.
        return _refuse(node, reasons.SidecarsNoRoom(demand.shared_milli, grows, sum(after)), True, fp)
    memory = empty.memory
    # With memory to pin, `finish` scores it: the score weighs the node's free memory too.
    score = 0 if memory else _score(ledger, after, strategy)
    return Fit(node, None, True, placed.per_numa, score, fp, placed.types, memory, ledger.unsettled > 0)


def _elsewhere(policy: BalloonsPolicy, step: nri.Step, free: tuple[int, ...], instances: Mapping[str, int],
               unlent: tuple[int, ...] | None, placed: nri.Plan) -> tuple[int, ...] | None:
    """None when the plugin, on a node of `free` cores per NUMA node, puts the balloon where `placed` has it; else
    the NUMA nodes it puts it on instead, () when not one per rank."""
    other = nri.place(policy, step, free, instances, unlent)
    if isinstance(other, nri.Plan) and other.per_numa == placed.per_numa:
        return None
    return tuple(n for n, _ in other.per_numa) if isinstance(other, nri.Plan) and \
        len(other.per_numa) == len(placed.per_numa) else ()


@lru_cache(maxsize=4096)
def _kubelet_on_empty(node: kub.KubeletNode, pod: kub.KPod) -> kub.Admitted | kub.Rejected:
    # Memoised: a fleet has a few shapes and kubelet settings, and the refusals no eviction changes are theirs.
    return kub.admit(node, kub.new_state(node), pod)


def _not_pinned(pod: kub.KPod | None, container: str) -> str | None:
    """Why the kubelet pins no CPU for the model container; None when it does."""
    if pod is None:
        return "the pod was not read"
    if pod.pod_level:
        return "the pod sets pod-level resources (spec.resources), which switch CPU pinning off"
    if not pod.guaranteed:
        return "the pod is not Guaranteed (every container needs cpu and memory requests equal to its limits)"
    if not any(c.name == container and c.cpus for c in pod.containers):
        return "its CPU request is not a whole number"
    return None


def _fit_kubelet(demand: ModelDemand, ledger: NodeLedger, name: str, fp: Footprint, strategy: str) -> Fit:
    node, state = ledger.kubelet, ledger.kstate
    if node is None or state is None:
        return _refuse(name, reasons.NotKubeletNode(), False, fp)
    pod = demand.kpod
    why = _not_pinned(pod, demand.container)
    if why is not None or pod is None:
        return _refuse(name, reasons.NotPinned(why or ""), False, fp)
    empty = _kubelet_on_empty(node, pod)
    if ledger.memory_unknown and not isinstance(empty, kub.Rejected):
        return _refuse(name, reasons.MemoryPlacementUnknown(len(ledger.memory_unknown)), True, fp)
    answer = empty if isinstance(empty, kub.Rejected) else kub.admit(node, state, pod)
    if isinstance(answer, kub.Rejected):
        never = answer is empty
        asked = pod.pod_cpus() if node.config.topology_scope == kub.POD else demand.cpus
        why_not = reasons.KubeletRejects(answer.reason, answer.message.removeprefix("Pod was rejected: "),
                                         node.config.describe(), asked, node.allocatable_per_numa,
                                         () if never else kub.free_per_numa(node, state))
        return _refuse(name, why_not, not never, fp)
    ahead = _overtaken(node, state, pod, answer, ledger.kubelet_pending)
    if ahead is not None:
        return _refuse(name, reasons.KubeletOrder(ahead), True, fp)
    gone = _freed_first(node, state, pod, answer, ledger.kubelet_leaving)
    if gone is not None:
        return _refuse(name, reasons.KubeletFreeing(gone), True, fp)
    tpc = ledger.threads_per_core
    per_numa, split = _spread(node, answer, demand, tpc)
    if split and node.config.topology_policy in kub.ALIGNING and isinstance(empty, kub.Admitted):
        alone, split_alone = _spread(node, empty, demand, tpc)
        if not split_alone:
            # The operator asked this node for alignment; under pod scope the other containers can take the pod
            # past one NUMA node and leave the model split. With room it keeps each rank local: wait for that.
            return _refuse(name, reasons.KubeletSplits(node.config.describe(), per_numa, alone,
                                                       demand.rank_count), True, fp)
    span = len(per_numa)
    # One NUMA node per rank first (2..10 by the strategy), then ranks sharing a NUMA node (1), then a split (0).
    score = 0 if split else 1 if span < demand.numa_nodes else \
        max(2, _score(ledger, list(kub.free_cores_of(node, answer.default)), strategy))
    return Fit(name, None, True, per_numa, score, fp, admitted=answer, split=split)


def _spread(node: kub.KubeletNode, answer: kub.Admitted, demand: ModelDemand, tpc: int
            ) -> tuple[tuple[tuple[int, int], ...], bool]:
    """The model container's cores per NUMA node where the kubelet puts it, and whether that splits the model.
    vLLM binds rank i to the i-th NUMA node of its CPUs, all of them: a rank short of its share there is as slow
    as one spread, and TP runs at its slowest rank's pace. So each NUMA node must hold whole ranks' shares (the
    fleet benchmark's 6 + 10 cores for TP=2 of 16, and 14 + 2 for TP=4 of 16, were splits)."""
    per_numa = tuple((i, -(-n // tpc)) for i, n in enumerate(node.machine.per_numa(
        answer.cpus.get(demand.container, 0))) if n)
    share = demand.cpus / (demand.numa_nodes * tpc)  # cores per rank
    whole = sum(math.floor(cores / share + 1e-9) for _, cores in per_numa)
    return per_numa, len(per_numa) > demand.numa_nodes or whole < demand.numa_nodes


def _overtaken(node: kub.KubeletNode, state: kub.KState, pod: kub.KPod, answer: kub.Admitted,
               pending: Mapping[str, tuple[str, kub.KPod]]) -> str | None:
    """A pod bound here that the kubelet has not admitted yet, whose admission would change if this one reached the
    kubelet first (rejected, or its containers or this pod's on other CPUs than predicted: the placement persisted
    at bind must be what the kubelet gives); None if none."""
    for uid, (name, other) in pending.items():
        if uid == pod.uid or uid not in state.assigned:
            continue
        first = _unmoved_without(node, state, pod, answer, uid)
        if first is None:
            return name
        second = kub.admit(node, first.state, other)
        if not isinstance(second, kub.Admitted) or dict(second.cpus) != state.assigned[uid]:
            return name
    return None


def _freed_first(node: kub.KubeletNode, state: kub.KState, pod: kub.KPod, answer: kub.Admitted,
                 leaving: Mapping[str, str]) -> str | None:
    """A pod terminating here whose CPUs, if the kubelet has freed them when this one reaches it, change this one's
    (or let it in where it was refused): the placement persisted at bind must be what the kubelet gives whichever
    comes first. None if none."""
    for uid, name in leaving.items():
        if uid in state.assigned and _unmoved_without(node, state, pod, answer, uid) is None:
            return name
    return None


def _unmoved_without(node: kub.KubeletNode, state: kub.KState, pod: kub.KPod, answer: kub.Admitted,
                     uid: str) -> kub.Admitted | None:
    """The kubelet's admission of `pod` with pod `uid`'s CPUs not yet (or no longer) given, when it gives `pod` the
    CPUs of `answer`; None when it rejects `pod` or gives it others."""
    first = kub.admit(node, kub.remove(state, uid), pod)
    return first if isinstance(first, kub.Admitted) and dict(first.cpus) == dict(answer.cpus) else None


def rank_local(demand: ModelDemand, result: Fit) -> bool:
    """Does each of the model's ranks get a NUMA node of its own (kubelet-static: its CPUs span exactly as many NUMA
    nodes as it has ranks, each with a rank's share)?"""
    return result.admitted is None or (len(result.per_numa) == demand.numa_nodes and not result.split)


def _init_never_fits(demand: ModelDemand, ledger: NodeLedger) -> reasons.Reason | None:
    """The pod's init containers need more of the shared balloon they run in than a node of this shape and policy
    can give it: the plugin fails them however few pods run beside."""
    if not demand.init_milli:
        return None
    cores = ledger.shared_cores(demand.namespace, demand.init_milli)
    if cores <= ledger.capacity_total:
        return None
    return reasons.InitExceedsNode(demand.init_milli, ledger.shared_type(demand.namespace), cores,
                                   ledger.capacity_total)


def _init_no_room(demand: ModelDemand, ledger: NodeLedger, free: tuple[int, ...]) -> reasons.Reason | None:
    """The shared balloon the pod's init containers run in cannot grow for them now. They run before any other
    container of the pod, so what is free now is what they have."""
    if not demand.init_milli:
        return None
    grows = ledger.shared_growth(demand.namespace, demand.init_milli)
    if grows <= sum(free):
        return None
    return reasons.InitNoRoom(demand.init_milli, ledger.shared_type(demand.namespace), grows, sum(free))


def _fit_shared_balloon(demand: ModelDemand, ledger: NodeLedger, node: str, fp: Footprint, free: tuple[int, ...],
                        strategy: str) -> Fit:
    """A pod without cores of its own on a node the balloons plugin runs: it serves every container of the pod
    from the shared balloon their namespace routes them to (`default` unless a type claims the namespace), which
    must grow for them, first for its init containers, then for the rest, into free cores only."""
    why = _init_never_fits(demand, ledger)
    if why is not None:
        return _refuse(node, why, False, fp)
    why = _init_no_room(demand, ledger, free)
    if why is not None:
        return _refuse(node, why, True, fp)
    if ledger.shared_growth(demand.namespace, demand.unpinned_milli + demand.shared_milli, containers=True) \
            > sum(free):
        return _refuse(node, reasons.PoolTaken(fp), True, fp)
    return Fit(node, None, True, (), _score(ledger, list(free), strategy), fp)


def _fit_shared(ledger: NodeLedger, node: str, fp: Footprint, free: tuple[int, ...], strategy: str) -> Fit:
    headroom = sum(free) * ledger.threads_per_core + max(0, ledger.shared_pool_cpus - ledger.shared_milli // 1000)
    if fp.cpus > headroom:
        return _refuse(node, reasons.PoolTaken(fp), True, fp)
    return Fit(node, None, True, (), _score(ledger, list(free), strategy), fp)


def placed_cpus(result: Fit) -> tuple[tuple[str, CPUSet], ...]:
    """kubelet-static: each container's exclusive CPUs as the kubelet will give them, for the persisted placement."""
    if result.admitted is None:
        return ()
    return tuple(sorted((name, kub.cpuset(mask)) for name, mask in result.admitted.cpus.items()))


def placed_memory(result: Fit) -> tuple[tuple[str, int, int], ...]:
    """kubelet-static with the Static Memory Manager: each container's memory block, for the persisted placement."""
    if result.admitted is None:
        return ()
    return tuple((name, b.numa, b.size) for name, b in result.admitted.memory.items())


def holding_for(uid: str, demand: ModelDemand, result: Fit, numa_count: int, assumed_at: float | None = None
                ) -> Holding:
    if result.unknown and result.footprint is not None:
        return unknown_holding(uid, demand, result.footprint, numa_count, assumed_at, result.memory)
    return Holding(uid, demand.pod, demand.identity,
                   result.footprint.balloon_type if result.footprint else None,
                   result.per_numa, assumed_at, types=result.types, memory=result.memory)


def unknown_holding(uid: str, demand: ModelDemand, fp: Footprint, numa_count: int, assumed_at: float | None = None,
                    memory: int = 0) -> Holding:
    """A pod whose NUMA nodes cannot be known, charged pessimistically: on every NUMA node, what one of its ranks
    takes (a balloon rank), or all of it (kubelet-static, which may put it all on one)."""
    per = fp.cores_per_numa or fp.cores
    return Holding(uid, demand.pod, demand.identity, fp.balloon_type, tuple((n, per) for n in range(numa_count)),
                   assumed_at, memory=memory, unknown=True)


def place(ledger: NodeLedger, uid: str, demand: ModelDemand, threads_per_core: int, strategy: str,
          assumed_at: float | None = None) -> Fit:
    """`fit`, then hold the cores if it fits. Exclusive demands only hold cores; best-effort ones
    join the shared pool (under NRI the balloon their namespace routes them to)."""
    result = fit(demand, ledger, threads_per_core, strategy)
    if not result.ok:
        return result
    if result.admitted is not None:
        held = holding_for(uid, demand, result, ledger.topology.numa_count, assumed_at) \
            if result.footprint is not None and result.footprint.exclusive else None
        ledger.kubelet_put(kub.rekey(result.admitted.state, demand.kpod.uid if demand.kpod else "", uid), held)
    elif result.footprint is not None and not result.footprint.exclusive:
        ledger.set_shared(uid, demand.unpinned_milli + demand.shared_milli, ledger.shared_type(demand.namespace))
    else:
        ledger.hold(holding_for(uid, demand, result, ledger.topology.numa_count, assumed_at))
    return result
