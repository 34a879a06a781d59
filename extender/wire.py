"""The kube-scheduler extender wire format (`k8s.io/kube-scheduler/extender/v1`).

The Go types carry no json tags: keys are the PascalCase field names, absent pointers and maps are
`null`, and the scheduler decodes with `encoding/json`, which matches keys case-insensitively (its own
compatibility test lowercases the whole document). We accept keys the same way; the embedded
Kubernetes objects (`v1.Pod`, `v1.NodeList`) keep their own lowerCamel json tags and are read as-is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from server.app import BadRequest

_ARGS_FIELDS = {"pod": "Pod", "nodes": "Nodes", "nodenames": "NodeNames"}
_PREEMPT_FIELDS = {"pod": "Pod", "nodenametovictims": "NodeNameToVictims",
                   "nodenametometavictims": "NodeNameToMetaVictims"}
_VICTIMS_FIELDS = {"pods": "Pods", "numpdbviolations": "NumPDBViolations"}
_BIND_FIELDS = {"podname": "PodName", "podnamespace": "PodNamespace", "poduid": "PodUID", "node": "Node"}


def _fields(body: Any, fields: dict[str, str], what: str) -> dict[str, Any]:
    """Go's decoding of a tagless struct: a key matches a field when equal under Unicode case folding
    (`"nodenames"`, `"NODENAMES"`); unknown keys are ignored; a repeated field keeps the last value."""
    if not isinstance(body, dict):
        raise BadRequest(f"{what} must be a JSON object, got {type(body).__name__}")
    out: dict[str, Any] = {}
    for key, value in body.items():
        canonical = fields.get(key.casefold())
        if canonical is not None:
            out[canonical] = value
    return out


@dataclass(frozen=True, slots=True)
class ExtenderArgs:
    pod: dict[str, Any]
    names: list[str]  # the candidates, in the order the scheduler sent them
    node_names: bool  # NodeNames was sent (nodeCacheCapable: true): answer NodeNames
    node_list: dict[str, Any] | None  # the NodeList that was sent (nodeCacheCapable: false): answer Nodes
    items: list[dict[str, Any]]  # node_list items, aligned with their names in `names`


def parse_args(body: Any) -> ExtenderArgs:
    """`ExtenderArgs` of /filter and /prioritize; BadRequest names what is wrong."""
    fields = _fields(body, _ARGS_FIELDS, "ExtenderArgs")
    pod = fields.get("Pod")
    if pod is None:
        raise BadRequest("ExtenderArgs has no Pod")
    if not isinstance(pod, dict):
        raise BadRequest(f"ExtenderArgs.Pod must be a v1.Pod object, got {type(pod).__name__}")
    names: list[str] = []
    raw_names = fields.get("NodeNames")
    if raw_names is not None:
        if not isinstance(raw_names, list) or not all(map(str.__instancecheck__, raw_names)):
            raise BadRequest("ExtenderArgs.NodeNames must be null or a list of node names")
        names = raw_names
    node_list = fields.get("Nodes")
    items: list[dict[str, Any]] = []
    if node_list is not None:
        if not isinstance(node_list, dict):
            raise BadRequest(f"ExtenderArgs.Nodes must be null or a v1.NodeList object, got {type(node_list).__name__}")
        raw_items = node_list.get("items")
        if raw_items is None:
            raw_items = []
        if not isinstance(raw_items, list):
            raise BadRequest("ExtenderArgs.Nodes.items must be a list of v1.Node objects")
        listed = []
        for i, item in enumerate(raw_items):
            meta = item.get("metadata") if isinstance(item, dict) else None
            name = meta.get("name") if isinstance(meta, dict) else None
            if not isinstance(name, str) or not name:
                raise BadRequest(f"ExtenderArgs.Nodes.items[{i}] is not a v1.Node with metadata.name")
            listed.append(name)
        items = raw_items
        if raw_names is None:
            names = listed
        else:  # never sent by kube-scheduler; judge both, answer both
            seen = set(names)
            names = names + [n for n in listed if n not in seen]
    elif raw_names is None:
        raise BadRequest("ExtenderArgs has neither NodeNames nor Nodes: nothing to filter")
    return ExtenderArgs(pod, names, raw_names is not None, node_list, items)


def filter_result(args: ExtenderArgs, passed: list[str], failed: dict[str, str],
                  unresolvable: dict[str, str], error: str = "") -> dict[str, Any]:
    """`ExtenderFilterResult`, all five keys, in the form the request came in: `NodeNames` for a
    nodeCacheCapable scheduler (`Nodes` null), a `NodeList` of the passing Node objects otherwise."""
    nodes = None
    if args.node_list is not None:
        keep = set(passed)
        nodes = dict(args.node_list)
        nodes["items"] = [item for item in args.items if item["metadata"]["name"] in keep]
    return {
        "Nodes": nodes,
        "NodeNames": passed if args.node_names else None,
        "FailedNodes": failed,
        "FailedAndUnresolvableNodes": unresolvable,
        "Error": error,
    }


def filter_error(error: str) -> dict[str, Any]:
    """`ExtenderFilterResult` that judges nothing: kube-scheduler fails the attempt with `error`."""
    return {"Nodes": None, "NodeNames": None, "FailedNodes": None, "FailedAndUnresolvableNodes": None, "Error": error}


def host_priorities(entries: list[tuple[str, int]]) -> list[dict[str, Any]]:
    """`HostPriorityList`: a bare JSON array, Score an integer in 0..10."""
    return [{"Host": n, "Score": s} for n, s in entries]


@dataclass(frozen=True, slots=True)
class PreemptArgs:
    pod: dict[str, Any]
    victims: dict[str, list[str]]  # node -> the uids of the victims kube-scheduler chose there, in its order
    pods: dict[str, dict[str, Any]]  # uid -> the victim's v1.Pod, when sent whole (nodeCacheCapable: false)


def parse_preempt_args(body: Any) -> PreemptArgs:
    """`ExtenderPreemptionArgs`: NodeNameToMetaVictims (uids; nodeCacheCapable: true) or NodeNameToVictims
    (whole pods); BadRequest names what is wrong."""
    fields = _fields(body, _PREEMPT_FIELDS, "ExtenderPreemptionArgs")
    pod = fields.get("Pod")
    if not isinstance(pod, dict):
        raise BadRequest("ExtenderPreemptionArgs has no Pod object")
    victims: dict[str, list[str]] = {}
    pods: dict[str, dict[str, Any]] = {}
    for key in ("NodeNameToMetaVictims", "NodeNameToVictims"):
        by_node = fields.get(key)
        if by_node is None:
            continue
        if not isinstance(by_node, dict):
            raise BadRequest(f"ExtenderPreemptionArgs.{key} must be null or an object of node names")
        for node, entry in by_node.items():
            listed = _fields(entry, _VICTIMS_FIELDS, f"ExtenderPreemptionArgs.{key}[{node}]").get("Pods") or []
            if not isinstance(listed, list):
                raise BadRequest(f"ExtenderPreemptionArgs.{key}[{node}].Pods must be a list")
            uids = victims.setdefault(node, [])
            for i, item in enumerate(listed):
                if key == "NodeNameToMetaVictims":
                    uid = _fields(item, {"uid": "UID"}, f"{key}[{node}].Pods[{i}]").get("UID")
                else:
                    meta = item.get("metadata") if isinstance(item, dict) else None
                    uid = meta.get("uid") if isinstance(meta, dict) else None
                    if isinstance(uid, str) and uid:
                        pods[uid] = item
                if not isinstance(uid, str) or not uid:
                    raise BadRequest(f"ExtenderPreemptionArgs.{key}[{node}].Pods[{i}] has no UID")
                uids.append(uid)
    return PreemptArgs(pod, victims, pods)


def preempt_result(chosen: dict[str, list[str]]) -> dict[str, Any]:
    """`ExtenderPreemptionResult`: always NodeNameToMetaVictims, whichever form came in (kube-scheduler's
    ProcessPreemption reads only that one and maps the uids back to its own pods). Only victim sets that violate
    no PodDisruptionBudget are chosen, so NumPDBViolations is 0; a node left out is no candidate."""
    return {"NodeNameToMetaVictims": {node: {"Pods": [{"UID": u} for u in uids], "NumPDBViolations": 0}
                                      for node, uids in chosen.items()}}


@dataclass(frozen=True, slots=True)
class BindArgs:
    pod_name: str
    namespace: str
    uid: str
    node: str

    @property
    def pod(self) -> str:
        return f"{self.namespace}/{self.pod_name}"


def parse_bind_args(body: Any) -> BindArgs:
    """`ExtenderBindingArgs`: PodName, PodNamespace, PodUID, Node (strings)."""
    fields = _fields(body, _BIND_FIELDS, "ExtenderBindingArgs")
    values: dict[str, str] = {}
    for field in _BIND_FIELDS.values():
        value = fields.get(field)
        if value is None:
            value = ""
        if not isinstance(value, str):
            raise BadRequest(f"ExtenderBindingArgs.{field} must be a string, got {type(value).__name__}")
        values[field] = value
    missing = [f for f in ("PodName", "PodNamespace", "PodUID", "Node") if not values[f]]
    if missing:
        raise BadRequest(f"ExtenderBindingArgs has no {', '.join(missing)}")
    return BindArgs(values["PodName"], values["PodNamespace"], values["PodUID"], values["Node"])


def bind_result(error: str = "") -> dict[str, str]:
    """`ExtenderBindingResult`: an empty Error is success."""
    return {"Error": error}
