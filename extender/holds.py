"""Cores promised to a pod between its scheduling cycle and its /bind.

kube-scheduler binds asynchronously: once a cycle has chosen a node it starts the next pod's cycle at
once, so the next `/filter` can arrive before this pod's `/bind`, and both would be offered the same
cores (the second bind then fails into backoff). So the node a pod is most likely to get is held for it
as an assumed pod in the ledger until its `/bind` arrives, or until a short deadline passes (the cycle
failed after us, or chose another node and its bind will move the hold): the node kube-scheduler picks
is the one we scored highest at /prioritize, or the only node /filter passed (it then skips /prioritize).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from extender.filter import PodRef
from placement.assume import AssumeCache
from placement.cluster import ClusterState

HOLD_SECONDS = 5.0  # kube-scheduler starts the bind right after the cycle; a permit plugin could delay it


class Holds:
    """Lives on the event loop, like the cluster state whose ledgers carry the holds."""

    def __init__(self, cluster: ClusterState, seconds: float = HOLD_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.cluster = cluster
        self.assumed = AssumeCache(cluster)
        self.seconds = seconds
        self.clock = clock
        self._held: dict[str, tuple[str, float]] = {}  # uid -> (node, deadline)

    def hold(self, ref: PodRef, node: str) -> bool:
        """Hold `node`'s cores for the pod (moving any earlier hold of it); False when they do not fit."""
        self.release(ref.uid)
        assert ref.demand is not None
        if not self.assumed.assume(ref.uid, ref.namespace, ref.name, ref.demand, node).ok:
            return False
        self._held[ref.uid] = (node, self.clock() + self.seconds)
        return True

    def held(self, uid: str) -> str | None:
        entry = self._held.get(uid)
        return entry[0] if entry is not None else None

    def release(self, uid: str) -> None:
        if self._held.pop(uid, None) is not None:
            self.assumed.forget(uid)

    def take(self, uid: str, node: str) -> bool:
        """At /bind: True when the pod's cores on `node` are held already, and the hold is now the bind's;
        a hold on another node is released (kube-scheduler chose that one)."""
        entry = self._held.pop(uid, None)
        if entry is None:
            return False
        if entry[0] == node:
            return True
        self.assumed.forget(uid)
        return False

    def expire(self) -> int:
        now = self.clock()
        stale = [uid for uid, (_, deadline) in self._held.items() if deadline <= now]
        for uid in stale:
            self.release(uid)
        return len(stale)
