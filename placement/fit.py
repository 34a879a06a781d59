"""Fit and score a model demand on one node, and say why not: the text users read.

`fit` is the one question both the webhook's pre-flight and the extender's filter ask, of the same
ledger; `place` is `fit` followed by `hold`, so the two can never disagree.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import NamedTuple

from placement.demand import ModelDemand, ModelIdentity, round_up
from placement.ledger import Holding, NodeLedger
from placement.topology import BalloonType

EXCLUSIVE_POLICIES = ("nri-balloons", "kubelet-static")

# Check ids: one name per refusal, shared by messages, logs and metrics.
FITS = "fits"
TP_EXCEEDS_NUMA = "tp-exceeds-numa"
FOOTPRINT_EXCEEDS_NODE = "footprint-exceeds-node"
BALLOON_TYPE_MISSING = "balloon-type-missing"
BALLOON_TYPE_CAPPED = "balloon-type-max-cpus"
NRI_NOT_RUNNING = "nri-not-running"
MAX_BALLOONS = "max-balloons-reached"
INSUFFICIENT_FREE = "insufficient-free"
NO_CPU = "no-cpu-request"


@dataclass(frozen=True, slots=True)
class Footprint:
    """What a demand costs on a given node."""

    policy: str
    numa_nodes: int  # distinct NUMA nodes it must span (nri-balloons: exactly TP)
    cores_per_numa: int  # nri-balloons: on each of them; kubelet-static: 0 (spread as needed)
    cores: int  # physical cores in total
    cpus: int  # logical CPUs those cores are
    balloon_type: str | None
    exclusive: bool

    def describe(self) -> str:
        if self.policy == "nri-balloons":
            return (f"balloon {self.balloon_type}: {self.numa_nodes} NUMA node{'s' if self.numa_nodes > 1 else ''}"
                    f" × {self.cores_per_numa} cores ({self.cpus} CPUs)")
        if self.policy == "kubelet-static":
            return f"kubelet-static: {self.cores} whole cores ({self.cpus} CPUs)"
        return f"best-effort: {self.cpus} CPUs from the shared pool"


class Fit(NamedTuple):
    # A named tuple, not a frozen dataclass: the extender builds thousands per demand, and a frozen
    # dataclass costs three times as much to build.
    node: str
    ok: bool
    check: str
    reason: str  # empty when it fits
    resolvable: bool  # could evicting pods make it fit?
    per_numa: tuple[tuple[int, int], ...] = ()
    score: int = 0
    footprint: Footprint | None = None


def fmt_free(ledger: NodeLedger, free: tuple[int, ...]) -> str:
    return ", ".join(f"NUMA {i}: {f}/{cap}" for i, (f, cap) in enumerate(zip(free, ledger.capacity))) \
        + " free cores"


@lru_cache(maxsize=4096)
def _footprint(policy: str, cpus: int, tp: int, balloon_type: str, node_tpc: int, hide: bool,
               kubelet_tpc: int) -> Footprint:
    # Memoised: a filter call asks this for one demand of hundreds of nodes of a few shapes.
    if policy == "nri-balloons":
        cores = cpus if hide else math.ceil(cpus / node_tpc)
        per = math.ceil(cores / tp) if tp > 0 else cores
        return Footprint(policy, tp, per, per * tp, per * tp * node_tpc, balloon_type, True)
    if policy == "kubelet-static":
        cores = math.ceil(round_up(cpus, kubelet_tpc) / node_tpc)
        return Footprint(policy, 1, 0, cores, cores * node_tpc, None, True)
    return Footprint(policy, 1, 0, 0, cpus, None, False)


def _balloon_type(demand: ModelDemand, ledger: NodeLedger) -> BalloonType | None:
    policy = ledger.nri.policy
    return policy.balloon_type(demand.balloon_type) if policy is not None else None


def footprint(demand: ModelDemand, ledger: NodeLedger, threads_per_core: int,
              btype: BalloonType | None = None) -> Footprint:
    """The demand's cost on this node. `threads_per_core` is the cluster's SMT width for kubelet-static
    rounding; the node's own width decides how many threads a core is."""
    if btype is None and demand.policy == "nri-balloons":
        btype = _balloon_type(demand, ledger)
    # Our own vllm types hide hyperthreads; an unknown type is refused before this matters.
    hide = btype.hide_hyperthreads if btype is not None else True
    return _footprint(demand.policy, demand.cpus, demand.tp, demand.balloon_type, ledger.threads_per_core, hide,
                      threads_per_core)


