"""How a pod's record becomes holdings on its node's ledger: observed (the balloons the plugin exports), else
persisted (where our /bind put it), else claimed (an exported balloon of its type no other pod holds), else
unknown (charged wherever it could be). Pure functions over a ledger; the cluster state calls them as it builds
or updates one.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from placement import fit as fitmod
from placement import kubelet as kub
from placement import kubeletnode, reasons
from placement import nri as nrimod
from placement.balloonspolicy import BalloonsPolicy
from placement.demand import ModelDemand, Routed
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
    def routed(self) -> tuple[Routed, ...]: ...
    @property
    def init_milli(self) -> int: ...
    @property
    def initializing(self) -> bool: ...
    @property
    def created(self) -> str: ...
    @property
    def started(self) -> bool: ...
    @property
    def kpod(self) -> kub.KPod | None: ...
    @property
    def phase(self) -> str: ...
    @property
    def shared_steps(self) -> tuple[tuple[str, int], ...]: ...


@dataclass(frozen=True, slots=True)
class Observed:
    """The balloons the plugin reports on one node: which holds each container, and where its cores are."""

    balloons: Mapping[str, tuple[tuple[int, int], ...]]  # balloon zone name -> (NUMA node, cores) it holds
    shared_cores: Mapping[str, frozenset[int]]  # balloon -> its cores that another balloon also holds
    container_balloon: Mapping[str, str]  # "namespace/pod/container" -> balloon zone name
    outside_reserved: tuple[int, ...]  # per NUMA node: cores beyond the reserved cpuset the shared balloons hold
    shared: frozenset[str]  # the balloons of shared types (reserved, default, routed by namespace)
    idle_lent: tuple[int, ...] = ()  # per NUMA node: lent reserved cores no balloon holds
    # `outside_reserved` by shared balloon type
    outside_by_type: Mapping[str, tuple[int, ...]] = field(default_factory=dict)

    def unclaimed(self) -> dict[str, tuple[tuple[int, int], ...]]:
        """The model balloons no exported container zone names: those of pods whose containers the plugin does not
        list (showContainersInNrt off), for pods of recorded or unknown placement to claim."""
        named = set(self.container_balloon.values())
        return {name: per_numa for name, per_numa in sorted(self.balloons.items())
                if name not in named and not name.startswith(("reserved[", "default["))}


def claim(zones: dict[str, tuple[tuple[int, int], ...]], balloon_type: str, numa: set[int] | None,
           cores: int, exact: bool = False) -> str | None:
    """Take from `zones` a balloon of `balloon_type` (the plugin names each `<type>[<instance>]`), on NUMA nodes
    `numa` when given: the first whose cores are `cores`, else (unless `exact`) the first."""
    mine = [name for name in zones if name.startswith(balloon_type + "[")]
    if numa is not None:
        mine = [name for name in mine if {n for n, _ in zones[name]} == numa]
    name = next((n for n in mine if sum(c for _, c in zones[n]) == cores), None if exact or not mine else mine[0])
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
    by_type: dict[str, list[int]] = {}
    for name, held in cores.items():
        if (btype := name.rsplit("[", 1)[0]) in shared_types:
            outside = by_type.setdefault(btype, [0] * topo.numa_count)
            for numa, _ in held - reserved_cores:
                outside[numa] += 1
    lent_cores = {core_of[c] for c in lent or () if c in core_of} - holders.keys()
    return Observed(
        {name: tuple(sorted(count_of(numa for numa, _ in held).items())) for name, held in cores.items()},
        {name: frozenset(c for _, c in held if holders[(_, c)] > 1) for name, held in cores.items()},
        dict(nrt["containers"]),
        tuple(sum(column) for column in zip(*by_type.values())) if by_type else (0,) * topo.numa_count,
        frozenset(name for name in cores if name.rsplit("[", 1)[0] in shared_types),
        tuple(sum(1 for numa, _ in lent_cores if numa == n) for n in range(topo.numa_count)) if lent else (),
        {btype: tuple(outside) for btype, outside in by_type.items()},
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



def routed_demand(ledger: NodeLedger, rec: Record) -> tuple[ModelDemand, int | None, int] | None:
    """What the plugin makes of a pod that is no model pod but whose balloon annotation routes containers to a
    dedicated type of the node's policy (one no namespace routes to): a balloon of that type, as it would make for
    a model container, holding them all (a pod's second container joins its first one's balloon: FillSamePod). As
    a model demand of as many ranks as the type spans, so it is held as a model's balloon is, with what its other
    containers request (CPU, None when there are none, and memory). Containers routed to a second dedicated type
    stay with those others: no pod has been seen to do that. None when no container is routed so, or the plugin
    could not make the balloon even on an empty node (it fails the container: the pod is counted as before)."""
    policy = ledger.nri.policy
    if not rec.routed or policy is None or not ledger.nri.running:
        return None
    dedicated = [r for r in rec.routed if r.balloon_type is not None and r.balloon_type not in policy.shared_types
                 and policy.balloon_type(r.balloon_type) is not None]
    if not dedicated:
        return None
    first = dedicated[0]
    mine = [r for r in dedicated if r.balloon_type == first.balloon_type]
    # A balloon holds at least 1 CPU, whatever its containers request.
    milli = max(1, sum(r.cpu_milli for r in mine))
    memory = sum(r.memory_bytes for r in mine)
    btype = policy.known_type(str(first.balloon_type))
    empty = nrimod.plan_empty(policy, btype, milli, ledger.capacity, ledger.threads_per_core)
    if not isinstance(empty, nrimod.Plan):
        return None
    demand = ModelDemand(pod=f"{rec.namespace}/{rec.name}", identity=None, container=first.container,
                         tp=len(empty.per_numa), tp_source=f"balloon type {btype.name}",
                         requested_policy="nri-balloons", resolved_policy="nri-balloons", balloon_type=btype.name,
                         cpu_milli=milli, preflight="skip", require_amx=False, node_pin=None, problems=(),
                         memory_bytes=memory, namespace=rec.namespace)
    others = None if len(mine) == len(rec.routed) else max(0, (rec.shared_milli or 0) - milli)
    return demand, others, max(0, rec.shared_memory - memory)


def account(ledger: NodeLedger, rec: Record, fit: Fitter, log: Log, observed: Observed | None = None,
            unclaimed: dict[str, tuple[tuple[int, int], ...]] | None = None,
            unplaced: Mapping[str, int] | None = None) -> None:
    """Hold what pod `rec` takes on its node's ledger: where the plugin's export shows it, else where its persisted
    placement says, else a balloon of its type no other pod claims, else wherever it could be (unknown). A pod
    that is no model pod is held so too where its balloon annotation puts containers in a dedicated balloon: the
    plugin routes by the annotation, whatever the pod's labels. `unplaced`: per balloon type, the pods here of no
    persisted placement, each of which needs one of the `unclaimed` balloons."""
    if ledger.kubelet is not None:
        account_kubelet(ledger, rec, log)
        if rec.leaving:
            ledger.mark_leaving(rec.uid)
        return
    demand = rec.model
    balloon = ledger.shared_type(rec.namespace)
    # What the pod's other containers request, beside the one with cores of its own.
    milli, memory = rec.shared_milli, rec.shared_memory
    if demand is None and (routed := routed_demand(ledger, rec)) is not None:
        demand, milli, memory = routed
    # Where the ledger follows the shared balloons resize by resize, a pod's init containers moved them once, before
    # its other containers started, and hold their cores aside while they run; elsewhere they count as shared
    # containers while they run, as the kubelet's effective request does.
    cycled = bool(rec.init_milli) and ledger.init_cycle(rec.uid, rec.namespace, rec.init_milli)
    init = rec.init_milli if rec.initializing and not cycled else 0
    if demand is None or demand.policy not in fitmod.EXCLUSIVE_POLICIES:
        ledger.set_shared(rec.uid, max((milli or 0) + (demand.unpinned_milli if demand else 0), init), balloon,
                          memory + (demand.memory_bytes if demand else 0), _steps(rec, None))
        ledger.set_initializing(rec.uid, cycled and rec.initializing)
        return
    held = _hold_model(ledger, rec, demand, balloon, fit, log, observed, unclaimed, unplaced or {}, (milli, memory),
                       init)
    if rec.leaving:
        # The fleet benchmark caught this: a ledger that counted a terminating pod's balloon, gone from the node,
        # foresaw the next balloon on another NUMA node than the plugin chose, and admitted a pod it then split
        # (`fit` now forecasts with and without such pods).
        ledger.mark_leaving(rec.uid)
    if held and (milli is not None or init):
        # After the model's cores: the kubelet creates the model container before the sidecars listed after it,
        # and their balloon grows from what the model's balloon left (the plugin did so on a full NUMA node). For
        # native sidecars and containers listed before the model, which start first, the order is a guess; live
        # and rebuilt ledgers use the same one.
        ledger.set_shared(rec.uid, max(milli or 0, init), balloon, memory, _steps(rec, demand.container))
    ledger.set_initializing(rec.uid, cycled and rec.initializing)


def _steps(rec: Record, skip: str | None) -> tuple[int, ...]:
    """The CPU of pod `rec`'s containers in its shared balloon, one by one as they start, less container `skip`
    (a model container with cores of its own)."""
    return tuple(milli for name, milli in rec.shared_steps if name != skip)


def _hold_model(ledger: NodeLedger, rec: Record, demand: ModelDemand, balloon: str, fit: Fitter, log: Log,
                observed: Observed | None, unclaimed: dict[str, tuple[tuple[int, int], ...]] | None,
                unplaced: Mapping[str, int], others: tuple[int | None, int], init: int) -> bool:
    """`account` for the model container; False when the pod's other containers (`others`: their CPU and memory;
    `init`, its init containers' CPU while they count as shared) were put into the shared pool with it."""
    zone = observed.container_balloon.get(f"{rec.namespace}/{rec.name}/{demand.container}") if observed else None
    if zone is not None and observed is not None:
        hold_observed(ledger, rec, demand, zone, observed, fit)
        return True
    result = fit(demand, ledger)
    if result.footprint is None or result.check in (reasons.BALLOON_TYPE_MISSING, reasons.NRI_NOT_RUNNING):
        # No balloon can exist for it there: it really runs in the shared pool.
        ledger.set_shared(rec.uid, max((others[0] or 0) + demand.unpinned_milli, init), balloon,
                          others[1] + demand.memory_bytes, _steps(rec, None))
        return False
    fp = result.footprint
    placed = rec.placed
    # A terminating pod's balloon may be gone from the export already (the kubelet removed its containers): it
    # is held where its placement says, as a pod not started yet, never in a balloon some other pod may own.
    spare = spare_balloons(unclaimed, demand.balloon_type, unplaced) if placed is not None else 1
    if placed is not None and placement_agrees(ledger, demand, fp, placed) \
            and export_agrees(unclaimed, demand, placed, rec.phase != "Pending" and not rec.leaving, spare):
        hold_placed(ledger, rec, demand, placed)
        return True
    # Not from a list (the plugin's placement depends on the order of creates and deletes), or not where the
    # placement says (two pods bound moments apart that the kubelet started in the other order): from a balloon of
    # its type that no pod of known placement holds, when the plugin exports its balloons; one of its size first,
    # wherever it is. A pod of known placement takes none that the pods of unknown placement need: its own may be
    # missing from an export written before it started.
    zone = None
    if unclaimed and demand.policy == "nri-balloons" and spare > 0:
        zone = claim(unclaimed, demand.balloon_type, None, fp.cores, exact=True)
        if zone is None and placed is not None:
            zone = claim(unclaimed, demand.balloon_type, {n for n, _ in placed.per_numa}, fp.cores)
        zone = zone or claim(unclaimed, demand.balloon_type, None, fp.cores)
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


