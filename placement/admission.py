"""Admission decisions for an object as the apiserver hands it over: a Pod, or the pod template of a
Deployment / StatefulSet times its replicas. The webhook and `render` both call these."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from placement.cluster import ClusterState
from placement.demand import (
    APP_NAME,
    COMPONENT,
    KSERVE_COMPONENT,
    LLMISVC,
    LLMISVC_WORKLOAD,
    OUT_MESSAGE,
    OUT_TYPE,
    PART_OF,
    controller_of,
    model_container,
)
from placement.fit import nominal_footprint
from placement.mutation import Mutation, mutate_pod
from placement.preflight import NRI_FALLBACK, Verdict, preflight
from placement.reasons import INSUFFICIENT_FREE
from placement.refusals import POD_SPEC, REPLICAS, NotMutated
from placement.vllm import vllm_notes

WORKLOAD_KINDS = ("Deployment", "StatefulSet")
LLMISVC_KIND = "LLMInferenceService"


class NotAdmissible(ValueError):
    """The object is not something we judge (wrong kind, no template): the message says what."""


@dataclass(frozen=True, slots=True)
class Subject:
    kind: str
    pod: Mapping[str, Any]  # the pod, or the workload's pod template shaped as a pod
    replicas: int
    namespace: str


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def subject_of(obj: Any, namespace: str = "") -> Subject:
    if not isinstance(obj, Mapping):
        raise NotAdmissible("object is not a JSON object")
    kind = obj.get("kind")
    meta = _mapping(obj.get("metadata"))
    ns = str(meta.get("namespace") or namespace or "default")
    if kind == "Pod":
        if not isinstance(obj.get("spec"), Mapping):
            raise NotAdmissible("Pod has no spec")
        return Subject("Pod", obj, 1, ns)
    if kind in WORKLOAD_KINDS:
        spec = _mapping(obj.get("spec"))
        template = spec.get("template")
        if not isinstance(template, Mapping) or not isinstance(template.get("spec"), Mapping):
            raise NotAdmissible(f"{kind} has no spec.template.spec")
        replicas = spec.get("replicas", 1)
        if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 0:
            raise NotAdmissible(f"{kind} spec.replicas {replicas!r} is not a whole number ≥ 0")
        if not isinstance(template.get("metadata") or {}, Mapping):
            raise NotAdmissible(f"{kind} spec.template.metadata is not an object")
        tmeta = dict(template.get("metadata") or {})
        tmeta["namespace"] = ns
        tmeta.setdefault("name", f"{meta.get('name', '')}")
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": tmeta, "spec": template["spec"]}
        return Subject(kind, pod, replicas, ns)
    if kind == LLMISVC_KIND:
        return _llmisvc_subject(obj, meta, ns)
    raise NotAdmissible(f"kind {kind!r} is not judged here; expected Pod, Deployment, StatefulSet or "
                        f"{LLMISVC_KIND}")


def _positive(value: object, what: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise NotAdmissible(f"{LLMISVC_KIND} {what} {value!r} is not a whole number ≥ 1")
    return value


def _llmisvc_subject(obj: Mapping[str, Any], meta: Mapping[str, Any], ns: str) -> Subject:
    """The decode (main) workload's pod as KServe's controller renders it (pkg/controller/v1alpha2/llmisvc,
    config/llmisvcconfig): spec.template with the workload labels, spec.labels and spec.annotations, and the
    parallelism the templates pass to `vllm serve`: --tensor-parallel-size always, and with a worker (a
    LeaderWorkerSet) --data-parallel-size-local, the data-parallel ranks in each pod; each group of
    data ÷ dataLocal pods per replica. The merged LLMInferenceServiceConfig is not read: without spec.template
    there is no container to judge here, and the pods are judged when they are created."""
    spec = _mapping(obj.get("spec"))
    template = spec.get("template")
    if not isinstance(template, Mapping) or not template.get("containers"):
        raise NotAdmissible(f"{LLMISVC_KIND} has no spec.template.containers to judge (the rest comes from its "
                            "LLMInferenceServiceConfig; its pods are checked when they are created)")
    replicas = spec.get("replicas", 1)
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 0:
        raise NotAdmissible(f"{LLMISVC_KIND} spec.replicas {replicas!r} is not a whole number ≥ 0")
    parallelism = _mapping(spec.get("parallelism"))
    tensor = _positive(parallelism.get("tensor"), "spec.parallelism.tensor")
    flags = [f"--tensor-parallel-size={tensor}"] if tensor else []
    pods_per_replica = 1
    if spec.get("worker") is not None:
        data = _positive(parallelism.get("data"), "spec.parallelism.data") or 1
        local = _positive(parallelism.get("dataLocal"), "spec.parallelism.dataLocal") or 1
        flags.append(f"--data-parallel-size-local={local}")
        pods_per_replica = max(1, data // local)
    name = str(meta.get("name", ""))
    labels = {**(spec.get("labels") or {}), PART_OF: LLMISVC, COMPONENT: LLMISVC_WORKLOAD, APP_NAME: name,
              KSERVE_COMPONENT: "workload"}
    pod_spec = dict(template)
    main, _ = model_container(pod_spec, spec.get("annotations") or {})
    if main is not None and flags:
        pod_spec["containers"] = [{**c, "args": [*(c.get("args") or ()), *flags]} if c is main else c
                                  for c in pod_spec["containers"]]
    pod = {"apiVersion": "v1", "kind": "Pod", "spec": pod_spec,
           "metadata": {"name": f"{name}-kserve", "namespace": ns, "labels": labels,
                        "annotations": dict(spec.get("annotations") or {})}}
    return Subject(LLMISVC_KIND, pod, replicas * pods_per_replica, ns)


@dataclass(frozen=True, slots=True)
class Decision:
    allowed: bool
    mode: str  # enforce | warn | skip | "" when the object is not a model pod
    check: str
    message: str  # the refusal (or, in warn mode, what would have been refused)
    warnings: tuple[str, ...]  # notes worth telling even when admitted, untruncated
    mutation: Mutation
    verdict: Verdict | None
    replicas: int

    @property
    def policy(self) -> str:
        return self.mutation.resolution.policy if self.mutation.resolution else "none"

    @property
    def reason(self) -> str:
        if self.mutation.resolution and self.mutation.resolution.reason:
            return self.mutation.resolution.reason
        return self.check


def validate(subject: Subject, cluster: ClusterState, require_mutated: bool = False, update: bool = False) -> Decision:
    """The pre-flight verdict under the pod's mode. The object is judged as it will be scheduled:
    our own mutation is applied first (it is idempotent, so an already mutated pod is unchanged).
    With `require_mutated` (the webhook, for a Pod), a model pod our mutating webhook never saw is
    refused: it would run unpinned, and its ReplicaSet retries once the mutating webhook is back.
    With `update` (a Deployment or StatefulSet changed), what does not fit *today's* free cores is
    admitted with the refusal as a warning: a GitOps sync scales ahead of the nodes that will hold it
    (and `kubectl scale` is never checked at all), while every pod is still checked when it is created."""
    mutation = mutate_pod(subject.pod, cluster, subject.namespace)
    demand = mutation.demand
    if demand is None:
        return Decision(True, "", "skipped", mutation.skipped or "", (), mutation, None, subject.replicas)
    mode = demand.preflight
    if mode == "skip" or subject.replicas == 0:
        return Decision(True, mode, "skipped", "", (), mutation, None, subject.replicas)
    verdict = preflight(demand, mutation.pod["spec"], cluster, subject.replicas, mutation.resolution)
    if verdict.check != POD_SPEC:
        verdict = replace(verdict, notes=verdict.notes + _vllm_notes(mutation, cluster))
    waiting = _waiting_text(subject, verdict)
    if waiting:
        return Decision(True, mode, verdict.check, waiting, verdict.notes, mutation, verdict, subject.replicas)
    if verdict.allowed and require_mutated and subject.kind == "Pod" and not _mutated(subject.pod):
        verdict = replace(verdict, allowed=False, refusal=NotMutated(demand.pod, OUT_TYPE))
    if verdict.allowed:
        return Decision(True, mode, verdict.check, "", verdict.notes, mutation, verdict, subject.replicas)
    if not cluster.settings.nri_enabled and verdict.check in NRI_CHECKS:
        return Decision(True, mode, "skipped", "", verdict.notes, mutation, verdict, subject.replicas)
    # warn mode admits and tells the same text; the webhook splits it into warnings the apiserver keeps.
    if update and verdict.check in CAPACITY_TODAY:
        message = (f"{verdict.message} Admitted as an update: the workload may scale ahead of its capacity; its pods "
                   "that do not fit are admitted, wait Pending, and are bound as soon as cores are free.")
        return Decision(True, mode, verdict.check, message, verdict.notes, mutation, verdict, subject.replicas)
    allowed = mode == "warn"
    return Decision(allowed, mode, verdict.check, verdict.message, verdict.notes, mutation, verdict,
                    subject.replicas)


def _vllm_notes(mutation: Mutation, cluster: ClusterState) -> tuple[str, ...]:
    demand = mutation.demand
    assert demand is not None and mutation.resolution is not None
    fp = nominal_footprint(demand, cluster.settings.mm_kubelet_threads_per_core)
    # hideHyperthreads: a rank's threads run one per core of its balloon part.
    hidden = demand.policy == "nri-balloons" and mutation.resolution.hide_hyperthreads
    return vllm_notes(demand, mutation.pod, (fp.cores if hidden else fp.cpus) // demand.numa_nodes)


def _waiting_text(subject: Subject, verdict: Verdict) -> str:
    """Why a controller's pod that does not fit now is admitted anyway, or "" when it is not such a pod. A refused
    create puts the controller into exponential backoff (minutes, doubling) that outlives the shortage; admitted,
    the pod waits in the scheduler's queue and is bound on the next cluster change that makes room."""
    if subject.kind != "Pod" or verdict.allowed or verdict.check not in CAPACITY_TODAY:
        return ""
    owner = controller_of(subject.pod.get("metadata") or {})
    if owner is None:
        return ""
    return (f"{verdict.message} Admitted because {owner} creates it (a refusal would put it into growing "
            "backoff): it waits Pending and is bound as soon as room appears.")


