"""Per-node, per-NUMA model capacity: who holds which cores, what is free.

Capacity is counted in physical cores: a core any of whose threads is reserved is not model
capacity (kubelet's full-pcpus-only and a hide-hyperthreads balloon both need whole cores).
The reserved pool is elastic: shared-pool CPU requests (non-model pods, best-effort model pods)
beyond the CPUs outside model capacity eat model cores too, from the NUMA nodes with the most free.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from placement.demand import ModelIdentity
from placement.topology import BalloonsPolicy, CPUSet, Topology


@dataclass(frozen=True, slots=True)
class Holding:
    """Cores a model pod holds on a node, per NUMA node."""

    uid: str
    pod: str
    identity: ModelIdentity | None
    balloon_type: str | None
    per_numa: tuple[tuple[int, int], ...]  # (NUMA node id, cores)
    assumed_at: float | None = None  # set while only our own /bind vouches for it
    shortfall: int = 0  # cores the pod really uses that did not fit the ledger (an overcommitted node)

    @property
    def cores(self) -> int:
        return sum(c for _, c in self.per_numa)

    @property
    def assumed(self) -> bool:
        return self.assumed_at is not None


class LedgerError(ValueError):
    pass


# One sequence for every ledger: a stamp names one ledger in one state, so a reader that derived
# something from a ledger knows it is still true while the stamp it saw is the ledger's stamp.
_stamps = itertools.count()


@dataclass(frozen=True, slots=True)
class NodeNRI:
    """What the NRI balloons plugin offers on a node."""

    policy: BalloonsPolicy | None
    status: str | None  # the plugin's own report in the policy status; None when absent

    @property
    def running(self) -> bool:
        # Absent status is taken as working: older plugins do not report it.
        return self.policy is not None and self.status in (None, "Success")


@dataclass(slots=True)
class NodeLedger:
    name: str
    topology: Topology
    reserved: CPUSet
    reserved_source: str
    labels: Mapping[str, str]
    nri: NodeNRI
    capacity: tuple[int, ...] = field(init=False)  # model cores per NUMA node
    capacity_desc: tuple[int, ...] = field(init=False)  # the same, largest first
    capacity_total: int = field(init=False)
    shared_pool_cpus: int = field(init=False)  # logical CPUs outside model capacity: reserved + orphan siblings
    holdings: dict[str, Holding] = field(default_factory=dict)
    shared: dict[str, int] = field(default_factory=dict)  # uid -> shared-pool CPU request, millicores
    _held: list[int] = field(init=False)
    _shared_total: int = field(init=False, default=0)
    _free: tuple[int, ...] | None = field(init=False, default=None)
    stamp: int = field(init=False, default_factory=lambda: next(_stamps))  # changes with every change
    _by_identity: dict[ModelIdentity, dict[str, Holding]] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        self.capacity = tuple(
            sum(1 for core in numa.cores if not any(t in self.reserved for t in core.threads))
            for numa in self.topology.numa_nodes
        )
        self.capacity_desc = tuple(sorted(self.capacity, reverse=True))
        self.capacity_total = sum(self.capacity)
        self.shared_pool_cpus = len(self.topology.cpus) - self.capacity_total * self.topology.threads_per_core
        self._held = [0] * self.topology.numa_count

    # -- what is free ------------------------------------------------------------------------------

    @property
    def threads_per_core(self) -> int:
        return self.topology.threads_per_core

    @property
    def shared_milli(self) -> int:
        return self._shared_total

    @property
    def elastic_cores(self) -> int:
        """Model cores the shared pool has grown into."""
        excess = self._shared_total - self.shared_pool_cpus * 1000
        if excess <= 0:
            return 0
        return math.ceil(math.ceil(excess / 1000) / self.threads_per_core)

    def free(self, exclude: ModelIdentity | None = None) -> tuple[int, ...]:
        """Free model cores per NUMA node; capacity held by `exclude`'s own pods counts as free."""
        if exclude is not None and exclude in self._by_identity:
            held = list(self._held)
            for h in self._by_identity[exclude].values():
                for numa, cores in h.per_numa:
                    held[numa] -= cores
            return self._spill_elastic(held)
        if self._free is None:
            self._free = self._spill_elastic(self._held)
        return self._free

    def _spill_elastic(self, held: list[int]) -> tuple[int, ...]:
        free = [cap - h for cap, h in zip(self.capacity, held)]
        for _ in range(min(self.elastic_cores, sum(self.capacity))):
            # The shared pool grows where most is free, as the balloons allocator would inflate it.
            i = max(range(len(free)), key=lambda k: (free[k], -k))
            if free[i] <= 0:
                break
            free[i] -= 1
        return tuple(max(0, f) for f in free)

    # -- changes -----------------------------------------------------------------------------------

    def hold(self, holding: Holding) -> None:
        """Record a placement computed by `fit`; refuses one that does not fit what is free."""
        if holding.uid in self.holdings:
            raise LedgerError(f"pod {holding.pod} ({holding.uid}) already holds cores on node {self.name}")
        free = self.free()
        for numa, cores in holding.per_numa:
            if not 0 <= numa < len(free) or cores < 0 or cores > free[numa]:
                raise LedgerError(
                    f"pod {holding.pod} wants {cores} cores on NUMA node {numa} of node {self.name}, "
                    f"which has {free[numa] if 0 <= numa < len(free) else 'no such NUMA node'} free"
                )
        self._add(holding)

    def _add(self, holding: Holding) -> None:
        for numa, cores in holding.per_numa:
            self._held[numa] += cores
        self.holdings[holding.uid] = holding
        if holding.identity is not None:
            self._by_identity.setdefault(holding.identity, {})[holding.uid] = holding
        self._free = None
        self.stamp = next(_stamps)

    def force_hold(self, holding: Holding) -> None:
        """Record a pod that already runs here even if it does not fit: it really uses the cores,
        so what fits is taken and the rest is kept as `shortfall`."""
        free = list(self.free())
        placed: list[tuple[int, int]] = []
        short = 0
        for numa, cores in holding.per_numa:
            take = min(cores, max(free[numa], 0))
            free[numa] -= take
            short += cores - take
            if take:
                placed.append((numa, take))
        self._add(Holding(holding.uid, holding.pod, holding.identity, holding.balloon_type,
                          tuple(placed), holding.assumed_at, holding.shortfall + short))

    def release(self, uid: str) -> Holding | None:
        holding = self.holdings.pop(uid, None)
        if holding is None:
            return None
        for numa, cores in holding.per_numa:
            self._held[numa] -= cores
        if holding.identity is not None:
            group = self._by_identity.get(holding.identity)
            if group is not None:
                group.pop(uid, None)
                if not group:
                    del self._by_identity[holding.identity]
        self._free = None
        self.stamp = next(_stamps)
        return holding

    def set_shared(self, uid: str, milli: int) -> None:
        self._shared_total += milli - self.shared.get(uid, 0)
        if milli:
            self.shared[uid] = milli
        else:
            self.shared.pop(uid, None)
        self._free = None
        self.stamp = next(_stamps)

    def drop_shared(self, uid: str) -> None:
        self.set_shared(uid, 0)

    def count_balloons(self, balloon_type: str, exclude: ModelIdentity | None = None) -> int:
        return sum(
            1 for h in self.holdings.values()
            if h.balloon_type == balloon_type and (exclude is None or h.identity != exclude)
        )

    def scratch(self, without: ModelIdentity | None = None) -> NodeLedger:
        """A copy to simulate on, without the pods of `without` (a model's own pods are being replaced)."""
        copy = NodeLedger(self.name, self.topology, self.reserved, self.reserved_source, self.labels, self.nri)
        for holding in self.holdings.values():
            if without is None or holding.identity != without:
                copy._add(holding)
        for uid, milli in self.shared.items():
            copy.set_shared(uid, milli)
        return copy

    # -- views -------------------------------------------------------------------------------------

    def to_json(self) -> dict[str, object]:
        free = self.free()
        numa_json = []
        for numa in self.topology.numa_nodes:
            held = [
                {"pod": h.pod, "uid": h.uid, "cores": c, "balloon": h.balloon_type, "assumed": h.assumed}
                for h in self.holdings.values() for n, c in h.per_numa if n == numa.id
            ]
            numa_json.append({
                "numa": numa.id,
                "cpus": str(numa.cpus),
                "cores": len(numa.cores),
                "reserved": str(self.reserved & numa.cpus),
                "capacity": self.capacity[numa.id],
                "held": held,
                "free": free[numa.id],
            })
        return {
            "node": self.name,
            "topology": {"source": self.topology.source, "numa_nodes": self.topology.numa_count,
                         "threads_per_core": self.threads_per_core, "cpus": len(self.topology.cpus)},
            "reserved": {"cpuset": str(self.reserved), "source": self.reserved_source},
            "nri": {"policy": (f"{self.nri.policy.namespace}/{self.nri.policy.name}" if self.nri.policy else None),
                    "status": self.nri.status, "running": self.nri.running},
            "shared_pool": {"cpus": self.shared_pool_cpus, "requested_milli": self._shared_total,
                            "elastic_cores": self.elastic_cores},
            "numa": numa_json,
        }
