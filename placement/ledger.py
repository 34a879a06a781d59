"""Per-node, per-NUMA model capacity: who holds which cores, what is free.

Capacity is counted in physical cores: a core any of whose threads is reserved is not model
capacity (kubelet's full-pcpus-only and a hide-hyperthreads balloon both need whole cores).
The reserved pool is elastic: shared-pool CPU requests (non-model pods, best-effort model pods)
beyond the CPUs outside model capacity eat model cores too, from the NUMA nodes with the most free.
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from collections.abc import Collection, Container, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

import orjson

from placement import inflation
from placement import kubelet as kub
from placement.balloonspolicy import RESERVED_TYPE, BalloonsPolicy, BalloonType
from placement.demand import ModelIdentity
from placement.topology import CPUSet, Topology


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
    types: tuple[str, ...] = ()  # every balloon type it instantiates: the composite and its components
    observed: bool = False  # per_numa is the cpuset the plugin exported, not our prediction
    note: str = ""  # what is wrong with where the plugin really put it (observed only)
    memory: int = 0  # bytes it takes on each NUMA node it holds (pinMemory: a rank's share of its request)
    # Where it really is cannot be known (no persisted placement, no exported zone): per_numa charges a rank's
    # cores on every NUMA node it could be on, and its balloon types are not counted.
    unknown: bool = False
    # Its pod is terminating: its cores stay held until it is gone, but the kubelet may already have removed its
    # containers, and the plugin its balloons (`NodeLedger.without_leaving`).
    leaving: bool = False
    # Unknown placement: what it could take on each NUMA node before it was charged, and its cores in all; a copy
    # of the ledger without some other pods charges it again from these (`NodeLedger.scratch`).
    asked: tuple[tuple[int, int], ...] = ()
    asked_cores: int = 0

    @property
    def cores(self) -> int:
        return sum(c for _, c in self.per_numa)

    @property
    def assumed(self) -> bool:
        return self.assumed_at is not None


class LedgerError(ValueError):
    pass


PLACEMENT = "cpu-policy.model-manager.io/placement"


class Placed(NamedTuple):
    """Where a model pod was put on its node, as decided at /bind and persisted on the pod (`PLACEMENT`): the
    node agent's placement depends on the order of creates and deletes, which no pod list carries, so a rebuilt
    ledger reads this instead of replaying the list."""

    node: str
    per_numa: tuple[tuple[int, int], ...]  # (NUMA node id, cores)
    types: tuple[str, ...]  # every balloon type instantiated: what balance-balloons counts
    # kubelet-static: each container's exclusive CPUs, as the kubelet's CPU Manager takes them, and its memory
    # block under the Static Memory Manager (NUMA bitmask, bytes)
    cpus: tuple[tuple[str, CPUSet], ...] = ()
    memory: tuple[tuple[str, int, int], ...] = ()

    @property
    def cores(self) -> int:
        return sum(c for _, c in self.per_numa)

    def annotation(self) -> str:
        raw: dict[str, object] = {"node": self.node, "numa": {str(n): c for n, c in self.per_numa},
                                  "types": list(self.types)}
        if self.cpus:
            raw["cpus"] = {name: str(cpus) for name, cpus in self.cpus}
        if self.memory:
            raw["memory"] = {name: [numa, size] for name, numa, size in self.memory}
        return orjson.dumps(raw).decode()

    @classmethod
    def parse(cls, text: object) -> Placed | None:
        """None for anything but what `annotation` writes: a hand-edited or foreign value is no placement."""
        try:
            if not isinstance(text, (str, bytes, bytearray, memoryview)):
                return None
            raw = orjson.loads(text)
            node, numa, types = raw["node"], raw["numa"], raw["types"]
            per_numa = tuple(sorted((int(n), c) for n, c in numa.items()))
            cpus = tuple(sorted((str(name), CPUSet.parse(value)) for name, value in (raw.get("cpus") or {}).items()))
            memory = tuple((str(name), int(n), int(b)) for name, (n, b) in (raw.get("memory") or {}).items())
        except (orjson.JSONDecodeError, TypeError, KeyError, ValueError, AttributeError):
            return None
        if not isinstance(node, str) or not isinstance(types, list) or not all(isinstance(t, str) for t in types) \
                or not all(n >= 0 and type(c) is int and c >= 0 for n, c in per_numa):
            return None
        if any(min(n, b) < 0 for _, n, b in memory):
            return None
        return cls(node, per_numa, tuple(types), cpus, memory)


class Stamps:
    """One sequence for every change to a cluster's ledgers, remembering which node took each of its latest stamps: a
    reader that derived something from every node up to some stamp learns which nodes changed since without
    looking at every node (the extender's verdicts over 1,000 candidates, twice per scheduling cycle). Taken on
    one thread only, like every change to the ledgers (the servers' event loop, where the watches apply their
    events)."""

    def __init__(self, keep: int = 1 << 16) -> None:
        self.taken = 0
        self._names: deque[str] = deque(maxlen=keep)

    def take(self, node: str) -> None:
        self.taken += 1
        self._names.append(node)

    def forget(self) -> None:
        """Every node may have changed (a policy was replaced): `changed_since` knows nothing before now."""
        self._names.clear()

    def changed_since(self, stamp: int) -> list[str] | None:
        """The nodes that took a stamp after `stamp`; None when the sequence no longer remembers so far back."""
        count = self.taken - stamp
        if count > len(self._names):
            return None
        return list(itertools.islice(reversed(self._names), count))


@dataclass(frozen=True, slots=True)
class NodeNRI:
    """What the NRI balloons plugin offers on a node."""

    policy: BalloonsPolicy | None
    status: str | None  # the plugin's own report in the policy status; None when absent

    @property
    def running(self) -> bool:
        # Absent status is taken as working: older plugins do not report it.
        return self.policy is not None and self.status in (None, "Success")


def shared_balloon_cpus(btype: BalloonType, milli: int, reserved: int) -> int:
    """Logical CPUs a non-model balloon takes beyond the reserved cpuset. The plugin sizes a balloon to
    ceil(sum of its containers' requests) and never below 1 CPU (AllocateResources), clamped to the
    type's min/max CPUs; `reserved` starts with the reserved cpuset and grows out of it only when
    its maxCPUs allows."""
    cpus = max(1, math.ceil(milli / 1000), btype.min_cpus)
    if btype.max_cpus:
        cpus = min(cpus, btype.max_cpus)
    if btype.name == RESERVED_TYPE:
        return max(0, cpus - reserved)
    return cpus


def _clamped(values: list[int]) -> tuple[int, ...]:
    # The common case has nothing below zero: one pass to check is cheaper than clamping each value.
    return tuple(values) if min(values, default=0) >= 0 else tuple(max(0, v) for v in values)


@dataclass(slots=True)
class NodeLedger:
    name: str
    topology: Topology
    reserved: CPUSet
    reserved_source: str
    labels: Mapping[str, str]
    nri: NodeNRI
    capacity: tuple[int, ...] = field(init=False)  # model cores per NUMA node
    capacity_total: int = field(init=False)
    shared_pool_cpus: int = field(init=False)  # logical CPUs outside model capacity: reserved + orphan siblings
    holdings: dict[str, Holding] = field(default_factory=dict)
    # uid -> (the balloon type its containers land in, "" off NRI; their CPU request in millicores)
    shared: dict[str, tuple[str, int]] = field(default_factory=dict)
    # The journal this ledger's changes go to: its ClusterState's, shared by all of that cluster's ledgers.
    stamps: Stamps = field(default_factory=Stamps, repr=False, compare=False)
    # Per NUMA node, model cores no model pod holds: capacity less holdings, kept as they change so that the
    # first `free()` after a change is a copy (holdings never exceed capacity: `hold` refuses, `force_hold`
    # clamps).
    _avail: list[int] = field(init=False)
    _shared_total: int = field(init=False, default=0)
    _shared_by_type: dict[str, int] = field(init=False, default_factory=dict)
    _shared_count: dict[str, int] = field(init=False, default_factory=dict)
    # Under the balloons plugin, per shared balloon type: cores per NUMA node it has grown into, applied resize by
    # resize as the plugin does (`placement.inflation`): where it grew depends on what was free then.
    _grown: dict[str, tuple[int, ...]] = field(init=False, default_factory=dict)
    # Where they have grown if this node's NUMA nodes sit on two packages, half each (issue 39: the plugin compares
    # packages first, and no label nor NodeResourceTopology says which NUMA nodes share one): kept beside `_grown`
    # on a node of four NUMA nodes or more, an even number, whose shared balloons grow resize by resize, and no
    # export says where they are. `fit` admits a balloon only where both put it (`free_paired`).
    _paired: dict[str, tuple[int, ...]] = field(init=False, default_factory=dict)
    _packages: tuple[int, ...] = field(init=False, default=())  # that layout: each NUMA node's package; () none
    # `free_paired`'s answer, with the `free()` it was computed beside: every change that moves it makes `free()` anew
    # (fit reads it twice per node, in the plan key and in the plan)
    _paired_free: tuple[tuple[int, ...], tuple[int, ...] | None] | None = field(init=False, default=None)
    # Where they have grown counted in CPUs, container by container, as the plugin resizes them (a core any CPU of
    # which a balloon holds is no model core; an odd CPU leaves its sibling free for the next growth, which may go
    # elsewhere): kept beside `_grown` on a node of SMT whose shared balloons grow resize by resize. `_grown`, in
    # whole cores per pod, is what a ledger replayed from a list holds alike (the CPU-level history of pods gone
    # since is not in a list); the oracle saw the plugin follow this one on live nodes, a model balloon admitted by
    # `_grown` alone spread over two NUMA nodes. `fit` admits a balloon only where both put it (`free_threads`).
    _threads: dict[str, tuple[int, ...]] = field(init=False, default_factory=dict)
    _keeps_threads: bool = field(init=False, default=False)
    _threads_free: tuple[tuple[int, ...], tuple[int, ...] | None] | None = field(init=False, default=None)
    _replayed: set[str] = field(init=False, default_factory=set)  # see `mark_replayed`
    # Where they follow the plugin resize by resize, the pods whose init containers grew a shared balloon and shrank
    # it back (`init_cycle`, once per pod), each with the cores per NUMA node they hold beyond that while they run;
    # and the pods whose init containers run now, whose cores are those.
    _cycled: dict[str, tuple[int, ...]] = field(init=False, default_factory=dict)
    _initializing: set[str] = field(init=False, default_factory=set)
    _instances: dict[str, int] = field(init=False, default_factory=dict)
    _instance_key: tuple[tuple[str, int], ...] | None = field(init=False, default=None)
    _balloons: dict[str, int] = field(init=False, default_factory=dict)  # holdings per balloon type
    _free: tuple[int, ...] | None = field(init=False, default=None)
    # Per NUMA node, cores beyond the reserved cpuset the shared balloons really hold (the plugin's exported
    # zones); None: predicted from their requests.
    observed_shared: tuple[int, ...] | None = None
    # Each shared balloon's size in CPUs as `observed_shared` holds it, once read: a resize since (a pod bound here or
    # gone, an init container, before the next export) moves it by what the resize moves; None while a build
    # replays the node's pods.
    _observed_sizes: dict[str, int] | None = field(init=False, default=None)
    observed_idle_lent: tuple[int, ...] | None = None  # with it, lent reserved cores no balloon holds, per NUMA node
    numa_memory: tuple[int, ...] = ()  # bytes per NUMA node; (): unknown, memory is not checked
    memory_total: int = field(init=False)
    _mem_avail: list[int] = field(init=False)  # the same for memory: NUMA memory less what model pods pin
    _shared_memory: dict[str, int] = field(init=False, default_factory=dict)
    _shared_memory_total: int = field(init=False, default=0)
    _free_memory: tuple[int, ...] | None = field(init=False, default=None)
    _by_identity: dict[ModelIdentity, dict[str, Holding]] = field(init=False, default_factory=dict)
    # The plugin lends the reserved cpuset to other balloons (BalloonsPolicy.lends_reserved): then `_lent` is the
    # reserved cores per NUMA node, counted in `capacity`, and `_kept_cpus` (the CPUs the reserved balloon holds
    # whatever it runs) is 0; otherwise no core is lent and the reserved balloon keeps its whole cpuset.
    lends_reserved: bool = field(init=False)
    # Per NUMA node, cores of shared balloons the ledger puts there by a guess (grown at once, without the history
    # of where each resize went, and no export says where they are); () when none is a guess. Set by `free()`.
    guessed: tuple[int, ...] = field(init=False, default=())
    _lent_held: tuple[int, ...] = field(init=False, default=())  # lent cores the grown-at-once reserved balloon took
    _lent: tuple[int, ...] = field(init=False)
    # Reserved as a CPU count, the reserved balloon starts on the first cores (where `reserved` has them) but its
    # minimum stays wherever it last shrank to (the oracle saw it move to NUMA node 1 after growing there): per NUMA
    # node, its cores, counted among the guessed ones; () for a reserved cpuset, which does not move.
    _floating: tuple[int, ...] = field(init=False, default=())
    _kept_cpus: int = field(init=False)
    unsettled: int = field(init=False, default=0)  # holdings of unknown placement: no NUMA choice can be foreseen
    leaving: int = field(init=False, default=0)  # holdings of terminating pods
    # A node the kubelet's static CPU Manager pins: its machine and settings, and the CPU Manager's state, which
    # decides what it admits next (which CPUs are free, not only how many).
    kubelet: kub.KubeletNode | None = None
    kstate: kub.KState | None = field(init=False, default=None)
    # Pods of unknown placement holding memory of a Static Memory Manager that the node's NodeResourceTopology says
    # is elsewhere than replayed: its NUMA groups, which decide its next hints, are unknown while they run.
    memory_unknown: frozenset[str] = field(init=False, default=frozenset())
    # Pods bound here the kubelet has not admitted yet (Pending, no startTime: an admitted pod pulling its image is
    # Pending for minutes, with its CPUs given): it admits pods in the order they reach it, which binds moments apart
    # do not decide.
    kubelet_pending: dict[str, tuple[str, kub.KPod]] = field(init=False, default_factory=dict)  # uid -> pod, as read
    # Pods terminating here that hold CPUs: the kubelet frees them while the pod terminates, at a moment no object
    # shows, so a pod bound meanwhile may get them or not.
    kubelet_leaving: dict[str, str] = field(init=False, default_factory=dict)  # uid -> "namespace/name"

    def __post_init__(self) -> None:
        policy = self.nri.policy
        self.lends_reserved = policy is not None and self.nri.running and policy.lends_reserved(len(self.reserved))
        reserved_cores = tuple(
            sum(1 for core in numa.cores if any(t in self.reserved for t in core.threads))
            for numa in self.topology.numa_nodes
        )
        # Lent, the reserved cores are model capacity like any other, and the reserved balloon grows from nothing.
        self._lent = reserved_cores if self.lends_reserved else (0,) * len(reserved_cores)
        self._kept_cpus = 0 if self.lends_reserved else len(self.reserved)
        if policy is not None and self.nri.running and policy.reserves_a_count and any(reserved_cores):
            self._floating = reserved_cores
        numa_count = self.topology.numa_count
        if numa_count >= 4 and numa_count % 2 == 0 and self._resized_as_plugin:
            self._packages = tuple(i * 2 // numa_count for i in range(numa_count))
        self._keeps_threads = self.topology.threads_per_core > 1 and self._resized_as_plugin
        self.capacity = tuple(len(numa.cores) - r + lent
                              for numa, r, lent in zip(self.topology.numa_nodes, reserved_cores, self._lent))
        self.capacity_total = sum(self.capacity)
        self.shared_pool_cpus = len(self.topology.cpus) - self.capacity_total * self.topology.threads_per_core
        self._avail = list(self.capacity)
        if self.kubelet is not None:
            self.kstate = kub.new_state(self.kubelet)
        self._mem_avail = list(self.numa_memory) or [0] * self.topology.numa_count
        self.memory_total = sum(self.numa_memory)
        self.stamps.take(self.name)

    # -- what is free ------------------------------------------------------------------------------

    @property
    def threads_per_core(self) -> int:
        return self.topology.threads_per_core

    @property
    def shared_milli(self) -> int:
        return self._shared_total

    @property
    def elastic_cores(self) -> int:
        """Model cores the shared balloons have grown into. Under the balloons plugin each type that non-model
        containers land in is one balloon of its own size; elsewhere, one shared pool beyond the CPUs outside
        model capacity."""
        policy = self.nri.policy
        if policy is None or not self.nri.running:
            excess = self._shared_total - self.shared_pool_cpus * 1000
            return math.ceil(math.ceil(excess / 1000) / self.threads_per_core) if excess > 0 else 0
        # Each balloon takes cores of its own.
        return sum(math.ceil(cpus / self.threads_per_core) for cpus in self._balloon_cpus().values())

    def _balloon_cpus(self) -> dict[str, int]:
        """Each shared balloon's size in CPUs, as the plugin sizes it (nothing without a policy)."""
        policy = self.nri.policy
        if policy is None:
            return {}
        return {name: shared_balloon_cpus(policy.route_type(name), milli, self._kept_cpus)
                for name, milli in self._shared_by_type.items()}

    def observe_shared(self, cores: tuple[int, ...]) -> None:
        """Cores per NUMA node that balloons hold beyond the reserved cpuset and every holding here, as the plugin's
        export says now; the shared balloons' growth from here on is added to it."""
        self.observed_shared = cores
        self._observed_sizes = self._balloon_cpus()
        self._free = None
        self.stamps.take(self.name)

    def derive(self) -> None:
        """Compute what every fit reads first of a node (free cores and memory, the two-package layout's free cores,
        the balloon counts), each kept until the ledger next changes: called at the end of a build, a bulk load's or
        a policy change's, off the request path, so that the first calls that meet a node do not pay for them
        (issue 39: 6.5 µs a node, 3 ms of a new model's first /filter of 500 nodes)."""
        self.free()
        self.free_paired()
        self.free_threads()
        self.free_memory()
        self._instance_key = self.instance_key  # the property keeps what it computes; said so for the linter

    def free(self) -> tuple[int, ...]:
        """Free model cores per NUMA node."""
        if self._free is None:
            self.guessed = self._lent_held = ()
            self._free = self._less_init(self._spill_elastic(self._avail)) if self.kstate is None or \
                self.kubelet is None else kub.free_cores(self.kubelet, self.kstate)
            if self.observed_shared is None:
                replayed = self._cores_of({t: g for t, g in self._grown.items() if t in self._replayed}) \
                    if self._replayed else ()
                for doubt in (self._floating, replayed):
                    if doubt:
                        self.guessed = tuple(g + d for g, d in zip(self.guessed or (0,) * len(doubt), doubt))
        return self._free

    @property
    def replayed(self) -> bool:
        """Some shared balloon's cores are where a replay of a list put them (`mark_replayed`)."""
        return bool(self._replayed) and self.observed_shared is None

    def mark_replayed(self) -> None:
        """This ledger was built from a list of the node's pods: where its shared balloons grew is history the list
        does not carry (pods that came and went, init containers that grew them and shrank them back, in the order
        they did), so their replayed cores are a guess (`guessed`) until they shrink back to their minimum or the
        plugin's export says where they are. The oracle saw a rebuilt reserved balloon on NUMA nodes 1 and 3 split
        27 + 23 cores where the plugin's was 25 + 25, and a TP=1 pod of 17 cores admitted on NUMA node 3 ran 12 + 5."""
        self._replayed = set(self._grown)
        self._free = None

    def kubelet_put(self, state: kub.KState, holding: Holding | None = None) -> None:
        """The kubelet's state after it admitted a pod here (`kubelet.admit`, or a pod of known CPUs), and the
        model pod's holding when it is one."""
        self.kstate = state
        if holding is not None:
            self._add(holding)
        self._free = None
        self.stamps.take(self.name)

    def _kubelet_remove(self, uid: str) -> None:
        if self.kubelet is not None and self.kstate is not None and uid in self.kstate.requested:
            self.kstate = kub.remove(self.kstate, uid)
            self.memory_unknown -= {uid}
            self.kubelet_pending.pop(uid, None)
            self.kubelet_leaving.pop(uid, None)
            self._free = None
            self.stamps.take(self.name)

    def free_paired(self) -> tuple[int, ...] | None:
        """`free()` if the node's NUMA nodes sit on two packages (see `_paired`); None where no such doubt is kept."""
        if not self._packages or self.observed_shared is not None:
            return None
        self._paired_free, answer = self._free_in(self._paired, 1, self._paired_free)
        return answer

    def free_threads(self) -> tuple[int, ...] | None:
        """`free()` if the shared balloons grew as `_threads` counts them; None where it agrees or is not kept."""
        if not self._keeps_threads or self.observed_shared is not None:
            return None
        self._threads_free, answer = self._free_in(self._threads, self.threads_per_core, self._threads_free)
        return answer

    def _free_in(self, grown: Mapping[str, tuple[int, ...]], unit: int,
                 known: tuple[tuple[int, ...], tuple[int, ...] | None] | None
                 ) -> tuple[tuple[tuple[int, ...], tuple[int, ...] | None], tuple[int, ...] | None]:
        """Free cores per NUMA node with the shared balloons as `grown` holds them (in `unit`s per core), or None
        where that is `free()`; with what to keep beside the `free()` it was computed from (`known`, the last)."""
        now = self.free()
        if known is not None and known[0] is now:
            return known, known[1]
        free = self._less_init(self._spill(self._avail, grown, unit))
        answer = free if free != now else None
        return (now, answer), answer

    def _less_init(self, free: tuple[int, ...]) -> tuple[int, ...]:
        """`free` less the cores of init containers that run now (see `_cycled`)."""
        if not self._initializing:
            return free
        return _clamped([f - sum(self._cycled[uid][i] for uid in self._initializing) for i, f in enumerate(free)])

    @property
    def follows_resizes(self) -> bool:
        """The shared balloons are grown and shrunk resize by resize, as the plugin does (placement/inflation.py)."""
        return self._resized_as_plugin

    def init_cycle(self, uid: str, namespace: str, milli: int) -> bool:
        """Pod `uid`'s init containers, `milli` at most at once, ran in the shared balloon of `namespace`: the plugin
        grew it for them and shrank it back before the pod's other containers started, which moves it to where cores
        were free (resize by resize). Applied once per pod; False where the ledger does not follow resizes (there an
        init container counts as a shared container while it runs)."""
        if not self._resized_as_plugin:
            return False
        if uid in self._cycled:
            return True
        balloon = self.shared_type(namespace)
        was = self._shared_by_type.get(balloon)
        self._shared_by_type[balloon] = (was or 0) + milli
        self._resize_shared(balloon)
        peak = self._grown_cores()
        if was is None:
            del self._shared_by_type[balloon]
        else:
            self._shared_by_type[balloon] = was
        self._resize_shared(balloon)
        self._cycled[uid] = tuple(max(0, p - a) for p, a in zip(peak, self._grown_cores()))
        self._free = self._free_memory = None
        self.stamps.take(self.name)
        return True

    def _grown_cores(self) -> tuple[int, ...]:
        return tuple(self._cores_of(self._grown))

    def set_initializing(self, uid: str, running: bool) -> None:
        """Whether pod `uid`'s init containers run now (their cores, `_cycled`, are then not free)."""
        if running == (uid in self._initializing) or uid not in self._cycled:
            return
        if running:
            self._initializing.add(uid)
        else:
            self._initializing.discard(uid)
        self._free = None
        self.stamps.take(self.name)

    def forget_init(self, uid: str) -> None:
        """Pod `uid` is gone."""
        self.set_initializing(uid, False)
        self._cycled.pop(uid, None)

    def after_init(self, namespace: str, milli: int) -> NodeLedger:
        """A copy of this node as a new pod's init containers, `milli` at most at once in the shared balloon of
        `namespace`, leave it: where its other containers then land."""
        copy = self.scratch()
        copy.init_cycle("", namespace, milli)
        return copy

    def seat_shared(self, grown: Mapping[str, tuple[int, ...]]) -> None:
        """The shared balloons hold `grown` (cores per NUMA node beyond the reserved cpuset, by type), as the plugin's
        export says: where they grow and shrink next starts from there."""
        if self._resized_as_plugin:
            self._grown = {name: cores for name, cores in grown.items() if any(cores)}
            self._replayed.clear()
            self._free = None
            self.stamps.take(self.name)

    def layout_key(self) -> tuple[Any, ...]:
        """Where the shared balloons sit and what they hold, for keys of what `after_init` reads."""
        return (tuple(sorted(self._grown.items())), tuple(sorted(self._paired.items())),
                tuple(sorted(self._threads.items())),
                tuple(sorted(self._shared_by_type.items())))

    def unlent_paired(self, free: Sequence[int]) -> tuple[int, ...]:
        """`unlent_free` on the two-package layout, whose free cores are `free` (`free_paired`)."""
        return tuple(self._unlent(free, self._reserved_cores(self._paired, 1)))

    def unlent_threads(self, free: Sequence[int]) -> tuple[int, ...]:
        """`unlent_free` on the layout counted in CPUs, whose free cores are `free` (`free_threads`)."""
        return tuple(self._unlent(free, self._reserved_cores(self._threads, self.threads_per_core)))

    def _spill(self, avail: Sequence[int], grown: Mapping[str, tuple[int, ...]], unit: int = 1) -> tuple[int, ...]:
        return _clamped([a - h for a, h in zip(avail, self._cores_of(grown, unit))])

    def _cores_of(self, grown: Mapping[str, tuple[int, ...]], unit: int = 1) -> list[int]:
        """Per NUMA node, the cores the shared balloons of `grown` hold, counted there in `unit`s per core (1: cores;
        the threads per core: CPUs, where a balloon's odd CPU takes a core of its own)."""
        out = [0] * len(self.capacity)
        for g in grown.values():
            for i, held in enumerate(g):
                out[i] += -(-held // unit)
        return out

    def _reserved_cores(self, grown: Mapping[str, tuple[int, ...]], unit: int) -> tuple[int, ...]:
        """Cores per NUMA node the reserved balloon has grown into (`grown` counts `unit`s); () when it has not."""
        held = grown.get(RESERVED_TYPE)
        return tuple(self._cores_of({RESERVED_TYPE: held}, unit)) if held else ()

    def unlent_free(self) -> tuple[int, ...]:
        """Free model cores per NUMA node that are not reserved cores the policy lends: every other balloon takes
        those last, so they are free as long as anything is, unless the reserved balloon holds them."""
        free = self.free()
        if self.observed_shared is not None and self.observed_idle_lent is not None:
            return tuple(f - min(idle, f) for f, idle in zip(free, self.observed_idle_lent))
        return tuple(self._unlent(free, self._reserved_cores(self._grown, 1) or self._lent_held))

    def _unlent(self, free: Sequence[int], held: Sequence[int]) -> list[int]:
        return [f - i for f, i in zip(free, self._idle_lent(free, held))]

    def _lent_last(self, free: Sequence[int], held: Sequence[int], want: int) -> Sequence[int]:
        """What a balloon other than the reserved one grows from: the unreserved free cores while they hold `want`
        (the reserved CPUs are the first device it is kept far from), else every free core."""
        unlent = self._unlent(free, held)
        return unlent if sum(unlent) >= want else free

    def _idle_lent(self, free: Sequence[int], held: Sequence[int]) -> list[int]:
        """Per NUMA node, lent reserved cores still free, given the reserved balloon's cores `held` (it takes lent
        ones first, everyone else last)."""
        if not held:
            return [min(lent, f) for lent, f in zip(self._lent, free)]
        return [min(max(0, lent - h), f) for lent, h, f in zip(self._lent, held, free)]

    def free_memory(self) -> tuple[int, ...]:
        """Bytes free per NUMA node: what model pods pin there, and the rest of the node's pods' requests spread
        over all NUMA nodes (their balloons' memory is the reserved CPUs' NUMA nodes, every one here); () unknown."""
        if not self.numa_memory:
            return ()
        if self._free_memory is None:
            avail = self._mem_avail
            spread = self._shared_memory_total // len(self.numa_memory)
            self._free_memory = _clamped([m - spread for m in avail] if spread else avail)
        return self._free_memory

    def held_by(self, identity: ModelIdentity | None) -> Collection[str]:
        """The pods of one model holding cores here (uids)."""
        return self._by_identity.get(identity, {}).keys() if identity is not None else ()

    def _spill_elastic(self, avail: list[int]) -> tuple[int, ...]:
        if self.observed_shared is not None:
            return self._beside_observed(avail)
        if self._grown:
            return self._spill(avail, self._grown)
        if not self._shared_by_type or self._resized_as_plugin:
            return tuple(avail)  # nothing shared grows into model cores
        policy = self.nri.policy
        if policy is not None and self.nri.running:
            free = self._grown_at_once(policy, list(avail))
            # The reserved balloon's lent cores take no unreserved one wherever they are: not part of the guess.
            self.guessed = tuple(a - f - t for a, f, t in zip(avail, free, self._lent_held or (0,) * len(free)))
            return _clamped(free)
        # The kubelet's shared pool: it grows where most is free.
        free = list(avail)
        for _ in range(min(self.elastic_cores, sum(self.capacity))):
            i = max(range(len(free)), key=lambda k: (free[k], -k))
            if free[i] <= 0:
                break
            free[i] -= 1
        return _clamped(free)

    def _beside_observed(self, avail: list[int]) -> tuple[int, ...]:
        """`avail` less what the plugin's export says the shared balloons hold (moved since by `_resize_shared` where
        the ledger follows resizes). Where it does not, what they grew since the export is held by the one-step rule
        of `_grown_at_once`, as a guess (`guessed`)."""
        assert self.observed_shared is not None
        free = [a - o for a, o in zip(avail, self.observed_shared)]
        policy, sizes = self.nri.policy, self._observed_sizes
        if policy is None or sizes is None or self._resized_as_plugin:
            return _clamped(free)
        t = self.threads_per_core
        grew = sum(max(0, -(-cpus // t) - -(-sizes.get(name, 0) // t)) for name, cpus in self._balloon_cpus().items())
        if grew:
            held = inflation.grow((0,) * len(free), _clamped(free), grew, balancing=policy.topology_balancing)
            free = [f - h for f, h in zip(free, held)]
            self.guessed = tuple(held)
        return _clamped(free)

    def _grown_at_once(self, policy: BalloonsPolicy, free: list[int]) -> list[int]:
        """`free` less the shared balloons under a policy no type of which prefers a NUMA node, where the
        resize-by-resize model is not held to the plugin (its choice between packages is not seen): each balloon
        grown to its size in one step, by the plugin's rules (the tightest NUMA node that holds it; lent reserved
        cores the reserved balloon's first and everyone else's last), from no history, so that a ledger rebuilt
        from a list agrees with the live one."""
        zero = (0,) * len(free)
        for name in sorted(self._shared_by_type, key=lambda n: (n != RESERVED_TYPE, n)):
            btype = policy.route_type(name)
            want = math.ceil(shared_balloon_cpus(btype, self._shared_by_type[name], self._kept_cpus)
                             / self.threads_per_core)
            idle = self._idle_lent(free, self._lent_held) if name == RESERVED_TYPE else ()
            if any(idle):
                first = min(want, sum(idle))
                grown = inflation.grow(zero, idle, first, balancing=policy.topology_balancing)
                free = [f - g for f, g in zip(free, grown)]
                want -= first
                self._lent_held = tuple(grown)
            if want <= 0:
                continue
            grown = inflation.grow(zero, self._lent_last(free, self._lent_held, want), want,
                                   balancing=policy.topology_balancing)
            free = [f - g for f, g in zip(free, grown)]
        return free

    @property
    def _resized_as_plugin(self) -> bool:
        """Shared balloons are grown and shrunk resize by resize (placement/inflation.py)."""
        return self.nri.policy is not None and self.nri.running and self.nri.policy.numa_preferring

    def shared_type(self, namespace: str) -> str:
        """The balloon type a pod's unannotated containers land in on this node ("" where NRI does not run)."""
        policy = self.nri.policy
        return policy.route(namespace).name if policy is not None and self.nri.running else ""

    def shared_growth(self, namespace: str, milli: int, containers: bool = False) -> int:
        """Cores the balloon a pod's unannotated containers land in (by `namespace`) grows by when they add
        `milli`: what a model pod's sidecars take beside its ranks. `containers`: there are some even at 0 milli,
        and an empty balloon grows to a CPU for them. In CPUs, as the plugin grows it: an odd CPU's sibling is not
        counted as room, for another balloon may hold it (group 1416 stream 4160002: a default balloon of 113 CPUs
        beside a reserved one of 1 on a 57-core node, and a container of 1 CPU failed there)."""
        policy = self.nri.policy
        if not (milli or containers) or policy is None or not self.nri.running:
            return 0
        btype = policy.route(namespace)
        now = self._shared_by_type.get(btype.name)
        cpus = shared_balloon_cpus(btype, (now or 0) + milli, self._kept_cpus)
        was = shared_balloon_cpus(btype, now, self._kept_cpus) if now is not None else 0
        return max(0, -(-(cpus - was) // self.threads_per_core))

    def shared_cores(self, namespace: str, milli: int) -> int:
        """Cores the balloon of `namespace`'s unannotated containers takes beyond the reserved cpuset when they
        request `milli` alone: what it needs of a node emptied of model pods."""
        policy = self.nri.policy
        if policy is None or not self.nri.running:
            return 0
        return self._shared_cores(policy.route(namespace), milli)

    def _shared_cores(self, btype: BalloonType, milli: int) -> int:
        return math.ceil(shared_balloon_cpus(btype, milli, self._kept_cpus) / self.threads_per_core)

    def _resize_shared(self, balloon: str) -> None:
        """Grow or shrink shared balloon type `balloon` to what its containers request now, where the plugin
        would: from what is free at this moment (and so on the two-package layout and in CPUs, where kept)."""
        policy = self.nri.policy
        if policy is None or not self._resized_as_plugin:
            return
        sizes = self._observed_sizes
        if sizes is not None and self.observed_shared is not None:
            # Under the plugin's export the plugin resizes a balloon when its size in CPUs changes, from where the
            # export seated it: move what the export said by what this resize moves (a half-held core the
            # whole-core layout drops is no resize: group 1962 stream 9620003).
            cpus = self._balloon_cpus().get(balloon, 0)
            if cpus == sizes.get(balloon, 0):
                return
            before = self._grown_cores()
            self._resize_all(balloon, policy)
            sizes[balloon] = cpus
            self.observed_shared = _clamped([o + a - b for o, a, b in
                                             zip(self.observed_shared, self._grown_cores(), before)])
            return
        self._resize_all(balloon, policy)

    def _resize_all(self, balloon: str, policy: BalloonsPolicy) -> None:
        """Resize `balloon` in each layout the ledger keeps."""
        self._free = None
        if self._packages:
            self._resize_in(self._paired, self._spill(self._avail, self._paired), balloon, policy, self._packages)
        if self._keeps_threads:
            self._resize_threads(balloon, policy)
        self._resize_in(self._grown, self.free(), balloon, policy, ())
        self._free = None

    def _resize_threads(self, balloon: str, policy: BalloonsPolicy) -> None:
        t = self.threads_per_core
        self._resize_in(self._threads, self._spill(self._avail, self._threads, t), balloon, policy, (), t)

    def _resize_in(self, grown_by_type: dict[str, tuple[int, ...]], free: tuple[int, ...], balloon: str,
                   policy: BalloonsPolicy, packages: tuple[int, ...], unit: int = 1) -> None:
        """Resize `balloon` in `grown_by_type` (`unit`s per NUMA node: 1 per core, or the threads per core to count
        CPUs as the plugin does), whose layout leaves `free` model cores per NUMA node. In CPUs, a free CPU is a free
        core's thread or the idle sibling of a shared balloon's odd CPU, which the plugin takes like any other."""
        btype = policy.route_type(balloon)
        milli = self._shared_by_type.get(balloon)
        want = 0 if milli is None else \
            -(-shared_balloon_cpus(btype, milli, self._kept_cpus) // (self.threads_per_core // unit))
        grown = grown_by_type.get(balloon, (0,) * len(self.capacity))
        reserved = btype.name == RESERVED_TYPE
        base = tuple(len(self.reserved & n.cpus) if unit > 1 else len(n.cores) - c
                     for n, c in zip(self.topology.numa_nodes, self.capacity)) \
            if reserved and not self.lends_reserved else ()
        held = self._cores_of(grown_by_type, unit)
        room = tuple((f + h) * unit - sum(g[i] for g in grown_by_type.values())
                     for i, (f, h) in enumerate(zip(free, held)))
        delta = want - sum(grown)
        if delta > 0:
            far = tuple(dict.fromkeys(b.close_numa for b in policy.balloon_types
                                      if b.close_numa is not None and b.close_numa != btype.close_numa))
            if self.lends_reserved:
                # The reserved balloon prefers the reserved cpuset, which every other balloon takes last.
                lent = [i * unit for i in self._idle_lent(free, self._reserved_cores(grown_by_type, unit))]
                if reserved:
                    # First the reserved cores still free, by the same rules, then the rest.
                    first = min(delta, sum(lent))
                    if first:
                        before = grown
                        grown = inflation.grow(grown, lent, first, far=far, balancing=policy.topology_balancing,
                                               packages=packages)
                        room = tuple(r - (g - b) for r, g, b in zip(room, grown, before))
                        delta -= first
                elif sum(room) - sum(lent) >= delta:
                    room = tuple(r - i for r, i in zip(room, lent))
            if delta:
                grown = inflation.grow(grown, room, delta, close=btype.close_numa, far=far, base=base,
                                       balancing=policy.topology_balancing, packages=packages)
            short = want - sum(grown)
            if short > 0:
                # No whole core is free, yet the plugin, which counts threads, still finds one: hold it where the
                # balloon has most, so that a ledger rebuilt in another order holds the same.
                most = max(range(len(grown)), key=lambda i: (grown[i], -i))
                grown = tuple(g + short if i == most else g for i, g in enumerate(grown))
        elif delta < 0:
            grown = inflation.shrink(grown, room, -delta, base=base, packages=packages)
        if any(grown):
            if grown_by_type is self._grown and self._replayed and balloon not in grown_by_type:
                self._replayed.add(balloon)  # grown from where a replay guessed the others are: a guess too
            grown_by_type[balloon] = grown
        else:
            grown_by_type.pop(balloon, None)
            if grown_by_type is self._grown:
                self._replayed.discard(balloon)  # back to its minimum: where it is is known again

    # -- changes -----------------------------------------------------------------------------------

    def hold(self, holding: Holding) -> None:
        """Record a placement computed by `fit`; refuses one that does not fit what is free."""
        if holding.uid in self.holdings:
            raise LedgerError(f"pod {holding.pod} ({holding.uid}) already holds cores on node {self.name}")
        if holding.unknown:
            self.hold_unknown(holding, 0)
            return
        free = self.free()
        for numa, cores in holding.per_numa:
            if not 0 <= numa < len(free) or cores < 0 or cores > free[numa]:
                raise LedgerError(
                    f"pod {holding.pod} wants {cores} cores on NUMA node {numa} of node {self.name}, "
                    f"which has {free[numa] if 0 <= numa < len(free) else 'no such NUMA node'} free"
                )
        self._add(holding)

    def hold_unknown(self, holding: Holding, cores: int) -> None:
        """Record a pod whose NUMA nodes are unknown: `holding.per_numa` is what it could take on each NUMA node
        it could be on, and each is charged as far as it is free; of its `cores` in all, what even that cannot
        hold is kept as `shortfall`."""
        free = self.free()
        charged = tuple((n, min(c, max(free[n], 0))) for n, c in holding.per_numa)
        taken = sum(c for _, c in charged)
        self._add(replace(holding, per_numa=tuple(p for p in charged if p[1]), unknown=True,
                          shortfall=max(0, cores - taken), asked=holding.per_numa, asked_cores=cores))

    def _add(self, holding: Holding) -> None:
        self.unsettled += holding.unknown
        self.leaving += holding.leaving
        for numa, cores in holding.per_numa:
            self._avail[numa] -= cores
            self._mem_avail[numa] -= holding.memory
        for name in holding.types:
            self._instances[name] = self._instances.get(name, 0) + 1
        if holding.balloon_type is not None:
            self._balloons[holding.balloon_type] = self._balloons.get(holding.balloon_type, 0) + 1
        self._instance_key = None
        self.holdings[holding.uid] = holding
        if holding.identity is not None:
            self._by_identity.setdefault(holding.identity, {})[holding.uid] = holding
        self._free = self._free_memory = None
        self.stamps.take(self.name)

    def mark_leaving(self, uid: str) -> None:
        """The pod of holding `uid` is terminating (see `Holding.leaving`)."""
        holding = self.holdings.get(uid)
        if holding is not None and not holding.leaving:
            # The kubelet holds its CPUs until it has removed the pod's containers, a moment no object shows.
            state, leaving = self.kstate, dict(self.kubelet_leaving)
            self.release(uid)
            self.kstate, self.kubelet_leaving = state, leaving
            self._add(replace(holding, leaving=True))

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
        self._add(replace(holding, per_numa=tuple(placed), shortfall=holding.shortfall + short))

    def release(self, uid: str) -> Holding | None:
        self._kubelet_remove(uid)
        self.set_initializing(uid, False)
        holding = self.holdings.pop(uid, None)
        if holding is None:
            return None
        self.unsettled -= holding.unknown
        self.leaving -= holding.leaving
        for numa, cores in holding.per_numa:
            self._avail[numa] += cores
            self._mem_avail[numa] += holding.memory
        for name in holding.types:
            self._instances[name] -= 1
        if holding.balloon_type is not None:
            self._balloons[holding.balloon_type] -= 1
        self._instance_key = None
        if holding.identity is not None:
            group = self._by_identity.get(holding.identity)
            if group is not None:
                group.pop(uid, None)
                if not group:
                    del self._by_identity[holding.identity]
        self._free = self._free_memory = None
        self.stamps.take(self.name)
        return holding

    def set_shared(self, uid: str, milli: int, balloon: str = "", memory: int = 0, steps: Sequence[int] = ()) -> None:
        """Containers of pod `uid` that hold no exclusive cores: `milli` CPU and `memory` bytes requested in
        balloon type `balloon` (the one they are routed to; "" off NRI). A pod with only best-effort containers
        still puts them in a balloon, so it is recorded even at 0 millicores. `steps`: each container's CPU in the
        order they start, when there are several: the plugin grows the balloon for each in turn (`_threads`)."""
        was = self._unshare(uid)
        if was is None and len(steps) > 1 and self._keeps_threads:
            self._grow_through(balloon, itertools.accumulate(steps[:-1]), milli)
        if memory:
            self._shared_memory[uid] = memory
            self._shared_memory_total += memory
        self.shared[uid] = (balloon, milli)
        self._shared_total += milli
        self._shared_by_type[balloon] = self._shared_by_type.get(balloon, 0) + milli
        self._shared_count[balloon] = self._shared_count.get(balloon, 0) + 1
        if was is not None and was != balloon:
            self._resize_shared(was)
        self._resize_shared(balloon)
        self._free = self._free_memory = None
        self.stamps.take(self.name)

    def _grow_through(self, balloon: str, sums: Iterable[int], milli: int) -> None:
        """Resize `balloon` in `_threads` as a pod's containers join it one by one, `sums` being what they request
        together after each but the last, which brings them to `milli`."""
        policy = self.nri.policy
        assert policy is not None
        was = self._shared_by_type.get(balloon)
        for part in sums:
            if part >= milli:
                break
            self._shared_by_type[balloon] = (was or 0) + part
            self._resize_threads(balloon, policy)
        if was is None:
            self._shared_by_type.pop(balloon, None)
        else:
            self._shared_by_type[balloon] = was

    def drop_shared(self, uid: str) -> None:
        self._kubelet_remove(uid)
        self.set_initializing(uid, False)
        was = self._unshare(uid)
        if was is not None:
            self._resize_shared(was)
            self._free = self._free_memory = None
            self.stamps.take(self.name)

    def _unshare(self, uid: str) -> str | None:
        """Take pod `uid`'s shared containers out of the totals (their balloons keep their size until resized);
        the balloon type they were in, None if it had none."""
        self._shared_memory_total -= self._shared_memory.pop(uid, 0)
        old = self.shared.pop(uid, None)
        if old is None:
            return None
        balloon, milli = old
        self._shared_total -= milli
        self._shared_count[balloon] -= 1
        if self._shared_count[balloon]:
            self._shared_by_type[balloon] -= milli
        else:
            del self._shared_by_type[balloon], self._shared_count[balloon]
        return balloon

    def count_balloons(self, balloon_type: str) -> int:
        """Balloons of this type made for pods (maxBalloons counts these, not components of composites)."""
        return self._balloons.get(balloon_type, 0)

    @property
    def instance_key(self) -> tuple[tuple[str, int], ...]:
        """Every balloon type's instance count: what `instances` answers, as one hashable value."""
        if self._instance_key is None:
            self._instance_key = tuple(sorted((k, v) for k, v in self._instances.items() if v))
        return self._instance_key

    @property
    def instances(self) -> Mapping[str, int]:
        """Balloons of each type including those inside composites: balance-balloons creates the component
        with the fewest."""
        return self._instances

    def without_leaving(self) -> NodeLedger:
        """This node as the plugin may already see it: without the holdings of terminating pods, whose containers the
        kubelet may have removed before their objects are gone."""
        return self.scratch(evicted={h.uid for h in self.holdings.values() if h.leaving})

    def leaving_key(self) -> tuple[Any, ...]:
        """What `without_leaving` takes away, for keys of what `fit` reads: () while no pod is terminating."""
        if not self.leaving:
            return ()
        return tuple(sorted((h.per_numa, h.types) for h in self.holdings.values() if h.leaving))

    def scratch(self, without: ModelIdentity | None = None, evicted: Container[str] = ()) -> NodeLedger:
        """A copy to simulate on, without the pods of `without` (a model's own pods are being replaced) and
        without the holdings of the pods `evicted` (uids: what a preemption would free)."""
        # Its own stamps (the default), not the cluster's: simulating on a copy changes nothing derived from the
        # cluster's ledgers (the extender's verdicts, the waiting pods' retry).
        copy = NodeLedger(self.name, self.topology, self.reserved, self.reserved_source, self.labels, self.nri,
                          observed_shared=self.observed_shared,
                          observed_idle_lent=self.observed_idle_lent, numa_memory=self.numa_memory,
                          kubelet=self.kubelet)
        kept = [h for h in self.holdings.values()
                if (without is None or h.identity != without) and h.uid not in evicted]
        for holding in kept:
            if not holding.unknown:
                copy._add(holding)
        # A pod of unknown placement was charged on what the others left free: without some of them, on more.
        for holding in kept:
            if holding.unknown:
                copy.hold_unknown(replace(holding, per_numa=holding.asked), holding.asked_cores)
        if self.kstate is not None:
            state = self.kstate
            kept_uids = {h.uid for h in kept}
            for uid in self.holdings:
                if uid not in kept_uids:
                    state = kub.remove(state, uid)
            copy.kstate = state
            copy.memory_unknown = self.memory_unknown & kept_uids
            copy.kubelet_pending = {u: p for u, p in self.kubelet_pending.items() if u in kept_uids}
            copy.kubelet_leaving = {u: p for u, p in self.kubelet_leaving.items() if u in kept_uids}
        # The shared balloons as they are: re-adding their pods would resize them from what is free in the copy.
        copy.shared, copy._shared_total = dict(self.shared), self._shared_total
        copy._shared_by_type, copy._shared_count = dict(self._shared_by_type), dict(self._shared_count)
        copy._shared_memory, copy._shared_memory_total = dict(self._shared_memory), self._shared_memory_total
        copy._grown = dict(self._grown)
        copy._paired = dict(self._paired)
        copy._threads = dict(self._threads)
        copy._replayed = set(self._replayed)
        copy._observed_sizes = dict(self._observed_sizes) if self._observed_sizes is not None else None
        copy._cycled, copy._initializing = dict(self._cycled), set(self._initializing)
        return copy

    # -- views -------------------------------------------------------------------------------------

    def agent(self) -> str:
        """Who pins CPUs here, and how: what messages, `render` and `report` name the node's policy by."""
        if self.kubelet is not None:
            cfg = self.kubelet.config
            return f"kubelet: {cfg.describe()} ({cfg.source})"
        policy = self.nri.policy
        return f"NRI balloons: {policy.namespace}/{policy.name}" if policy is not None else "no CPU pinning agent"

    def to_json(self) -> dict[str, object]:
        free = self.free()
        free_memory = self.free_memory()
        numa_json = []
        for numa in self.topology.numa_nodes:
            held = [
                {"pod": h.pod, "uid": h.uid, "cores": c, "balloon": h.balloon_type, "assumed": h.assumed,
                 "observed": h.observed, **({"placement": "unknown"} if h.unknown else {}),
                 **({"problem": h.note} if h.note else {})}
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
                **({"memory": {"capacity": self.numa_memory[numa.id], "free": free_memory[numa.id]}}
                   if free_memory else {}),
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
