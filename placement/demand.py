"""What a model pod asks for: policy, TP, model container, CPUs — read from the pod alone.

Everything that needs the cluster (does the balloon type exist? how many threads per core on the
node?) is decided in `fit.py` / `cluster.py`; this module only reads one pod.
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from placement.config import CPU_POLICIES, PREFLIGHT_MODES, Settings
from placement.kubelet import KPod, kubelet_pod
from placement.quantity import QuantityError, cpu_milli, format_cpu, memory_bytes

# Inputs a user may set.
ANN_POLICY = "model-manager.io/cpu-policy"
ANN_TP = "model-manager.io/tensor-parallel-size"
ANN_PP = "model-manager.io/pipeline-parallel-size"
ANN_DP = "model-manager.io/data-parallel-size"
ANN_BALLOON = "model-manager.io/nri-balloon"
ANN_NODE = "model-manager.io/node"
ANN_REQUIRE_AMX = "model-manager.io/require-amx"
ANN_PREFLIGHT = "model-manager.io/preflight"
ANN_CONTAINER = "model-manager.io/container"
# Outputs the webhook writes.
OUT_TYPE = "cpu-policy.model-manager.io/type"
OUT_REASON = "cpu-policy.model-manager.io/reason"
OUT_MESSAGE = "cpu-policy.model-manager.io/message"  # the sentence behind `reason`
OUT_TP = "cpu-policy.model-manager.io/tensor-parallel-size"
OUT_NUMA = "cpu-policy.model-manager.io/numa-nodes"
OUT_CPUS = "cpu-policy.model-manager.io/cpus"
OUT_REQUESTED = "cpu-policy.model-manager.io/requested-cpu"
BALLOON_KEY = "balloon.balloons.resource-policy.nri.io"
BALLOON_PREFIX = BALLOON_KEY + "/container."
BALLOON_POD = BALLOON_KEY + "/pod"
MAX_LABEL_NAME = 63  # the name part of an annotation key (after the "/")

KSERVE_LABEL = "serving.kserve.io/inferenceservice"
# KServe's LLMInferenceService controller (pkg/constants) and llm-d label their vLLM pods with these; its router and
# router-scheduler pods share part-of but not a workload component.
PART_OF = "app.kubernetes.io/part-of"
COMPONENT = "app.kubernetes.io/component"
APP_NAME = "app.kubernetes.io/name"
LLMISVC = "llminferenceservice"
LLMISVC_WORKLOAD = "llminferenceservice-workload"  # -prefill, -worker, -leader, -worker-prefill, …
KSERVE_COMPONENT = "kserve.io/component"
LLMD_ROLE = "llm-d.ai/role"
LLMD_ROLES = ("decode", "prefill", "both")
VALID_TP = (1, 2, 4, 8)
DEFAULT_CONTAINERS = ("main", "kserve-container")

_TP_FLAGS = ("--tensor-parallel-size", "-tp")
# (what, its annotation, vLLM's flags by precedence, how a rank count is written): the three ways vLLM splits a
# model into ranks, each of which runs on a NUMA node of its own. Data parallelism may span pods (KServe's
# LeaderWorkerSet templates pass --data-parallel-size N --data-parallel-size-local L): the ranks in this pod are the
# local ones.
_PARALLEL = (
    ("tensor", ANN_TP, (_TP_FLAGS,), "TP"),
    ("pipeline", ANN_PP, (("--pipeline-parallel-size", "-pp"),), "PP"),
    ("data", ANN_DP, (("--data-parallel-size-local", "-dpl"), ("--data-parallel-size", "-dp")), "DP"),
)


@dataclass(frozen=True, slots=True)
class ModelIdentity:
    """Pods of one model: a workload's replicas replace its running pods, a pod the ones being deleted."""

    namespace: str
    label: str
    value: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.value}"