def nominal_footprint(demand: ModelDemand, threads_per_core: int, hide_hyperthreads: bool) -> Footprint:
    """The footprint on a node of the cluster's usual SMT width: what the webhook annotates."""
    return _footprint(demand.policy, demand.cpus, demand.tp, demand.balloon_type, threads_per_core,
                      hide_hyperthreads, threads_per_core)


def _refuse(node: str, check: str, reason: str, resolvable: bool, fp: Footprint | None = None) -> Fit:
    return Fit(node, False, check, reason, resolvable, footprint=fp)


def fit(demand: ModelDemand, ledger: NodeLedger, threads_per_core: int, strategy: str,
        own_free: bool = False, name: str | None = None) -> Fit:
    """Does the demand fit this node now? With `own_free` (admission), capacity held by the same
    model's pods counts as free, so re-deploying or rolling a model is never refused because of its
    own old pods; the scheduler side counts what is held now. `name` is how the reason names the node
    (default: its own name); the answer does not depend on it.

    A refusal no eviction can change (`resolvable=False`) is decided before what the node holds is
    read: by the demand and the node's shape alone. The extender shares such refusals between nodes
    of one shape."""
    node = ledger.name if name is None else name
    numa_count = len(ledger.capacity)
    if demand.tp > numa_count:
        return _refuse(node, TP_EXCEEDS_NUMA,
                       f"{demand.pod}: TP={demand.tp} needs {demand.tp} NUMA nodes; node {node} has {numa_count}",
                       False)
    policy = demand.policy
    btype = None
    if policy == "nri-balloons":
        btype = _balloon_type(demand, ledger)
        if btype is None or not ledger.nri.running:
            return _nri_refusal(demand, ledger, node)
    fp = footprint(demand, ledger, threads_per_core, btype)
    if fp.exclusive and fp.cores == 0:
        return _refuse(node, NO_CPU, f"{demand.pod}: the model container requests no CPU", False, fp)
    own = demand.identity if own_free else None
    free = ledger.free(exclude=own)
    if policy == "nri-balloons":
        return _fit_balloon(demand, ledger, node, fp, free, strategy, own, btype)  # type: ignore[arg-type]
    if policy == "kubelet-static":
        return _fit_static(demand, ledger, node, fp, free, strategy)
    return _fit_shared(demand, ledger, node, fp, free, strategy)


def _nri_refusal(demand: ModelDemand, ledger: NodeLedger, node: str) -> Fit:
    policy = ledger.nri.policy
    if policy is None:
        return _refuse(node, BALLOON_TYPE_MISSING,
                       f"{demand.pod}: no BalloonsPolicy applies to node {node}, so balloon {demand.balloon_type} "
                       "cannot be created there", False)
    where = f"BalloonsPolicy {policy.namespace}/{policy.name}"
    if not ledger.nri.running:
        return _refuse(node, NRI_NOT_RUNNING,
                       f"{demand.pod}: the NRI balloons plugin reports {ledger.nri.status} for node {node} in "
                       f"{where}, so it is not pinning CPUs there", False)
    known = ", ".join(t.name for t in policy.balloon_types) or "none"
    return _refuse(node, BALLOON_TYPE_MISSING,
                   f"{demand.pod}: balloon type {demand.balloon_type} is not defined in {where} "
                   f"that applies to node {node} (types there: {known})", False)


def _score(ledger: NodeLedger, free_after: list[int], strategy: str) -> int:
    total = ledger.capacity_total
    if total == 0:
        return 0
    if strategy == "BalancedAllocation":
        fractions = [1 - f / c for f, c in zip(free_after, ledger.capacity) if c > 0]
        value = 1 - (max(fractions) - min(fractions)) if fractions else 0.0
    else:
        used = total - sum(free_after)
        # MostAllocated packs, so whole NUMA nodes stay free for large models.
        value = (total - used) / total if strategy == "LeastAllocated" else used / total
    return max(0, min(10, math.floor(value * 10 + 0.5)))


def _most_free(free: tuple[int, ...], count: int) -> list[int]:
    """The `count` NUMA nodes with the most free cores, ties to the lowest id: the balloons allocator's choice."""
    if count == 1:
        best = max(free)
        return [free.index(best)]
    return sorted(range(len(free)), key=lambda i: (-free[i], i))[:count]