def placement_agrees(ledger: NodeLedger, demand: ModelDemand, fp: fitmod.Footprint, placed: Placed) -> bool:
    """Can the pod run where its persisted placement says? On this node, with the cores it asks for now (a resized
    pod's record is stale), on NUMA nodes the node has; for a balloon, on one NUMA node per rank, its own type the
    first of the types it instantiates and each of them one the node's policy defines. Anything else is a stale or
    foreign value, no placement."""
    if placed.node != ledger.name or placed.cores != fp.cores \
            or any(n >= ledger.topology.numa_count for n, _ in placed.per_numa):
        return False
    if demand.policy != "nri-balloons":
        return True
    return len(placed.per_numa) == demand.numa_nodes and types_agree(ledger, demand, placed)


def types_agree(ledger: NodeLedger, demand: ModelDemand, placed: Placed) -> bool:
    """The balloon types a persisted placement records (what balance-balloons counts): the pod's own type first,
    each one the node's policy defines."""
    policy = ledger.nri.policy
    return placed.types[:1] == (demand.balloon_type,) and policy is not None \
        and all(policy.balloon_type(t) is not None for t in placed.types)


def spare_balloons(unclaimed: Mapping[str, tuple[tuple[int, int], ...]] | None, balloon_type: str | None,
                   unplaced: Mapping[str, int]) -> int:
    """Balloons of the type no pod claims beyond those the pods of unknown placement need."""
    if not unclaimed or balloon_type is None:
        return 0
    return sum(1 for name in unclaimed if name.startswith(balloon_type + "[")) - unplaced.get(balloon_type, 0)


