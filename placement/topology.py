"""A node's CPUs: NUMA nodes -> physical cores -> SMT threads, and its reserved cpuset.

The vocabulary follows kubelet's cpumanager/topology: a CPUSet of logical CPU ids, cores made of SMT
threads, NUMA nodes made of cores. Everything here is an immutable value or a pure function.
"""

from __future__ import annotations

import contextlib
import math
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from placement.quantity import QuantityError, cpu_milli

# --------------------------------------------------------------------------------------------------
# CPUSet


class CPUSetError(ValueError):
    pass


_RANGE = re.compile(r"^\s*(\d+)\s*(?:-\s*(\d+)\s*)?$")


@dataclass(frozen=True, slots=True)
class CPUSet:
    """An immutable set of logical CPU ids that prints as a Linux cpuset list (`0-3,8,10-11`)."""

    cpus: frozenset[int] = frozenset()

    @classmethod
    def of(cls, cpus: Iterable[int]) -> CPUSet:
        return cls(frozenset(cpus))

    @classmethod
    def parse(cls, text: str) -> CPUSet:
        if not text or not text.strip():
            return cls()
        cpus: set[int] = set()
        for part in text.split(","):
            match = _RANGE.match(part)
            if not match:
                raise CPUSetError(f"invalid cpuset {text!r}: {part.strip()!r} is not a CPU id or a range like 4-7")
            lo = int(match.group(1))
            hi = int(match.group(2)) if match.group(2) is not None else lo
            if hi < lo:
                raise CPUSetError(f"invalid cpuset {text!r}: range {lo}-{hi} runs backwards")
            if hi > 65535:
                raise CPUSetError(f"invalid cpuset {text!r}: CPU id {hi} is beyond any machine")
            cpus.update(range(lo, hi + 1))
        return cls(frozenset(cpus))

    def __str__(self) -> str:
        ids = sorted(self.cpus)
        parts: list[str] = []
        i = 0
        while i < len(ids):
            j = i
            while j + 1 < len(ids) and ids[j + 1] == ids[j] + 1:
                j += 1
            parts.append(str(ids[i]) if i == j else f"{ids[i]}-{ids[j]}")
            i = j + 1
        return ",".join(parts)

    def __len__(self) -> int:
        return len(self.cpus)

    def __iter__(self) -> Iterator[int]:
        return iter(sorted(self.cpus))

    def __contains__(self, cpu: object) -> bool:
        return cpu in self.cpus

    def __or__(self, other: CPUSet) -> CPUSet:
        return CPUSet(self.cpus | other.cpus)

    def __sub__(self, other: CPUSet) -> CPUSet:
        return CPUSet(self.cpus - other.cpus)

    def __and__(self, other: CPUSet) -> CPUSet:
        return CPUSet(self.cpus & other.cpus)


# --------------------------------------------------------------------------------------------------
# Topology


@dataclass(frozen=True, slots=True)
class Core:
    id: int
    threads: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class NUMANode:
    id: int
    cores: tuple[Core, ...]

    @property
    def cpus(self) -> CPUSet:
        return CPUSet.of(t for c in self.cores for t in c.threads)


@dataclass(frozen=True, slots=True)
class Topology:
    numa_nodes: tuple[NUMANode, ...]
    threads_per_core: int
    source: str  # "nrt", "labels" or "single-numa": where the shape came from

    @property
    def numa_count(self) -> int:
        return len(self.numa_nodes)

    @property
    def cpus(self) -> CPUSet:
        return CPUSet.of(t for n in self.numa_nodes for c in n.cores for t in c.threads)

    def shape(self) -> tuple[tuple[int, ...], int]:
        """What makes two nodes interchangeable for a cpuset list: cores per NUMA node and SMT width."""
        return tuple(len(n.cores) for n in self.numa_nodes), self.threads_per_core


def linux_layout(cores_per_numa: Iterable[int], threads_per_core: int, source: str) -> Topology:
    """Lay cores out the way Linux enumerates Xeon CPUs: primaries first by NUMA node, then each
    sibling level at +cores_total (`lscpu`: NUMA node0 CPU(s): 0-31,64-95)."""
    return _layout(tuple(cores_per_numa), threads_per_core, source)


@lru_cache(maxsize=256)
def _layout(counts: tuple[int, ...], threads_per_core: int, source: str) -> Topology:
    # A fleet has a handful of shapes: thousands of nodes share one immutable Topology.
    total = sum(counts)
    numa: list[NUMANode] = []
    first = 0
    for numa_id, count in enumerate(counts):
        cores = tuple(
            Core(core, tuple(core + level * total for level in range(threads_per_core)))
            for core in range(first, first + count)
        )
        numa.append(NUMANode(numa_id, cores))
        first += count
    return Topology(tuple(numa), threads_per_core, source)


NUMA_ZONE = re.compile(r"^node-(\d+)$")


def _label_bool(labels: Mapping[str, str], key: str) -> bool | None:
    value = labels.get(key)
    if value is None:
        return None
    return str(value).strip().lower() == "true"


SMT_LABEL = "feature.node.kubernetes.io/cpu-hardware_multithreading"


def smt_label_width(labels: Mapping[str, str], default_threads_per_core: int) -> int:
    """Threads per core by the node's NFD SMT label."""
    smt = _label_bool(labels, SMT_LABEL)
    # Xeon SMT is 2-way; without the NFD label we trust the cluster-wide setting.
    return default_threads_per_core if smt is None else (2 if smt else 1)


