"""The pod a model pod should become: annotations, Guaranteed resources, node affinity.

Pure: a pod in, a new pod out (the input is never modified). Idempotent: mutating the output again
changes nothing, so the apiserver's reinvocation finds an empty patch. The JSON patch itself is
the webhook's business.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import orjson

from placement.cluster import ClusterState
from placement.demand import (
    OUT_CPUS,
    OUT_MESSAGE,
    OUT_NUMA,
    OUT_REASON,
    OUT_REQUESTED,
    OUT_TP,
    OUT_TYPE,
    ModelDemand,
    balloon_annotation,
    is_model_pod,
    read_model_pod,
    round_up,
)
from placement.fit import balloon_request, nominal_cpus
from placement.kubelet import kubelet_pod
from placement.ledger import PLACEMENT, NodeLedger
from placement.preflight import NRI_FALLBACK, Resolution, fallback_text, resolve_policy
from placement.quantity import QuantityError, cpu_milli, format_cpu
from placement.topology import SMT_LABEL, smt_label_width

MIRROR_ANNOTATION = "kubernetes.io/config.mirror"


@dataclass(frozen=True, slots=True)
class Mutation:
    pod: dict[str, Any]  # the pod as it should be (a copy)
    demand: ModelDemand | None  # None when the pod is left alone
    resolution: Resolution | None
    skipped: str | None  # why the pod is left alone, e.g. "not a model pod"
    dropped: tuple[str, ...] = ()  # annotations it carried that are not the creator's to write (`without_placement`)


def _copy(obj: Mapping[str, Any]) -> dict[str, Any]:
    # A JSON document copies ~10x faster through orjson than through copy.deepcopy.
    copied: dict[str, Any] = orjson.loads(orjson.dumps(obj))
    return copied


def _writable(pod: Mapping[str, Any]) -> dict[str, Any]:
    """A new pod whose parts every mutation may write (metadata, annotations, spec, affinity) are
    copies; everything else is shared with the input (containers are copied where they are written,
    see `_make_guaranteed`). Sharing is what lets the patch builder and its check skip untouched
    subtrees by identity, and nothing here writes to a shared part."""
    out = dict(pod)
    meta = out["metadata"] = dict(out.get("metadata") or {})
    if meta.get("annotations") is not None:
        meta["annotations"] = dict(meta["annotations"])
    spec = out["spec"] = dict(out.get("spec") or {})
    if spec.get("affinity") is not None:
        spec["affinity"] = _copy(spec["affinity"])
    return out


def _writable_container(container: Any) -> Any:
    if not isinstance(container, dict):
        return container
    out = dict(container)
    if out.get("resources") is not None:
        out["resources"] = _copy(out["resources"])
    return out


def without_placement(pod: Mapping[str, Any]) -> tuple[dict[str, Any], tuple[str, ...]]:
    """The pod (its written parts copied) without a placement annotation, and the annotations dropped. Only our
    extender writes where a pod sits, in the Binding that puts it on its node: on a new pod the value is a copy of
    another pod's or a claim of its creator's, which a ledger rebuilt from a list would trust."""
    out = _writable(pod)
    annotations = out["metadata"].get("annotations")
    if isinstance(annotations, dict) and PLACEMENT in annotations:
        del annotations[PLACEMENT]
        return out, (PLACEMENT,)
    return out, ()


def dropped_text(pod: str, dropped: tuple[str, ...]) -> str:
    """The admission warning for what `without_placement` dropped."""
    return (f"model-placement removed annotation {', '.join(dropped)} from {pod}: only model-placement's extender "
            "writes it, in the Binding that puts the pod on its node")


def skip_reason(pod: Mapping[str, Any], namespace: str, cluster: ClusterState) -> str | None:
    """Pods we never touch, whatever the webhook configuration sends us."""
    meta = pod.get("metadata") or {}
    ns = meta.get("namespace") or namespace
    if ns in cluster.settings.protected_namespaces:
        return f"namespace {ns} is protected"
    if MIRROR_ANNOTATION in (meta.get("annotations") or {}):
        return "mirror pod"
    if meta.get("deletionTimestamp"):
        return "pod is being deleted"
    if not is_model_pod(meta.get("labels"), cluster.settings):
        return "not a model pod"
    return None


def mutate_pod(pod: Mapping[str, Any], cluster: ClusterState, namespace: str = "") -> Mutation:
    skipped = skip_reason(pod, namespace, cluster)
    if skipped:
        return Mutation(_copy(pod), None, None, skipped)
    settings = cluster.settings
    out, dropped = without_placement(pod)
    spec = out["spec"]
    demand = read_model_pod(out, settings, namespace)

    # Affinity first: which nodes are eligible decides whether NRI can be honoured.
    if demand.require_amx:
        _require_on_every_term(spec, "matchExpressions",
                               {"key": settings.amx_node_label, "operator": "In", "values": ["true"]})
    if demand.node_pin:
        _require_on_every_term(spec, "matchFields",
                               {"key": "metadata.name", "operator": "In", "values": [demand.node_pin]})
    if settings.scheduler_name and spec.get("schedulerName") in (None, "", "default-scheduler"):
        spec["schedulerName"] = settings.scheduler_name

    resolution = resolve_policy(demand, cluster.iter_eligible(spec), settings.nri_enabled)
    annotations = out.setdefault("metadata", {}).setdefault("annotations", {})
    if annotations is None:
        annotations = out["metadata"]["annotations"] = {}
    annotations[OUT_TYPE] = resolution.policy
    if resolution.reason:
        annotations[OUT_REASON] = resolution.reason
        # Admission warnings reach only the client that created the pod, for a ReplicaSet's pods the controller
        # manager: the sentence is kept where an operator looks, `kubectl describe pod`.
        annotations[OUT_MESSAGE] = fallback_text(demand) if resolution.reason == NRI_FALLBACK else (
            "runs best-effort without exclusive cores: nri_enabled is false in the model-placement configuration.")
    else:
        annotations.pop(OUT_REASON, None)
        annotations.pop(OUT_MESSAGE, None)
    annotations[OUT_TP] = str(demand.tp)
    annotations[OUT_NUMA] = str(demand.numa_nodes)

    tpc = settings.mm_kubelet_threads_per_core
    resolved = replace(demand, resolved_policy=resolution.policy)
    if resolution.policy == "nri-balloons":
        annotations[balloon_annotation(demand.container)] = demand.balloon_type
        width = smt_width(resolved, annotations, spec, cluster, resolution.hide_hyperthreads)
        milli = balloon_request(demand, annotations, width, resolution.hide_hyperthreads, settings.nri_cpu_request)
        if milli is not None and milli != demand.cpu_milli:
            annotations.setdefault(OUT_REQUESTED, format_cpu(demand.cpu_milli))
            _set_cpu(spec, demand.container, format_cpu(milli))
            resolved = replace(resolved, cpu_milli=milli, requested_milli=demand.requested_milli or demand.cpu_milli)
    elif resolution.policy == "kubelet-static":
        _make_guaranteed(spec, demand.container, tpc, {"cpu": settings.native_sidecar_cpu,
                                                        "memory": settings.native_sidecar_memory})
        # Judged as the kubelet will get it: a Deployment's template is validated unmutated, and a sidecar whose
        # limits exceed its requests is Guaranteed only once made equal here.
        resolved = replace(resolved, kpod=kubelet_pod("", spec))
    annotations[OUT_CPUS] = str(nominal_cpus(resolved, tpc))
    return Mutation(out, resolved, resolution, None, dropped)


def smt_width(demand: ModelDemand, annotations: Mapping[str, Any], spec: dict[str, Any], cluster: ClusterState,
              hide_hyperthreads: bool) -> int:
    """The SMT width the balloon request is written for. A request is written before a node is chosen and a core
    is as many CPUs as the node has threads per core, so where the eligible nodes with the balloon type differ in
    width the pod is given one: the fleet's usual width when a node of it fits the pod now, else the first other
    one where a node does, else the usual one; and its node affinity keeps it on nodes of that width (their
    SMT label), where the request means what the user asked for."""
    usual = cluster.settings.mm_kubelet_threads_per_core
    if not any(smt_label_width(node.labels, usual) != usual for node in cluster.nodes.values()):
        return usual  # one width in the whole fleet: no need to look at which nodes are eligible
    by_width: dict[int, list[NodeLedger]] = {}
    for ledger in cluster.iter_eligible(spec):
        policy = ledger.nri.policy
        if ledger.nri.running and policy is not None and policy.balloon_type(demand.balloon_type) is not None:
            by_width.setdefault(ledger.threads_per_core, []).append(ledger)
    if len(by_width) <= 1:
        return next(iter(by_width), usual)
    mode = cluster.settings.nri_cpu_request
    chosen = usual
    for width in sorted(by_width, key=lambda w: (w != usual, -w)):
        milli = balloon_request(demand, annotations, width, hide_hyperthreads, mode)
        sized = replace(demand, cpu_milli=milli) if milli is not None else demand
        if any(cluster.fit_admission(sized, ledger).ok for ledger in by_width[width]):
            chosen = width
            break
    _require_on_every_term(spec, "matchExpressions", smt_requirement(chosen, usual))
    return chosen


def smt_requirement(width: int, usual: int) -> dict[str, Any]:
    """A node selector requirement for nodes of SMT width `width`, read as `node_topology` reads it: the SMT
    label's true is 2, false is 1, no label the fleet's usual width."""
    if width == usual:
        other = [value for value, w in (("true", 2), ("false", 1)) if w != usual]
        return {"key": SMT_LABEL, "operator": "NotIn", "values": other}
    return {"key": SMT_LABEL, "operator": "In", "values": ["true" if width == 2 else "false"]}


def _set_cpu(spec: dict[str, Any], container_name: str, value: str) -> None:
    """requests.cpu, and limits.cpu where set, of the named container (copied, as every written part is)."""
    containers = spec.get("containers")
    if not isinstance(containers, list):
        return
    spec["containers"] = [_writable_container(c) for c in containers]
    for container in spec["containers"]:
        if isinstance(container, dict) and container.get("name") == container_name:
            resources = container.get("resources") or {}
            container["resources"] = resources
            resources["requests"] = {**(resources.get("requests") or {}), "cpu": value}
            if (resources.get("limits") or {}).get("cpu") is not None:
                resources["limits"] = {**resources["limits"], "cpu": value}


def _require_on_every_term(spec: dict[str, Any], field: str, requirement: dict[str, Any]) -> None:
    """Node selector terms are ORed, so a requirement must be ANDed into every one of them."""
    affinity = spec.get("affinity") or {}
    spec["affinity"] = affinity
    node_affinity = affinity.get("nodeAffinity") or {}
    affinity["nodeAffinity"] = node_affinity
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    node_affinity["requiredDuringSchedulingIgnoredDuringExecution"] = required
    terms = required.get("nodeSelectorTerms") or []
    required["nodeSelectorTerms"] = terms
    if not terms:
        terms.append({})
    for term in terms:
        items = term.get(field) or []
        if requirement not in items:
            items.append(_copy(requirement))
        term[field] = items


def _whole_cpus(value: object) -> int | None:
    try:
        milli = cpu_milli(value)
    except QuantityError:
        return None
    return milli // 1000 if milli % 1000 == 0 else None


def _make_guaranteed(spec: dict[str, Any], model_container: str, tpc: int, sidecar: Mapping[str, str]) -> None:
    """requests == limits for cpu and memory everywhere; whole CPU counts rounded up to whole cores,
    because kubelet's full-pcpus-only answers SMTAlignmentError to an odd count. A fractional
    sidecar stays fractional: it runs in the shared pool. A native sidecar that sets neither (KServe's
    llm-d-routing-sidecar has `resources: {}`) is given `sidecar`: it runs beside the model for the pod's life,
    so the pod is Guaranteed only if it is too. A value we cannot read is left for the validating webhook to
    refuse with a message."""
    for section in ("initContainers", "containers"):
        if isinstance(spec.get(section), list):
            spec[section] = [_writable_container(c) for c in spec[section]]
        for container in spec.get(section) or ():
            resources = container.get("resources") or {}
            container["resources"] = resources
            requests = resources.get("requests") or {}
            limits = resources.get("limits") or {}
            native = section == "initContainers" and container.get("restartPolicy") == "Always"
            for name in ("cpu", "memory"):
                value = requests.get(name, limits.get(name))
                if value is None and native:
                    value = sidecar[name]
                if value is None:
                    continue
                if name == "cpu":
                    whole = _whole_cpus(value)
                    if container.get("name") == model_container:
                        try:
                            whole = math.ceil(cpu_milli(value) / 1000)
                        except QuantityError:
                            whole = None
                    if whole is not None:
                        value = format_cpu(round_up(whole, tpc) * 1000)
                requests[name] = value
                limits[name] = value
            if requests:
                resources["requests"] = requests
            if limits:
                resources["limits"] = limits
