"""Where the balloons plugin grows and shrinks a balloon that non-model containers share (reserved, default, a
namespace-routed type), NUMA node by NUMA node, in cores.

Read from nri-plugins v0.14.0 (cmd/plugins/balloons/policy: resizeBalloon, cputree.go's resizer chain, and
pkg/cpuallocator) and held to the real plugin in tests/oracle/test_inflation.py:
- growing by `delta`, the device hints go first: a type that prefers a NUMA node keeps to it when it has room
  for all of `delta`; then, for every NUMA node some other type prefers (fillFarFromDevices, in the policy's
  order), that node is left out while what remains still holds all of `delta`. Among what is left, a NUMA node
  that holds all of `delta` alone takes it (resizeCpusMaxLocalSet: the one where the balloon already has most
  cores, then the tightest fit unless the policy balances topology, then the lowest id); otherwise idle cores
  are taken in id order (takeIdleCores), which is NUMA node order;
- shrinking, cores go one at a time (resizeCpusOneAtATime) from the NUMA node where the balloon has the fewest
  cores, then the fewest free, then the highest id (sorterRelease), never the reserved cpuset's own. The plugin
  compares packages before NUMA nodes, which the ledger cannot see (no label nor NodeResourceTopology says which
  NUMA nodes share a package): on nodes of several packages with several NUMA nodes each, where a shrink frees
  cores is the plugin's exported zones' to tell.
So growth depends on what was free at each resize, and the ledger applies each one as it happens. It does so
under policies where some type prefers a NUMA node (the generated one): that is where it is held to the plugin.
Elsewhere (a policy of plain types) the ledger keeps spreading the growth where most is free.

Every comparison above is made package first (the plugin's sorters compare the balloon's and the free CPUs level by
level from the top of the topology), then NUMA node: `packages` gives each NUMA node's package. Without it each
NUMA node is a package of its own, which is what a node of one NUMA node per package, or of one package, does.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def grow(grown: Sequence[int], free: Sequence[int], delta: int, *, close: int | None = None,
         far: Sequence[int] = (), base: Sequence[int] = (), balancing: bool = False,
         packages: Sequence[int] = ()) -> tuple[int, ...]:
    """`grown` (cores per NUMA node beyond `base`, the balloon's own reserved cores; or CPUs, as the ledger also
    counts them: `NodeLedger._threads`) after `delta` more, taken from `free`. `close` is the NUMA node the type
    prefers; `far`, in order, the ones others prefer."""
    numa = range(len(free))
    pkg = packages or tuple(numa)
    held = [g + (base[i] if i < len(base) else 0) for i, g in enumerate(grown)]
    room = {i for i in numa if free[i] > 0}
    if close is not None and free[close] >= delta:
        room = {close}
    for node in far:
        if node in room and sum(free[i] for i in room - {node}) >= delta:
            room.discard(node)
    held_pkg = _by_package(pkg, held, numa)
    free_pkg = _by_package(pkg, free, room)
    sign = -1 if balancing else 1
    out = list(grown)
    alone = [i for i in room if free[i] >= delta]
    if alone:
        best = min(alone, key=lambda i: (-held_pkg[pkg[i]], -held[i], sign * free_pkg[pkg[i]], sign * free[i], i))
        out[best] += delta
        return tuple(out)
    # No NUMA node holds it: the package that does, by the same order, else the whole node; idle cores in id order.
    whole = [p for p in sorted(free_pkg) if free_pkg[p] >= delta]
    if whole:
        chosen = min(whole, key=lambda p: (-held_pkg[p], sign * free_pkg[p], p))
        room = {i for i in room if pkg[i] == chosen}
    for i in sorted(room):
        take = min(delta, free[i])
        out[i] += take
        delta -= take
        if not delta:
            break
    return tuple(out)


def shrink(grown: Sequence[int], free: Sequence[int], delta: int, *, base: Sequence[int] = (),
           packages: Sequence[int] = ()) -> tuple[int, ...]:
    """`grown` after `delta` fewer cores (or CPUs), released one at a time."""
    out, room = list(grown), list(free)
    numa = range(len(out))
    pkg = packages or tuple(numa)
    held = [g + (base[i] if i < len(base) else 0) for i, g in enumerate(out)]
    for _ in range(min(delta, sum(out))):
        held_pkg = _by_package(pkg, held, numa)
        room_pkg = _by_package(pkg, room, numa)
        i = min((i for i in numa if out[i] > 0),
                key=lambda i: (held_pkg[pkg[i]], held[i], room_pkg[pkg[i]], room[i], -i))
        out[i] -= 1
        held[i] -= 1
        room[i] += 1
    return tuple(out)


def _by_package(packages: Sequence[int], values: Sequence[int], numa: Iterable[int]) -> dict[int, int]:
    """Sum of `values` per package over NUMA nodes `numa`; every package present, at 0 when none of `numa` is in it."""
    out = dict.fromkeys(packages, 0)
    for i in numa:
        out[packages[i]] += values[i]
    return out
