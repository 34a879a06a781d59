"""Which nodes a pod may land on: nodeSelector and required node affinity, as kube-scheduler reads them.

The webhook asks this of a pod *after* its own mutation (AMX expression, node pin), so pre-flight
looks only at nodes the scheduler could really use.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any


Matcher = Callable[[str, Mapping[str, str]], bool]  # (node name, node labels) -> may the pod land there?


def _requirement(req: Mapping[str, Any]) -> Callable[[str | None], bool]:
    """One NodeSelectorRequirement, read once: the test of a node's value (None when the node has none)."""
    op = req.get("operator")
    listed = [str(v) for v in req.get("values") or ()]
    values = frozenset(listed)
    if op == "In":
        return lambda value: value is not None and value in values
    if op == "NotIn":
        return lambda value: value is None or value not in values
    if op == "Exists":
        return lambda value: value is not None
    if op == "DoesNotExist":
        return lambda value: value is None
    if op in ("Gt", "Lt") and len(listed) == 1:
        try:
            bound = int(listed[0])
        except ValueError:
            return lambda value: False
        greater = op == "Gt"

        def compare(value: str | None) -> bool:
            if value is None:
                return False
            try:
                have = int(value)
            except ValueError:
                return False
            return have > bound if greater else have < bound

        return compare
    return lambda value: False


def _term(term: Mapping[str, Any]) -> Matcher:
    exprs = [(str(r.get("key")), _requirement(r)) for r in term.get("matchExpressions") or ()]
    fields = [(r.get("key") == "metadata.name", _requirement(r)) for r in term.get("matchFields") or ()]
    if not exprs and not fields:
        return lambda name, labels: False  # an empty term matches nothing (core/v1 NodeSelectorTerm)
    return lambda name, labels: all(test(labels.get(key)) for key, test in exprs) and all(
        test(name if is_name else None) for is_name, test in fields)


def node_selector(spec: Mapping[str, Any]) -> Matcher:
    """The pod's nodeSelector, nodeName and required node affinity, read once; the matcher it returns
    costs one lookup per requirement per node (a pod's values are sets, not lists re-read per node)."""
    selector = [(k, str(v)) for k, v in (spec.get("nodeSelector") or {}).items()]
    node_name = spec.get("nodeName")
    required = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    raw_terms = required.get("nodeSelectorTerms")
    terms = None if raw_terms is None else [_term(t) for t in raw_terms if isinstance(t, Mapping)]

    def matches(name: str, labels: Mapping[str, str]) -> bool:
        if any(labels.get(k) != v for k, v in selector):
            return False
        if node_name and node_name != name:
            return False
        return terms is None or any(term(name, labels) for term in terms)

    return matches


def node_matches(spec: Mapping[str, Any], name: str, labels: Mapping[str, str]) -> bool:
    return node_selector(spec)(name, labels)
