"""Which nodes a pod may land on: nodeSelector and required node affinity, as kube-scheduler reads them.

The webhook asks this of a pod *after* its own mutation (AMX expression, node pin), so pre-flight
looks only at nodes the scheduler could really use.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def _requirement(req: Mapping[str, Any], value: str | None) -> bool:
    op = req.get("operator")
    values = [str(v) for v in req.get("values") or ()]
    if op == "In":
        return value is not None and value in values
    if op == "NotIn":
        return value is None or value not in values
    if op == "Exists":
        return value is not None
    if op == "DoesNotExist":
        return value is None
    if op in ("Gt", "Lt") and value is not None and len(values) == 1:
        try:
            have, bound = int(value), int(values[0])
        except ValueError:
            return False
        return have > bound if op == "Gt" else have < bound
    return False


def _term(term: Mapping[str, Any], name: str, labels: Mapping[str, str]) -> bool:
    exprs: Sequence[Mapping[str, Any]] = term.get("matchExpressions") or ()
    fields: Sequence[Mapping[str, Any]] = term.get("matchFields") or ()
    if not exprs and not fields:
        return False  # an empty term matches nothing (core/v1 NodeSelectorTerm)
    return all(_requirement(r, labels.get(str(r.get("key")))) for r in exprs) and all(
        _requirement(r, name if r.get("key") == "metadata.name" else None) for r in fields
    )


def node_matches(spec: Mapping[str, Any], name: str, labels: Mapping[str, str]) -> bool:
    selector = spec.get("nodeSelector") or {}
    if any(labels.get(k) != str(v) for k, v in selector.items()):
        return False
    if spec.get("nodeName") and spec["nodeName"] != name:
        return False
    required = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    terms = required.get("nodeSelectorTerms")
    if terms is None:
        return True
    return any(_term(t, name, labels) for t in terms if isinstance(t, Mapping))
