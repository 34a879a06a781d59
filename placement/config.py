"""Settings: the one switch (`kubernetes_cpu_policy`) and every knob.

Precedence is per-pod annotation > environment > config file > default. The per-pod part lives in
`demand.py`, which is where a pod is read; this module resolves the cluster-wide settings from the config file's
mapping and the environment as the server layer read them (`server.inputs.load_settings`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal, get_args

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from placement.kubelet import CPU_OPTIONS
from placement.quantity import cpu_milli, memory_bytes
from placement.topology import CPUSet

CpuPolicy = Literal["nri-balloons", "kubelet-static", "best-effort"]
Preflight = Literal["enforce", "warn", "skip"]
Profile = Literal["siblings", "minimal", "standard", "observability", "full"]
ScoringStrategy = Literal["MostAllocated", "LeastAllocated", "BalancedAllocation"]
CpuRequest = Literal["cores", "cpus"]
TopologyPolicy = Literal["none", "best-effort", "restricted", "single-numa-node"]
TopologyScope = Literal["container", "pod"]
MemoryPolicy = Literal["None", "Static"]

CPU_POLICIES: tuple[str, ...] = get_args(CpuPolicy)
PREFLIGHT_MODES: tuple[str, ...] = get_args(Preflight)


class ConfigError(ValueError):
    """An invalid setting: names the key, the value and what is allowed."""


def _cpu_list(value: str) -> str:
    CPUSet.parse(value)
    return value


CpuList = Annotated[str, AfterValidator(_cpu_list)]  # a Linux cpuset list such as 0-3,64-67

# The label an operator puts on nodes whose kubelet runs the static CPU Manager (the default node group selects it).
KUBELET_STATIC_LABEL = "model-manager.io/cpu-manager"


class KubeletGroup(BaseModel):
    """A group of kubelet-static nodes and what no object announces about their kubelets (docs/configuration.md).
    The Topology Manager policy and scope are read from each node's NodeResourceTopology where it has one; these
    apply where it does not."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1)
    node_selector: dict[str, str] = Field(default_factory=dict)  # labels a node must carry; empty: every node
    cpu_manager_policy_options: tuple[str, ...] = ("full-pcpus-only",)
    topology_manager_policy: TopologyPolicy = "single-numa-node"
    topology_manager_scope: TopologyScope = "pod"
    topology_manager_policy_options: tuple[Literal["prefer-closest-numa-nodes"], ...] = ()
    reserved_system_cpus: CpuList = ""  # the kubelet's reservedSystemCPUs; empty: from the node's allocatable CPUs
    memory_manager_policy: MemoryPolicy = "None"
    reserved_memory: tuple[str, ...] = ()  # Static: per NUMA node, in order
    packages: int | None = Field(default=None, ge=1, le=8)  # sockets; None: from the NUMA distances

    @field_validator("cpu_manager_policy_options")
    @classmethod
    def _options(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        unknown = [v for v in value if v not in CPU_OPTIONS]
        if unknown:
            raise ValueError(f"{', '.join(unknown)}: the placement model follows only {', '.join(CPU_OPTIONS)}")
        return value

    @field_validator("reserved_memory")
    @classmethod
    def _memory(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for v in value:
            memory_bytes(v)
        return value

    def selects(self, labels: Mapping[str, str]) -> bool:
        return all(labels.get(k) == v for k, v in self.node_selector.items())


class Settings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    kubernetes_cpu_policy: CpuPolicy = "nri-balloons"
    nri_enabled: bool = True
    preflight: Preflight = "enforce"
    nri_deployment_profile: Profile = "standard"
    nri_reserved_cpu_list: CpuList = ""
    nri_balloon_prefix: str = Field(default="vllm-balloon-tp", min_length=1)
    # On a hide-hyperthreads balloon type: "cores", the model container's cpu: N means N physical cores for N
    # threads (the request becomes N x SMT width); "cpus", the request stays, rounded up to whole cores.
    nri_cpu_request: CpuRequest = "cores"
    # The namespace the NRI balloons plugin reads its BalloonsPolicies from (its --config-namespace); policies
    # elsewhere configure nothing on the nodes, so the ledger ignores them.
    nri_config_namespace: str = Field(default="kube-system", min_length=1)
    mm_kubelet_threads_per_core: int = Field(default=2, ge=1, le=8)
    require_amx: bool = True
    amx_node_label: str = "feature.node.kubernetes.io/cpu-security.amx.enabled"
    numa_count_label: str = "feature.node.kubernetes.io/memory-numa.node_count"
    scheduler_name: str = ""
    scoring_strategy: ScoringStrategy = "MostAllocated"
    # Labels whose presence makes a pod a model pod.
    model_labels: tuple[str, ...] = ("model-manager.io/model", "serving.kserve.io/inferenceservice")
    # KServe LLMInferenceService and llm-d workload pods are model pods by their own labels (demand.is_llm_workload).
    llm_workloads: bool = True
    # Namespaces never touched, whatever the webhook configuration sends us.
    protected_namespaces: tuple[str, ...] = ("kube-system", "model-placement")
    # Under kubelet-static, what a native sidecar (an init container with restartPolicy: Always) that sets no cpu or
    # memory is given as requests = limits: without both, the pod is Burstable and the kubelet pins no core.
    native_sidecar_cpu: str = "100m"
    native_sidecar_memory: str = "128Mi"
    # How long after its creation a model pod waits Pending for a node that keeps each rank on its own NUMA node,
    # while only nodes that would split it have room now and a node that would not could once pods leave; then it
    # runs split. A split rank pays on every token for the pod's life; the wait is paid once.
    split_wait_seconds: float = Field(default=120.0, ge=0)
    # An assumed pod (bound by us, not yet seen bound by the watch) is dropped after this long.
    assume_ttl_seconds: float = Field(default=30.0, gt=0)
    # kubelet-static node groups, first match wins: the nodes they select are pinned by the kubelet whatever
    # BalloonsPolicy would apply, and so is every node no BalloonsPolicy applies to (with KubeletGroup's defaults).
    kubelet_node_groups: tuple[KubeletGroup, ...] = (
        KubeletGroup(name="static", node_selector={KUBELET_STATIC_LABEL: "static"}),)

    @field_validator("native_sidecar_cpu", "native_sidecar_memory")
    @classmethod
    def _positive_quantity(cls, value: str, info: ValidationInfo) -> str:
        cpu = info.field_name == "native_sidecar_cpu"
        if (cpu_milli if cpu else memory_bytes)(value) <= 0:
            raise ValueError(f"{value!r} is none: give a positive quantity such as {'100m' if cpu else '128Mi'}")
        return value



# The short names docs/configuration.md documents, besides every key's generic variable (`_env_name`).
_ENV_ALIASES: dict[str, str] = {
    "MM_CPU_POLICY": "kubernetes_cpu_policy",
    "MM_NRI_PREFLIGHT": "preflight",
}
_SKIP_PREFLIGHT = "MM_NRI_SKIP_PREFLIGHT"
_TRUE = {"1", "true", "yes", "on"}


def _env_name(key: str) -> str:
    """MM_<KEY>, the prefix not doubled: mm_kubelet_threads_per_core is MM_KUBELET_THREADS_PER_CORE."""
    return "MM_" + key.upper().removeprefix("MM_")


def _env_overrides(env: Mapping[str, str]) -> tuple[dict[str, Any], dict[str, str]]:
    """The settings the environment gives, and for each the variable it came from."""
    out: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for key in Settings.model_fields:
        generic = _env_name(key)
        if generic in env:
            out[key], origin[key] = env[generic], generic
    for var, key in _ENV_ALIASES.items():
        if var in env:
            out[key], origin[key] = env[var], var
    known = set(map(_env_name, Settings.model_fields)) | set(_ENV_ALIASES) | {_SKIP_PREFLIGHT}
    unknown = sorted(var for var in env if var.startswith("MM_") and var not in known)
    if unknown:
        # A misspelt variable silently left at its default is worse than a refusal to start.
        verb = "is not a setting" if len(unknown) == 1 else "are not settings"
        raise ConfigError(f"invalid configuration: {', '.join(unknown)} {verb}; known variables: "
                          f"{', '.join(sorted(known))}")
    if env.get(_SKIP_PREFLIGHT, "").strip().lower() in _TRUE:
        out["preflight"], origin["preflight"] = "skip", _SKIP_PREFLIGHT
    for key in ("model_labels", "protected_namespaces"):
        if isinstance(out.get(key), str):
            out[key] = tuple(s.strip() for s in out[key].split(",") if s.strip())
    return out, origin


def _explain(error: ValidationError, source: Mapping[str, Any], origin: Mapping[str, str]) -> str:
    parts = []
    for item in error.errors():
        key = ".".join(str(p) for p in item["loc"]) or "<config>"
        top = str(item["loc"][0]) if item["loc"] else ""
        value = source.get(top, item.get("input")) if item["loc"] else item.get("input")
        annotation = Settings.model_fields.get(str(item["loc"][0]) if item["loc"] else "")
        allowed = ""
        if annotation is not None and get_args(annotation.annotation):
            allowed = f"; allowed: {', '.join(map(str, get_args(annotation.annotation)))}"
        if item["type"] == "extra_forbidden":
            allowed = f"; known keys: {', '.join(Settings.model_fields)}"
        where = origin.get(top, "")
        if where.startswith("MM_"):  # the variable is what the operator typed
            parts.append(f"{where}={value!r} (setting {key}): {item['msg']}{allowed}")
        else:
            parts.append(f"{key}={value!r}{f' in {where}' if where else ''}: {item['msg']}{allowed}")
    return "invalid configuration: " + "; ".join(parts)


def resolve_settings(env: Mapping[str, str], file: Mapping[str, Any] | None = None, file_name: str = "") -> Settings:
    """Defaults < the config file's settings < the environment's. Raises ConfigError naming key, value, allowed
    values and where the value came from (`file_name`, or the variable)."""
    raw: dict[str, Any] = dict(file or {})
    origin = dict.fromkeys(map(str, raw), f"config file {file_name}")
    overrides, from_env = _env_overrides(env)
    raw.update(overrides)
    origin.update(from_env)
    try:
        return Settings(**raw)
    except ValidationError as exc:
        raise ConfigError(_explain(exc, raw, origin)) from None
