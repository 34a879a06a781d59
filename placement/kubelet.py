"""What the kubelet (v1.35) does with a pod on a node: its static CPU Manager, Topology Manager and Memory Manager.

The rules are the kubelet's own (`pkg/kubelet/cm/cpumanager`, `topologymanager`, `memorymanager` of the release
pinned in tests/peers; facts in docs/design.md), and `tests/oracle` holds this model to that code, run:

- A container gets exclusive CPUs only when its pod is Guaranteed and its CPU request is whole (a pod with pod-level
  resources gets none). Init containers first, then app containers, each allocated before the next is looked at.
- The Topology Manager merges the providers' NUMA hints per container (scope `container`) or once for the whole pod
  (`pod`). A hint is *preferred* when its NUMA count is the fewest whose total CPUs (reserved and taken included)
  hold the request: capacity decides, not what is free. `restricted` and `single-numa-node` reject a pod whose best
  hint is not preferred (`TopologyAffinityError`); `best-effort` admits it and the CPU Manager spills; `none` gives
  no hint at all. Among preferred hints the narrowest wins, then the lowest NUMA ids.
- Within (and past) the hint the CPU Manager takes CPUs best-fit: whole free NUMA nodes or sockets, whole free
  cores, then single threads, always from the fullest NUMA node, socket and core first.
- `full-pcpus-only` rejects a count that is not a multiple of the SMT width, or more than the free whole cores
  hold (`SMTAlignmentError`); it never rounds.
- A regular init container's CPUs stay assigned until the pod ends; the pod's app containers may reuse them.

CPU sets are ints here (bit i = CPU i): the extender asks this of thousands of nodes per pod.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, NamedTuple

from placement.quantity import QuantityError, cpu_milli, memory_bytes
from placement.topology import CPUSet, Topology

NONE, BEST_EFFORT, RESTRICTED, SINGLE_NUMA_NODE = "none", "best-effort", "restricted", "single-numa-node"
TOPOLOGY_POLICIES = (NONE, BEST_EFFORT, RESTRICTED, SINGLE_NUMA_NODE)
ALIGNING = (RESTRICTED, SINGLE_NUMA_NODE)  # the policies that reject a pod they cannot align
CONTAINER, POD = "container", "pod"
FULL_PCPUS_ONLY = "full-pcpus-only"
DISTRIBUTE_ACROSS_NUMA = "distribute-cpus-across-numa"
STRICT_RESERVATION = "strict-cpu-reservation"
PREFER_CLOSEST = "prefer-closest-numa-nodes"
# The CPU Manager options this model follows; the kubelet's others are refused in the settings that name them.
CPU_OPTIONS = (FULL_PCPUS_ONLY, DISTRIBUTE_ACROSS_NUMA, STRICT_RESERVATION)

TOPOLOGY_AFFINITY_ERROR = "TopologyAffinityError"
SMT_ALIGNMENT_ERROR = "SMTAlignmentError"
UNEXPECTED_ADMISSION_ERROR = "UnexpectedAdmissionError"


def bits(mask: int) -> Iterator[int]:
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low


def mask_of(ids: Iterable[int]) -> int:
    out = 0
    for i in ids:
        out |= 1 << i
    return out


def cpuset(mask: int) -> CPUSet:
    return CPUSet.of(bits(mask))


# --------------------------------------------------------------------------------------------------
# The machine as the kubelet's cadvisor sees it


@dataclass(frozen=True, slots=True, eq=False)
class Machine:
    """CPUs by NUMA node, socket and core. A core's id is its lowest thread (cadvisor's unique core id)."""

    numa: tuple[int, ...]  # CPUs of NUMA node i
    numa_socket: tuple[int, ...]  # the socket NUMA node i is on
    sockets: Mapping[int, int]  # socket id -> its CPUs
    cores: Mapping[int, int]  # core id -> its CPUs
    cpu_core: Mapping[int, int]  # CPU -> its core id
    cpu_numa: Mapping[int, int]  # CPU -> its NUMA node
    memory: tuple[int, ...]  # bytes of memory on NUMA node i
    distances: tuple[tuple[int, ...], ...]
    all: int
    cpus_per_core: int
    cpus_per_socket: int
    # Every non-empty set of NUMA nodes as the Topology Manager walks them (fewest first, then by id): (NUMA
    # bitmask, its CPUs, how many NUMA nodes), and the most CPUs any set of k NUMA nodes holds, at [k].
    masks: tuple[tuple[int, int, int], ...]
    by_size: tuple[tuple[tuple[int, int], ...], ...]  # at [k]: (NUMA bitmask, its CPUs) of every set of k, lowest first
    most_cpus: tuple[int, ...]
    socket_cores: Mapping[int, tuple[int, ...]]  # socket id -> its core ids
    numa_cores: tuple[tuple[int, ...], ...]  # NUMA node -> its core ids
    # Linux's numbering (sibling k of core c is CPU c + k * cores): the primaries, and the stride to each sibling
    # level; () where the machine is numbered otherwise.
    sibling_stride: tuple[int, ...]
    primaries: int
    numa_first: bool  # at least as many sockets as NUMA nodes: the accumulator orders NUMA nodes before sockets
    smallest_numa: int  # CPUs of the smallest NUMA node

    @property
    def numa_count(self) -> int:
        return len(self.numa)

    def fewest_numa(self, request: int) -> int:
        """minAffinitySize: the fewest NUMA nodes whose CPUs, taken or not, hold `request`."""
        return next((k for k in range(1, self.numa_count) if self.most_cpus[k] >= request), self.numa_count)

    def numa_mask(self, numa: int) -> int:
        """The CPUs of the NUMA nodes in bitmask `numa`."""
        out = 0
        for i in bits(numa):
            out |= self.numa[i]
        return out

    def per_numa(self, cpus: int) -> tuple[int, ...]:
        return tuple((cpus & m).bit_count() for m in self.numa)


@lru_cache(maxsize=256)
def machine(topology: Topology, packages: int, memory: tuple[int, ...]) -> Machine:
    """`packages` sockets, NUMA nodes split over them in order (sub-NUMA clustering: several per socket)."""
    count = topology.numa_count
    packages = max(1, min(packages, count))
    numa_socket = tuple(i * packages // count for i in range(count))
    numa = tuple(mask_of(n.cpus) for n in topology.numa_nodes)
    sockets: dict[int, int] = {}
    cores: dict[int, int] = {}
    cpu_core: dict[int, int] = {}
    cpu_numa: dict[int, int] = {}
    for node in topology.numa_nodes:
        sockets[numa_socket[node.id]] = sockets.get(numa_socket[node.id], 0) | numa[node.id]
        for core in node.cores:
            core_id = min(core.threads)
            cores[core_id] = mask_of(core.threads)
            for t in core.threads:
                cpu_core[t], cpu_numa[t] = core_id, node.id
    distances = tuple(tuple(10 if a == b else 11 if numa_socket[a] == numa_socket[b] else 21 for b in range(count))
                      for a in range(count))
    total = sum(len(n.cpus) for n in topology.numa_nodes)
    masks = []
    most = [0] * (count + 1)
    for size in range(1, count + 1):
        for combo in itertools.combinations(range(count), size):
            cpus = 0
            for i in combo:
                cpus |= numa[i]
            masks.append((mask_of(combo), cpus, size))
            most[size] = max(most[size], cpus.bit_count())
    numa_cores = tuple(tuple(min(c.threads) for c in n.cores) for n in topology.numa_nodes)
    socket_cores = {s: tuple(c for n in range(count) if numa_socket[n] == s for c in numa_cores[n]) for s in sockets}
    width = len(cores)
    linux = all(threads == mask_of(core + k * width for k in range(bin(threads).count("1")))
                for core, threads in cores.items())
    return Machine(numa, numa_socket, sockets, cores, cpu_core, cpu_numa,
                   memory if len(memory) == count else (0,) * count, distances, mask_of(topology.cpus),
                   total // max(1, len(cores)), total // max(1, len(sockets)), tuple(masks),
                   tuple(tuple(sorted((mask, cpus) for mask, cpus, size in masks if size == k))
                         for k in range(count + 1)),
                   tuple(most),
                   socket_cores, numa_cores,
                   tuple(k * width for k in range(1, topology.threads_per_core)) if linux else (),
                   mask_of(cores) if linux else 0, len(sockets) >= count,
                   min((n.bit_count() for n in numa), default=0))


# --------------------------------------------------------------------------------------------------
# The kubelet's settings on a node


@dataclass(frozen=True, slots=True)
class KubeletConfig:
    """What decides placement on a node: what its NodeResourceTopology announces (the Topology Manager policy and
    scope, its reserved CPUs per NUMA node) and what the operator states for its node group (the rest)."""

    topology_policy: str = SINGLE_NUMA_NODE
    topology_scope: str = POD
    cpu_options: frozenset[str] = frozenset({FULL_PCPUS_ONLY})
    reserved_cpus: CPUSet | None = None  # reservedSystemCPUs
    reserved_count: int = 1  # ceil(systemReserved + kubeReserved cpu) where reservedSystemCPUs is not set
    memory_policy: str = "None"  # None | Static
    reserved_memory: tuple[int, ...] = ()  # Static: bytes reserved on NUMA node i
    prefer_closest: bool = False  # topologyManagerPolicyOptions prefer-closest-numa-nodes
    source: str = "assumed"  # where the Topology Manager policy and scope came from, for messages

    def describe(self) -> str:
        return f"Topology Manager {self.topology_policy}, scope {self.topology_scope}"


class NodeError(ValueError):
    """The kubelet would not start with these settings on this machine."""


@dataclass(frozen=True, slots=True, eq=False)
class KubeletNode:
    """A node's machine and kubelet settings, checked as the kubelet checks them at start."""

    machine: Machine
    config: KubeletConfig
    reserved: int
    reserved_physical: int

    @property
    def allocatable(self) -> int:
        return self.machine.all & ~self.reserved

    @property
    def allocatable_per_numa(self) -> tuple[int, ...]:
        return self.machine.per_numa(self.allocatable)

    def option(self, name: str) -> bool:
        return name in self.config.cpu_options


