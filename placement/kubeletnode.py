"""Which nodes the kubelet's static CPU Manager pins, and with what settings.

What a node announces comes first: node-feature-discovery's topology-updater writes the Topology Manager policy and
scope (attributes `topologyManagerPolicy` / `topologyManagerScope`, and the deprecated `topologyPolicies`) and one
`node-N` zone per NUMA node whose cpu `capacity - allocatable` is the CPUs the kubelet reserves there. What no object
announces (CPU Manager options, the Memory Manager, reservedSystemCPUs, the packages) comes from the operator's node
group. Where nothing is known the defaults are the strictest the kubelet runs (single-numa-node, pod scope,
full-pcpus-only): a pod that policy admits, every other policy admits too, so the assumption never binds a pod the
kubelet rejects; it only refuses some it would have admitted (docs/design.md).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

from placement import kubelet as kub
from placement.config import KubeletGroup, Settings
from placement.quantity import QuantityError, cpu_milli, memory_bytes
from placement.topology import CPUSet, Topology, zone_resources

# NFD's deprecated `topologyPolicies` values (pkg/topologypolicy): the policy and the scope in one word.
_DEPRECATED = {
    "SingleNUMANodeContainerLevel": (kub.SINGLE_NUMA_NODE, kub.CONTAINER),
    "SingleNUMANodePodLevel": (kub.SINGLE_NUMA_NODE, kub.POD),
    "RestrictedContainerLevel": (kub.RESTRICTED, kub.CONTAINER),
    "RestrictedPodLevel": (kub.RESTRICTED, kub.POD),
    "BestEffortContainerLevel": (kub.BEST_EFFORT, kub.CONTAINER),
    "BestEffortPodLevel": (kub.BEST_EFFORT, kub.POD),
    "None": (kub.NONE, kub.CONTAINER),
}


def announced(nrt: Mapping[str, Any] | None) -> tuple[str, str] | None:
    """The Topology Manager policy and scope the node's NodeResourceTopology announces; None when it does not."""
    if not nrt:
        return None
    attrs = nrt.get("attributes") or {}
    policy, scope = attrs.get("topologyManagerPolicy"), attrs.get("topologyManagerScope")
    if policy in kub.TOPOLOGY_POLICIES:
        return str(policy), str(scope) if scope in (kub.CONTAINER, kub.POD) else kub.CONTAINER
    for old in nrt.get("topologyPolicies") or ():
        if old in _DEPRECATED:
            return _DEPRECATED[old]
    return None


def group_for(settings: Settings, labels: Mapping[str, str]) -> KubeletGroup | None:
    return next((g for g in settings.kubelet_node_groups if g.selects(labels)), None)


def selected(settings: Settings, labels: Mapping[str, str]) -> bool:
    """A node group's selector names the node: its kubelet pins, whatever BalloonsPolicy would apply. Node-feature-
    discovery announces a Topology Manager on balloons nodes too (the kubelet's, with the static CPU Manager off), so
    its NodeResourceTopology alone says nothing about who pins."""
    return any(g.node_selector and g.selects(labels) for g in settings.kubelet_node_groups)


def _zone_cpus(nrt: Mapping[str, Any] | None) -> dict[int, tuple[int, int, int]]:
    """Per NUMA node: cpu capacity, allocatable and available, from the `node-N` zones."""
    out: dict[int, tuple[int, int, int]] = {}
    for numa, res in zone_resources(nrt, "cpu").items():
        with contextlib.suppress(QuantityError):
            values = [cpu_milli(res.get(k)) // 1000 if res.get(k) is not None else -1
                      for k in ("capacity", "allocatable", "available")]
            out[numa] = (values[0], values[1], values[2])
    return out


def zone_available(nrt: Mapping[str, Any] | None, numa_count: int) -> tuple[int, ...] | None:
    """The free CPUs per NUMA node the node last published; None unless every NUMA node has a figure."""
    zones = _zone_cpus(nrt)
    if len(zones) != numa_count or any(zones.get(i, (0, 0, -1))[2] < 0 for i in range(numa_count)):
        return None
    return tuple(zones[i][2] for i in range(numa_count))


