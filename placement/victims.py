"""Which pods to evict so that a model pod gets its NUMA-local cores on one node: the fewest, all on the
NUMA nodes it then gets, never one a PodDisruptionBudget protects.

kube-scheduler's own preemption dry-runs the in-tree filters only, so it counts CPUs node-wide: it may
evict pods whose cores are on the wrong NUMA node, or (where only our filter refused) find no victim at
all. `choose` answers with the ledger: a set of victims is good when, their holdings released, `fit`
says yes and every core they held is on a NUMA node the pod is then given. A pod whose placement is unknown
(running since before the install, bound by another scheduler) may be a victim too: which NUMA nodes it frees
cannot be known, but the ledger charges those that stay wherever they could be, so `fit` says yes only where the
pod fits whichever that is (issue 39: two such pods on a node, and evicting both was the way). Among the good sets
of the smallest size it prefers no PDB violation, then the lowest priorities, then the fewest cores taken.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import combinations
from typing import Any

from placement.cluster import ClusterState
from placement.demand import ModelDemand
from placement.fit import Fit
from placement.ledger import NodeLedger

MAX_CHECKS = 4096  # fits tried per node: 12 candidate pods up to sets of 4, far more than a node runs


@dataclass(frozen=True, slots=True)
class Candidate:
    """A pod that may be evicted: lower priority than the preemptor, not terminating."""

    uid: str
    pod: str  # namespace/name, for messages
    priority: int = 0
    pdbs: tuple[str, ...] = ()  # namespace/name of the PodDisruptionBudgets that cover it


@dataclass(frozen=True, slots=True)
class Choice:
    node: str
    victims: tuple[Candidate, ...]
    numa: tuple[int, ...]  # the NUMA nodes the pod gets once they are gone
    fit: Fit

    @property
    def uids(self) -> list[str]:
        return [v.uid for v in self.victims]

    def describe(self) -> str:
        pods = ", ".join(v.pod for v in self.victims)
        where = ", ".join(str(n) for n in self.numa)
        return f"evict {pods} on node {self.node} (NUMA node{'s' if len(self.numa) > 1 else ''} {where})"


@dataclass(frozen=True, slots=True)
class Outcome:
    choice: Choice | None
    blocked_by: tuple[str, ...] = ()  # PDBs that forbade every set of victims that would have worked
    leaving: bool = False  # a pod of the node is terminating already: its cores come free without evicting

    @property
    def why_not(self) -> str:
        if self.leaving:
            return "a pod there is terminating already; its cores come free without evicting more"
        if self.blocked_by:
            return ("evicting lower-priority pods would make room, but PodDisruptionBudget "
                    f"{', '.join(self.blocked_by)} allows no more disruptions")
        return "evicting lower-priority pods would not free enough cores on the NUMA nodes it needs"


def violations(victims: Iterable[Candidate], allowed: Mapping[str, int]) -> tuple[str, ...]:
    """The PDBs evicting all of `victims` would take below zero disruptions allowed (as the disruption
    controller and kube-scheduler's filterPodsWithPDBViolation count: each victim spends one of each)."""
    spent: dict[str, int] = {}
    for victim in victims:
        for pdb in victim.pdbs:
            spent[pdb] = spent.get(pdb, 0) + 1
    return tuple(sorted(p for p, n in spent.items() if n > allowed.get(p, 0)))


def _good(cluster: ClusterState, demand: ModelDemand, ledger: NodeLedger, victims: Sequence[Candidate]) -> Fit | None:
    uids = {victim.uid for victim in victims}
    # A pod of unknown placement frees cores no one can name: its eviction is worth it when the pod then fits
    # wherever the pods of unknown placement that stay may be (the ledger charges them so).
    touched = {n for uid in uids if (holding := ledger.holdings.get(uid)) is not None and not holding.unknown
               for n, _ in holding.per_numa}
    result = cluster.fit(demand, ledger.scratch(evicted=uids))
    if not result.ok or not touched <= {n for n, _ in result.per_numa}:
        return None
    return result


def choose(cluster: ClusterState, demand: ModelDemand, ledger: NodeLedger, candidates: Iterable[Candidate],
           allowed: Mapping[str, int], max_checks: int = MAX_CHECKS) -> Outcome:
    """The fewest of `candidates` (only those holding cores on `ledger` count) whose eviction lets `demand`
    fit there, all on the NUMA nodes it then gets; `allowed` is each PDB's disruptions allowed now."""
    holders = [c for c in candidates if c.uid in ledger.holdings]
    # Lowest priority first, then the most cores freed: the first good set of a size is usually the best.
    holders.sort(key=lambda c: (c.priority, -ledger.holdings[c.uid].cores, c.pod))
    checks = 0
    blocked: set[str] = set()
    for size in range(1, len(holders) + 1):
        best: tuple[Any, ...] | None = None
        for combo in combinations(holders, size):
            checks += 1
            if checks > max_checks:
                break
            result = _good(cluster, demand, ledger, combo)
            if result is None:
                continue
            broken = violations(combo, allowed)
            if broken:
                blocked.update(broken)
                continue
            rank = (max(c.priority for c in combo), sum(c.priority for c in combo),
                    sum(ledger.holdings[c.uid].cores for c in combo))
            if best is None or rank < best[0]:
                best = (rank, combo, result)
        if best is not None:
            _, combo, result = best
            numa = tuple(sorted(n for n, _ in result.per_numa))
            return Outcome(Choice(ledger.name, tuple(combo), numa, result))
        if checks > max_checks:
            break
    return Outcome(None, tuple(sorted(blocked)))


def best_node(outcomes: Iterable[Outcome]) -> Choice | None:
    """Of several nodes' choices, the one evicting the fewest pods, then the lowest priorities."""
    choices = [o.choice for o in outcomes if o.choice is not None]
    if not choices:
        return None
    return min(choices, key=lambda c: (len(c.victims), max(v.priority for v in c.victims),
                                       sum(v.priority for v in c.victims), c.node))