def kubelet_node(mach: Machine, config: KubeletConfig) -> KubeletNode:
    if config.topology_policy not in TOPOLOGY_POLICIES:
        raise NodeError(f"unknown Topology Manager policy {config.topology_policy!r}")
    if config.topology_policy != NONE and mach.numa_count > 8:
        raise NodeError(f"Topology Manager {config.topology_policy} is unsupported on machines with more than 8 "
                        f"NUMA nodes ({mach.numa_count})")
    unknown = sorted(config.cpu_options - set(CPU_OPTIONS))
    if unknown:
        raise NodeError(f"CPU Manager option(s) {', '.join(unknown)} not modelled")
    if config.reserved_cpus is not None and len(config.reserved_cpus):
        reserved = mask_of(config.reserved_cpus) & mach.all
        if reserved.bit_count() != len(config.reserved_cpus):
            raise NodeError(f"reservedSystemCPUs {config.reserved_cpus} names CPUs the node lacks")
    else:
        if config.reserved_count <= 0:
            raise NodeError("the static policy requires systemreserved.cpu + kubereserved.cpu to be greater than "
                            "zero")
        # The kubelet takes them as it takes any CPUs (NewStaticPolicy: takeByTopology): the lowest whole cores.
        group = mach.cpus_per_core if FULL_PCPUS_ONLY in config.cpu_options else 1
        reserved = (_take_distributed(mach, mach.all, config.reserved_count, group)
                    if DISTRIBUTE_ACROSS_NUMA in config.cpu_options
                    else take_packed(mach, mach.all, config.reserved_count)) or 0
    physical = 0
    for cpu in bits(reserved):
        physical |= mach.cores[mach.cpu_core[cpu]]
    return KubeletNode(mach, config, reserved, physical)


# --------------------------------------------------------------------------------------------------
# Pods as the kubelet reads them


class KContainer(NamedTuple):
    name: str
    kind: str  # "init", "sidecar" (restartPolicy Always) or "app"
    cpus: int  # exclusive CPUs (a whole request in a Guaranteed pod), else 0
    memory: int  # bytes requested
    has_cpu: bool  # it states a CPU request (podGuaranteedCPUs skips those that do not)


class KPod(NamedTuple):
    uid: str
    guaranteed: bool
    pod_level: bool  # spec.resources set: the static policy pins nothing
    containers: tuple[KContainer, ...]  # init containers in order, then app containers
    cpu_milli: int  # the scheduler's effective request: what the kubelet's resource predicate sums
    memory: int

    @property
    def exclusive(self) -> bool:
        return any(c.cpus for c in self.containers) and not self.pod_level

    def pod_cpus(self) -> int:
        """podGuaranteedCPUs: max(each init container with the sidecars before it, apps + every sidecar)."""
        init_peak = sidecars = apps = 0
        for c in self.containers:
            if not c.has_cpu:
                continue
            if c.kind == "sidecar":
                sidecars += c.cpus
            elif c.kind == "init":
                init_peak = max(init_peak, sidecars + c.cpus)
            else:
                apps += c.cpus
        return max(init_peak, apps + sidecars)


