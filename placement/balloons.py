"""The per-node BalloonsPolicy, rendered from the same topology model the ledger uses, so what the NRI
plugin enforces and what the extender assumes come from one source."""

from __future__ import annotations

from typing import Any

from placement.config import Settings
from placement.demand import VALID_TP
from placement.topology import Topology, profile_reserved


def node_balloons_policy(node: str, topology: Topology, settings: Settings, namespace: str) -> dict[str, Any]:
    reserved = profile_reserved(topology, settings.nri_deployment_profile)
    types = [
        {
            "name": f"{settings.nri_balloon_prefix}{tp}",
            "hideHyperthreads": True,
            # Siblings of a hidden-hyperthread balloon must stay idle, not be spread onto.
            "preferSpreadOnPhysicalCores": False,
            "preferNewBalloons": True,
        }
        for tp in VALID_TP
        if tp <= topology.numa_count
    ]
    return {
        "apiVersion": "config.nri/v1alpha1",
        "kind": "BalloonsPolicy",
        "metadata": {"name": f"node.{node}", "namespace": namespace},
        "spec": {
            "reservedResources": {"cpu": f"cpuset:{reserved}"},
            "pinCPU": True,
            "pinMemory": True,
            "allocatorTopologyBalancing": True,
            "balloonTypes": [{"name": "reserved", "namespaces": ["kube-system"]}, *types],
        },
    }
