"""Which nodes a pod may land on, as kube-scheduler decides it before any extender is asked: the one rule that
/validate, /filter, `render`, `explain` and `report` apply.

Read from the Kubernetes release pinned in tests/peers/kube (v1.35): the filter plugins NodeUnschedulable,
NodeName, TaintToleration and NodeAffinity, in that order (the first that fails names the reason), with
k8s.io/component-helpers' nodeaffinity, k8s.io/api's Toleration.ToleratesTaint and apimachinery's label
requirements. A pod with spec.nodeName never meets the scheduler: the kubelet admits it against its node
affinity and NoExecute taints only, cordon or not.

The webhook asks this of a pod *after* its own mutation (AMX expression, node pin), so pre-flight looks only at
nodes the scheduler could really use.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple, Protocol

NO_SCHEDULE, NO_EXECUTE = "NoSchedule", "NoExecute"  # PreferNoSchedule only scores
UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"  # what NodeUnschedulable lets a pod tolerate
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
INT64 = range(-(2**63), 2**63)

# apimachinery's content.IsLabelKey / IsLabelValue; a requirement failing them makes its whole term match nothing.
_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_SUBDOMAIN = re.compile(rf"{_DNS_LABEL}(\.{_DNS_LABEL})*")
_PARSE_INT = re.compile(r"[+-]?[0-9]+")  # strconv.ParseInt(s, 10, 64), before its range check


def _label_key(key: str) -> bool:
    parts = key.split("/")
    if len(parts) > 2:
        return False
    if len(parts) == 2 and not (0 < len(parts[0]) <= 253 and _SUBDOMAIN.fullmatch(parts[0])):
        return False
    name = parts[-1]
    return len(name) <= 63 and _NAME.fullmatch(name) is not None


def _label_value(value: str) -> bool:
    return value == "" or (len(value) <= 63 and _NAME.fullmatch(value) is not None)


def _int64(text: str) -> int | None:
    if _PARSE_INT.fullmatch(text) is None:
        return None
    value = int(text)
    return value if value in INT64 else None


class Taint(NamedTuple):
    key: str
    value: str
    effect: str

    def __str__(self) -> str:  # v1.Taint.ToString
        return f"{self.key}{'=' + self.value if self.value else ''}:{self.effect}"


def node_taints(spec: Mapping[str, Any]) -> tuple[Taint, ...]:
    """A Node spec's taints that keep pods off (NoSchedule, NoExecute); PreferNoSchedule only lowers a score."""
    out = []
    for t in spec.get("taints") or ():
        if isinstance(t, Mapping) and t.get("effect") in (NO_SCHEDULE, NO_EXECUTE):
            out.append(Taint(str(t.get("key") or ""), str(t.get("value") or ""), str(t["effect"])))
    return tuple(out)