def _requests(container: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    res = container.get("resources") or {}
    limits = dict(res.get("limits") or {})
    requests = {**{k: v for k, v in limits.items() if k in ("cpu", "memory")}, **(res.get("requests") or {})}
    return requests, limits


def _milli(value: object) -> int:
    try:
        return cpu_milli(value)
    except QuantityError:
        return 0


def _bytes(value: object) -> int:
    try:
        return memory_bytes(value)
    except QuantityError:
        return 0


def kubelet_pod(uid: str, spec: Mapping[str, Any]) -> KPod:
    """The pod as the kubelet reads it: QoS over every container (GetPodQOS, cpu and memory), each container's
    exclusive CPUs, and the effective request the resource predicate sums."""
    raw: list[tuple[Mapping[str, Any], str]] = []
    for c in spec.get("initContainers") or ():
        if isinstance(c, Mapping):
            raw.append((c, "sidecar" if c.get("restartPolicy") == "Always" else "init"))
    for c in spec.get("containers") or ():
        if isinstance(c, Mapping):
            raw.append((c, "app"))
    guaranteed, any_set = True, False
    parsed = []
    for c, kind in raw:
        requests, limits = _requests(c)
        for name, parse in (("cpu", _milli), ("memory", _bytes)):
            req = parse(requests[name]) if name in requests else 0
            lim = parse(limits[name]) if name in limits else 0
            any_set |= bool(req or lim)
            if not lim or req != lim:
                guaranteed = False
        parsed.append((c, kind, requests))
    guaranteed = guaranteed and any_set
    containers = []
    init_peak = sidecars = apps = mem_init = mem_sidecars = mem_apps = 0
    for c, kind, requests in parsed:
        milli = _milli(requests["cpu"]) if "cpu" in requests else 0
        mem = _bytes(requests["memory"]) if "memory" in requests else 0
        whole = milli // 1000 if guaranteed and milli % 1000 == 0 else 0
        containers.append(KContainer(str(c.get("name", "")), kind, whole, mem, "cpu" in requests))
        if kind == "sidecar":
            sidecars += milli
            mem_sidecars += mem
        elif kind == "init":
            init_peak = max(init_peak, sidecars + milli)
            mem_init = max(mem_init, mem_sidecars + mem)
        else:
            apps += milli
            mem_apps += mem
    return KPod(uid, guaranteed, bool(spec.get("resources")), tuple(containers), max(init_peak, apps + sidecars),
                max(mem_init, mem_apps + mem_sidecars))


# --------------------------------------------------------------------------------------------------
# The CPU Manager's allocation (cpu_assignment.go): best fit, fullest first


class _Accumulator:
    __slots__ = ("avail", "m", "need", "numa_first", "result")

    def __init__(self, m: Machine, avail: int, need: int) -> None:
        self.m, self.avail, self.need, self.result = m, avail, need, 0
        self.numa_first = m.numa_first

    def _sorted(self, ids: Iterable[int], cpus_of: Mapping[int, int] | Sequence[int]) -> list[int]:
        avail = self.avail
        return sorted((i for i in ids if cpus_of[i] & avail), key=lambda i: ((cpus_of[i] & avail).bit_count(), i))

    def numa_nodes(self) -> list[int]:
        m = self.m
        if self.numa_first:
            return self._sorted(range(m.numa_count), m.numa)
        return [n for s in self.sockets() for n in self._sorted(
            (i for i in range(m.numa_count) if m.numa_socket[i] == s), m.numa)]

    def sockets(self) -> list[int]:
        m = self.m
        if not self.numa_first:
            return self._sorted(m.sockets, m.sockets)
        out: list[int] = []
        for n in self.numa_nodes():
            out.extend(self._sorted((m.numa_socket[n],), m.sockets))
        return out

    def core_order(self) -> list[int]:
        m = self.m
        out: list[int] = []
        if self.numa_first:
            for s in self.sockets():
                out.extend(self._sorted(m.socket_cores[s], m.cores))
        else:
            for n in self.numa_nodes():
                out.extend(self._sorted(m.numa_cores[n], m.cores))
        return out

    def take(self, cpus: int) -> None:
        self.result |= cpus
        self.avail &= ~cpus
        self.need -= cpus.bit_count()

    def take_full_numa(self) -> None:
        m = self.m
        if self.need < m.smallest_numa:  # nothing to take: skip the sort
            return
        for n in self.numa_nodes():
            if m.numa[n] & self.avail == m.numa[n] and self.need >= m.numa[n].bit_count():
                self.take(m.numa[n])

    def take_full_sockets(self) -> None:
        m = self.m
        if self.need < m.cpus_per_socket:
            return
        for s in self.sockets():
            cpus = m.sockets[s]
            if (cpus & self.avail).bit_count() == m.cpus_per_socket and self.need >= cpus.bit_count():
                self.take(cpus)

    def take_full_cores(self) -> None:
        m = self.m
        if not m.primaries:
            for c in self.core_order():
                cpus = m.cores[c]
                if (cpus & self.avail).bit_count() == m.cpus_per_core and self.need >= cpus.bit_count():
                    self.take(cpus)
            return
        # Free cores all sort alike (every thread free), so by id within each group of the order: the free
        # primaries, lowest first, as Linux numbers them.
        groups = [m.sockets[s] for s in self.sockets()] if self.numa_first else [m.numa[n] for n in self.numa_nodes()]
        for group in groups:
            whole = self.avail & m.primaries & group
            for stride in m.sibling_stride:
                whole &= self.avail >> stride
            for core in bits(whole):
                if self.need < m.cpus_per_core:
                    return
                self.take(m.cores[core])

    def take_remaining(self) -> None:
        for c in self.core_order():
            for cpu in bits(self.m.cores[c] & self.avail):
                self.take(1 << cpu)
                if self.need < 1:
                    return


def take_packed(m: Machine, avail: int, need: int) -> int | None:
    """takeByTopologyNUMAPacked; None when the CPUs are not there."""
    if need < 1:
        return 0
    if need > avail.bit_count():
        return None
    if m.primaries and need % m.cpus_per_core == 0 and need < m.smallest_numa and avail:
        # The usual case, whole cores within one NUMA node (a single-NUMA hint): no whole NUMA node or socket to
        # take, so the accumulator's first whole-core pass takes the free cores of that node, lowest id first.
        numa = m.numa[m.cpu_numa[(avail & -avail).bit_length() - 1]]
        if avail & ~numa == 0:
            whole = avail & m.primaries
            for stride in m.sibling_stride:
                whole &= avail >> stride
            cores = need // m.cpus_per_core
            if whole.bit_count() >= cores:
                taken = 0
                for core in bits(whole):
                    taken |= m.cores[core]
                    cores -= 1
                    if cores == 0:
                        return taken
    acc = _Accumulator(m, avail, need)
    first, second = (acc.take_full_numa, acc.take_full_sockets) if acc.numa_first else \
        (acc.take_full_sockets, acc.take_full_numa)
    for step in (first, second, acc.take_full_cores, acc.take_remaining):
        step()
        if acc.need < 1:
            return acc.result
    return None


def _stdev(values: Sequence[int]) -> float:
    mean = round(sum(values) / len(values) * 1000) / 1000
    return round(math.sqrt(sum((v - mean) ** 2 for v in values) / len(values)) * 1000) / 1000


class _GoSlice(NamedTuple):
    """A combination as Go's iterateCombinations hands it out: a slice (array, length) whose array later
    combinations may write into."""

    array: list[int]
    length: int

    def now(self) -> tuple[int, ...]:
        return tuple(self.array[:self.length])


def _go_combinations(items: Sequence[int], k: int) -> Iterator[_GoSlice]:
    """cpuAccumulator.iterateCombinations, append's growth included: the slice of a combination of 4, or of 6 to 8,
    shares its array with the next ones of the same prefix, so one the caller keeps ends up with their last
    elements (cpu_assignment.go keeps bestCombo and bestRemainder this way, and the kubelet uses what they hold
    when the loop ends)."""
    def helper(left: int, start: int, array: list[int], length: int, cap: int) -> Iterator[_GoSlice]:
        if left == 0:
            yield _GoSlice(array, length)
            return
        for i in range(start, len(items) - left + 1):
            if length < cap:
                child, child_cap = array, cap
            else:
                child_cap = max(1, cap * 2)
                child = array[:length] + [0] * (child_cap - length)
            child[length] = items[i]
            yield from helper(left - 1, i + 1, child, length + 1, child_cap)
    if k >= 1:
        yield from helper(k, 0, [], 0, 0)


def _take_distributed(m: Machine, avail: int, need: int, group: int) -> int | None:
    """takeByTopologyNUMADistributed (distribute-cpus-across-numa): evenly over the fewest NUMA nodes that balance
    what stays free best; packed where no even split exists."""
    if need % group:
        return take_packed(m, avail, need)
    acc = _Accumulator(m, avail, need)
    if need < 1:
        return 0
    if need > avail.bit_count():
        return None
    numas = acc.numa_nodes()
    free = {n: (m.numa[n] & avail).bit_count() for n in numas}
    groups = (m.all.bit_count() - 1) // group + 1
    per_numa_groups = (groups - 1) // m.numa_count + 1
    needed_groups = (need - 1) // group + 1
    lo, hi = (needed_groups - 1) // per_numa_groups + 1, min(needed_groups, len(numas))
    for k in range(lo, hi + 1):
        best: tuple[float, _GoSlice, _GoSlice | None] | None = None
        for kept in _go_combinations(numas, k):
            combo = kept.now()
            if best is not None and best[0] == 0:
                break
            if sum(free[n] for n in combo) < need or sum(free[n] // group for n in combo) * group < need:
                continue
            share = need // k // group * group
            if any(free[n] < share for n in combo):
                continue
            after = dict(free)
            for n in combo:
                after[n] -= share
            remainder = need - share * k
            local: tuple[float, _GoSlice | None] | None = (_stdev(list(after.values())), None) \
                if remainder == 0 else None
            candidates = [n for n in combo if after[n] >= group]
            for size in range(len(candidates), 0, -1) if remainder else ():
                for held in _go_combinations(candidates, size):
                    subset = held.now()
                    left, trial = remainder, dict(after)
                    if sum(trial[n] for n in subset) < left:
                        continue
                    while left > 0:
                        before = left
                        for n in subset:
                            if left == 0:
                                break
                            if trial[n] < group:
                                continue
                            trial[n] -= group
                            left -= group
                        if left == before:  # the kubelet would loop here for good; no split of this subset
                            break
                    if left > 0:
                        continue
                    balance = _stdev(list(trial.values()))
                    if local is None or balance < local[0]:
                        local = (balance, held)
            if local is not None and (best is None or local[0] < best[0]):
                best = (local[0], kept, local[1])
        if best is None:
            continue
        chosen, extra = best[1].now(), best[2].now() if best[2] is not None else ()
        share = need // len(chosen) // group * group
        for n in chosen:
            acc.take(take_packed(m, m.numa[n] & acc.avail, share) or 0)
        left = need - share * len(chosen)
        while left > 0:
            before = left
            for n in extra:
                if left == 0:
                    break
                if (m.numa[n] & acc.avail).bit_count() < group:
                    continue
                acc.take(take_packed(m, m.numa[n] & acc.avail, group) or 0)
                left -= group
            if left == before:
                return None
        return acc.result if acc.need == 0 else None
    return take_packed(m, avail, need)


# --------------------------------------------------------------------------------------------------
# The Static Memory Manager (memorymanager/policy_static.go): memory only, no hugepages


def _find_best(hints: Sequence[Hint]) -> Hint:
    """findBestHint: preferred before not, then the narrowest."""
    best = hints[0]
    for h in hints[1:]:
        assert h.numa is not None and best.numa is not None
        if (h.preferred and not best.preferred) or (h.preferred == best.preferred and _narrower(h.numa, best.numa)):
            best = h
    return best


def _release_memory(mem: MemoryState, blocks: Mapping[str, tuple[int, int]]) -> MemoryState:
    """RemoveContainer for each of a pod's blocks: what a block took is given back node by node, each up to what is
    taken there."""
    free, count, cells = list(mem.free), list(mem.count), list(mem.cells)
    for numa, size in blocks.values():
        for i in bits(numa):
            count[i] -= 1
            if count[i] == 0:
                cells[i] = 1 << i
            back = min(mem.allocatable[i] - free[i], size)
            free[i] += back
            size -= back
    return MemoryState(tuple(free), tuple(count), tuple(cells), mem.allocatable, mem.blocks)


def _charge(free: list[int], count: list[int], cells: list[int], mask: int, size: int) -> None:
    """updateMachineState: the block's NUMA nodes form one group, and its bytes come from them in order."""
    for i in bits(mask):
        count[i] += 1
        cells[i] = mask
        if size and free[i] > 0:
            take = min(free[i], size)
            free[i] -= take
            size -= take


def _with_blocks(mem: MemoryState, uid: str, blocks: Mapping[str, Block]) -> MemoryState:
    """`mem` with pod `uid`'s running containers' blocks charged, in the pod's order."""
    if not blocks:
        return mem
    free, count, cells = list(mem.free), list(mem.count), list(mem.cells)
    for block in blocks.values():
        _charge(free, count, cells, block.numa, block.size)
    return MemoryState(tuple(free), tuple(count), tuple(cells), mem.allocatable,
                       {**mem.blocks, uid: {name: (b.numa, b.size) for name, b in blocks.items()}})


class _MemoryPass:
    """One pod's admission on a scratch copy of the Memory Manager's machine state."""

    __slots__ = ("allocatable", "blocks", "cells", "count", "free", "node", "pod", "reuse")

    def __init__(self, node: KubeletNode, mem: MemoryState, pod: KPod) -> None:
        self.node, self.pod = node, pod
        self.free, self.count, self.cells = list(mem.free), list(mem.count), list(mem.cells)
        self.allocatable = mem.allocatable
        self.blocks: dict[str, tuple[int, int]] = {}
        self.reuse: dict[int, int] = {}  # initContainersReusableMemory: NUMA mask -> bytes

    def calculate(self, request: int) -> list[Hint]:
        count = self.node.machine.numa_count
        smallest = count
        found: list[tuple[int, int]] = []
        for size in range(1, count + 1):
            for combo in itertools.combinations(range(count), size):
                if sum(self.allocatable[i] for i in combo) < request:
                    continue
                smallest = min(smallest, size)
                mask = mask_of(combo)
                if size == 1 and self.cells[combo[0]] != mask:
                    continue
                if size > 1 and any(self.count[i] > 0 and (self.cells[i].bit_count() == 1 or self.cells[i] != mask)
                                    for i in combo):
                    continue
                if sum(self.free[i] for i in combo) + self.reuse.get(mask, 0) < request:
                    continue
                found.append((mask, size))
        return [Hint(mask, size == smallest) for mask, size in found]

    def hints(self, request: int) -> list[Hint] | None:
        """What the provider tells the Topology Manager; None (no preference) when no NUMA node has room, too."""
        if not self.pod.guaranteed or self.pod.pod_level:
            return None
        return self.calculate(request) or None

    def allocate(self, c: KContainer, hint: Hint | None) -> Rejected | None:
        if not self.pod.guaranteed or self.pod.pod_level:
            return None
        request = c.memory
        given = hint or Hint(None, False)
        best = given
        if given.numa is None:
            found = self.calculate(request)
            if not found:
                return _unexpected("[memorymanager] failed to get the default NUMA affinity, no NUMA nodes with "
                                   "enough memory is available")
            best = _find_best(found)
            if not best.preferred and given.preferred:
                return _unexpected("[memorymanager] failed to find the default preferred hint")
        assert best.numa is not None
        if sum(self.free[i] for i in bits(best.numa)) < request:
            wider = [h for h in self.calculate(request) if h.numa is not None and best.numa & ~h.numa == 0]
            if not wider:
                return _unexpected("[memorymanager] failed to find NUMA nodes to extend the current topology hint")
            extended = _find_best(wider)
            if not extended.preferred and best.preferred:
                return _unexpected("[memorymanager] failed to find the extended preferred hint")
            best = extended
        mask = best.numa
        assert mask is not None
        if mask.bit_count() > 1 and any(self.count[i] > 0 and (self.cells[i].bit_count() == 1 or self.cells[i] != mask)
                                        for i in bits(mask)):
            return _unexpected("[memorymanager] preferred hint violates NUMA node allocation")
        reusable = self.reuse.get(mask, 0)
        _charge(self.free, self.count, self.cells, mask, 0 if reusable >= request else request - reusable)
        if c.kind == "init":
            self.reuse[mask] = max(self.reuse.get(mask, 0), request)
        elif self.reuse.get(mask):
            self.reuse[mask] = max(0, self.reuse[mask] - request)
        self.blocks[c.name] = (mask, request)
        self._shrink_init_blocks(c, mask, request)
        return None

    def _shrink_init_blocks(self, c: KContainer, mask: int, size: int) -> None:
        """updateInitContainersMemoryBlocks: a later container's block takes over what earlier regular init
        containers on the same NUMA nodes held."""
        for other in self.pod.containers:
            if other.name == c.name or other.kind == "app" or size == 0:
                break
            if other.kind == "sidecar" or other.name not in self.blocks:
                continue
            numa, held = self.blocks[other.name]
            if numa != mask or held == 0:
                continue
            moved = min(held, size)
            self.blocks[other.name] = (numa, held - moved)
            size -= moved

    def placed(self) -> dict[str, Block]:
        """Each container's block, in the pod's order (a regular init container's as later containers shrank it)."""
        return {name: Block(numa, size) for name, (numa, size) in self.blocks.items()}

    def state(self, before: MemoryState) -> MemoryState:
        """The machine state once the pod runs."""
        return started(before, self.pod.uid, self.placed(), {c.name for c in self.pod.containers if c.kind == "init"})


def started(mem: MemoryState, uid: str, blocks: Mapping[str, Block], init: Collection[str]) -> MemoryState:
    """The machine state once pod `uid` runs: every container's block charged in the pod's order, then each regular
    init container's released, as the kubelet's AddContainer releases it when the next container starts. The release
    is not an undo: a NUMA node the init container's block touched keeps that block's group for as long as another
    block uses it, which decides the single-NUMA hints of every pod after."""
    charged = _with_blocks(mem, uid, blocks)
    done = {name: (b.numa, b.size) for name, b in blocks.items() if name in init}
    if not done:
        return charged
    after = _release_memory(charged, done)
    after.blocks = {**after.blocks, uid: {n: b for n, b in after.blocks[uid].items() if n not in init}}
    return after


# --------------------------------------------------------------------------------------------------
# State, hints and admission


@dataclass(slots=True)
class MemoryState:
    """The Static Memory Manager's machine state: per NUMA node, free bytes, how many blocks use it, and the group of
    NUMA nodes ("cells") those blocks span; each container's block (its NUMA nodes and bytes)."""

    free: tuple[int, ...]
    count: tuple[int, ...]
    cells: tuple[int, ...]  # NUMA bitmask of the group node i belongs to
    allocatable: tuple[int, ...]
    blocks: dict[str, dict[str, tuple[int, int]]] = field(default_factory=dict)  # uid -> container -> (NUMA, bytes)


@dataclass(slots=True)
class KState:
    """The CPU Manager's state on one node (the default set and each container's exclusive CPUs), the Memory
    Manager's (Static only), and the pods the resource predicate counts."""

    default: int
    assigned: dict[str, dict[str, int]] = field(default_factory=dict)  # pod uid -> container -> CPUs
    requested: dict[str, tuple[int, int]] = field(default_factory=dict)  # pod uid -> (cpu milli, memory bytes)
    memory: MemoryState | None = None
    used: tuple[int, int] = (0, 0)  # the sum of `requested`: what the resource predicate reads

    def copy(self) -> KState:
        mem = self.memory
        return KState(self.default, {uid: dict(c) for uid, c in self.assigned.items()}, dict(self.requested),
                      None if mem is None else MemoryState(mem.free, mem.count, mem.cells, mem.allocatable,
                                                          dict(mem.blocks)), self.used)

    def request(self, uid: str, value: tuple[int, int]) -> None:
        self.unrequest(uid)
        self.requested[uid] = value
        self.used = (self.used[0] + value[0], self.used[1] + value[1])

    def unrequest(self, uid: str) -> None:
        old = self.requested.pop(uid, None)
        if old is not None:
            self.used = (self.used[0] - old[0], self.used[1] - old[1])


def memory_allocatable(node: KubeletNode) -> tuple[int, ...]:
    reserved = node.config.reserved_memory
    return tuple(m - (reserved[i] if i < len(reserved) else 0) for i, m in enumerate(node.machine.memory))


def new_state(node: KubeletNode) -> KState:
    strict = node.option(STRICT_RESERVATION)
    count = node.machine.numa_count
    allocatable = memory_allocatable(node)
    memory = MemoryState(allocatable, (0,) * count, tuple(1 << i for i in range(count)), allocatable) \
        if node.config.memory_policy == "Static" else None
    return KState(node.machine.all & ~node.reserved if strict else node.machine.all, memory=memory)


def available(node: KubeletNode, state: KState) -> int:
    """Where exclusive CPUs come from: the default set less the reserved CPUs."""
    return state.default & ~node.reserved


def free_per_numa(node: KubeletNode, state: KState) -> tuple[int, ...]:
    """Free CPUs per NUMA node: what node-feature-discovery publishes as each zone's `available`."""
    return node.machine.per_numa(available(node, state))


def free_cores(node: KubeletNode, state: KState) -> tuple[int, ...]:
    """Whole free cores per NUMA node (every thread free): what a model's ranks can be given."""
    return free_cores_of(node, state.default)


def free_cores_of(node: KubeletNode, default: int) -> tuple[int, ...]:
    m, avail = node.machine, default & ~node.reserved
    if m.primaries:
        whole = avail & m.primaries
        for stride in m.sibling_stride:
            whole &= avail >> stride
        return tuple((whole & numa).bit_count() for numa in m.numa)
    return tuple(sum(1 for core in cores if m.cores[core] & avail == m.cores[core]) for cores in m.numa_cores)


class Hint(NamedTuple):
    numa: int | None  # bitmask of NUMA nodes; None: any
    preferred: bool


def _cpu_hints(node: KubeletNode, avail: int, reusable: int, request: int) -> list[Hint]:
    """generateCPUTopologyHints: every NUMA mask whose free (and reusable) CPUs hold the request, preferred when
    its size is the fewest NUMA nodes whose *total* CPUs hold it."""
    m = node.machine
    smallest = m.fewest_numa(request)
    hints = []
    for mask, cpus, size in m.masks:
        if reusable & ~cpus:
            continue
        if (reusable | (avail & cpus)).bit_count() >= request:
            hints.append(Hint(mask, size == smallest))
    return hints


def _narrower(a: int, b: int) -> bool:
    ca, cb = a.bit_count(), b.bit_count()
    return a < b if ca == cb else ca < cb


def _average_distance(m: Machine, mask: int) -> float:
    ids = list(bits(mask))
    return sum(m.distances[a][b] for a in ids for b in ids) / (len(ids) ** 2)


def _merge(node: KubeletNode, providers: Sequence[list[Hint] | None]) -> tuple[Hint, bool]:
    """The policy's Merge: the best of every permutation of one hint per provider, and whether it admits."""
    cfg, m = node.config, node.machine
    if len(providers) == 1 and providers[0] and not (cfg.prefer_closest and cfg.topology_policy != SINGLE_NUMA_NODE):
        # One provider (the CPU Manager's, the Memory Manager off): every preferred hint is of the fewest NUMA
        # nodes, and the lowest mask among them wins; without one, restricted and single-numa-node reject.
        single = cfg.topology_policy == SINGLE_NUMA_NODE
        lowest = min((h.numa for h in providers[0] if h.preferred and h.numa is not None
                      and (not single or h.numa.bit_count() == 1)), default=None)
        if lowest is not None:
            return (Hint(None, True) if single and lowest == (1 << m.numa_count) - 1 else Hint(lowest, True)), True
        if cfg.topology_policy != BEST_EFFORT:
            return Hint(None, False), False
    default = (1 << m.numa_count) - 1
    filtered: list[list[Hint]] = [[Hint(None, True)] if hints is None else hints or [Hint(None, False)]
                                  for hints in providers]
    if cfg.topology_policy == SINGLE_NUMA_NODE:
        filtered = [[h for h in hints if h.preferred and (h.numa is None or h.numa.bit_count() == 1)]
                    for hints in filtered]
    closest = cfg.prefer_closest and cfg.topology_policy != SINGLE_NUMA_NODE

    def better_mask(current: int, candidate: int) -> bool:
        if candidate == current:
            return False
        if closest and current.bit_count() == candidate.bit_count():
            dc, dn = _average_distance(m, current), _average_distance(m, candidate)
            return candidate < current if dc == dn else dn < dc
        return _narrower(candidate, current)

    narrowest = [min((h.numa for h in hints if h.numa is not None), key=lambda x: (x.bit_count(), x), default=None)
                 for hints in filtered]
    best_count = max((n.bit_count() for n in narrowest if n is not None), default=0)
    best: Hint | None = None
    for perm in itertools.product(*filtered):
        preferred, first, merged = True, None, default
        for h in perm:
            if h.numa is not None:
                if first is None:
                    first = h.numa
                elif h.numa != first:
                    preferred = False
                merged &= h.numa
            if not h.preferred:
                preferred = False
        cand = Hint(merged, preferred)
        if merged == 0:
            continue
        if best is None:
            best = cand
            continue
        current = best.numa or 0  # every candidate kept has a mask
        cur_n, cand_n = current.bit_count(), merged.bit_count()
        if best.preferred != cand.preferred:
            if cand.preferred:
                best = cand
            continue
        if best.preferred or cur_n > best_count:
            if better_mask(current, merged):
                best = cand
            continue
        if cur_n == best_count:
            if cand_n == best_count and better_mask(current, merged):
                best = cand
            continue
        if cand_n > best_count:
            continue
        if cand_n == best_count or cand_n > cur_n:
            best = cand
            continue
        if cand_n == cur_n and better_mask(current, merged):
            best = cand
    result = best or Hint(default, False)
    if cfg.topology_policy == SINGLE_NUMA_NODE and result.numa == default:
        result = Hint(None, result.preferred)
    admit = cfg.topology_policy == BEST_EFFORT or result.preferred
    return result, admit


class Rejected(NamedTuple):
    reason: str
    message: str  # the pod's status message: "Pod was rejected: …"


class Block(NamedTuple):
    """A running container's memory under the Static Memory Manager (a regular init container's is freed when the
    next container starts: memorymanager's AddContainer)."""

    numa: int  # its NUMA nodes (bitmask)
    size: int  # bytes

class Admitted(NamedTuple):
    cpus: Mapping[str, int]  # container -> its exclusive CPUs (only containers that have some)
    default: int  # the CPU Manager's default set with the pod in it
    memory: Mapping[str, Block]  # container -> its memory block (Static Memory Manager only)
    before: KState
    uid: str
    requested: tuple[int, int]
    memory_after: MemoryState | None

    @property
    def state(self) -> KState:
        """The node's state with the pod in it: built when asked (a fit that is only scored never needs it)."""
        after = self.before.copy()
        after.default = self.default
        after.memory = self.memory_after
        if self.cpus:
            after.assigned[self.uid] = dict(self.cpus)
        after.request(self.uid, self.requested)
        return after


def _rejected(reason: str, text: str) -> Rejected:
    return Rejected(reason, "Pod was rejected: " + text)


def _unexpected(err: str) -> Rejected:
    return _rejected(UNEXPECTED_ADMISSION_ERROR, f"Allocate failed due to {err}, which is unexpected")


class _Pass:
    """One pod's admission on a scratch copy of the CPU Manager's default set."""

    __slots__ = ("cpus", "default", "mem", "node", "pod", "reuse")

    def __init__(self, node: KubeletNode, state: KState, pod: KPod) -> None:
        self.node, self.pod, self.default = node, pod, state.default
        self.cpus: dict[str, int] = {}
        self.reuse = 0  # cpusToReuse: CPUs of this pod's finished init containers
        self.mem = None if state.memory is None else _MemoryPass(node, state.memory, pod)

    def available(self) -> int:
        return self.default & ~self.node.reserved

    def hints(self, cpus: int, memory: int) -> list[list[Hint] | None]:
        """Each provider's hints, in the kubelet's order: the CPU Manager's, then the Memory Manager's."""
        mine = None if cpus == 0 or self.pod.pod_level else _cpu_hints(self.node, self.available(), self.reuse, cpus)
        return [mine] if self.mem is None else [mine, self.mem.hints(memory)]

    def affinity(self, cpus: int, memory: int) -> tuple[Hint, bool]:
        """The Topology Manager's merged hint for a request, and whether its policy admits it."""
        cfg = self.node.config
        if self.mem is None and cpus and not self.pod.pod_level and cfg.topology_policy != BEST_EFFORT and \
                not (cfg.prefer_closest and cfg.topology_policy != SINGLE_NUMA_NODE):
            # The CPU Manager alone, and a policy that admits only a preferred hint: that is a mask of the fewest
            # NUMA nodes whose total CPUs hold the request, and the lowest such mask with room now wins (_merge's
            # answer, without building every hint).
            m = self.node.machine
            smallest = m.fewest_numa(cpus)
            if cfg.topology_policy == SINGLE_NUMA_NODE and smallest > 1:
                return Hint(None, False), False
            avail, reuse = self.available(), self.reuse
            # by_size is in mask order: the first with room is the lowest.
            lowest = next((mask for mask, numa in m.by_size[smallest] if not reuse & ~numa
                           and (reuse | (avail & numa)).bit_count() >= cpus), None)
            if lowest is None:
                return Hint(None, False), False
            return (Hint(None, True) if lowest == (1 << m.numa_count) - 1 and cfg.topology_policy == SINGLE_NUMA_NODE
                    else Hint(lowest, True)), True
        return _merge(self.node, self.hints(cpus, memory))

    def allocate(self, c: KContainer, hint: Hint | None) -> Rejected | None:
        why = self._allocate_cpus(c, hint.numa if hint is not None else None)
        if why is None and self.mem is not None:
            why = self.mem.allocate(c, hint)
        return why

    def _allocate_cpus(self, c: KContainer, affinity: int | None) -> Rejected | None:
        n = c.cpus
        if n == 0 or self.pod.pod_level:
            return None
        node, m = self.node, self.node.machine
        if node.option(FULL_PCPUS_ONLY):
            group = m.cpus_per_core
            if n % group:
                return _rejected(SMT_ALIGNMENT_ERROR, f"SMT Alignment Error: requested {n} cpus not multiple cpus "
                                                      f"per core = {group}")
            physical = (self.default & ~node.reserved_physical).bit_count()
            if n > physical:
                return _rejected(SMT_ALIGNMENT_ERROR, "SMT Alignment Error: not enough free physical CPUs: "
                                 f"available physical CPUs = {physical}, requested CPUs = {n}, CPUs per core = {group}")
        pool = self.available() | self.reuse
        taken = 0
        if affinity is not None:
            aligned = pool & m.numa_mask(affinity)
            want = min(n, aligned.bit_count())
            got = self._take(aligned, want)
            if got is None:
                return _unexpected(f"not enough cpus available to satisfy request: requested={want}, "
                                   f"available={aligned.bit_count()}")
            taken = got
        rest = self._take(pool & ~taken, n - taken.bit_count())
        if rest is None:
            return _unexpected(f"not enough cpus available to satisfy request: requested={n - taken.bit_count()}, "
                               f"available={(pool & ~taken).bit_count()}")
        taken |= rest
        self.default &= ~taken
        self.cpus[c.name] = taken
        self.reuse = self.reuse | taken if c.kind == "init" else self.reuse & ~taken
        return None

    def _take(self, avail: int, need: int) -> int | None:
        node = self.node
        if node.option(DISTRIBUTE_ACROSS_NUMA):
            group = node.machine.cpus_per_core if node.option(FULL_PCPUS_ONLY) else 1
            return _take_distributed(node.machine, avail, need, group)
        return take_packed(node.machine, avail, need)


def admit(node: KubeletNode, state: KState, pod: KPod) -> Admitted | Rejected:
    """The kubelet's answer to pod `pod` arriving on a node in `state`: the Topology Manager's admit handler (which
    allocates), then the resource predicate. Pure: `state` is not changed."""
    run = _Pass(node, state, pod)
    policy = node.config.topology_policy
    if policy == NONE:
        for c in pod.containers:
            if (why := run.allocate(c, None)) is not None:
                return why
    elif node.config.topology_scope == POD:
        hint, ok = run.affinity(pod.pod_cpus(), pod.memory)
        if not ok:
            return _rejected(TOPOLOGY_AFFINITY_ERROR, "Resources cannot be allocated with Topology locality")
        for c in pod.containers:
            if (why := run.allocate(c, hint)) is not None:
                return why
    else:
        for c in pod.containers:
            hint, ok = run.affinity(c.cpus, c.memory)
            if not ok:
                return _rejected(TOPOLOGY_AFFINITY_ERROR, "Resources cannot be allocated with Topology locality")
            if (why := run.allocate(c, hint)) is not None:
                return why
    if (why := _predicate(node, state, pod)) is not None:
        return why
    memory_after = run.mem.state(state.memory) if run.mem is not None and state.memory is not None else None
    return Admitted(run.cpus, run.default, run.mem.placed() if run.mem is not None else {}, state, pod.uid,
                    (pod.cpu_milli, pod.memory), memory_after)


def _predicate(node: KubeletNode, state: KState, pod: KPod) -> Rejected | None:
    """The kubelet's resource predicate (after the Topology Manager): requests against allocatable."""
    allocatable_milli = (node.machine.all.bit_count() - node.reserved.bit_count()) * 1000
    used = state.used[0]
    if pod.cpu_milli and used + pod.cpu_milli > allocatable_milli:
        return _rejected("OutOfcpu", f"Node didn't have enough resource: cpu, requested: {pod.cpu_milli}, used: "
                                     f"{used}, capacity: {allocatable_milli}")
    allocatable_memory = sum(node.machine.memory) - sum(node.config.reserved_memory)
    used = state.used[1]
    # A machine whose memory nothing reports (no NodeResourceTopology zones, no capacity): not checked.
    if pod.memory and any(node.machine.memory) and used + pod.memory > allocatable_memory:
        return _rejected("OutOfmemory", f"Node didn't have enough resource: memory, requested: {pod.memory}, used: "
                                        f"{used}, capacity: {allocatable_memory}")
    return None


def reconcile(node: KubeletNode, state: KState, published: Sequence[int], unknown: Iterable[str], unseen: str
              ) -> KState:
    """The state with the free CPUs per NUMA node that node-feature-discovery published (from the kubelet's
    podresources API): where it shows fewer free, the difference is held as `unseen`; where it shows more, the pods
    of unknown placement give back what they were guessed to hold there."""
    m = node.machine
    after = state.copy()
    extra = 0
    for numa, (ours, theirs) in enumerate(zip(free_per_numa(node, state), published)):
        if theirs < ours:
            got = take_packed(m, available(node, after) & m.numa[numa], ours - theirs) or 0
            after.default &= ~got
            extra |= got
        elif theirs > ours:
            left = theirs - ours
            for uid in unknown:
                held = after.assigned.get(uid)
                for container, cpus in list((held or {}).items()):
                    for cpu in sorted(bits(cpus & m.numa[numa]), reverse=True)[:left]:
                        cpus &= ~(1 << cpu)
                        after.default |= 1 << cpu
                        left -= 1
                    if held is not None:
                        held[container] = cpus
                if left == 0:
                    break
    if extra:
        after.assigned[unseen] = {"": extra}
        after.request(unseen, (0, 0))
    return after


def reconcile_memory(mem: MemoryState, published: Sequence[int], unknown: Iterable[str]) -> MemoryState:
    """The Memory Manager's state with the single-NUMA blocks of pods of unknown placement moved, one by one, from
    NUMA nodes where it shows less free memory than node-feature-discovery published to ones where it shows at
    least that block more, as long as that brings them closer (most blocks of small pods are single-NUMA, and a
    replay in creation order puts them where the pods since gone left room)."""
    diff = [ours - theirs for ours, theirs in zip(mem.free, published)]  # > 0: a block is missing there
    after = mem
    for uid in unknown:
        for name, (numa, size) in list(after.blocks.get(uid, {}).items()):
            here = numa.bit_length() - 1
            if numa.bit_count() != 1 or diff[here] >= 0 or size == 0:
                continue
            there = next((i for i in sorted(range(len(diff)), key=lambda i: (diff[i] != size, i))
                          if diff[i] >= size), None)
            if there is None:
                continue
            diff[here] += size
            diff[there] -= size
            moved = _release_memory(after, {name: (numa, size)})
            free, count, cells = list(moved.free), list(moved.count), list(moved.cells)
            _charge(free, count, cells, 1 << there, size)
            blocks = {**moved.blocks, uid: {**moved.blocks[uid], name: (1 << there, size)}}
            after = MemoryState(tuple(free), tuple(count), tuple(cells), mem.allocatable, blocks)
    return after


def pessimize(node: KubeletNode, state: KState, unknown: Iterable[str], unseen: str) -> KState:
    """Where nothing says where the pods of unknown placement are (no NodeResourceTopology), each NUMA node is
    charged as if they were all there: the CPUs they were guessed to hold elsewhere are held on it too, so nothing
    admitted next counts on CPUs they may hold."""
    m = node.machine
    held = [0] * m.numa_count
    for uid in unknown:
        for cpus in state.assigned.get(uid, {}).values():
            for numa, count in enumerate(m.per_numa(cpus)):
                held[numa] += count
    total = sum(held)
    if not total:
        return state
    after = state.copy()
    extra = 0
    for numa in range(m.numa_count):
        want = total - held[numa]
        free = available(node, after) & m.numa[numa]
        got = take_packed(m, free, min(want, free.bit_count())) or 0
        after.default &= ~got
        extra |= got
    if extra:
        after.assigned[unseen] = {"": extra}
        after.request(unseen, (0, 0))
    return after


def rekey(state: KState, old: str, new: str) -> KState:
    """The state with pod `old`'s CPUs and requests under uid `new` (a fit asks for a pod not yet named)."""
    after = state.copy()
    if old in after.assigned:
        after.assigned[new] = after.assigned.pop(old)
    if old in after.requested:
        after.request(new, after.requested[old])
        after.unrequest(old)
    if after.memory is not None and old in after.memory.blocks:
        after.memory.blocks[new] = after.memory.blocks.pop(old)
    return after


def remove(state: KState, uid: str) -> KState:
    """The pod is gone: its CPUs return to the default set (RemoveContainer, for each of its containers)."""
    after = state.copy()
    for cpus in after.assigned.pop(uid, {}).values():
        after.default |= cpus
    after.unrequest(uid)
    if after.memory is not None and uid in after.memory.blocks:
        after.memory = _release_memory(after.memory, after.memory.blocks.pop(uid))
    return after


def place_known(state: KState, uid: str, cpus: Mapping[str, int], requested: tuple[int, int],
                memory: Mapping[str, Block] | None = None, init: Collection[str] = ()) -> KState:
    """A pod whose CPUs (and memory blocks, its regular `init` containers' among them) are known (persisted at bind,
    or observed): held exactly there."""
    after = state.copy()
    held = 0
    for mask in cpus.values():
        held |= mask
    after.default &= ~held
    if cpus:
        after.assigned[uid] = dict(cpus)
    after.request(uid, requested)
    if after.memory is not None and memory:
        after.memory = started(after.memory, uid, memory, init)
    return after
