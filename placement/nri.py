"""Where the NRI balloons plugin will put a model container's balloon, predicted from what a node holds.

The rules are the plugin's own (containers/nri-plugins, cmd/plugins/balloons/policy, the release pinned in
tests/peers/balloons), and tests/oracle holds this module to the real plugin:
- a balloon holds ceil(request) logical CPUs, at least 1, at least minCPUs; a request above maxCPUs fails the
  container (MaxAvailMilliCpus), it is never clamped into a smaller balloon;
- a composite type makes one balloon per component, each sized request / components (resizeCompositeBalloon);
  with componentCreation balance-balloons, one balloon of the component type that, counted with every type
  it is made of, has the fewest balloons, components included, ties to the first listed (newCompositeBalloon,
  balloonsByDefIncludingComponents);
- a plain type that prefers /sys/devices/system/node/nodeN is taken from NUMA node N when N has room; the
  preference is dropped otherwise (resizeCpusWithDevices), and we then refuse: where it would go is not NUMA-local
  by design;
- a plain type with no such preference is pushed away from every NUMA node some other type prefers, lowest id
  first while the rest still has room (fillFarFromDevices), then taken from the deepest topology level with room
  (resizeCpusMaxLocalSet): one NUMA node when one has room, else spread, which we refuse.
A balloon takes whole cores (request / SMT width) unless the type spreads on physical cores, when each CPU is a
core of its own and its sibling is left to others.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import lru_cache
from typing import NamedTuple

from placement.topology import COMPONENT_BALANCE, BalloonsPolicy, BalloonType

# The plugin reads a container's CPU request back from its cpu.shares (pkg/resmgr/cache), and the kubelet's
# MilliCPUToShares stops at 262,144 shares: 256 CPUs. The oracle showed a 288-CPU request given a 256-CPU balloon.
MAX_REQUEST_MILLI = 262_144 * 1000 // 1024

# Check ids (shared with fit.py's).
INSUFFICIENT_FREE = "insufficient-free"
BALLOON_TYPE_CAPPED = "balloon-type-max-cpus"
BALLOON_TYPE_MISSING = "balloon-type-missing"
NOT_NUMA_LOCAL = "balloon-not-numa-local"


class Plan(NamedTuple):
    per_numa: tuple[tuple[int, int], ...]  # (NUMA node id, whole cores), by NUMA id
    types: tuple[str, ...]  # every balloon type instantiated: the composite and each component
    cpus: int  # logical CPUs the balloon holds


class Refusal(NamedTuple):
    check: str
    reason: str  # names neither node nor pod: the class of refusal with its numbers
    resolvable: bool  # could freeing capacity on this node change it?


Instances = Callable[[str], int]


def _no_instances(name: str) -> int:
    return 0


def balloon_cpus(btype: BalloonType, milli: int) -> int:
    return max(1, math.ceil(milli / 1000), btype.min_cpus)


def plan(policy: BalloonsPolicy, btype: BalloonType, milli: int, free: tuple[int, ...], tpc: int,
         instances: Instances = _no_instances) -> Plan | Refusal:
    """The balloon the plugin creates for a container of `milli` CPU in `btype`, on a node with `free` whole
    cores per NUMA node and `instances` balloons of each type."""
    left = list(free)
    parts: dict[int, int] = {}
    types: list[str] = []
    cpus = _plan(policy, btype, milli, left, tpc, instances, parts, types)
    if isinstance(cpus, Refusal):
        return cpus
    return Plan(tuple(sorted(parts.items())), tuple(types), cpus)


def plan_empty(policy: BalloonsPolicy, btype: BalloonType, milli: int, capacity: tuple[int, ...], tpc: int
               ) -> Plan | Refusal:
    """`plan` on an empty node of this shape: a refusal here no eviction can change. Memoised: a fleet has a
    few shapes and policies, asked about for thousands of nodes."""
    return _plan_empty(policy, btype.name, milli, capacity, tpc)


@lru_cache(maxsize=4096)
def _plan_empty(policy: BalloonsPolicy, name: str, milli: int, capacity: tuple[int, ...], tpc: int) -> Plan | Refusal:
    return plan(policy, policy.balloon_type(name), milli, capacity, tpc)  # type: ignore[arg-type]


def _balanced(policy: BalloonsPolicy, comps: tuple[BalloonType, ...], instances: Instances) -> int:
    """balance-balloons: the component whose type, with every type it is composed of, has the fewest balloons
    (balloonsByDefIncludingComponents), ties to the first listed. A block of NUMA nodes is thus chosen by how
    many balloons its NUMA nodes already hold."""
    best, fewest = 0, -1
    for i, comp in enumerate(comps):
        count = sum(map(instances, _closure(policy, comp.name)))
        if fewest < 0 or count < fewest:
            best, fewest = i, count
    return best


@lru_cache(maxsize=4096)
def _components(policy: BalloonsPolicy, name: str) -> tuple[BalloonType | None, ...]:
    # Keyed by name: hashing a BalloonType (a dozen fields) would cost more than the lookup saves.
    btype = policy.balloon_type(name)
    return tuple(policy.balloon_type(c) for c in btype.components) if btype is not None else ()


@lru_cache(maxsize=4096)
def _closure(policy: BalloonsPolicy, name: str) -> tuple[str, ...]:
    seen = [name]
    for current in seen:
        btype = policy.balloon_type(current)
        for comp in btype.components if btype is not None else ():
            if comp not in seen:
                seen.append(comp)
    return tuple(seen)


def _plan(policy: BalloonsPolicy, btype: BalloonType, milli: int, free: list[int], tpc: int,
          instances: Instances, parts: dict[int, int], types: list[str]) -> int | Refusal:
    """Place `btype`'s balloon(s) into `free` (updated), recording them in `parts` and `types`; the logical CPUs
    they hold, or why the plugin would fail the container or leave its NUMA node."""
    types.append(btype.name)
    asked = max(1, math.ceil(milli / 1000))
    if btype.max_cpus and asked > btype.max_cpus:
        return Refusal(BALLOON_TYPE_CAPPED,
                       f"balloon type {btype.name} holds at most maxCPUs={btype.max_cpus} CPUs and this needs "
                       f"{asked}", False)
    if not btype.composite:
        cpus = balloon_cpus(btype, milli)
        cores = cpus if policy.spreads(btype) else math.ceil(cpus / tpc)
        numa = _numa_for(policy, btype, cores, free, tpc)
        if isinstance(numa, Refusal):
            return numa
        free[numa] -= cores
        parts[numa] = parts.get(numa, 0) + cores
        return cpus
    comps = _components(policy, btype.name)
    if None in comps:
        missing = next(c for c, t in zip(btype.components, comps) if t is None)
        return Refusal(BALLOON_TYPE_MISSING,
                       f"composite balloon type {btype.name} names component type {missing}, which the "
                       "BalloonsPolicy does not define", False)
    known: tuple[BalloonType, ...] = comps  # type: ignore[assignment]
    if btype.component_creation == COMPONENT_BALANCE:
        return _plan(policy, known[_balanced(policy, known, instances)], milli, free, tpc, instances, parts, types)
    total = 0
    for comp in known:
        cpus = _plan(policy, comp, milli // len(known), free, tpc, instances, parts, types)
        if isinstance(cpus, Refusal):
            return cpus
        total += cpus
    return total


def _numa_for(policy: BalloonsPolicy, btype: BalloonType, cores: int, free: list[int], tpc: int) -> int | Refusal:
    if btype.close_numa is not None:
        k = btype.close_numa
        if k >= len(free):
            return Refusal(NOT_NUMA_LOCAL, f"balloon type {btype.name} prefers NUMA node {k}, which a node with "
                                           f"{len(free)} NUMA node{'s' if len(free) != 1 else ''} lacks", False)
        if free[k] < cores:
            return Refusal(INSUFFICIENT_FREE,
                           f"balloon type {btype.name} is carved from NUMA node {k} and needs {_cores(cores)} there",
                           True)
        return k
    allowed = list(range(len(free)))
    if policy.numa_preferring:
        for k in range(len(free)):
            rest = [i for i in allowed if i != k]
            if rest and sum(free[i] for i in rest) >= cores:
                allowed = rest
    fitting = [i for i in allowed if free[i] >= cores]
    if not fitting:
        return Refusal(NOT_NUMA_LOCAL if sum(free[i] for i in allowed) >= cores else INSUFFICIENT_FREE,
                       f"balloon type {btype.name} needs {_cores(cores)} on one NUMA node", True)
    if policy.topology_balancing:
        return max(fitting, key=lambda i: (free[i], -i))
    return min(fitting, key=lambda i: (free[i], i))


def _cores(count: int) -> str:
    return f"{count} free core{'s' if count != 1 else ''}"