@dataclass(frozen=True, slots=True)
class ModelDemand:
    """One model pod's request, as read from the pod (nothing resolved against the cluster yet)."""

    pod: str  # namespace/name (or namespace/generateName*) for messages
    identity: ModelIdentity | None
    container: str
    tp: int
    tp_source: str
    requested_policy: str
    resolved_policy: str | None  # the webhook's own output annotation, when present
    balloon_type: str
    cpu_milli: int
    preflight: str
    require_amx: bool
    node_pin: str | None
    problems: tuple[str, ...]  # things the pod itself gets wrong, each a user-facing sentence
    pp: int = 1  # pipeline stages in this pod
    dp: int = 1  # data-parallel ranks in this pod
    memory_bytes: int = 0  # the model container's memory request (limit when no request)
    requested_milli: int = 0  # the CPU request the user wrote (before the webhook sized it); 0: as cpu_milli
    # The pod's other containers, once it runs (sidecars, native sidecars): CPU they take in the balloon their
    # namespace routes them to, which grows into free cores for them.
    shared_milli: int = 0
    namespace: str = ""
    # The pod as the kubelet reads it (every container's exclusive CPUs): what kubelet-static nodes admit or reject.
    kpod: KPod | None = None
    # While its regular init containers run, before any other container starts: the most CPU they take there at
    # once, with the native sidecars started before them (`pod_init_cpu_milli`). 0: none.
    init_milli: int = 0

    @property
    def requested_cpu(self) -> str:
        """`cpu: N` as the user wrote it: the unit every message speaks in."""
        return format_cpu(self.requested_milli or self.cpu_milli)

    @property
    def policy(self) -> str:
        return self.resolved_policy or self.requested_policy

    @property
    def unpinned_milli(self) -> int:
        """The model container's CPU request as a shared balloon counts it, when it has no cores of its own."""
        return min(self.cpu_milli, MAX_REQUEST_MILLI)

    @property
    def cpus(self) -> int:
        """Whole CPUs of the model container (a fractional request rounds up)."""
        return math.ceil(self.cpu_milli / 1000)

    @property
    def numa_nodes(self) -> int:
        """Each rank runs on a NUMA node of its own: TP × PP × DP of them."""
        return self.tp * self.pp * self.dp

    @property
    def ranks(self) -> str:
        return ranks_text(self.tp, self.pp, self.dp)

    @property
    def rank_count(self) -> str:
        """"1 rank", "4 ranks": how many NUMA nodes of its own the model wants, as messages count them."""
        return f"{self.numa_nodes} rank{'s' if self.numa_nodes != 1 else ''}"


def ranks_text(tp: int, pp: int = 1, dp: int = 1) -> str:
    parts = [f"TP={tp}"] + ([f"PP={pp}"] if pp != 1 else []) + ([f"DP={dp}"] if dp != 1 else [])
    return " × ".join(parts)


def balloon_annotation(container: str) -> str:
    """The plugin's container-scoped key, or its pod-scoped one when the container's name makes the key's
    name part longer than the apiserver allows (the plugin reads container > pod > unscoped)."""
    if len("container.") + len(container) <= MAX_LABEL_NAME:
        return BALLOON_PREFIX + container
    return BALLOON_POD


def routed_type(annotations: Mapping[str, Any], container: str) -> str | None:
    """The balloon type the plugin's annotation routes `container` to, as it reads it (QueryEffectiveAnnotation:
    container-scoped, else pod-scoped, else unscoped key); None when no such annotation is on the pod."""
    for key in (BALLOON_PREFIX + container, BALLOON_POD, BALLOON_KEY):
        value = annotations.get(key)
        if value is not None:
            return str(value)
    return None


class Routed(NamedTuple):
    """A container of a pod that carries the plugin's balloon annotation: the type it is routed to (None: by its
    namespace, like any other), and what it requests."""

    container: str
    balloon_type: str | None
    cpu_milli: int
    memory_bytes: int


