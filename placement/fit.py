"""Fit and score a model demand on one node, and say why not: the text users read.

`fit` is the one question both the webhook's pre-flight and the extender's filter ask, of the same
ledger; `place` is `fit` followed by `hold`, so the two can never disagree.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from placement.demand import ModelDemand, ModelIdentity
from placement.ledger import Holding, NodeLedger

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


@dataclass(frozen=True, slots=True)
class Fit:
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


def footprint(demand: ModelDemand, ledger: NodeLedger, threads_per_core: int) -> Footprint:
    """The demand's cost on this node. `threads_per_core` is the cluster's SMT width for kubelet-static
    rounding; the node's own width decides how many threads a core is."""
    policy = demand.policy
    tpc = ledger.threads_per_core
    if policy == "nri-balloons":
        btype = ledger.nri.policy.balloon_type(demand.balloon_type) if ledger.nri.policy else None
        # Our own vllm types hide hyperthreads; an unknown type is refused before this matters.
        hide = btype.hide_hyperthreads if btype is not None else True
        cores = demand.footprint_cores(tpc, hide)
        per = math.ceil(cores / demand.tp) if demand.tp > 0 else cores
        return Footprint(policy, demand.tp, per, per * demand.tp, per * demand.tp * tpc, demand.balloon_type, True)
    if policy == "kubelet-static":
        cpus = demand.kubelet_cpus(threads_per_core)
        cores = math.ceil(cpus / tpc)
        return Footprint(policy, 1, 0, cores, cores * tpc, None, True)
    return Footprint(policy, 1, 0, 0, demand.cpus, None, False)


def _refuse(node: str, check: str, reason: str, resolvable: bool, fp: Footprint | None = None) -> Fit:
    return Fit(node, False, check, reason, resolvable, footprint=fp)


def fit(demand: ModelDemand, ledger: NodeLedger, threads_per_core: int, strategy: str,
        own_free: bool = False) -> Fit:
    """Does the demand fit this node now? With `own_free` (admission), capacity held by the same
    model's pods counts as free, so re-deploying or rolling a model is never refused because of its
    own old pods; the scheduler side counts what is held now."""
    node = ledger.name
    numa_count = ledger.topology.numa_count
    if demand.tp > numa_count:
        return _refuse(node, TP_EXCEEDS_NUMA,
                       f"{demand.pod}: TP={demand.tp} needs {demand.tp} NUMA nodes; node {node} has {numa_count}",
                       False)
    if demand.policy == "nri-balloons":
        refusal = _nri_refusal(demand, ledger)
        if refusal is not None:
            return refusal
    fp = footprint(demand, ledger, threads_per_core)
    if fp.exclusive and fp.cores == 0:
        return _refuse(node, NO_CPU, f"{demand.pod}: the model container requests no CPU", False, fp)
    own = demand.identity if own_free else None
    free = ledger.free(exclude=own)
    if fp.policy == "nri-balloons":
        return _fit_balloon(demand, ledger, fp, free, strategy, own)
    if fp.policy == "kubelet-static":
        return _fit_static(demand, ledger, fp, free, strategy)
    return _fit_shared(demand, ledger, fp, free, strategy)


def _nri_refusal(demand: ModelDemand, ledger: NodeLedger) -> Fit | None:
    node = ledger.name
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
    btype = policy.balloon_type(demand.balloon_type)
    if btype is None:
        known = ", ".join(t.name for t in policy.balloon_types) or "none"
        return _refuse(node, BALLOON_TYPE_MISSING,
                       f"{demand.pod}: balloon type {demand.balloon_type} is not defined in {where} "
                       f"that applies to node {node} (types there: {known})", False)
    return None


def _score(ledger: NodeLedger, free_after: list[int], strategy: str) -> int:
    total = sum(ledger.capacity)
    if total == 0:
        return 0
    used = total - sum(free_after)
    if strategy == "LeastAllocated":
        value = (total - used) / total
    elif strategy == "BalancedAllocation":
        fractions = [1 - f / c for f, c in zip(free_after, ledger.capacity) if c > 0]
        value = 1 - (max(fractions) - min(fractions)) if fractions else 0.0
    else:  # MostAllocated: pack, so whole NUMA nodes stay free for large models
        value = used / total
    return max(0, min(10, math.floor(value * 10 + 0.5)))