def _fit_balloon(demand: ModelDemand, ledger: NodeLedger, node: str, fp: Footprint, free: tuple[int, ...],
                 strategy: str, own: ModelIdentity | None, btype: BalloonType) -> Fit:
    per = fp.cores_per_numa
    if btype.max_cpus != 0 and fp.cpus > btype.max_cpus:
        cap = "forbids this type on the node" if btype.max_cpus < 0 else f"caps it at maxCPUs={btype.max_cpus}"
        return _refuse(node, BALLOON_TYPE_CAPPED,
                       f"{demand.pod} needs {fp.describe()}; balloon type {btype.name} on node {node} {cap}",
                       False, fp)
    if ledger.capacity_desc[fp.numa_nodes - 1] < per:
        return _refuse(node, FOOTPRINT_EXCEEDS_NODE,
                       f"{demand.pod} needs {fp.describe()}; node {node} has at most {ledger.capacity_desc[0]} "
                       f"model cores per NUMA node even when empty ({len(ledger.reserved)} CPUs reserved)",
                       False, fp)
    if btype.max_balloons > 0 and ledger.count_balloons(btype.name, exclude=own) >= btype.max_balloons:
        return _refuse(node, MAX_BALLOONS,
                       f"{demand.pod}: node {node} already runs maxBalloons={btype.max_balloons} "
                       f"{btype.name} balloons", True, fp)
    order = _most_free(free, fp.numa_nodes)
    if free[order[-1]] < per:
        enough = sum(1 for f in free if f >= per)
        return _refuse(node, INSUFFICIENT_FREE,
                       f"{demand.pod} needs {fp.describe()}; node {node} has {fmt_free(ledger, free)} "
                       f"({enough} NUMA node{'s' if enough != 1 else ''} with ≥{per} free, {fp.numa_nodes} needed)",
                       True, fp)
    after = list(free)
    for i in order:
        after[i] -= per
    chosen = tuple((i, per) for i in sorted(order))
    return Fit(node, True, FITS, "", True, chosen, _score(ledger, after, strategy), fp)


def _fit_static(demand: ModelDemand, ledger: NodeLedger, node: str, fp: Footprint, free: tuple[int, ...],
                strategy: str) -> Fit:
    if fp.cores > ledger.capacity_total:
        return _refuse(node, FOOTPRINT_EXCEEDS_NODE,
                       f"{demand.pod} needs {fp.describe()}; node {node} has {ledger.capacity_total} model cores "
                       f"even when empty ({len(ledger.reserved)} CPUs reserved)", False, fp)
    if fp.cores > sum(free):
        return _refuse(node, INSUFFICIENT_FREE,
                       f"{demand.pod} needs {fp.describe()}; node {node} has {fmt_free(ledger, free)} "
                       f"({sum(free)} in all)", True, fp)
    # Topology Manager keeps it on one NUMA node when one can hold it; else the fewest NUMA nodes.
    remaining = fp.cores
    chosen: list[tuple[int, int]] = []
    for i in _most_free(free, len(free)):
        if remaining == 0:
            break
        take = min(free[i], remaining)
        chosen.append((i, take))
        remaining -= take
    after = list(free)
    for i, cores in chosen:
        after[i] -= cores
    return Fit(node, True, FITS, "", True, tuple(sorted(chosen)), _score(ledger, after, strategy), fp)


def _fit_shared(demand: ModelDemand, ledger: NodeLedger, node: str, fp: Footprint, free: tuple[int, ...],
                strategy: str) -> Fit:
    headroom = sum(free) * ledger.threads_per_core + max(0, ledger.shared_pool_cpus - ledger.shared_milli // 1000)
    if fp.cpus > headroom:
        return _refuse(node, INSUFFICIENT_FREE,
                       f"{demand.pod} needs {fp.describe()}; node {node} has {headroom} CPUs unclaimed",
                       True, fp)
    return Fit(node, True, FITS, "", True, (), _score(ledger, list(free), strategy), fp)


def holding_for(uid: str, demand: ModelDemand, result: Fit, assumed_at: float | None = None) -> Holding:
    return Holding(uid, demand.pod, demand.identity,
                   result.footprint.balloon_type if result.footprint else None,
                   result.per_numa, assumed_at)


def place(ledger: NodeLedger, uid: str, demand: ModelDemand, threads_per_core: int, strategy: str,
          assumed_at: float | None = None) -> Fit:
    """`fit`, then hold the cores if it fits. Exclusive demands only hold cores; best-effort ones
    join the shared pool."""
    result = fit(demand, ledger, threads_per_core, strategy)
    if not result.ok:
        return result
    if result.footprint is not None and not result.footprint.exclusive:
        ledger.set_shared(uid, demand.cpu_milli)
    else:
        ledger.hold(holding_for(uid, demand, result, assumed_at))
    return result
