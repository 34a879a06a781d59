"""Pods the extender binds itself, held before the watch shows the binding: scheduler-plugins' `cache.Interface`
(AssumePod, FinishBinding, ForgetPod, and expiry) over the cluster's pod records.

An assumed pod is a pod record with `assumed_at` set, on its node, so every ledger read counts its cores at once
and two pods scheduled back to back are never promised the same ones; the watch confirms it (its record replaces
ours), `confirm` does where there is no watch, and `forget` or `expire` release it.
"""

from __future__ import annotations

from placement import fit as fitmod
from placement import reasons
from placement.cluster import ClusterState, PodRecord
from placement.demand import ModelDemand
from placement.ledger import Placed


class AssumeCache:
    def __init__(self, cluster: ClusterState) -> None:
        self.cluster = cluster

    def assume(self, uid: str, namespace: str, name: str, demand: ModelDemand, node: str) -> fitmod.Fit:
        """Hold the cores of a pod we are binding, before the watch shows the binding, so the next
        scheduling cycle cannot be promised the same cores."""
        cluster = self.cluster
        ledger = cluster.ledger(node)
        if ledger is None:
            return fitmod.Fit(node, reasons.UnknownNode(node), False)
        old = cluster.pods.get(uid)
        if old is not None and old.node is not None:
            return fitmod.Fit(node, reasons.AlreadyBound(f"{namespace}/{name}", old.node), False)
        now = cluster.clock()
        result = cluster.fit(demand, ledger)
        if not result.ok:
            return result
        placed = None if result.unknown else Placed(node, result.per_numa, result.types, fitmod.placed_cpus(result),
                                                         fitmod.placed_memory(result))
        # Its init containers, if any, are still to run: held as they will be.
        cluster.put(PodRecord(uid, namespace, name, node, "Pending", old.created if old else "", demand,
                              old.shared_milli if old else None, assumed_at=now, priority=old.priority if old else 0,
                              placed=placed, kpod=demand.kpod._replace(uid=uid) if demand.kpod else None,
                              init_milli=demand.init_milli, initializing=bool(demand.init_milli),
                              shared_steps=old.shared_steps if old else ()))
        return result

    def placement(self, uid: str) -> str | None:
        """The PLACEMENT annotation for a pod we are binding: where we decided it goes; None when that cannot be
        known (the node holds a pod of unknown placement)."""
        rec = self.cluster.pods.get(uid)
        return rec.placed.annotation() if rec is not None and rec.placed is not None else None

    def confirm(self, uid: str) -> bool:
        """Our own binding is known to have happened (a snapshot has no watch to show it)."""
        rec = self.cluster.pods.get(uid)
        if rec is None or rec.assumed_at is None:
            return False
        self.cluster.put(rec._replace(assumed_at=None))
        return True

    def forget(self, uid: str) -> None:
        """Drop an assumption whose binding failed."""
        rec = self.cluster.pods.get(uid)
        if rec is not None and rec.assumed_at is not None:
            self.cluster.drop(uid)

    def expire(self, ttl: float | None = None) -> list[PodRecord]:
        """Release the pods assumed longer than `ttl` ago (the setting by default) that no binding was seen for."""
        cluster = self.cluster
        ttl = cluster.settings.assume_ttl_seconds if ttl is None else ttl
        now = cluster.clock()
        stale = [r for r in cluster.pods.values() if r.assumed_at is not None and now - r.assumed_at > ttl]
        for rec in stale:
            cluster.drop(rec.uid)
            cluster.log.warning("assumed pod not seen bound in time; releasing its cores", extra={
                "pod": f"{rec.namespace}/{rec.name}", "node": rec.node, "reason": f"no binding seen in {ttl:g}s"})
        return stale
