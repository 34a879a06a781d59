"""What a user would call a good placement, read off the cpusets the real plugin gave: one verdict for the oracle
and the fleet benchmark alike."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from tests.oracle.sysfs import NodeShape


def cores_by_numa(shape: NodeShape, cpus: Iterable[int]) -> dict[int, int]:
    """Physical cores per NUMA node of a cpuset."""
    cores = {shape.core_of(c) for c in cpus}
    return dict(Counter(core // shape.cores_per_numa for core in cores))


def rank_per_numa(spread: dict[int, int], ranks: int, cpus: int, shape: NodeShape) -> bool:
    """Each rank on a NUMA node of its own, with its whole share of the request there: vLLM binds rank i to the
    i-th NUMA node of its cpuset, so 11 cores on one and 3 on the other is not TP=2 on 7 + 7."""
    return len(spread) == ranks and all(c * ranks * shape.threads_per_core >= cpus for c in spread.values())


def shared_cores(shape: NodeShape, mine: Iterable[int], others: Iterable[Iterable[int]]) -> set[int]:
    """Physical cores of cpuset `mine` that a thread of any of the `others` runs on."""
    theirs = {shape.core_of(c) for cpus in others for c in cpus}
    return {shape.core_of(c) for c in mine} & theirs