def export_agrees(unclaimed: dict[str, tuple[tuple[int, int], ...]] | None, demand: ModelDemand, placed: Placed,
                  started: bool, spare: int) -> bool:
    """Where the plugin exports its balloons (`unclaimed`: those no exported container zone names), a persisted
    placement holds where a balloon of the pod's type lies on its NUMA nodes (claimed for it here; for a `started`
    pod, one of its size). Where none does, it holds for a pod not `started` (bound, its balloon perhaps not made
    yet), and for a started one while no balloon of its type is left unheld (`spare`); one that is, elsewhere, is
    where the pod really is."""
    if unclaimed is None or demand.policy != "nri-balloons":
        return True
    if claim(unclaimed, demand.balloon_type, {n for n, _ in placed.per_numa}, placed.cores, exact=started) is not None:
        return True
    return not started or spare <= 0


def exported_where_placed(rec: Record, unclaimed: Mapping[str, tuple[tuple[int, int], ...]] | None) -> bool:
    """Does the export show a balloon of the pod's type on the NUMA nodes its persisted placement names? Such pods
    claim theirs first, so that a started pod whose placement the export contradicts takes a balloon no placement
    accounts for."""
    placed, demand = rec.placed, rec.model
    if placed is None or demand is None or not unclaimed:
        return False
    numa = {n for n, _ in placed.per_numa}
    return any(name.startswith(demand.balloon_type + "[") and {n for n, _ in zones} == numa
               for name, zones in unclaimed.items())


