"""Running model pods as our extender left them: each with the placement its Binding recorded (the
`cpu-policy.model-manager.io/placement` annotation), decided in creation order on the nodes of `objects`."""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any

from placement.assume import AssumeCache
from placement.cluster import ClusterState
from placement.config import Settings
from placement.demand import is_model_pod, read_model_pod
from placement.ledger import PLACEMENT

Obj = dict[str, Any]


def bound_by_us(objects: Iterable[Obj], settings: Settings | None = None) -> list[Obj]:
    """`objects` with every bound model pod annotated where /bind would have put it; the rest unchanged."""
    settings = settings or Settings()
    objects = [copy.deepcopy(o) for o in objects]
    cluster = ClusterState.from_objects([o for o in objects if o.get("kind") != "Pod"], settings)
    pods = [o for o in objects if o.get("kind") == "Pod"]
    binds = AssumeCache(cluster)
    for pod in sorted(pods, key=lambda p: str(p["metadata"].get("creationTimestamp") or "")):
        meta, node = pod["metadata"], (pod.get("spec") or {}).get("nodeName")
        demand = read_model_pod(pod, settings) if node and is_model_pod(meta.get("labels"), settings) else None
        if demand is not None and binds.assume(meta["uid"], meta["namespace"], meta["name"], demand, node).ok:
            meta.setdefault("annotations", {})[PLACEMENT] = binds.placement(meta["uid"])
        cluster.apply("Pod", "ADDED", pod)
    return objects
