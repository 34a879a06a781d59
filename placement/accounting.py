"""How a pod's record becomes holdings on its node's ledger: observed (the balloons the plugin exports), else
persisted (where our /bind put it), else claimed (an exported balloon of its type no other pod holds), else
unknown (charged wherever it could be). Pure functions over a ledger; the cluster state calls them as it builds
or updates one.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from placement import fit as fitmod
from placement import nri as nrimod
from placement import reasons
from placement.balloonspolicy import BalloonsPolicy
from placement.demand import ModelDemand
from placement.ledger import Holding, NodeLedger, NodeNRI, Placed, Stamps
from placement.topology import CPUSet, CPUSetError, Topology

Fitter = Callable[[ModelDemand, NodeLedger], fitmod.Fit]


class Log(Protocol):
    """Where the state reports what an operator should hear of (a logging.Logger is one): the core writes no
    log of its own, the layer that runs it says where the lines go."""

    def info(self, msg: str, *, extra: Mapping[str, object] | None = None) -> None: ...

    def warning(self, msg: str, *, extra: Mapping[str, object] | None = None) -> None: ...


class Record(Protocol):
    """What accounting reads of a pod's record (placement.cluster.PodRecord)."""

    @property
    def uid(self) -> str: ...
    @property
    def namespace(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def model(self) -> ModelDemand | None: ...
    @property
    def shared_milli(self) -> int | None: ...
    @property
    def shared_memory(self) -> int: ...
    @property
    def assumed_at(self) -> float | None: ...
    @property
    def placed(self) -> Placed | None: ...
    @property
    def leaving(self) -> bool: ...
    @property
    def init_milli(self) -> int: ...
    @property
    def initializing(self) -> bool: ...
    @property
    def created(self) -> str: ...


@dataclass(frozen=True, slots=True)
class Observed:
    """The balloons the plugin reports on one node: which holds each container, and where its cores are."""

    balloons: Mapping[str, tuple[tuple[int, int], ...]]  # balloon zone name -> (NUMA node, cores) it holds
    shared_cores: Mapping[str, frozenset[int]]  # balloon -> its cores that another balloon also holds
    container_balloon: Mapping[str, str]  # "namespace/pod/container" -> balloon zone name
    outside_reserved: tuple[int, ...]  # per NUMA node: cores beyond the reserved cpuset the shared balloons hold
    shared: frozenset[str]  # the balloons of shared types (reserved, default, routed by namespace)
    idle_lent: tuple[int, ...] = ()  # per NUMA node: lent reserved cores no balloon holds

    def unclaimed(self) -> dict[str, tuple[tuple[int, int], ...]]:
        """The model balloons no exported container zone names: those of pods whose containers the plugin does not
        list (showContainersInNrt off), for pods of recorded or unknown placement to claim."""
        named = set(self.container_balloon.values())
        return {name: per_numa for name, per_numa in sorted(self.balloons.items())
                if name not in named and not name.startswith(("reserved[", "default["))}


def claim(zones: dict[str, tuple[tuple[int, int], ...]], balloon_type: str, numa: set[int] | None,
           cores: int) -> str | None:
    """Take from `zones` a balloon of `balloon_type` (the plugin names each `<type>[<instance>]`): on NUMA nodes
    `numa` when given, else the first whose cores are `cores`, else the first of the type."""
    mine = [name for name in zones if name.startswith(balloon_type + "[")]
    if numa is not None:
        mine = [name for name in mine if {n for n, _ in zones[name]} == numa]
    name = next((n for n in mine if sum(c for _, c in zones[n]) == cores), mine[0] if mine else None)
    if name is not None:
        del zones[name]
    return name


def observed_balloons(nrt: Mapping[str, Any] | None, topo: Topology, reserved: CPUSet,
                      shared_types: Collection[str] = ("reserved", "default"), lent: CPUSet | None = None
                      ) -> Observed | None:
    """`shared_types`: the balloon types pods land in by namespace, whose growth beyond the reserved cpuset takes
    model cores; a model type's balloons are held by the pods in them (or, unclaimed, counted after them)."""
    if nrt is None:
        return None
    raw = nrt.get("balloons")
    if not raw:
        return None
    core_of = {t: (numa.id, core.id) for numa in topo.numa_nodes for core in numa.cores for t in core.threads}
    cores: dict[str, set[tuple[int, int]]] = {}
    for name, text in raw.items():
        try:
            cores[name] = {core_of[c] for c in CPUSet.parse(text) if c in core_of}
        except CPUSetError:
            continue
    holders: dict[tuple[int, int], int] = {}
    for held in cores.values():
        for core in held:
            holders[core] = holders.get(core, 0) + 1
    reserved_cores = {core_of[c] for c in reserved if c in core_of}
    outside = [0] * topo.numa_count
    for name, held in cores.items():
        if name.rsplit("[", 1)[0] in shared_types:
            for numa, _ in held - reserved_cores:
                outside[numa] += 1
    lent_cores = {core_of[c] for c in lent or () if c in core_of} - holders.keys()
    return Observed(
        {name: tuple(sorted(count_of(numa for numa, _ in held).items())) for name, held in cores.items()},
        {name: frozenset(c for _, c in held if holders[(_, c)] > 1) for name, held in cores.items()},
        dict(nrt["containers"]),
        tuple(outside),
        frozenset(name for name in cores if name.rsplit("[", 1)[0] in shared_types),
        tuple(sum(1 for numa, _ in lent_cores if numa == n) for n in range(topo.numa_count)) if lent else (),
    )


def rank_memory(ledger: NodeLedger, demand: ModelDemand, span: int) -> int:
    """Bytes a pod pins on each of its NUMA nodes (pinMemory): its memory request shared by its ranks."""
    policy = ledger.nri.policy
    if not (ledger.numa_memory and demand.memory_bytes and policy is not None and policy.pin_memory):
        return 0
    return -(-demand.memory_bytes // max(1, span))


def count_of(values: Iterable[int]) -> dict[int, int]:
    out: dict[int, int] = {}
    for v in values:
        out[v] = out.get(v, 0) + 1
    return out



def account(ledger: NodeLedger, rec: Record, fit: Fitter, log: Log, observed: Observed | None = None,
            unclaimed: dict[str, tuple[tuple[int, int], ...]] | None = None) -> None:
    """Hold what pod `rec` takes on its node's ledger: where the plugin's export shows it, else where its persisted
    placement says, else a balloon of its type no other pod claims, else wherever it could be (unknown)."""
    demand = rec.model
    balloon = ledger.shared_type(rec.namespace)
    # Where the ledger follows the shared balloons resize by resize, a pod's init containers moved them once, before
    # its other containers started, and hold their cores aside while they run; elsewhere they count as shared
    # containers while they run, as the kubelet's effective request does.
    cycled = bool(rec.init_milli) and ledger.init_cycle(rec.uid, rec.namespace, rec.init_milli)
    init = rec.init_milli if rec.initializing and not cycled else 0
    if demand is None or demand.policy not in fitmod.EXCLUSIVE_POLICIES:
        ledger.set_shared(rec.uid, max((rec.shared_milli or 0) + (demand.unpinned_milli if demand else 0), init),
                          balloon, rec.shared_memory + (demand.memory_bytes if demand else 0))
        ledger.set_initializing(rec.uid, cycled and rec.initializing)
        return
    held = _hold_model(ledger, rec, demand, balloon, fit, log, observed, unclaimed, init)
    if rec.leaving:
        # The fleet benchmark caught this: a ledger that counted a terminating pod's balloon, gone from the node,
        # foresaw the next balloon on another NUMA node than the plugin chose, and admitted a pod it then split
        # (`fit` now forecasts with and without such pods).
        ledger.mark_leaving(rec.uid)
    if held and (rec.shared_milli is not None or init):
        # After the model's cores: the kubelet creates the model container before the sidecars listed after it,
        # and their balloon grows from what the model's balloon left (the plugin did so on a full NUMA node). For
        # native sidecars and containers listed before the model, which start first, the order is a guess; live
        # and rebuilt ledgers use the same one.
        ledger.set_shared(rec.uid, max(rec.shared_milli or 0, init), balloon, rec.shared_memory)
    ledger.set_initializing(rec.uid, cycled and rec.initializing)


def _hold_model(ledger: NodeLedger, rec: Record, demand: ModelDemand, balloon: str, fit: Fitter, log: Log,
                observed: Observed | None, unclaimed: dict[str, tuple[tuple[int, int], ...]] | None, init: int
                ) -> bool:
    """`account` for the model container; False when its sidecars (and `init`, its init containers' CPU while they
    count as shared) were put into the shared pool with it."""
    zone = observed.container_balloon.get(f"{rec.namespace}/{rec.name}/{demand.container}") if observed else None
    if zone is not None and observed is not None:
        hold_observed(ledger, rec, demand, zone, observed, fit)
        return True
    result = fit(demand, ledger)
    if result.footprint is None or result.check in (reasons.BALLOON_TYPE_MISSING, reasons.NRI_NOT_RUNNING):
        # No balloon can exist for it there: it really runs in the shared pool.
        ledger.set_shared(rec.uid, max((rec.shared_milli or 0) + demand.unpinned_milli, init), balloon,
                          rec.shared_memory + demand.memory_bytes)
        return False
    fp = result.footprint
    placed = rec.placed
    if placed is not None and placed.node == ledger.name and placed.cores == fp.cores \
            and hold_placed(ledger, rec, demand, placed):
        if unclaimed:
            claim(unclaimed, demand.balloon_type, {n for n, _ in placed.per_numa}, placed.cores)
        return True
    # Not from a list (the plugin's placement depends on the order of creates and deletes): from a balloon of
    # its type that no pod of known placement holds, when the plugin exports its balloons.
    zone = claim(unclaimed, demand.balloon_type, None, fp.cores) if unclaimed and demand.policy == "nri-balloons" \
        else None
    if zone is not None and observed is not None:
        hold_observed(ledger, rec, demand, zone, observed, fit, matched=True)
        return True
    # Where it is cannot be known: counted so that nothing admitted next can spread.
    if not result.ok:
        log.warning("pod of unknown placement overcommits its node", extra={
            "pod": demand.pod, "node": ledger.name, "reason": result.reason})
    ledger.hold_unknown(fitmod.unknown_holding(rec.uid, demand, fp, ledger.topology.numa_count, rec.assumed_at,
                                               rank_memory(ledger, demand, fp.numa_nodes)), fp.cores)
    return True


def hold_placed(ledger: NodeLedger, rec: Record, demand: ModelDemand, placed: Placed) -> bool:
    """Hold the pod where its persisted placement says; False when that cannot be where it runs (a NUMA node
    the node lacks, or, for a balloon, not one NUMA node per rank). The caller has checked that it holds the
    cores the pod asks for now (a resized pod's record is stale)."""
    numa_count = ledger.topology.numa_count
    if any(n >= numa_count for n, _ in placed.per_numa) or (
            demand.policy == "nri-balloons" and len(placed.per_numa) != demand.numa_nodes):
        return False
    ledger.force_hold(Holding(rec.uid, demand.pod, demand.identity,
                              demand.balloon_type if demand.policy == "nri-balloons" else None, placed.per_numa,
                              rec.assumed_at, types=placed.types,
                              memory=rank_memory(ledger, demand, len(placed.per_numa))))
    return True

def hold_observed(ledger: NodeLedger, rec: Record, demand: ModelDemand, zone: str, observed: Observed, fit: Fitter,
                  matched: bool = False) -> None:
    """Observed beats predicted: the cores the plugin reports for the pod's balloon, whatever we foresaw.
    The balloon types it instantiates (for balance-balloons' counts) are those its persisted placement
    recorded when the plugin put it there, else the predicted ones when it is where we foresaw; else its type
    and the per-NUMA types of the NUMA nodes it really holds. The recorded ones come first: a per-NUMA type
    whose node lacked room is still the type the plugin counts, wherever it carved the cores from."""
    per_numa = observed.balloons.get(zone, ())
    where = {n for n, _ in per_numa}
    predicted = fit(demand, ledger)
    placed = rec.placed
    if placed is not None and placed.node == ledger.name and {n for n, _ in placed.per_numa} == where:
        types = placed.types
    elif predicted.ok and {n for n, _ in predicted.per_numa} == where:
        types = predicted.types
    else:
        types = types_on(ledger, demand, where)
    # `matched`: its balloon is known by type only (no container zone); a prediction says nothing about it.
    notes = []
    if not matched and predicted.ok and {n for n, _ in predicted.per_numa} != where:
        notes.append(f"predicted on NUMA {', '.join(str(n) for n, _ in predicted.per_numa)}")
    if len(per_numa) > demand.numa_nodes:
        notes.append(f"spans {len(per_numa)} NUMA nodes for {demand.ranks}")
    if observed.shared_cores.get(zone):
        notes.append(f"shares {len(observed.shared_cores[zone])} cores with another balloon")
    ledger.force_hold(Holding(rec.uid, demand.pod, demand.identity, demand.balloon_type, per_numa, rec.assumed_at,
                              types=types, observed=True, note="; ".join(notes),
                              memory=rank_memory(ledger, demand, len(per_numa))))

def types_on(ledger: NodeLedger, demand: ModelDemand, numa: set[int]) -> tuple[str, ...]:
    """The balloon types a balloon of the demand's type on NUMA nodes `numa` instantiated (balance-balloons
    counts them all: the composite, its blocks, its per-NUMA components)."""
    policy = ledger.nri.policy
    if policy is None or policy.balloon_type(demand.balloon_type) is None:
        return (demand.balloon_type,)
    step = nrimod.compile_type(policy, demand.balloon_type, demand.cpu_milli, ledger.threads_per_core)
    return nrimod.types_on(policy, step, ledger.capacity, numa) or (demand.balloon_type,)


def build_ledger(name: str, labels: Mapping[str, str], topo: Topology, reserved: tuple[CPUSet, str],
                 policy: BalloonsPolicy | None, nrt: Mapping[str, Any] | None, numa_memory: tuple[int, ...],
                 records: Iterable[Record], stamps: Stamps, fit: Fitter, log: Log) -> NodeLedger:
    """A node's ledger from its resolved inputs (topology, reserved cpuset and where it came from, the policy that
    applies, the plugin's export) and the records of the pods on it."""
    nri = NodeNRI(policy, policy.node_status.get(name) if policy else None)
    ledger = NodeLedger(name, topo, reserved[0], reserved[1], labels, nri, stamps=stamps, numa_memory=numa_memory)
    shared = {"reserved", "default", *(t.name for t in policy.balloon_types if t.namespaces)} if policy else ()
    # Lent, the reserved cores are held like any other, and which of them no balloon holds is read off the export.
    kept, lent = (CPUSet(), reserved[0]) if ledger.lends_reserved else (reserved[0], CPUSet())
    observed = observed_balloons(nrt, topo, kept, shared, lent) if nri.running else None
    if observed is not None:
        ledger.observed_shared = observed.outside_reserved
        ledger.observed_idle_lent = observed.idle_lent or None
    # Pods whose placement is known first: one of unknown placement is charged on what they leave free.
    unclaimed = observed.unclaimed() if observed is not None else None
    for rec in sorted(records, key=lambda r: (r.placed is None, r.created, r.namespace, r.name)):
        account(ledger, rec, fit, log, observed, unclaimed)
    if observed is not None and unclaimed:
        # Balloons no pod here accounts for (idle ones the policy keeps, or a pod's the list does not show yet)
        # still hold their cores.
        extra = list(observed.outside_reserved)
        for per_numa in unclaimed.values():
            for numa, cores in per_numa:
                extra[numa] += cores
        ledger.observe_shared(tuple(extra))
    # Free cores are what every question reads first: computed with the rest of the build (a bulk load's, off the
    # request path), not by the first request that meets the node (issue 39: a new model's first calls).
    ledger.free()
    return ledger