def hold_placed(ledger: NodeLedger, rec: Record, demand: ModelDemand, placed: Placed) -> None:
    """Hold the pod where its persisted placement says (`placement_agrees` has checked it)."""
    ledger.force_hold(Holding(rec.uid, demand.pod, demand.identity,
                              demand.balloon_type if demand.policy == "nri-balloons" else None, placed.per_numa,
                              rec.assumed_at, types=placed.types,
                              memory=rank_memory(ledger, demand, len(placed.per_numa))))

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
    if placed is not None and placed.node == ledger.name and {n for n, _ in placed.per_numa} == where \
            and types_agree(ledger, demand, placed):
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
    shared = policy.shared_types if policy else ()
    # Lent, the reserved cores are held like any other, and which of them no balloon holds is read off the export.
    kept, lent = (CPUSet(), reserved[0]) if ledger.lends_reserved else (reserved[0], CPUSet())
    observed = observed_balloons(nrt, topo, kept, shared, lent) if nri.running else None
    if observed is not None:
        ledger.observed_shared = observed.outside_reserved
        ledger.observed_idle_lent = observed.idle_lent or None
    # Pods whose placement is known first: one of unknown placement is charged on what they leave free.
    unclaimed = observed.unclaimed() if observed is not None else None
    records = list(records)
    unplaced = Counter(r.model.balloon_type for r in records if r.placed is None and r.model is not None
                       and r.model.balloon_type is not None)
    # Running ones before those the plugin may not have started yet (which take a balloon of another size on their
    # NUMA nodes if one is left), terminating ones last: neither must take the balloon of a pod that runs.
    for rec in sorted(records, key=lambda r: (r.placed is None, r.leaving, r.phase == "Pending",
                                              not exported_where_placed(r, unclaimed), r.created, r.namespace,
                                              r.name)):
        account(ledger, rec, fit, log, observed, unclaimed, unplaced)
    if observed is not None:
        # Where the shared balloons are is what the plugin says, whatever the replay grew: the next resize (a new
        # pod's init containers, a pod bound here before the next export) moves them from there.
        ledger.seat_shared(observed.outside_by_type)
        # Balloons no pod here accounts for (idle ones the policy keeps, or a pod's the list does not show yet)
        # still hold their cores.
        extra = list(observed.outside_reserved)
        for per_numa in (unclaimed or {}).values():
            for numa, cores in per_numa:
                extra[numa] += cores
        ledger.observe_shared(tuple(extra))
    else:
        ledger.mark_replayed()
    ledger.derive()
    return ledger