def waiting_reason(mutation: Mutation, cluster: ClusterState, namespace: str = "") -> str:
    """Why this controller's pod, which does not fit now, is admitted to wait Pending; "" when it fits, is a
    person's pod, or is not judged."""
    demand = mutation.demand
    meta = mutation.pod.get("metadata") or {}
    if demand is None or demand.problems or demand.preflight == "skip" or controller_of(meta) is None:
        return ""
    verdict = preflight(demand, mutation.pod["spec"], cluster, 1, mutation.resolution)
    return _waiting_text(Subject("Pod", mutation.pod, 1, namespace or "default"), verdict)


def keep_reason(mutation: Mutation, reason: str) -> Mutation:
    """The mutation with `reason` kept on the pod (`OUT_MESSAGE`, after the policy's own sentence): the admission
    warning reaches only the controller-manager, `kubectl describe pod` reaches the operator."""
    annotations = mutation.pod["metadata"]["annotations"]
    annotations[OUT_MESSAGE] = " ".join(filter(None, (annotations.get(OUT_MESSAGE), reason)))
    return mutation


def _mutated(pod: Mapping[str, Any]) -> bool:
    return OUT_TYPE in ((pod.get("metadata") or {}).get("annotations") or {})


# Refusals that depend on what is free now, not on what the workload asks of a node.
CAPACITY_TODAY = (INSUFFICIENT_FREE, REPLICAS)
NRI_CHECKS = ("balloon-type-missing", "nri-not-running", "balloon-type-max-cpus", "max-balloons-reached",
              NRI_FALLBACK)