def routed_containers(annotations: Mapping[str, Any] | None, spec: Mapping[str, Any]) -> tuple[Routed, ...]:
    """Each container that runs for the pod's life (app containers, native sidecars) with the type the balloon
    annotation routes it to; () when the pod carries no balloon annotation. Regular init containers run to
    completion before the others start and the plugin frees their CPUs when they exit: they are not listed."""
    if not annotations or not any(str(k).startswith(BALLOON_KEY) for k in annotations):
        return ()
    running = [c for c in spec.get("initContainers") or () if isinstance(c, _MAPPING)
               and c.get("restartPolicy") == "Always"]
    running += [c for c in spec.get("containers") or () if isinstance(c, _MAPPING)]
    return tuple(Routed(str(c.get("name", "")), routed_type(annotations, str(c.get("name", ""))),
                        container_cpu_milli(c)[0], container_memory_bytes(c)[0]) for c in running)


def round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def pod_display_name(pod: Mapping[str, Any], namespace: str = "") -> str:
    meta = pod.get("metadata") or {}
    ns = meta.get("namespace") or namespace or "default"
    name = meta.get("name") or (f"{meta['generateName']}*" if meta.get("generateName") else "<unnamed>")
    return f"{ns}/{name}"


def controller_of(meta: Mapping[str, Any]) -> str | None:
    """The controller that creates this pod ("ReplicaSet llama-7f9c"), from its ownerReference with
    `controller: true`; None for a pod a person created."""
    for ref in meta.get("ownerReferences") or ():
        if isinstance(ref, Mapping) and ref.get("controller") is True:
            return f"{ref.get('kind', 'controller')} {ref.get('name', '')}".strip()
    return None


def is_llm_workload(labels: Mapping[str, Any]) -> bool:
    """A KServe LLMInferenceService or llm-d workload pod (the vLLM server, any role), not its router."""
    return (labels.get(PART_OF) == LLMISVC and str(labels.get(COMPONENT, "")).startswith(LLMISVC_WORKLOAD)) \
        or labels.get(KSERVE_COMPONENT) == "workload" or labels.get(LLMD_ROLE) in LLMD_ROLES


def is_model_pod(labels: Mapping[str, Any] | None, settings: Settings) -> bool:
    if not labels:
        return False
    return any(key in labels for key in settings.model_labels) or (settings.llm_workloads and is_llm_workload(labels))


def model_identity(meta: Mapping[str, Any], namespace: str, settings: Settings) -> ModelIdentity | None:
    labels = meta.get("labels") or {}
    ns = meta.get("namespace") or namespace or "default"
    for key in (KSERVE_LABEL, *settings.model_labels):
        if labels.get(key):
            return ModelIdentity(ns, key, str(labels[key]))
    if settings.llm_workloads and labels.get(APP_NAME) and is_llm_workload(labels):
        # One service's decode, prefill and worker pods are different workloads: none replaces another.
        return ModelIdentity(ns, APP_NAME, f"{labels[APP_NAME]}/{labels.get(COMPONENT) or labels.get(LLMD_ROLE)}")
    return None


def model_container(spec: Mapping[str, Any],
                    annotations: Mapping[str, Any]) -> tuple[Mapping[str, Any] | None, str | None]:
    """The model container and, when the annotation names a container that does not exist, a problem."""
    containers = [c for c in spec.get("containers") or () if isinstance(c, Mapping)]
    if not containers:
        return None, "the pod has no containers"
    by_name = {c.get("name"): c for c in containers}
    wanted = annotations.get(ANN_CONTAINER)
    if wanted:
        if wanted in by_name:
            return by_name[wanted], None
        return containers[0], (
            f"annotation {ANN_CONTAINER}={wanted!r} names no container of this pod "
            f"(containers: {', '.join(str(n) for n in by_name)})"
        )
    for name in DEFAULT_CONTAINERS:
        if name in by_name:
            return by_name[name], None
    return containers[0], None


def _tokens(container: Mapping[str, Any]) -> list[str]:
    words: list[str] = []
    for part in (container.get("command") or []) + (container.get("args") or []):
        text = str(part)
        if " " in text.strip():  # `sh -c "vllm serve … -tp 2"`: split the script too
            try:
                # ... and what it quotes: KServe's templates run `eval "exec vllm serve … --tensor-parallel-size 2"`,
                # where a flag may follow a trimmed template line as `\--flag` (eval drops the backslash).
                words.extend(w[1:] if w.startswith("\\-") else w
                             for quoted in shlex.split(text) for w in quoted.split())
            except ValueError:
                words.extend(text.split())
        else:
            words.append(text)
    return words


