"""`model-placement balloons-policy`: the per-node BalloonsPolicy for chosen nodes of a cluster."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from placement.balloons import node_balloons_policy
from placement.cluster import ClusterState


class UnknownNode(LookupError):
    pass


def balloons_policies(state: ClusterState, nodes: Sequence[str], namespace: str) -> list[dict[str, Any]]:
    names = list(nodes) or sorted(state.nodes)
    missing = [n for n in names if n not in state.nodes]
    if missing:
        raise UnknownNode(f"unknown node(s): {', '.join(missing)}; known: {', '.join(sorted(state.nodes))}")
    return [node_balloons_policy(n, state.ledger(n).topology, state.settings, namespace)  # type: ignore[union-attr]
            for n in names]