def zone_memory_available(nrt: Mapping[str, Any] | None, numa_count: int) -> tuple[int, ...] | None:
    """The free memory per NUMA node (bytes) the node last published: the Memory Manager's blocks, as
    node-feature-discovery reads them from podresources, taken from each zone's allocatable; None unless every NUMA
    node has a figure."""
    out: dict[int, int] = {}
    for numa, res in zone_resources(nrt, "memory").items():
        with contextlib.suppress(QuantityError):
            out[numa] = memory_bytes(res.get("available"))
    if sorted(out) != list(range(numa_count)):
        return None
    return tuple(out[i] for i in range(numa_count))


def _packages(nrt: Mapping[str, Any] | None, numa_count: int) -> int:
    for zone in (nrt or {}).get("zones") or ():
        costs = [c.get("value") for c in zone.get("costs") or () if isinstance(c, Mapping)]
        values = [c for c in costs if isinstance(c, int)]
        if values and len(values) == len(costs):
            # NUMA nodes at a distance of 20 or more are on another package (SLIT: 10 local, 11-12 sub-NUMA).
            return max(1, numa_count // max(1, sum(1 for c in values if c < 20)))
    return min(2, numa_count)


def _reserved_count(nrt: Mapping[str, Any] | None, capacity_cpu: str | None, allocatable_cpu: str | None) -> int:
    zones = _zone_cpus(nrt)
    if zones and all(c >= 0 and a >= 0 for c, a, _ in zones.values()):
        return sum(c - a for c, a, _ in zones.values())
    with contextlib.suppress(QuantityError, TypeError):
        if capacity_cpu is not None and allocatable_cpu is not None:
            return math.ceil((cpu_milli(capacity_cpu) - cpu_milli(allocatable_cpu)) / 1000)
    return 1


def kubelet_config(settings: Settings, labels: Mapping[str, str], nrt: Mapping[str, Any] | None,
                   capacity_cpu: str | None, allocatable_cpu: str | None) -> kub.KubeletConfig:
    named = group_for(settings, labels)
    group = named or KubeletGroup(name="default")
    said = announced(nrt)
    policy, scope = said or (group.topology_manager_policy, group.topology_manager_scope)
    source = "NodeResourceTopology" if said else (f"node group {group.name}" if named is not None
                                                    else "assumed: nothing announces it")
    reserved = CPUSet.parse(group.reserved_system_cpus) if group.reserved_system_cpus else None
    return kub.KubeletConfig(
        topology_policy=policy, topology_scope=scope, cpu_options=frozenset(group.cpu_manager_policy_options),
        reserved_cpus=reserved, reserved_count=_reserved_count(nrt, capacity_cpu, allocatable_cpu),
        memory_policy=group.memory_manager_policy,
        reserved_memory=tuple(memory_bytes(v) for v in group.reserved_memory),
        prefer_closest="prefer-closest-numa-nodes" in group.topology_manager_policy_options, source=source)


@lru_cache(maxsize=1024)
def _node(topology: Topology, packages: int, memory: tuple[int, ...], config: kub.KubeletConfig) -> kub.KubeletNode:
    # A fleet has a few shapes and settings: thousands of nodes share one checked KubeletNode.
    return kub.kubelet_node(kub.machine(topology, packages, memory), config)


def machine_memory(nrt: Mapping[str, Any] | None, total: str | None, numa_count: int) -> tuple[int, ...]:
    """Bytes of memory per NUMA node as the kubelet's cadvisor sees them (reserved memory included): the `node-N`
    zones' memory capacity, else the node's capacity split evenly; () when neither is known."""
    zones: dict[int, int] = {}
    for numa, res in zone_resources(nrt, "memory").items():
        with contextlib.suppress(QuantityError):
            zones[numa] = memory_bytes(res.get("capacity"))
    if len(zones) == numa_count and all(zones.values()):
        return tuple(zones[i] for i in range(numa_count))
    with contextlib.suppress(QuantityError):
        if total is not None and numa_count:
            return (memory_bytes(total) // numa_count,) * numa_count
    return ()


def kubelet_node(settings: Settings, labels: Mapping[str, str], topology: Topology, nrt: Mapping[str, Any] | None,
                 total_memory: str | None, capacity_cpu: str | None, allocatable_cpu: str | None) -> kub.KubeletNode:
    """The node as its kubelet runs it. Raises kubelet.NodeError where the kubelet would not start."""
    memory = machine_memory(nrt, total_memory, topology.numa_count)
    config = kubelet_config(settings, labels, nrt, capacity_cpu, allocatable_cpu)
    group = group_for(settings, labels)
    packages = group.packages if group is not None and group.packages is not None else None
    return _node(topology, packages or _packages(nrt, topology.numa_count), tuple(memory), config)