def _fit_balloon(demand: ModelDemand, ledger: NodeLedger, fp: Footprint, free: tuple[int, ...],
                 strategy: str, own: ModelIdentity | None) -> Fit:
    node = ledger.name
    per = fp.cores_per_numa
    btype = ledger.nri.policy.balloon_type(demand.balloon_type) if ledger.nri.policy else None
    if btype is not None and btype.max_cpus != 0 and fp.cpus > btype.max_cpus:
        cap = "forbids this type on the node" if btype.max_cpus < 0 else f"caps it at maxCPUs={btype.max_cpus}"
        return _refuse(node, BALLOON_TYPE_CAPPED,
                       f"{demand.pod} needs {fp.describe()}; balloon type {btype.name} on node {node} {cap}",
                       False, fp)
    roomy = sum(1 for cap in ledger.capacity if cap >= per)
    if roomy < fp.numa_nodes:
        return _refuse(node, FOOTPRINT_EXCEEDS_NODE,
                       f"{demand.pod} needs {fp.describe()}; node {node} has at most {max(ledger.capacity, default=0)} "
                       f"model cores per NUMA node even when empty ({len(ledger.reserved)} CPUs reserved)",
                       False, fp)
    if btype is not None and btype.max_balloons > 0 \
            and ledger.count_balloons(btype.name, exclude=own) >= btype.max_balloons:
        return _refuse(node, MAX_BALLOONS,
                       f"{demand.pod}: node {node} already runs maxBalloons={btype.max_balloons} "
                       f"{btype.name} balloons", True, fp)
    # As the balloons allocator would: the NUMA nodes with the most free cores, ties to the lowest id.
    order = sorted(range(len(free)), key=lambda i: (-free[i], i))[: fp.numa_nodes]
    if any(free[i] < per for i in order):
        enough = sum(1 for f in free if f >= per)
        return _refuse(node, INSUFFICIENT_FREE,
                       f"{demand.pod} needs {fp.describe()}; node {node} has {fmt_free(ledger, free)} "
                       f"({enough} NUMA node{'s' if enough != 1 else ''} with ≥{per} free, {fp.numa_nodes} needed)",
                       True, fp)
    chosen = tuple(sorted((i, per) for i in order))
    after = list(free)
    for i, cores in chosen:
        after[i] -= cores
    return Fit(node, True, FITS, "", True, chosen, _score(ledger, after, strategy), fp)


def _fit_static(demand: ModelDemand, ledger: NodeLedger, fp: Footprint, free: tuple[int, ...],
                strategy: str) -> Fit:
    node = ledger.name
    if fp.cores > sum(ledger.capacity):
        return _refuse(node, FOOTPRINT_EXCEEDS_NODE,
                       f"{demand.pod} needs {fp.describe()}; node {node} has {sum(ledger.capacity)} model cores "
                       f"even when empty ({len(ledger.reserved)} CPUs reserved)", False, fp)
    if fp.cores > sum(free):
        return _refuse(node, INSUFFICIENT_FREE,
                       f"{demand.pod} needs {fp.describe()}; node {node} has {fmt_free(ledger, free)} "
                       f"({sum(free)} in all)", True, fp)
    order = sorted(range(len(free)), key=lambda i: (-free[i], i))
    # Topology Manager keeps it on one NUMA node when one can hold it; else the fewest NUMA nodes.
    remaining = fp.cores
    chosen: list[tuple[int, int]] = []
    for i in order:
        if remaining == 0:
            break
        take = min(free[i], remaining)
        chosen.append((i, take))
        remaining -= take
    after = list(free)
    for i, cores in chosen:
        after[i] -= cores
    return Fit(node, True, FITS, "", True, tuple(sorted(chosen)), _score(ledger, after, strategy), fp)


def _fit_shared(demand: ModelDemand, ledger: NodeLedger, fp: Footprint, free: tuple[int, ...],
                strategy: str) -> Fit:
    node = ledger.name
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