def flag_from_args(container: Mapping[str, Any], flags: tuple[str, ...]) -> str | None:
    """The last `FLAG N`, `FLAG=N` of any of `flags` (argparse: last wins)."""
    words = _tokens(container)
    found: str | None = None
    for i, word in enumerate(words):
        for flag in flags:
            if word == flag and i + 1 < len(words):
                found = words[i + 1]
            elif word.startswith(flag + "="):
                found = word[len(flag) + 1:]
    return found


def _parse_size(raw: str, what: str, source: str) -> tuple[int, str | None]:
    try:
        size = int(str(raw).strip())
    except ValueError:
        return 1, f"{what}-parallel-size {raw!r} from {source} is not a whole number"
    if size < 1:
        return 1, f"{what}-parallel-size {size} from {source} must be at least 1"
    return size, None


def _parse_tp(raw: str, source: str) -> tuple[int, str | None]:
    try:
        tp = int(str(raw).strip())
    except ValueError:
        return 1, f"tensor-parallel-size {raw!r} from {source} is not a whole number; use one of 1, 2, 4, 8"
    if tp not in VALID_TP:
        return tp, (
            f"tensor-parallel-size {tp} (from {source}) is not supported: a balloon spans 1, 2, 4 or 8 "
            "NUMA nodes; use 1, 2, 4 or 8"
        )
    return tp, None


def _read_parallel(annotations: Mapping[str, Any], container: Mapping[str, Any], name: str
                   ) -> tuple[dict[str, int], str, list[str]]:
    """TP, PP and DP from the user's annotation, else ours (for TP), else vLLM's flags; where TP came from; and
    what is wrong with them."""
    sizes: dict[str, int] = {}
    problems: list[str] = []
    tp_source = "default"
    for what, key, flags, short in _PARALLEL:
        sources = [(key, f"annotation {key}")] + ([(OUT_TP, f"annotation {OUT_TP}")] if short == "TP" else [])
        raw, source = next(((annotations[k], src) for k, src in sources if annotations.get(k) is not None),
                           (None, ""))
        for group in flags if raw is None else ():
            raw, source = flag_from_args(container, group), f"{group[0]} in container {name!r}"
            if raw is not None:
                break
        size, problem = (1, None) if raw is None else \
            (_parse_tp(raw, source) if short == "TP" else _parse_size(raw, what, source))
        sizes[short] = size
        if short == "TP" and raw is not None:
            tp_source = source
        if problem:
            problems.append(problem)
    span = sizes["TP"] * sizes["PP"] * sizes["DP"]
    if not problems and span not in VALID_TP:
        problems.append(f"{ranks_text(sizes['TP'], sizes['PP'], sizes['DP'])} makes {span} ranks, one NUMA node "
                        "each, and a balloon spans 1, 2, 4 or 8 NUMA nodes: choose sizes whose product is one of "
                        "these")
    return sizes, tp_source, problems


def _flag(value: Any) -> bool | None:
    if value is None:
        return None
    return str(value).strip().lower() not in {"false", "0", "no", "off"}


def _requested(container: Mapping[str, Any], resource: str, parse: Callable[[object], int]) -> tuple[int, str | None]:
    """requests.<resource>, else limits.<resource> (the apiserver defaults a missing request to the limit)."""
    resources = container.get("resources") or {}
    value = (resources.get("requests") or {}).get(resource)
    if value is None:
        value = (resources.get("limits") or {}).get(resource)
        if value is None:
            return 0, None
    try:
        return parse(value), None
    except QuantityError as exc:
        return 0, f"container {container.get('name')!r}: {exc}"


def container_cpu_milli(container: Mapping[str, Any]) -> tuple[int, str | None]:
    return _requested(container, "cpu", cpu_milli)


