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
  preference is dropped otherwise (resizeCpusWithDevices), and its implicit anti-affinity to every other preferred
  NUMA node decides, as below: it may still land on one NUMA node, another one;
- a plain type with no such preference is pushed away from every NUMA node some other type prefers, lowest id
  first while the rest still has room (fillFarFromDevices), then taken from the deepest topology level with room
  (resizeCpusMaxLocalSet): one NUMA node when one has room, else spread, which we refuse.
A balloon takes whole cores (request / SMT width) unless the type spreads on physical cores, when each CPU is a
core of its own and its sibling is left to others.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Collection, Mapping
from functools import lru_cache
from typing import Final, NamedTuple

from placement import reasons
from placement.balloonspolicy import COMPONENT_BALANCE, BalloonsPolicy, BalloonType


class Plan(NamedTuple):
    per_numa: tuple[tuple[int, int], ...]  # (NUMA node id, whole cores), by NUMA id
    types: tuple[str, ...]  # every balloon type instantiated: the composite and each component
    cpus: int  # logical CPUs the balloon holds


# Why the plugin would fail the container, or leave its NUMA node.
Refusal = reasons.TypeCapped | reasons.ComponentMissing | reasons.PreferredNumaMissing | reasons.NoRoomOnOneNuma
# The same for isinstance, which checks a tuple of classes several times faster than a union (and a count, where
# a function returns one or a refusal, is told from it faster still, by one check of `int`).
_REFUSALS: Final = (reasons.TypeCapped, reasons.ComponentMissing, reasons.PreferredNumaMissing,
                    reasons.NoRoomOnOneNuma)

Instances = Mapping[str, int]  # balloons of each type on the node, components of composites included
_NONE: Instances = {}


def balloon_cpus(btype: BalloonType, milli: int) -> int:
    return max(1, math.ceil(milli / 1000), btype.min_cpus)


def plan(policy: BalloonsPolicy, btype: BalloonType, milli: int, free: tuple[int, ...], tpc: int,
         instances: Instances = _NONE) -> Plan | Refusal:
    """The balloon the plugin creates for a container of `milli` CPU in `btype`, on a node with `free` whole
    cores per NUMA node and `instances` balloons of each type."""
    return place(policy, compile_type(policy, btype.name, milli, tpc), free, instances)


def place(policy: BalloonsPolicy, step: Step, free: tuple[int, ...], instances: Instances = _NONE,
          unlent: tuple[int, ...] | None = None) -> Plan | Refusal:
    """`plan` for a type compiled by `compile_type`. `unlent`: under a policy that lends the reserved cpuset, the
    free cores per NUMA node that are not lent reserved ones."""
    if isinstance(step, _REFUSALS):
        return step
    pinned = step.pinned[_fewest(step, instances)] if isinstance(step, _Fewest) else step.pinned
    if pinned is not None and _has_room(pinned.per_numa, free):
        return pinned
    parts: list[tuple[int, int]] = []
    types: list[str] = []
    cpus = _run(policy, step, list(free), instances, parts, types, None if unlent is None else list(unlent))
    if not isinstance(cpus, int):
        return cpus
    return Plan(_by_numa(parts), tuple(types), cpus)


def _has_room(per_numa: tuple[tuple[int, int], ...], free: tuple[int, ...]) -> bool:
    return all(numa < len(free) and free[numa] >= cores for numa, cores in per_numa)