def placed_as_kubelet_would(ledger: NodeLedger, rec: Record) -> bool:
    """Whether pod `rec`'s persisted placement can be trusted on this kubelet-static node: each container's CPUs as
    many as the kubelet gives it, all of them CPUs of this machine."""
    placed, kpod, node = rec.placed, rec.kpod, ledger.kubelet
    if placed is None or kpod is None or node is None or placed.node != ledger.name or not placed.cpus:
        return False
    want = {c.name: c.cpus for c in kpod.containers if c.cpus and not kpod.pod_level}
    return {name: len(cpus) for name, cpus in placed.cpus} == want and \
        all(kub.mask_of(cpus) & ~node.machine.all == 0 for _, cpus in placed.cpus)


def account_kubelet(ledger: NodeLedger, rec: Record, log: Log) -> bool:
    """Hold what pod `rec` takes on a kubelet-static node: its containers' CPUs where its persisted placement says,
    else where the kubelet would put it now (a guess: the kubelet's choice depends on the order pods came in);
    every pod counts, for a Guaranteed one's exclusive CPUs and for the resource predicate's sums. True when its
    CPUs are known."""
    node, state, kpod = ledger.kubelet, ledger.kstate, rec.kpod
    if node is None or state is None or kpod is None:
        return False
    requested = (kpod.cpu_milli, kpod.memory)
    placed = rec.placed
    known = placed_as_kubelet_would(ledger, rec)
    if known and placed is not None:
        cpus = {name: kub.mask_of(c) for name, c in placed.cpus}
        memory = {name: kub.Block(numa, size) for name, numa, size in placed.memory}
        after = kub.place_known(state, rec.uid, cpus, requested, memory,
                                {c.name for c in kpod.containers if c.kind == "init"})
    else:
        answer = kub.admit(node, state, kpod)
        if isinstance(answer, kub.Admitted):
            cpus, after = dict(answer.cpus), answer.state
        else:
            # It runs although the kubelet, as we know the node, would refuse it: our view of the node is off.
            # Its CPUs are charged wherever they are free, so nothing admitted next counts on them.
            cpus = {}
            pool = kub.available(node, state)
            for c in kpod.containers:
                got = kub.take_packed(node.machine, pool, c.cpus) if c.cpus and not kpod.pod_level else None
                if got:
                    cpus[c.name] = got
                    pool &= ~got
            after = kub.place_known(state, rec.uid, cpus, requested)
            log.warning("pod runs where the kubelet, as modelled, would reject it", extra={
                "pod": f"{rec.namespace}/{rec.name}", "node": ledger.name, "reason": answer.message})
    if rec.phase == "Pending" and not rec.started and cpus:
        ledger.kubelet_pending = {**ledger.kubelet_pending, rec.uid: (f"{rec.namespace}/{rec.name}", kpod)}
    if rec.leaving and cpus:
        ledger.kubelet_leaving = {**ledger.kubelet_leaving, rec.uid: f"{rec.namespace}/{rec.name}"}
    demand = rec.model
    if demand is None:
        ledger.kubelet_put(after)
        return known
    held = 0
    for mask in cpus.values():
        held |= mask
    tpc = ledger.threads_per_core
    per_numa = tuple((i, -(-n // tpc)) for i, n in enumerate(node.machine.per_numa(held)) if n)
    ledger.kubelet_put(after, Holding(rec.uid, demand.pod, demand.identity, None, per_numa, rec.assumed_at,
                                      unknown=not known and bool(held)))
    return known


def build_kubelet_ledger(name: str, labels: Mapping[str, str], topo: Topology, node: kub.KubeletNode,
                         nrt: Mapping[str, Any] | None, numa_memory: tuple[int, ...], records: Iterable[Record],
                         stamps: Stamps, log: Log) -> NodeLedger:
    """A kubelet-static node's ledger: its pods in the order they came, each where its persisted placement says, else
    where the kubelet would have put it then (a guess: the kubelet's choice depends on pods since gone too); then
    the free CPUs per NUMA node that node-feature-discovery publishes are the truth for the pods of unknown
    placement (observed beats predicted); where it publishes none, they are charged on every NUMA node."""
    ledger = NodeLedger(name, topo, kub.cpuset(node.reserved), f"kubelet ({node.config.source})", labels,
                        NodeNRI(None, None), stamps=stamps, numa_memory=numa_memory, kubelet=node)
    unknown = []
    # Pods whose CPUs are known first: a guess about one of unknown placement must not take CPUs a known one holds
    # (both would then count the same CPUs, and the node would look freer than it is).
    for rec in sorted(records, key=lambda r: (not placed_as_kubelet_would(ledger, r), r.created, r.namespace, r.name)):
        if not account_kubelet(ledger, rec, log) and rec.kpod and rec.kpod.exclusive:
            unknown.append(rec.uid)
    published = kubeletnode.zone_available(nrt, topo.numa_count)
    if ledger.kstate is not None and published is not None:
        ledger.kubelet_put(kub.reconcile(node, ledger.kstate, published, unknown, UNSEEN))
    elif ledger.kstate is not None and unknown:
        ledger.kubelet_put(kub.pessimize(node, ledger.kstate, unknown, UNSEEN))
    published_memory = kubeletnode.zone_memory_available(nrt, topo.numa_count)
    state = ledger.kstate
    if state is not None and state.memory is not None and published_memory is not None and unknown:
        memory = kub.reconcile_memory(state.memory, published_memory, unknown)
        if memory is not state.memory:
            moved = state.copy()
            moved.memory = memory
            ledger.kubelet_put(moved)
        if any(ours > theirs for ours, theirs in zip(memory.free, published_memory)):
            # Observed beats predicted in bytes only: where the blocks cannot be made to agree, the groups they
            # formed cannot be read back either.
            ledger.memory_unknown = frozenset(uid for uid in unknown if memory.blocks.get(uid))
    ledger.derive()
    return ledger


# The CPUs node-feature-discovery reports taken that no pod the ledger knows of holds.
UNSEEN = "nodeResourceTopology:unseen"