def container_memory_bytes(container: Mapping[str, Any]) -> tuple[int, str | None]:
    return _requested(container, "memory", memory_bytes)


def read_model_pod(pod: Mapping[str, Any], settings: Settings, namespace: str = "") -> ModelDemand:
    """Read a model pod (the caller has checked `is_model_pod`). Never raises on bad input: what the
    pod gets wrong is collected in `problems`, each phrased for the user."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    annotations = meta.get("annotations") or {}
    problems: list[str] = []

    container, problem = model_container(spec, annotations)
    if problem:
        problems.append(problem)
    container = container or {}
    name = str(container.get("name", ""))

    # The user's own annotations first: ours only restate them, and must not hide a bad value.
    sizes, tp_source, parallel_problems = _read_parallel(annotations, container, name)
    problems.extend(parallel_problems)
    tp = sizes["TP"]
    span = tp * sizes["PP"] * sizes["DP"]

    requested = str(annotations.get(ANN_POLICY) or settings.kubernetes_cpu_policy)
    if requested not in CPU_POLICIES:
        problems.append(
            f"annotation {ANN_POLICY}={requested!r} is not a CPU policy; use one of {', '.join(CPU_POLICIES)}"
        )
        requested = settings.kubernetes_cpu_policy
    resolved = annotations.get(OUT_TYPE)
    resolved = str(resolved) if resolved in CPU_POLICIES else None

    preflight = str(annotations.get(ANN_PREFLIGHT) or settings.preflight)
    if preflight not in PREFLIGHT_MODES:
        problems.append(f"annotation {ANN_PREFLIGHT}={preflight!r} is not one of {', '.join(PREFLIGHT_MODES)}")
        preflight = settings.preflight

    balloon = (
        routed_type(annotations, name)
        or annotations.get(ANN_BALLOON)
        or f"{settings.nri_balloon_prefix}{span}"
    )

    cpu, problem = container_cpu_milli(container)
    if problem:
        problems.append(problem)
    elif cpu == 0 and container:
        problems.append(
            f"model container {name!r} requests no CPU; set resources.requests.cpu (e.g. \"16\") so the "
            "balloon can be sized"
        )

    memory, problem = container_memory_bytes(container)
    if problem:
        problems.append(problem)
    try:
        requested_milli = cpu_milli(annotations[OUT_REQUESTED]) if annotations.get(OUT_REQUESTED) else 0
    except QuantityError:
        requested_milli = 0
    amx = _flag(annotations.get(ANN_REQUIRE_AMX))
    return ModelDemand(
        pod=pod_display_name(pod, namespace),
        identity=model_identity(meta, namespace, settings),
        container=name,
        tp=tp,
        tp_source=tp_source,
        requested_policy=requested,
        resolved_policy=resolved,
        balloon_type=str(balloon),
        cpu_milli=cpu,
        preflight=preflight,
        require_amx=settings.require_amx if amx is None else amx,
        node_pin=str(annotations[ANN_NODE]) if annotations.get(ANN_NODE) else None,
        problems=tuple(problems),
        pp=sizes["PP"],
        dp=sizes["DP"],
        memory_bytes=memory,
        requested_milli=requested_milli,
        shared_milli=pod_shared_cpu_milli(spec, name),
        namespace=str(meta.get("namespace") or namespace),
        kpod=kubelet_pod("", spec),
        init_milli=pod_init_cpu_milli(spec),
    )


# The balloons plugin reads a container's CPU request back from its cpu.shares (pkg/resmgr/cache), and the kubelet's
# MilliCPUToShares stops at 262,144 shares: 256 CPUs. The oracle showed a 288-CPU request given a 256-CPU balloon, and
# a 386-CPU init container run in a shared balloon of 256 CPUs.
MAX_REQUEST_MILLI = 262_144 * 1000 // 1024


def _shared_request(container: Mapping[str, Any]) -> int:
    """A container's CPU request as a shared balloon counts it. The kubelet's shared pool, which no request sizes,
    is counted by the same figure: only a container of more than 256 CPUs reads differently."""
    return min(container_cpu_milli(container)[0], MAX_REQUEST_MILLI)


def pod_shared_cpu_milli(spec: Mapping[str, Any], skip: str | None = None, initializing: bool = False) -> int:
    """CPU a pod takes from the shared pool, less container `skip` (a model container with cores of its own):
    its app containers plus its native sidecars (restartable init containers, which run for the pod's life).
    While it is `initializing`, the kubelet's effective request instead: max(that, `pod_init_cpu_milli`). The
    kubelet runs init containers to completion before the app containers, and the balloons plugin releases a
    container's CPUs when it exits, so an init container's request is held only while the pod initializes. Bad
    quantities count as 0."""
    # Read for every pod listed or watched: plain loops, no intermediate lists.
    apps = 0
    for c in spec.get("containers") or ():
        if isinstance(c, _MAPPING) and (skip is None or c.get("name") != skip):
            apps += _shared_request(c)
    sidecars = 0
    for c in spec.get("initContainers") or ():
        if isinstance(c, _MAPPING) and c.get("restartPolicy") == "Always":
            sidecars += _shared_request(c)
    return max(apps + sidecars, pod_init_cpu_milli(spec)) if initializing else apps + sidecars


def pod_shared_steps(spec: Mapping[str, Any]) -> tuple[tuple[str, int], ...]:
    """Each container that runs for the pod's life (native sidecars, then app containers: the order the kubelet
    starts them in), by name, with its CPU request as a shared balloon counts it; () when there is only one. The
    balloons plugin grows a shared balloon container by container, each time to the CPUs all of its containers
    request, and where each growth goes depends on what was free then."""
    out: list[tuple[str, int]] = []
    for section, sidecars in (("initContainers", True), ("containers", False)):
        for c in spec.get(section) or ():
            if isinstance(c, _MAPPING) and (not sidecars or c.get("restartPolicy") == "Always"):
                out.append((str(c.get("name", "")), _shared_request(c)))
    return tuple(out) if len(out) > 1 else ()


def pod_init_cpu_milli(spec: Mapping[str, Any]) -> int:
    """The most CPU a pod's containers request at once while its regular init containers run: each of those with the
    native sidecars started before it (they run one at a time, in order, before any app container). 0: none."""
    sidecars = 0
    peak = 0
    for c in spec.get("initContainers") or ():
        if not isinstance(c, _MAPPING):
            continue
        if c.get("restartPolicy") == "Always":
            sidecars += _shared_request(c)
        else:
            peak = max(peak, sidecars + _shared_request(c))
    return peak


def initializing(pod: Mapping[str, Any]) -> bool:
    """Has the pod regular init containers that may still run? Only a Pending pod runs them (it turns Running once
    they all completed); one whose statuses show each of them terminated with exit code 0 is past them."""
    spec = pod.get("spec") or {}
    regular = [c.get("name") for c in spec.get("initContainers") or ()
               if isinstance(c, _MAPPING) and c.get("restartPolicy") != "Always"]
    if not regular:
        return False
    status = pod.get("status") or {}
    if (status.get("phase") or "Pending") != "Pending":
        return False
    done = {s.get("name") for s in status.get("initContainerStatuses") or ()
            if isinstance(s, _MAPPING) and ((s.get("state") or {}).get("terminated") or {}).get("exitCode") == 0}
    return not all(name in done for name in regular)


def pod_shared_memory(spec: Mapping[str, Any], skip: str | None = None) -> int:
    """Memory requested by a pod's containers and sidecar init containers, less container `skip`."""
    total = 0
    for section in ("containers", "initContainers"):
        for c in spec.get(section) or ():
            if isinstance(c, _MAPPING) and (skip is None or c.get("name") != skip) and \
                    (section == "containers" or c.get("restartPolicy") == "Always"):
                total += container_memory_bytes(c)[0]
    return total


# dict first: parsed JSON is dicts, and an exact type matches ~10x faster than the Mapping ABC's check.
_MAPPING = (dict, Mapping)