class SchedulingNode(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def labels(self) -> Mapping[str, str]: ...
    @property
    def taints(self) -> tuple[Taint, ...]: ...
    @property
    def unschedulable(self) -> bool: ...


class Miss(NamedTuple):
    """Why kube-scheduler does not offer a node to a pod. `reason` names neither node nor pod (kube-scheduler
    counts identical reasons); `change` says what would make the node eligible."""

    check: str  # unschedulable | node-pin | taint | node-selector | node-affinity | amx
    reason: str
    change: str


Test = Callable[[str | None], bool]  # a node's value for a key (None: it has none) -> does the requirement hold?


def _nothing(value: str | None) -> bool:
    return False


def _requirement(req: Mapping[str, Any]) -> Test | None:
    """One label NodeSelectorRequirement, read once; None when kube-scheduler cannot parse it."""
    op, key = req.get("operator"), req.get("key")
    values = [str(v) for v in _sequence(req.get("values"))]
    if not isinstance(key, str) or not _label_key(key) or not all(_label_value(v) for v in values):
        return None
    chosen = frozenset(values)
    if op in ("In", "NotIn"):
        if not values:
            return None
        if op == "In":
            return lambda value: value is not None and value in chosen
        return lambda value: value is None or value not in chosen
    if op in ("Exists", "DoesNotExist"):
        if values:
            return None
        return (lambda value: value is not None) if op == "Exists" else (lambda value: value is None)
    if op in ("Gt", "Lt"):
        bound = _int64(values[0]) if len(values) == 1 else None
        if bound is None:
            return None
        greater = op == "Gt"

        def compare(value: str | None) -> bool:
            have = None if value is None else _int64(value)
            return have is not None and (have > bound if greater else have < bound)

        return compare
    return None


class _Term(NamedTuple):
    labels: tuple[tuple[str, Test], ...]
    names: tuple[tuple[bool, str], ...]  # matchFields on metadata.name: (In?, the one value)
    parsed: bool  # False: a requirement kube-scheduler cannot parse, and the term matches no node

    def matches(self, name: str, labels: Mapping[str, str]) -> bool:
        if not self.parsed:
            return False
        for key, test in self.labels:
            if not test(labels.get(key)):
                return False
        # A field other than metadata.name reads as "" (fields.Set), which NotIn any non-empty value passes.
        return all((name == value) == is_in for is_in, value in self.names)


def _term(term: Mapping[str, Any]) -> _Term:
    labels: list[tuple[str, Test]] = []
    names: list[tuple[bool, str]] = []
    for req in _sequence(term.get("matchExpressions")):
        test = _requirement(req) if isinstance(req, Mapping) else None
        if test is None:
            return _Term((), (), False)
        labels.append((str(req["key"]), test))
    for req in _sequence(term.get("matchFields")):
        values = req.get("values") if isinstance(req, Mapping) else None
        if not isinstance(values, list) or len(values) != 1 or req.get("operator") not in ("In", "NotIn"):
            return _Term((), (), False)
        value = str(values[0])
        if req.get("key") != "metadata.name":
            if (req["operator"] == "In" and value != "") or (req["operator"] == "NotIn" and value == ""):
                return _Term((), (), False)  # the node has no such field: In never holds, NotIn always does
            continue
        names.append((req["operator"] == "In", value))
    return _Term(tuple(labels), tuple(names), True)


def _tolerates(tolerations: tuple[Mapping[str, Any], ...], taint: Taint) -> bool:
    """v1.Toleration.ToleratesTaint, with the TaintTolerationComparisonOperators gate off (its 1.35 default):
    a toleration with Gt or Lt tolerates nothing."""
    for t in tolerations:
        effect, key = t.get("effect") or "", t.get("key") or ""
        if (effect and effect != taint.effect) or (key and key != taint.key):
            continue
        op = t.get("operator") or "Equal"
        if op == "Exists" or (op == "Equal" and str(t.get("value") or "") == taint.value):
            return True
    return False


class Eligibility:
    """A pod's nodeSelector, nodeName, required node affinity and tolerations, read once: asking a node costs a
    lookup per requirement and per taint."""

    __slots__ = ("_first_terms", "amx_label", "node_name", "selector", "terms", "tolerations")

    def __init__(self, spec: Mapping[str, Any], amx_label: str = "") -> None:
        # A field of the wrong JSON type (the apiserver never sends one; a fuzzer does) is read as absent.
        self.selector = tuple((str(k), str(v)) for k, v in _mapping(spec.get("nodeSelector")).items())
        self.node_name = str(spec.get("nodeName") or "")
        affinity = _mapping(_mapping(spec.get("affinity")).get("nodeAffinity"))
        required = affinity.get(REQUIRED)
        required = None if required is None else _mapping(required)
        terms = _sequence(required.get("nodeSelectorTerms")) if required is not None else ()
        # Set but with no (or only empty) terms: it matches no node (an empty NodeSelectorTerm is skipped).
        self.terms = None if required is None else tuple(
            _term(t) for t in terms if isinstance(t, Mapping) and (t.get("matchExpressions") or t.get("matchFields")))
        # For the reason of a miss, each term's label requirements as written, each parsed once (None: unparsable).
        self._first_terms = tuple(
            (tuple((req, str(req.get("key")) if isinstance(req, Mapping) else "",
                    _requirement(req) if isinstance(req, Mapping) else None)
                   for req in _sequence(term.get("matchExpressions"))), _sequence(term.get("matchFields")))
            for term in terms if isinstance(term, Mapping))
        self.tolerations = tuple(t for t in _sequence(spec.get("tolerations")) if isinstance(t, Mapping))
        self.amx_label = amx_label  # named as such in a reason: the AMX expression is ours

    def allows(self, node: SchedulingNode) -> bool:
        return self.miss(node) is None

    def miss(self, node: SchedulingNode) -> Miss | None:
        """Why the node is not offered; None when it is."""
        by_kubelet = bool(self.node_name)
        if node.unschedulable and not by_kubelet \
                and not _tolerates(self.tolerations, Taint(UNSCHEDULABLE_TAINT, "", NO_SCHEDULE)):
            return Miss("unschedulable", "cordoned (spec.unschedulable)",
                        "uncordon the node, or give the pod a toleration for "
                        f"{UNSCHEDULABLE_TAINT}:{NO_SCHEDULE}")
        if by_kubelet and self.node_name != node.name:
            return Miss("node-pin", f"the pod is pinned to node {self.node_name} (spec.nodeName)",
                        "none: spec.nodeName binds the pod to that node")
        for taint in node.taints:
            if by_kubelet and taint.effect != NO_EXECUTE:
                continue
            if not _tolerates(self.tolerations, taint):
                return Miss("taint", f"taint {taint} is not tolerated",
                            f"give the pod a toleration for {taint} (or remove the taint from the node)")
        labels = node.labels
        for key, value in self.selector:
            if labels.get(key) != value:
                return Miss("node-selector", f"nodeSelector {key}={value}: {_has(labels, key)}",
                            f"label the node {key}={value}, or change the pod's nodeSelector")
        if self.terms is not None:
            for term in self.terms:
                if term.matches(node.name, labels):
                    return None
            return self._affinity_miss(node)
        return None

    def _affinity_miss(self, node: SchedulingNode) -> Miss:
        """The first requirement of the first term that fails: with one term (ours adds to every term) it is the
        reason; the AMX requirement and the node pin are named as such."""
        labels = node.labels
        change = "label the node to match, or change the pod's required node affinity"
        for requirements, fields in self._first_terms:
            for req, key, test in requirements:
                if test is not None and test(labels.get(key)):
                    continue
                if key and key == self.amx_label:
                    return Miss("amx", f"no AMX ({_has(labels, key)}; AMX is required: require_amx, or the pod's "
                                       "model-manager.io/require-amx annotation)",
                                'set model-manager.io/require-amx: "false" if the model does not need AMX, or use '
                                "a node with AMX")
                return Miss("node-affinity", f"required node affinity {_shown(req)}: {_has(labels, key)}"
                                             f"{'' if test is not None else _UNPARSED}", change)
            for req in fields:
                if not _term({"matchFields": [req]}).matches(node.name, labels):
                    return Miss("node-pin", f"required node affinity on fields {_shown(req)}"
                                                 f"{'' if _term({'matchFields': [req]}).parsed else _UNPARSED}",
                                "none on this node: the pod is pinned by name to other nodes (the "
                                "model-manager.io/node annotation, or matchFields metadata.name)")
        return Miss("node-affinity", "required node affinity: no nodeSelectorTerm matches the node", change)


_UNPARSED = " (kube-scheduler cannot parse it: it matches no node)"


def _shown(req: Any) -> str:
    if not isinstance(req, Mapping):
        return repr(req)
    values = list(_sequence(req.get("values")))
    return f"{req.get('key')} {req.get('operator')}{' ' + ','.join(map(str, values)) if values else ''}"


def _has(labels: Mapping[str, str], key: str) -> str:
    return f"the node has {key}={labels[key]}" if key in labels else f"the node has no label {key}"


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _sequence(value: object) -> Sequence[Any]:
    return value if isinstance(value, list | tuple) else ()
