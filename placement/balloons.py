"""The per-node BalloonsPolicy, rendered from the same topology model the ledger uses, so what the NRI
plugin enforces and what the extender assumes come from one source.

It is designed so that the plugin's choice is NUMA-local and predictable (`placement.nri` predicts it;
tests/oracle proves it against the real plugin):
- one plain type per NUMA node, `vllm-numa-N`, preferring that node (preferCloseToDevices): each rank's CPUs
  are carved from its own NUMA node;
- per NUMA span k, composite types with one component per rank: k = 1 picks one NUMA node (balance-balloons over
  the per-NUMA types); k > 1 over aligned blocks of k NUMA nodes, which Linux numbers package by package, so a
  block stays inside one package whenever k fits in one. Where a node has several blocks, `<prefix>k` picks one
  of them by balance-balloons. Non-aligned cross-package sets are left out on purpose: balance-balloons picks the
  set with the fewest instances, so any such set would be chosen as soon as the aligned ones each held one model;
- every model type makes a new balloon per pod (preferNewBalloons) and hides hyperthreads; balloons take whole
  cores (preferSpreadOnPhysicalCores: false);
- `reserved` comes first and catches every namespace (annotated model containers are routed by their annotation
  before namespaces are read), so every non-model container, a model pod's sidecars included, shares it. It holds
  the whole reserved cpuset from the start (minCPUs); without that the plugin sizes it from zero and a model
  balloon may take reserved CPUs it has not grown into yet. It has no maxCPUs: the plugin fails a container that
  a full fixed-size balloon cannot take (the oracle showed it), so past the reserved cpuset it grows into free
  cores, which the ledger books (`shared_balloon_cpus`).
"""

from __future__ import annotations

from typing import Any

from placement.balloonspolicy import COMPONENT_BALANCE, RESERVED_TYPE
from placement.config import Settings
from placement.demand import VALID_TP, round_up
from placement.topology import PROFILE_RESERVED_CPUS, CPUSet, Topology, spread_reserved

NUMA_TYPE = "vllm-numa-"


def numa_blocks(numa_count: int, span: int) -> list[tuple[int, ...]]:
    """Aligned blocks of `span` consecutive NUMA nodes."""
    return [tuple(range(start, start + span)) for start in range(0, numa_count - span + 1, span)]


def _set_type(block: tuple[int, ...]) -> str:
    return NUMA_TYPE + "-".join(str(i) for i in block)


def _composite(name: str, components: list[str], balance: bool) -> dict[str, Any]:
    out: dict[str, Any] = {
        "name": name,
        "components": [{"balloonType": c} for c in components],
        "hideHyperthreads": True,
        "preferNewBalloons": True,
    }
    if balance:
        out["componentCreation"] = COMPONENT_BALANCE
    return out


def model_balloon_types(topology: Topology, prefix: str) -> list[dict[str, Any]]:
    n = topology.numa_count
    types: list[dict[str, Any]] = [
        {
            "name": f"{NUMA_TYPE}{i}",
            "preferCloseToDevices": [f"/sys/devices/system/node/node{i}"],
            "hideHyperthreads": True,
            "preferNewBalloons": True,
        }
        for i in range(n)
    ]
    for span in VALID_TP:
        if span > n:
            break
        blocks = numa_blocks(n, span)
        if span == 1:
            types.append(_composite(f"{prefix}1", [f"{NUMA_TYPE}{i}" for i in range(n)], balance=n > 1))
        elif len(blocks) == 1:
            types.append(_composite(f"{prefix}{span}", [f"{NUMA_TYPE}{i}" for i in blocks[0]], balance=False))
        else:
            for block in blocks:
                types.append(_composite(_set_type(block), [f"{NUMA_TYPE}{i}" for i in block], balance=False))
            types.append(_composite(f"{prefix}{span}", [_set_type(b) for b in blocks], balance=True))
    return types


def whole_core_reserved(topology: Topology, profile: str) -> CPUSet:
    """The profile's CPU count, rounded up so that every NUMA node reserves whole cores: a half-reserved
    core's sibling would be free to the plugin and could join a model balloon."""
    n, tpc = topology.numa_count, topology.threads_per_core
    count = PROFILE_RESERVED_CPUS[profile]
    per_numa = tpc if count is None else round_up(-(-count // n), tpc)
    return spread_reserved(topology, per_numa * n)


def node_balloons_policy(node: str, topology: Topology, settings: Settings, namespace: str) -> dict[str, Any]:
    reserved = whole_core_reserved(topology, settings.nri_deployment_profile)
    size = len(reserved)
    return {
        "apiVersion": "config.nri/v1alpha1",
        "kind": "BalloonsPolicy",
        "metadata": {"name": f"node.{node}", "namespace": namespace},
        "spec": {
            "reservedResources": {"cpu": f"cpuset:{reserved}"},
            "pinCPU": True,
            "pinMemory": True,
            "preferSpreadOnPhysicalCores": False,
            "balloonTypes": [
                {"name": RESERVED_TYPE, "namespaces": ["*"], "minCPUs": size},
                *model_balloon_types(topology, settings.nri_balloon_prefix),
            ],
        },
    }