def _by_numa(parts: list[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    """(NUMA node, cores) by NUMA id, the balloons that share a NUMA node added up."""
    if len(parts) == 1:
        return tuple(parts)
    merged: dict[int, int] = {}
    for numa, cores in parts:
        merged[numa] = merged.get(numa, 0) + cores
    return tuple(sorted(merged.items()))


def plan_empty(policy: BalloonsPolicy, btype: BalloonType, milli: int, capacity: tuple[int, ...], tpc: int
               ) -> Plan | Refusal:
    """`plan` on an empty node of this shape: a refusal here no eviction can change. Memoised: a fleet has a
    few shapes and policies, asked about for thousands of nodes."""
    return _plan_empty(policy, btype.name, milli, capacity, tpc)


@lru_cache(maxsize=4096)
def _plan_empty(policy: BalloonsPolicy, name: str, milli: int, capacity: tuple[int, ...], tpc: int) -> Plan | Refusal:
    return plan(policy, policy.known_type(name), milli, capacity, tpc)


# What the plugin does for a type and request, decided once per (policy, type, request, SMT width): everything
# but the NUMA node each balloon is taken from, which depends on what the node holds. A fit then only walks it.
class _Balloon(NamedTuple):
    btype: BalloonType
    cores: int
    cpus: int
    pinned: Plan | None  # the type prefers a NUMA node: its plan wherever that node has room


class _All(NamedTuple):
    name: str
    steps: tuple[Step, ...]  # one balloon per component, in order
    pinned: Plan | None  # every balloon's type prefers a NUMA node: the plan wherever they all have room


class _Fewest(NamedTuple):
    name: str
    steps: tuple[Step, ...]  # balance-balloons: one of these
    closures: tuple[tuple[str, ...], ...]  # each one's type with every type it is made of
    pinned: tuple[Plan | None, ...]  # per step, as _All's


Step = _Balloon | _All | _Fewest | Refusal


@lru_cache(maxsize=4096)
def compile_type(policy: BalloonsPolicy, name: str, milli: int, tpc: int) -> Step:
    """What the plugin does for a container of `milli` CPU in the policy's type `name` on nodes of SMT width
    `tpc`, but for the NUMA nodes: what `place` walks."""
    # Keyed by the type's name: hashing a BalloonType (a dozen fields) would cost more than the lookup saves.
    btype = policy.known_type(name)
    asked = max(1, math.ceil(milli / 1000))
    if btype.max_cpus and asked > btype.max_cpus:
        return reasons.TypeCapped(name, btype.max_cpus, asked)
    if not btype.composite:
        cpus = balloon_cpus(btype, milli)
        cores = cpus if policy.spreads(btype) else math.ceil(cpus / tpc)
        k = btype.close_numa
        return _Balloon(btype, cores, cpus, None if k is None else Plan(((k, cores),), (name,), cpus))
    missing = [c for c in btype.components if policy.balloon_type(c) is None]
    if missing:
        return reasons.ComponentMissing(name, missing[0])
    if btype.component_creation == COMPONENT_BALANCE:
        steps = tuple(compile_type(policy, c, milli, tpc) for c in btype.components)
        return _Fewest(name, steps, tuple(_closure(policy, c) for c in btype.components),
                       tuple(_pinned(name, (step,)) for step in steps))
    steps = tuple(compile_type(policy, c, milli // len(btype.components), tpc) for c in btype.components)
    return _All(name, steps, _pinned(name, steps))


def _pinned(name: str, steps: tuple[Step, ...]) -> Plan | None:
    """The plan of composite `name` made of `steps` when each of them has a plan of its own wherever there is
    room (a balloon of a type that prefers a NUMA node, or such composites); else None."""
    known: list[Plan] = []
    for step in steps:
        pinned = None if isinstance(step, (_Fewest, *_REFUSALS)) else step.pinned
        if pinned is None:
            return None
        known.append(pinned)
    return Plan(_by_numa([part for plan in known for part in plan.per_numa]),
                (name, *(t for plan in known for t in plan.types)), sum(plan.cpus for plan in known))


@lru_cache(maxsize=4096)
def variants(step: Step) -> tuple[Step, ...]:
    """`step` once for each balloon the plugin may make of it, every balance-balloons choice taken in turn (which
    one it makes depends on instance counts): each variant is a plain composite that `place` walks without
    reading any count."""
    if isinstance(step, _Fewest):
        return tuple(_All(step.name, (v,), _pinned(step.name, (v,))) for sub in step.steps for v in variants(sub))
    if isinstance(step, _All):
        choices = [variants(sub) for sub in step.steps]
        if all(len(c) == 1 and c[0] is sub for c, sub in zip(choices, step.steps)):
            return (step,)
        return tuple(_All(step.name, combo, _pinned(step.name, combo)) for combo in itertools.product(*choices))
    return (step,)


def types_on(policy: BalloonsPolicy, step: Step, capacity: tuple[int, ...], numa: Collection[int]) -> tuple[str, ...]:
    """The balloon types the plugin instantiated for a balloon of `step` it put on NUMA nodes `numa`: those of the
    variant it could have made there (most NUMA nodes in common, ties to the first listed, as balance-balloons
    breaks them). What balance-balloons counts for the next pod, composite blocks included."""
    best: tuple[str, ...] = ()
    most = -1
    for variant in variants(step):
        plan = place(policy, variant, capacity)
        if isinstance(plan, Plan):
            common = sum(1 for n, _ in plan.per_numa if n in numa)
            if common > most:
                best, most = plan.types, common
    return best


def _closure(policy: BalloonsPolicy, name: str) -> tuple[str, ...]:
    seen = [name]
    for current in seen:
        btype = policy.balloon_type(current)
        for comp in btype.components if btype is not None else ():
            if comp not in seen:
                seen.append(comp)
    return tuple(seen)


def _run(policy: BalloonsPolicy, step: Step, free: list[int], instances: Instances, parts: list[tuple[int, int]],
         types: list[str], unlent: list[int] | None) -> int | Refusal:
    """Place `step`'s balloon(s) into `free` (and `unlent`, updated), recording them in `parts` and `types`; the
    logical CPUs they hold, or why the plugin would fail the container or leave its NUMA node."""
    if isinstance(step, _Balloon):
        btype = step.btype
        types.append(btype.name)
        cores = step.cores
        numa = _numa_for(policy, btype, cores, free, unlent)
        if not isinstance(numa, int):
            return numa
        free[numa] -= cores
        if unlent is not None:  # lent reserved cores are taken last
            unlent[numa] = max(0, unlent[numa] - cores)
        parts.append((numa, cores))
        return step.cpus
    if isinstance(step, _REFUSALS):
        return step
    types.append(step.name)
    if isinstance(step, _Fewest):
        return _run(policy, step.steps[_fewest(step, instances)], free, instances, parts, types, unlent)
    total = 0
    for sub in step.steps:
        cpus = _run(policy, sub, free, instances, parts, types, unlent)
        if not isinstance(cpus, int):
            return cpus
        total += cpus
    return total


def _fewest(step: _Fewest, instances: Instances) -> int:
    """balloonsByDefIncludingComponents: the component whose type, with every type it is composed of, has the
    fewest balloons, ties to the first listed. A block of NUMA nodes is thus chosen by how many balloons its
    NUMA nodes already hold."""
    best, fewest = 0, -1
    for i, closure in enumerate(step.closures):
        count = 0
        for name in closure:
            count += instances.get(name, 0)
        if fewest < 0 or count < fewest:
            best, fewest = i, count
    return best


def _numa_for(policy: BalloonsPolicy, btype: BalloonType, cores: int, free: list[int], unlent: list[int] | None
              ) -> int | Refusal:
    if btype.close_numa is not None:
        k = btype.close_numa
        if k >= len(free):
            return reasons.PreferredNumaMissing(btype.name, k, len(free))
        if free[k] >= cores:
            return k
        # The preference is dropped and the type's implicit preferFarFromDevices (every NUMA node other types
        # prefer, its own excepted) decides, as for a plain type (resizeCpusWithDevices): often still one NUMA node.
    else:
        k = None
    # Lent reserved CPUs are the first device every other type is kept far from (fillFarFromDevices lists the
    # reserved type's first): the hint holds while the unreserved free cores hold the balloon, and then the choice
    # below is made among them (on the real plugin: tests/oracle/test_lent_reserved.py).
    if unlent is not None and sum(unlent) >= cores:
        free = unlent
    allowed = list(range(len(free)))
    room = sum(free)  # in `allowed`
    if policy.numa_preferring:
        for j in range(len(free)):
            if j != k and len(allowed) > 1 and room - free[j] >= cores:
                allowed.remove(j)
                room -= free[j]
    fitting = [i for i in allowed if free[i] >= cores]
    if not fitting:
        together = room >= cores
        return reasons.NoRoomOnOneNuma(btype.name, cores, k,
                                       reasons.NOT_NUMA_LOCAL if together else reasons.INSUFFICIENT_FREE)
    if policy.topology_balancing:
        return max(fitting, key=lambda i: (free[i], -i))
    return min(fitting, key=lambda i: (free[i], i))