def node_topology(
    node_name: str,
    labels: Mapping[str, str],
    capacity_cpu: object,
    nrt: Mapping[str, Any] | None,
    numa_count_label: str,
    default_threads_per_core: int,
) -> tuple[Topology, str]:
    """A node's topology from the best source available, and a note saying which and why.

    1. NodeResourceTopology `Node` zones `node-N` (cpu capacity per NUMA node);
    2. the NUMA-count label with `status.capacity.cpu` and the SMT label;
    3. one NUMA node.
    """
    tpc = smt_label_width(labels, default_threads_per_core)
    try:
        total_cpus = cpu_milli(capacity_cpu) // 1000 if capacity_cpu is not None else 0
    except QuantityError:
        total_cpus = 0

    zones = _nrt_numa_cpus(nrt) if nrt else {}
    if zones:
        ids = sorted(zones)
        per_numa = [zones[i] // tpc for i in ids]
        if all(per_numa):
            return linux_layout(per_numa, tpc, "nrt"), f"{len(ids)} NUMA nodes from NodeResourceTopology"

    numa_count = 0
    raw = labels.get(numa_count_label)
    if raw is not None:
        try:
            numa_count = int(str(raw).strip())
        except ValueError:
            numa_count = 0
    if total_cpus > 0 and numa_count > 0:
        cores_total = total_cpus // tpc
        if cores_total >= numa_count:
            base, extra = divmod(cores_total, numa_count)
            per_numa = [base + (1 if i < extra else 0) for i in range(numa_count)]
            return linux_layout(per_numa, tpc, "labels"), f"{numa_count} NUMA nodes from label {numa_count_label}"

    cores_total = max(total_cpus // tpc, 0)
    note = (
        f"node {node_name}: no NodeResourceTopology and no {numa_count_label} label; "
        f"assuming one NUMA node of {total_cpus} CPUs"
    )
    return linux_layout([cores_total], tpc, "single-numa"), note


def zone_resources(nrt: Mapping[str, Any] | None, resource: str) -> dict[int, Mapping[str, Any]]:
    """Per NUMA node, the `node-N` zone's entry for `resource` (capacity, allocatable, available) in a
    NodeResourceTopology as node-feature-discovery writes it."""
    out: dict[int, Mapping[str, Any]] = {}
    for zone in (nrt or {}).get("zones") or ():
        if not isinstance(zone, Mapping):
            continue
        match = NUMA_ZONE.match(str(zone.get("name", "")))
        if match is None:
            continue
        for res in zone.get("resources") or ():
            if isinstance(res, Mapping) and res.get("name") == resource:
                out[int(match.group(1))] = res
    return out


def _nrt_numa_cpus(nrt: Mapping[str, Any]) -> dict[int, int]:
    out: dict[int, int] = {}
    for numa, res in zone_resources(nrt, "cpu").items():
        with contextlib.suppress(QuantityError):
            out[numa] = cpu_milli(res.get("capacity")) // 1000
    return out


# --------------------------------------------------------------------------------------------------
# Reserved CPUs


def spread_reserved(topology: Topology, count: int) -> CPUSet:
    """`count` CPUs spread evenly over NUMA nodes (lower ids take the remainder) and, within each,
    balanced between primary threads and their siblings: 3 CPUs on a 2-way SMT NUMA node are the
    primaries of its first two cores and the sibling of the first."""
    counts, tpc = topology.shape()
    return _spread(counts, tpc, count)


@lru_cache(maxsize=1024)
def _spread(counts: tuple[int, ...], tpc: int, count: int) -> CPUSet:
    # Keyed by shape, not by Topology: hashing a whole topology costs more than it saves.
    topology = _layout(counts, tpc, "labels")
    count = max(0, min(count, len(topology.cpus)))
    n = topology.numa_count
    chosen: list[int] = []
    for numa in topology.numa_nodes:
        want = count // n + (1 if numa.id < count % n else 0)
        want = min(want, sum(len(c.threads) for c in numa.cores))
        cores_needed = math.ceil(want / topology.threads_per_core)
        for level in range(topology.threads_per_core):
            take = min(want, cores_needed)
            chosen.extend(core.threads[level] for core in numa.cores[:take])
            want -= take
    return CPUSet.of(chosen)


# The CPUs each NRI deployment profile (settings' nri_deployment_profile) reserves for the system.
PROFILE_RESERVED_CPUS: dict[str, int | None] = {
    # None: one physical core per NUMA node, so the count depends on the node.
    "siblings": None,
    "minimal": 8,
    "standard": 12,
    "observability": 16,
    "full": 20,
}


def profile_reserved(topology: Topology, profile: str) -> CPUSet:
    count = PROFILE_RESERVED_CPUS[profile]
    if count is None:  # siblings: one physical core per NUMA node
        count = topology.numa_count * topology.threads_per_core
    return spread_reserved(topology, count)


def reserved_from_spec(topology: Topology, spec: str) -> CPUSet:
    """`spec.reservedResources.cpu` of a BalloonsPolicy: `cpuset:…`, `exclude-cpuset:…` or a quantity."""
    text = str(spec).strip()
    if text.startswith("cpuset:"):
        return CPUSet.parse(text[len("cpuset:"):]) & topology.cpus
    if text.startswith("exclude-cpuset:"):
        return topology.cpus - CPUSet.parse(text[len("exclude-cpuset:"):])
    # The plugin rounds a quantity up to whole CPUs and allocates them as any balloon on an idle node: whole cores
    # from the lowest ids, both threads of one before the next (the oracle: "2" on SMT is CPU 0 and its sibling).
    count = math.ceil(cpu_milli(text) / 1000)
    threads = [t for numa in topology.numa_nodes for core in numa.cores for t in core.threads]
    return CPUSet.of(threads[:count])
