"""The install manifests (manifests/), the Dockerfile and .dockerignore.

Every YAML document under manifests/ is loaded; built-in kinds are validated strictly against the bundled Kubernetes
OpenAPI schemas (kubernetes_validate, offline), the rest against the fields their upstream types define:
KubeSchedulerConfiguration `extenders`, BalloonsPolicy, cert-manager.
The webhook configurations, RBAC, Deployments and kustomizations are checked for the properties the design relies on.
The three kustomize builds are rendered (with the kube peer's kubectl) and validated too.

The checkers return lists of problems, so the last tests can show that each of them really fails on a bad input.
"""

from __future__ import annotations

import base64
import copy
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_validate import utils as kv

from server.inputs import load_settings
from tests.peers.build import build

ROOT = Path(__file__).resolve().parent.parent
MANIFESTS = ROOT / "manifests"
BASE = MANIFESTS / "base"
OVERLAY = MANIFESTS / "overlays" / "cert-manager"
EXAMPLES = MANIFESTS / "examples"
CERTS = MANIFESTS / "certs"

NAMESPACE = "model-placement"
WEBHOOK_SERVICE = "model-placement-webhook"
TLS_SECRET = "model-placement-tls"
TLS_KEYS = {"tls.crt", "tls.key", "ca.crt"}
SCHEDULER_NAME = "model-placement-scheduler"
MODEL_LABELS = ("model-manager.io/model", "serving.kserve.io/inferenceservice")
# What makes a KServe LLMInferenceService / llm-d workload pod a model pod (placement.demand.is_llm_workload).
LLM_WORKLOAD_MARKS = ("'llminferenceservice-workload'", "'kserve.io/component'", "'llm-d.ai/role'")
LLMISVC_WEBHOOK = "llminferenceservices.validate.model-placement.io"
OPT_IN_LABEL = "model-placement.io/enabled"
PROTECTED_NAMESPACES = {"kube-system", "model-placement"}

# Newest schemas bundled with kubernetes_validate, plus 1.30: the first release with matchConditions GA.
LATEST_K8S = kv.major_minor(kv.latest_version())
K8S_VERSIONS = sorted({LATEST_K8S, "1.30"}, key=lambda v: tuple(map(int, v.split("."))))

# Kinds without a built-in schema, each checked by its own test below.
CUSTOM_KINDS = {
    ("config.nri/v1alpha1", "BalloonsPolicy"),
    ("cert-manager.io/v1", "Issuer"),
    ("cert-manager.io/v1", "Certificate"),
}

# What our servers answer: path -> {(group, resource): operations}.
SERVED = {
    "/mutate": {("", "pods"): {"CREATE"}},
    "/validate": {
        ("", "pods"): {"CREATE"},
        ("apps", "deployments"): {"CREATE", "UPDATE"},
        ("apps", "statefulsets"): {"CREATE", "UPDATE"},
        ("serving.kserve.io", "llminferenceservices"): {"CREATE", "UPDATE"},
    },
}

# The one switch and its knobs: the keys the settings ConfigMap may hold.
SETTINGS_KEYS = {
    "kubernetes_cpu_policy", "nri_enabled", "preflight", "nri_deployment_profile", "nri_reserved_cpu_list",
    "nri_balloon_prefix", "mm_kubelet_threads_per_core", "require_amx", "amx_node_label", "numa_count_label",
    "scheduler_name", "scoring_strategy", "nri_cpu_request", "nri_config_namespace",
}

# `staging/src/k8s.io/kube-scheduler/config/v1/types.go` Extender (json names, exact).
EXTENDER_KEYS = {
    "urlPrefix", "filterVerb", "preemptVerb", "prioritizeVerb", "weight", "bindVerb", "enableHTTPS", "tlsConfig",
    "httpTimeout", "nodeCacheCapable", "managedResources", "ignorable",
}
EXTENDER_TLS_KEYS = {"insecure", "serverName", "certFile", "keyFile", "caFile", "certData", "keyData", "caData"}
EXTENDER_MANAGED_RESOURCE_KEYS = {"name", "ignoredByScheduler"}
# kubescheduler.config.k8s.io/v1 KubeSchedulerConfiguration, LeaderElectionConfiguration and KubeSchedulerProfile.
SCHEDULER_CONFIG_KEYS = {
    "apiVersion", "kind", "parallelism", "leaderElection", "clientConnection", "percentageOfNodesToScore",
    "podInitialBackoffSeconds", "podMaxBackoffSeconds", "profiles", "extenders", "delayCacheUntilActive",
    "enableProfiling", "enableContentionProfiling",
}
LEADER_ELECTION_KEYS = {
    "leaderElect", "leaseDuration", "renewDeadline", "retryPeriod", "resourceLock", "resourceName",
    "resourceNamespace",
}
PROFILE_KEYS = {"schedulerName", "percentageOfNodesToScore", "plugins", "pluginConfig"}
# The routes the extender serves.
EXTENDER_VERBS = {"filterVerb": "filter", "prioritizeVerb": "prioritize", "preemptVerb": "preempt", "bindVerb": "bind"}

# BalloonsPolicy spec = balloons.Config + control, log, instrumentation, agent (nri-plugins' config/v1alpha1).
BALLOONS_POLICY_KEYS = {
    "pinCPU", "pinMemory", "reservedResources", "availableResources", "reservedPoolNamespaces",
    "allocatorTopologyBalancing", "preferSpreadOnPhysicalCores", "balloonTypes", "preserve", "showContainersInNrt",
    "loadClasses", "schedulingClasses", "cpuClasses", "idleCPUClass", "turboDomain", "controllableInterrupts",
    "control", "log", "instrumentation", "agent",
}
BALLOON_DEF_KEYS = {
    "name", "components", "componentCreation", "namespaces", "groupBy", "matchExpressions", "maxCPUs", "minCPUs",
    "memoryTypes", "pinMemory", "allocatorPriority", "preferSpreadOnPhysicalCores", "hideHyperthreads",
    "allocatorTopologyBalancing", "cpuClass", "loads", "minBalloons", "maxBalloons", "preferSpreadingPods",
    "preferPerNamespaceBalloon", "preferNewBalloons", "shareIdleCPUsInSame", "preferCloseToDevices",
    "preferIsolCpus", "preferCoreType", "schedulingClass", "showContainersInNrt", "irqClaim", "irqMode",
}
BALLOON_TYPES_SERVED = {"vllm-balloon-tp1", "vllm-balloon-tp2", "vllm-balloon-tp4"}

# The least-privilege set for model-placement's own code, rule by rule: (apiGroup, resource, resourceNames) -> verbs.
OUR_CLUSTER_ROLES = {
    "model-placement:cluster-state-reader": {
        ("", "nodes", ()): {"get", "list", "watch"},
        ("", "pods", ()): {"get", "list", "watch"},
        ("config.nri", "balloonspolicies", ()): {"get", "list", "watch"},
        ("topology.node.k8s.io", "noderesourcetopologies", ()): {"get", "list", "watch"},
    },
    "model-placement:event-recorder": {
        ("", "events", ()): {"create"},
        ("events.k8s.io", "events", ()): {"create"},
    },
    "model-placement:pod-binder": {
        ("", "pods/binding", ()): {"create"},
        ("", "pods/status", ()): {"patch"},
    },
    "model-placement-scheduler:preemption": {
        ("", "pods/eviction", ()): {"create"},
        ("policy", "poddisruptionbudgets", ()): {"get", "list"},
    },
}
OUR_ROLES = {
    (NAMESPACE, "model-placement-scheduler:leader-election"): {
        ("coordination.k8s.io", "leases", ()): {"create"},
        ("coordination.k8s.io", "leases", (SCHEDULER_NAME,)): {"get", "update"},
    },
}
# Which ServiceAccount holds which role: (kind, name, binding namespace or None).
EXPECTED_GRANTS = {
    "model-placement-webhook": {
        ("ClusterRole", "model-placement:cluster-state-reader", None),
        ("ClusterRole", "model-placement:event-recorder", None),
    },
    "model-placement-scheduler": {
        ("ClusterRole", "model-placement:cluster-state-reader", None),
        ("ClusterRole", "model-placement:event-recorder", None),
        ("ClusterRole", "model-placement:pod-binder", None),
        ("ClusterRole", "model-placement-scheduler:preemption", None),
        ("ClusterRole", "system:kube-scheduler", None),
        ("ClusterRole", "system:volume-scheduler", None),
        ("Role", "extension-apiserver-authentication-reader", "kube-system"),
        ("Role", "model-placement-scheduler:leader-election", NAMESPACE),
    },
}


# --------------------------------------------------------------------------------------------------- loading helpers


def yaml_files(root: Path = MANIFESTS) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.suffix in {".yaml", ".yml"} and p.is_file())


def load_all(path: Path) -> list[dict[str, Any]]:
    with path.open() as fh:
        return [doc for doc in yaml.safe_load_all(fh) if doc is not None]


def kustomization_files() -> list[Path]:
    return [p for p in yaml_files() if p.name in {"kustomization.yaml", "kustomization.yml", "Kustomization"}]


def _file_entry(entry: str) -> str:
    """`key=path` or `path` (generator `files` syntax) -> path."""
    return entry.split("=", 1)[1] if "=" in entry else entry


def kustomization_refs(kfile: Path) -> tuple[set[Path], set[Path], set[Path]]:
    """(resource files, generator source files, resource directories) a kustomization names."""
    k = load_all(kfile)[0]
    here = kfile.parent
    resources, sources, dirs = set(), set(), set()
    for entry in k.get("resources", []):
        target = (here / entry).resolve()
        (dirs if target.is_dir() or not target.suffix else resources).add(target)
    for gen in k.get("configMapGenerator", []) + k.get("secretGenerator", []):
        for entry in gen.get("files", []):
            sources.add((here / _file_entry(entry)).resolve())
        for entry in gen.get("envs", []):
            sources.add((here / entry).resolve())
    for patch in k.get("patches", []):
        if "path" in patch:
            resources.add((here / patch["path"]).resolve())
    return resources, sources, dirs


def generator_sources() -> set[Path]:
    out: set[Path] = set()
    for kfile in kustomization_files():
        out |= kustomization_refs(kfile)[1]
    return out


def resource_files() -> list[Path]:
    """Every YAML file holding Kubernetes objects: not a kustomization, not a generator's source file."""
    skip = set(kustomization_files()) | generator_sources()
    return [p for p in yaml_files() if p.resolve() not in skip and p not in skip]


def resources() -> list[tuple[Path, dict[str, Any]]]:
    return [(p, doc) for p in resource_files() for doc in load_all(p)]


def docs_of(kind: str, items: list[tuple[Path, dict[str, Any]]] | None = None) -> list[dict[str, Any]]:
    return [d for _, d in (resources() if items is None else items) if d.get("kind") == kind]


def one(kind: str, name: str, items: list[tuple[Path, dict[str, Any]]] | None = None) -> dict[str, Any]:
    found = [d for d in docs_of(kind, items) if d["metadata"]["name"] == name]
    assert len(found) == 1, f"expected exactly one {kind} {name}, found {len(found)}"
    return found[0]


def scheduler_config() -> dict[str, Any]:
    path = BASE / "config" / "kube-scheduler.yaml"
    (doc,) = load_all(path)
    return doc


def settings_config() -> dict[str, Any]:
    (doc,) = load_all(BASE / "config" / "model-placement.yaml")
    return doc


def builtin(doc: dict[str, Any]) -> bool:
    return (doc.get("apiVersion"), doc.get("kind")) not in CUSTOM_KINDS


def validate_strict(doc: dict[str, Any], version: str) -> str | None:
    """None if `doc` is valid for Kubernetes `version` (strict: no unknown fields), else the error."""
    try:
        kv.validate(doc, version, strict=True)
    except kv.ValidationError as exc:
        where = "/".join(map(str, exc.absolute_path))
        return f"{doc.get('kind')} {doc.get('metadata', {}).get('name')}: {where}: {exc.message}"
    except kv.SchemaNotFoundError:
        return f"no schema for {doc.get('apiVersion')} {doc.get('kind')} in Kubernetes {version}"
    return None


def containers(doc: dict[str, Any]) -> Iterator[dict[str, Any]]:
    spec = doc["spec"]["template"]["spec"]
    yield from spec.get("initContainers", [])
    yield from spec["containers"]


def container(doc: dict[str, Any], name: str) -> dict[str, Any]:
    (c,) = [c for c in doc["spec"]["template"]["spec"]["containers"] if c["name"] == name]
    return c


def flags(args: list[str]) -> dict[str, str | bool]:
    """`--k=v` / `--k v` / `--flag` -> {k: v}."""
    out: dict[str, str | bool] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        if arg.startswith("--"):
            key, eq, value = arg[2:].partition("=")
            if eq:
                out[key] = value
            elif i + 1 < len(args) and not args[i + 1].startswith("-"):
                out[key] = args[i + 1]
                i += 1
            else:
                out[key] = True
        i += 1
    return out


def mount_source(doc: dict[str, Any], ctr: dict[str, Any], file_path: str) -> tuple[dict[str, Any], str] | None:
    """The pod volume and the key inside it that `file_path` resolves to in container `ctr`, if any."""
    volumes = {v["name"]: v for v in doc["spec"]["template"]["spec"].get("volumes", [])}
    for mount in ctr.get("volumeMounts", []):
        prefix = mount["mountPath"].rstrip("/") + "/"
        if file_path.startswith(prefix) and "subPath" not in mount:
            return volumes[mount["name"]], file_path[len(prefix):]
    return None


_DURATION = re.compile(r"^(\d+(\.\d+)?(ns|us|µs|ms|s|m|h))+$")


def label_selector_matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    for key, value in selector.get("matchLabels", {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions", []):
        key, op, values = expr["key"], expr["operator"], expr.get("values", [])
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


# -------------------------------------------------------------------------------------------------------- checkers


def check_scheduler_config(cfg: dict[str, Any]) -> list[str]:
    errors: list[str] = []
    if cfg.get("apiVersion") != "kubescheduler.config.k8s.io/v1" or cfg.get("kind") != "KubeSchedulerConfiguration":
        errors.append("not a kubescheduler.config.k8s.io/v1 KubeSchedulerConfiguration")
    errors += [f"unknown top-level key {k!r}" for k in set(cfg) - SCHEDULER_CONFIG_KEYS]
    le = cfg.get("leaderElection", {})
    errors += [f"unknown leaderElection key {k!r}" for k in set(le) - LEADER_ELECTION_KEYS]
    if le.get("leaderElect") is not True:
        errors.append("leaderElection.leaderElect must be true")
    if le.get("resourceName") != SCHEDULER_NAME or le.get("resourceNamespace") != NAMESPACE:
        errors.append("leader election must use its own Lease model-placement/model-placement-scheduler")
    if le.get("resourceLock", "leases") != "leases":
        errors.append("leader election must use leases")
    profiles = cfg.get("profiles", [])
    for p in profiles:
        errors += [f"unknown profile key {k!r}" for k in set(p) - PROFILE_KEYS]
    if [p.get("schedulerName") for p in profiles] != [SCHEDULER_NAME]:
        errors.append(f"exactly one profile, schedulerName {SCHEDULER_NAME}")
    extenders = cfg.get("extenders", [])
    if len(extenders) != 1:
        errors.append("exactly one extender expected")
    for ext in extenders:
        errors += [f"unknown extender key {k!r}" for k in set(ext) - EXTENDER_KEYS]
        tls = ext.get("tlsConfig", {})
        errors += [f"unknown tlsConfig key {k!r}" for k in set(tls) - EXTENDER_TLS_KEYS]
        for mr in ext.get("managedResources", []):
            errors += [f"unknown managedResources key {k!r}" for k in set(mr) - EXTENDER_MANAGED_RESOURCE_KEYS]
        if ext.get("urlPrefix") != "http://127.0.0.1:8444":
            errors.append("urlPrefix must be http://127.0.0.1:8444 (the sidecar, loopback only)")
        for key, verb in EXTENDER_VERBS.items():
            if ext.get(key) != verb:
                errors.append(f"{key} must be {verb!r}")
        weight = ext.get("weight")
        if not isinstance(weight, int) or isinstance(weight, bool) or weight <= 0:
            errors.append("weight must be a positive integer when prioritizeVerb is set")
        if ext.get("nodeCacheCapable") is not True:
            errors.append("nodeCacheCapable must be true")
        # Loopback inside the pod: nothing else can reach it, so TLS would only cost CPU on every cycle.
        if ext.get("enableHTTPS") is not False:
            errors.append("enableHTTPS must be false (the sidecar is on loopback)")
        if "ignorable" not in ext or ext["ignorable"] is not False:
            errors.append("ignorable must be explicitly false")
        timeout = ext.get("httpTimeout")
        if not isinstance(timeout, str) or not _DURATION.match(timeout):
            errors.append(f"httpTimeout must be a Go duration, got {timeout!r}")
        if ext.get("managedResources"):
            errors.append("managedResources would hide model pods that request no extended resource")
        if tls:
            errors.append("tlsConfig is unused over plain HTTP: remove it")
    return errors


def check_balloons_policy(doc: dict[str, Any]) -> list[str]:
    errors: list[str] = []
    if doc.get("apiVersion") != "config.nri/v1alpha1" or doc.get("kind") != "BalloonsPolicy":
        errors.append("not a config.nri/v1alpha1 BalloonsPolicy")
    meta = doc.get("metadata", {})
    name = meta.get("name", "")
    if not (name == "default" or name.startswith("node.") or name.startswith("group.")):
        errors.append(f"name {name!r}: the plugin only reads default, node.<name> and group.<group>")
    spec = doc.get("spec", {})
    errors += [f"unknown spec key {k!r}" for k in set(spec) - BALLOONS_POLICY_KEYS]
    reserved = spec.get("reservedResources", {}).get("cpu")
    if reserved is None:
        errors.append("spec.reservedResources.cpu is required")
    elif not re.match(r"^(cpuset:|exclude-cpuset:)[0-9,\-]+$|^\d+(m)?$", str(reserved)):
        errors.append(f"reservedResources.cpu {reserved!r}: cpuset:LIST, exclude-cpuset:LIST or a quantity")
    names = [b.get("name") for b in spec.get("balloonTypes", [])]
    if len(names) != len(set(names)):
        errors.append("two balloon types with the same name")
    for b in spec.get("balloonTypes", []):
        if not b.get("name"):
            errors.append("missing or empty name in a balloon type")
        errors += [f"balloon type {b.get('name')}: unknown key {k!r}" for k in set(b) - BALLOON_DEF_KEYS]
        if b.get("maxCPUs") and b.get("minCPUs", 0) > b["maxCPUs"]:
            errors.append(f"balloon type {b.get('name')}: minCPUs > maxCPUs")
        if b.get("allocatorPriority", "high") not in {"high", "normal", "low", "none"}:
            errors.append(f"balloon type {b.get('name')}: bad allocatorPriority")
    return errors


POLICY_WEBHOOK = "balloonspolicies.validate.model-placement.io"


def check_policy_webhook(wh: dict[str, Any]) -> list[str]:
    """The BalloonsPolicy webhook: the plugin's own CRD, where the plugin reads it (no namespaceSelector: the
    plugin's namespace is an install choice), fail open, only when the spec changes."""
    errors = []
    if wh.get("rules") != [{"apiGroups": ["config.nri"], "apiVersions": ["v1alpha1"], "resources": ["balloonspolicies"],
                            "operations": ["CREATE", "UPDATE"], "scope": "Namespaced"}]:
        errors.append(f"{POLICY_WEBHOOK}: rules must be config.nri/v1alpha1 balloonspolicies CREATE, UPDATE")
    if wh.get("failurePolicy") != "Ignore":
        errors.append(f"{POLICY_WEBHOOK}: failurePolicy must be Ignore (advisory: the plugin judges it again)")
    if "namespaceSelector" in wh:
        errors.append(f"{POLICY_WEBHOOK}: no namespaceSelector")
    if "object.spec != oldObject.spec" not in " ".join(c.get("expression", "") for c in wh.get("matchConditions", [])):
        errors.append(f"{POLICY_WEBHOOK}: matchConditions must skip updates that leave the spec alone")
    return errors


def check_webhook_configuration(doc: dict[str, Any]) -> list[str]:
    errors: list[str] = []
    mutating = doc["kind"] == "MutatingWebhookConfiguration"
    for wh in doc.get("webhooks", []):
        name = wh.get("name", "")
        if len(name.split(".")) < 3:
            errors.append(f"{name}: webhook names must be fully qualified")
        if wh.get("admissionReviewVersions") != ["v1"]:
            errors.append(f"{name}: admissionReviewVersions must be [v1]")
        if wh.get("sideEffects") != "None":
            errors.append(f"{name}: sideEffects must be None")
        if not 1 <= wh.get("timeoutSeconds", 10) <= 30 or "timeoutSeconds" not in wh:
            errors.append(f"{name}: explicit timeoutSeconds within 1..30")
        if wh.get("failurePolicy") not in {"Ignore", "Fail"}:
            errors.append(f"{name}: explicit failurePolicy Ignore or Fail")
        if mutating and wh.get("reinvocationPolicy") != "IfNeeded":
            errors.append(f"{name}: reinvocationPolicy must be IfNeeded")
        svc = wh.get("clientConfig", {}).get("service", {})
        if (svc.get("name"), svc.get("namespace"), svc.get("port", 443)) != (WEBHOOK_SERVICE, NAMESPACE, 443):
            errors.append(f"{name}: clientConfig must point at {NAMESPACE}/{WEBHOOK_SERVICE}:443")
        path = svc.get("path")
        expected_path = "/mutate" if mutating else "/validate"
        if path != expected_path:
            errors.append(f"{name}: path must be {expected_path}")
        if name == POLICY_WEBHOOK:
            errors += check_policy_webhook(wh)
            continue
        served = SERVED.get(path or "", {})
        for rule in wh.get("rules", []):
            if rule.get("apiVersions") != (["v1alpha1", "v1alpha2"] if name == LLMISVC_WEBHOOK else ["v1"]):
                errors.append(f"{name}: rule apiVersions must be [v1]")
            if rule.get("scope") != "Namespaced":
                errors.append(f"{name}: rule scope must be Namespaced")
            for group in rule.get("apiGroups", []):
                for resource in rule.get("resources", []):
                    ops = served.get((group, resource))
                    if ops is None:
                        errors.append(f"{name}: {group or 'core'}/{resource} is not served at {path}")
                    elif not set(rule.get("operations", [])) <= ops or "*" in rule.get("operations", []):
                        errors.append(f"{name}: {resource} operations {rule.get('operations')} not all served")
        if not wh.get("rules"):
            errors.append(f"{name}: no rules")
        sel = wh.get("namespaceSelector", {})
        if sel.get("matchLabels", {}).get(OPT_IN_LABEL) != "true":
            errors.append(f"{name}: namespaceSelector must require {OPT_IN_LABEL}=true")
        excluded = set()
        for expr in sel.get("matchExpressions", []):
            if expr.get("key") == "kubernetes.io/metadata.name" and expr.get("operator") == "NotIn":
                excluded |= set(expr.get("values", []))
        if not excluded >= PROTECTED_NAMESPACES:
            errors.append(f"{name}: namespaceSelector must exclude {sorted(PROTECTED_NAMESPACES)} by name")
        conditions = wh.get("matchConditions", [])
        if not conditions:
            errors.append(f"{name}: matchConditions must send only model objects")
        text = " ".join(c.get("expression", "") for c in conditions)
        if name == LLMISVC_WEBHOOK:  # every LLMInferenceService is a model; judged only when its spec changes
            if "object.spec != oldObject.spec" not in text or wh.get("failurePolicy") != "Ignore":
                errors.append(f"{name}: advisory (Ignore), only when the spec changes")
            continue
        for label in (*MODEL_LABELS, *LLM_WORKLOAD_MARKS):
            if label.strip("'") == label:
                label = f"'{label}'"
            if label not in text:
                errors.append(f"{name}: matchConditions do not look for the model label {label}")
        workload = any(r.get("apiGroups") == ["apps"] for r in wh.get("rules", []))
        if workload and "spec.template.metadata.labels" not in text:
            errors.append(f"{name}: workloads must be matched on their pod template's labels")
        for c in conditions:
            expr = c.get("expression", "")
            if expr.count("(") != expr.count(")") or expr.count("'") % 2:
                errors.append(f"{name}: unbalanced CEL in {c.get('name')}")
        names = [c.get("name") for c in conditions]
        if len(names) != len(set(names)):
            errors.append(f"{name}: duplicate matchCondition names")
    return errors


def rule_set(rules: list[dict[str, Any]]) -> dict[tuple[str, str, tuple[str, ...]], set[str]]:
    out: dict[tuple[str, str, tuple[str, ...]], set[str]] = {}
    for rule in rules:
        for group in rule.get("apiGroups", []):
            for resource in rule.get("resources", []):
                key = (group, resource, tuple(rule.get("resourceNames", [])))
                out.setdefault(key, set()).update(rule.get("verbs", []))
    return out


def check_rbac(items: list[tuple[Path, dict[str, Any]]]) -> list[str]:
    errors: list[str] = []
    for doc in docs_of("ClusterRole", items) + docs_of("Role", items):
        meta = doc["metadata"]
        for rule in doc.get("rules", []):
            for field in ("verbs", "resources", "apiGroups"):
                if "*" in rule.get(field, []):
                    errors.append(f"{doc['kind']} {meta['name']}: wildcard in {field}")
            if "nonResourceURLs" in rule:
                errors.append(f"{doc['kind']} {meta['name']}: nonResourceURLs")
        if doc["kind"] == "ClusterRole":
            expected = OUR_CLUSTER_ROLES.get(meta["name"])
        else:
            expected = OUR_ROLES.get((meta.get("namespace"), meta["name"]))
        if expected is None:
            errors.append(f"unexpected {doc['kind']} {meta['name']}")
        elif rule_set(doc.get("rules", [])) != expected:
            errors.append(f"{doc['kind']} {meta['name']}: rules {rule_set(doc['rules'])} != {expected}")
        if doc.get("aggregationRule"):
            errors.append(f"{doc['kind']} {meta['name']}: aggregation")
    declared = set(OUR_CLUSTER_ROLES) | {n for _, n in OUR_ROLES}
    present = {d["metadata"]["name"] for d in docs_of("ClusterRole", items) + docs_of("Role", items)}
    errors += [f"missing role {n}" for n in declared - present]
    grants: dict[str, set[tuple[str, str, str | None]]] = {}
    for doc in docs_of("ClusterRoleBinding", items) + docs_of("RoleBinding", items):
        ref = doc["roleRef"]
        where = doc["metadata"].get("namespace") if doc["kind"] == "RoleBinding" else None
        for subject in doc.get("subjects", []):
            if subject.get("kind") != "ServiceAccount" or subject.get("namespace") != NAMESPACE:
                errors.append(f"{doc['kind']} {doc['metadata']['name']}: subject {subject} is not one of our SAs")
                continue
            grants.setdefault(subject["name"], set()).add((ref["kind"], ref["name"], where))
    if grants != EXPECTED_GRANTS:
        errors.append(f"grants {grants} != {EXPECTED_GRANTS}")
    return errors


def check_hardening(doc: dict[str, Any]) -> list[str]:
    errors: list[str] = []
    name = doc["metadata"]["name"]
    pod = doc["spec"]["template"]["spec"]
    psc = pod.get("securityContext", {})
    if psc.get("runAsNonRoot") is not True or not psc.get("runAsUser"):
        errors.append(f"{name}: pod must run as a non-root numeric user")
    if psc.get("seccompProfile", {}).get("type") != "RuntimeDefault":
        errors.append(f"{name}: pod seccompProfile RuntimeDefault")
    if pod.get("hostNetwork") or pod.get("hostPID") or pod.get("hostIPC"):
        errors.append(f"{name}: host namespaces")
    if "terminationGracePeriodSeconds" not in pod:
        errors.append(f"{name}: terminationGracePeriodSeconds")
    for c in containers(doc):
        sc = c.get("securityContext", {})
        where = f"{name}/{c['name']}"
        if sc.get("allowPrivilegeEscalation") is not False:
            errors.append(f"{where}: allowPrivilegeEscalation false")
        if sc.get("readOnlyRootFilesystem") is not True:
            errors.append(f"{where}: readOnlyRootFilesystem")
        if sc.get("runAsNonRoot") is not True:
            errors.append(f"{where}: runAsNonRoot")
        if sc.get("capabilities", {}).get("drop") != ["ALL"] or sc.get("capabilities", {}).get("add"):
            errors.append(f"{where}: capabilities drop ALL, add none")
        if sc.get("seccompProfile", {}).get("type") != "RuntimeDefault":
            errors.append(f"{where}: seccompProfile RuntimeDefault")
        if sc.get("privileged"):
            errors.append(f"{where}: privileged")
        res = c.get("resources", {})
        for part in ("requests", "limits"):
            if not {"cpu", "memory"} <= set(res.get(part, {})):
                errors.append(f"{where}: resources.{part} cpu and memory")
        if "readinessProbe" not in c or "livenessProbe" not in c:
            errors.append(f"{where}: readiness and liveness probes")
        if c.get("lifecycle", {}).get("preStop"):
            errors.append(f"{where}: no preStop hook (the server shuts down gracefully on SIGTERM)")
        if ":" not in c.get("image", "").rsplit("/", 1)[-1] or c["image"].endswith(":latest"):
            errors.append(f"{where}: pin the image tag")
    return errors


# ----------------------------------------------------------------------------------------------------------- tests


def test_every_yaml_document_loads() -> None:
    files = yaml_files()
    assert files, "no manifests found"
    for path in resource_files():
        docs = load_all(path)
        assert docs, f"{path}: empty"
        for doc in docs:
            assert {"apiVersion", "kind", "metadata"} <= set(doc), f"{path}: not a Kubernetes object"
            assert doc["metadata"].get("name"), f"{path}: {doc['kind']} without a name"


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_builtin_kinds_validate_strictly(version: str) -> None:
    problems, seen = [], 0
    for path, doc in resources():
        if not builtin(doc):
            continue
        seen += 1
        error = validate_strict(doc, version)
        if error:
            problems.append(f"{path.relative_to(ROOT)}: {error}")
    assert seen >= 20
    assert not problems, "\n".join(problems)


def test_only_known_custom_kinds() -> None:
    kinds = {(d["apiVersion"], d["kind"]) for _, d in resources() if not builtin(d)}
    assert kinds == CUSTOM_KINDS


def test_namespaced_objects_declare_their_namespace() -> None:
    """No namespace transformer in the kustomizations: every namespaced object names its namespace itself."""
    cluster_scoped = {
        "Namespace", "ClusterRole", "ClusterRoleBinding", "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
    }
    for path, doc in resources():
        ns = doc["metadata"].get("namespace")
        if doc["kind"] in cluster_scoped:
            assert ns is None, f"{path}: cluster-scoped {doc['kind']} with a namespace"
        elif path.is_relative_to(EXAMPLES) and doc["kind"] == "Pod":
            assert ns is None, "the example pod goes to the user's namespace (kubectl -n)"
        else:
            assert ns, f"{path}: {doc['kind']} {doc['metadata']['name']} has no namespace"
    for kfile in kustomization_files():
        assert "namespace" not in load_all(kfile)[0], f"{kfile}: a namespace transformer would move kube-system"


def test_kustomizations_list_exactly_the_files_that_exist() -> None:
    owned: dict[Path, Path] = {}
    reached_dirs: set[Path] = set()
    for kfile in kustomization_files():
        files, sources, dirs = kustomization_refs(kfile)
        for f in files | sources:
            if f.is_relative_to(CERTS.resolve()):
                continue  # TLS material written at install time, never committed
            assert f.is_file(), f"{kfile.relative_to(ROOT)} lists {f} which does not exist"
            assert f not in owned, f"{f} listed by both {owned.get(f)} and {kfile}"
            owned[f] = kfile
        for d in dirs:
            assert (d / "kustomization.yaml").is_file(), f"{kfile} lists {d}, which has no kustomization.yaml"
            reached_dirs.add(d)
    manifests = {
        p.resolve() for p in yaml_files() if p not in kustomization_files() and not p.is_relative_to(EXAMPLES)
    }
    assert manifests == set(owned), (
        f"not listed: {sorted(map(str, manifests - set(owned)))}; listed but absent: "
        f"{sorted(map(str, set(owned) - manifests))}"
    )
    assert BASE.resolve() in reached_dirs
    # Examples are applied by hand, never by a kustomization.
    assert not (EXAMPLES / "kustomization.yaml").exists()
    assert all(not owner.is_relative_to(EXAMPLES) for owner in owned)
    assert not any(f.is_relative_to(EXAMPLES.resolve()) for f in owned)


def test_default_kustomization_builds_tls_secret_and_ca_bundle_from_certs_dir() -> None:
    k = load_all(MANIFESTS / "kustomization.yaml")[0]
    assert k["resources"] == ["base"]
    (gen,) = k["secretGenerator"]
    assert gen["name"] == TLS_SECRET and gen["namespace"] == NAMESPACE
    assert {_file_entry(f) for f in gen["files"]} == {f"certs/{key}" for key in TLS_KEYS}
    assert {f.split("=", 1)[0] for f in gen["files"]} == TLS_KEYS
    assert gen["options"]["disableNameSuffixHash"] is True
    targets = {
        t["select"]["kind"]: t for r in k["replacements"] for t in r["targets"] if r["source"]["name"] == TLS_SECRET
    }
    assert set(targets) == {"MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"}
    for t in targets.values():
        assert t["fieldPaths"] == ["webhooks.*.clientConfig.caBundle"]
    gitignore = (CERTS / ".gitignore").read_text().split()
    assert "*" in gitignore, "private keys in manifests/certs must never be committed"


def test_webhook_configurations() -> None:
    items = resources()
    mutating = one("MutatingWebhookConfiguration", "model-placement", items)
    validating = one("ValidatingWebhookConfiguration", "model-placement", items)
    assert check_webhook_configuration(mutating) == []
    assert check_webhook_configuration(validating) == []
    # Pods are mutated on CREATE; pods, deployments, statefulsets and LLMInferenceServices are validated.
    assert {r for w in mutating["webhooks"] for r in w["rules"][0]["resources"]} == {"pods"}
    assert {r for w in validating["webhooks"] for rule in w["rules"] for r in rule["resources"]} == {
        "pods", "deployments", "statefulsets", "balloonspolicies", "llminferenceservices",
    }
    # The failure policies documented in docs/install.md.
    webhooks = mutating["webhooks"] + validating["webhooks"]
    policies = {w["name"]: (w["failurePolicy"], w["timeoutSeconds"]) for w in webhooks}
    assert policies == {
        "pods.mutate.model-placement.io": ("Ignore", 5),
        "pods.validate.model-placement.io": ("Fail", 5),
        "workloads.validate.model-placement.io": ("Ignore", 3),
        LLMISVC_WEBHOOK: ("Ignore", 3),
        POLICY_WEBHOOK: ("Ignore", 5),
    }
    # caBundle is never committed: kustomize or cert-manager fills it.
    for w in mutating["webhooks"] + validating["webhooks"]:
        assert "caBundle" not in w["clientConfig"]


def test_namespace_selector_can_never_match_protected_namespaces() -> None:
    items = resources()
    webhooks = (
        one("MutatingWebhookConfiguration", "model-placement", items)["webhooks"]
        + one("ValidatingWebhookConfiguration", "model-placement", items)["webhooks"]
    )
    for wh in webhooks:
        if wh["name"] == POLICY_WEBHOOK:  # BalloonsPolicies live where the plugin reads them, kube-system
            continue
        sel = wh["namespaceSelector"]
        for ns in PROTECTED_NAMESPACES:
            # Even if someone labels them.
            labels = {"kubernetes.io/metadata.name": ns, OPT_IN_LABEL: "true"}
            assert not label_selector_matches(sel, labels), f"{wh['name']} matches {ns}"
        assert label_selector_matches(sel, {"kubernetes.io/metadata.name": "llm", OPT_IN_LABEL: "true"})
        assert not label_selector_matches(sel, {"kubernetes.io/metadata.name": "llm"})
        assert not label_selector_matches(sel, {"kubernetes.io/metadata.name": "llm", OPT_IN_LABEL: "false"})
    # And our own namespace does not opt in.
    ns = one("Namespace", NAMESPACE, items)
    assert OPT_IN_LABEL not in ns["metadata"].get("labels", {})


def test_kube_scheduler_configuration() -> None:
    cfg = scheduler_config()
    assert check_scheduler_config(cfg) == []
    (ext,) = cfg["extenders"]
    # Arithmetic from docs/install.md: score * weight * 10 against the default score plugins.
    default_plugins = {"TaintToleration": 3, "NodeAffinity": 2, "NodeResourcesFit": 1, "PodTopologySpread": 2,
                       "InterPodAffinity": 2, "NodeResourcesBalancedAllocation": 1, "ImageLocality": 1}
    one_step = 1 * ext["weight"] * 10
    assert one_step > 100 * max(w for p, w in default_plugins.items() if p.startswith("NodeResources"))
    assert 10 * ext["weight"] * 10 > 100 * sum(default_plugins.values())
    install = (ROOT / "docs" / "install.md").read_text()
    assert f"weight: {ext['weight']}" in install or f"weight {ext['weight']}" in install


def test_scheduler_pod_wires_the_extender() -> None:
    items = resources()
    dep = one("Deployment", "model-placement-scheduler", items)
    cfg = scheduler_config()
    (ext,) = cfg["extenders"]
    sched = container(dep, "kube-scheduler")
    assert sched["image"].startswith("registry.k8s.io/kube-scheduler:v1.")
    config_flag = flags(sched["command"] + sched.get("args", []))["config"]
    volume, key = mount_source(dep, sched, str(config_flag))
    assert volume["configMap"]["name"] == "model-placement-scheduler-config"
    base_k = load_all(BASE / "kustomization.yaml")[0]
    (gen,) = [g for g in base_k["configMapGenerator"] if g["name"] == "model-placement-scheduler-config"]
    assert gen["files"] == [f"{key}=config/kube-scheduler.yaml"]
    # The extender sidecar listens where urlPrefix points, loopback only, in plain HTTP: the pod mounts no TLS Secret.
    assert all("secret" not in v for v in dep["spec"]["template"]["spec"]["volumes"])
    sidecar = container(dep, "extender")
    args = sidecar["args"]
    assert next(a for a in args if not a.startswith("-")) == "extender"  # global flags may come first
    f = flags(args)
    port = ext["urlPrefix"].rsplit(":", 1)[1]
    assert f["port"] == port and f["host"] == "127.0.0.1" and f["in-cluster"] is True
    volume, key = mount_source(dep, sidecar, str(f["config"]))
    assert volume["configMap"]["name"] == "model-placement-config" and key == "config.yaml"
    assert f["insecure-http"] is True and not {"tls-cert", "tls-key", "client-ca"} & set(f)
    # It answers /bind and /preempt within the httpTimeout of the very configuration kube-scheduler reads.
    source = mount_source(dep, sidecar, str(f["scheduler-config"]))
    assert source is not None and source == mount_source(dep, sched, str(config_flag))
    # Probes reach the loopback listener from inside the container.
    for probe in ("readinessProbe", "livenessProbe"):
        cmd = sidecar[probe]["exec"]["command"]
        assert cmd[:2] == ["python", "-c"] and f"http://127.0.0.1:{port}" in cmd[2]
        compile(cmd[2], probe, "exec")
    assert sidecar["readinessProbe"]["exec"]["command"][3] == "/readyz"
    assert sidecar["livenessProbe"]["exec"]["command"][3] == "/healthz"
    assert dep["spec"]["template"]["spec"]["serviceAccountName"] == "model-placement-scheduler"


def test_settings_config() -> None:
    settings = settings_config()
    assert set(settings) <= SETTINGS_KEYS, set(settings) - SETTINGS_KEYS
    assert settings["scheduler_name"] == scheduler_config()["profiles"][0]["schedulerName"] == SCHEDULER_NAME
    base_k = load_all(BASE / "kustomization.yaml")[0]
    (gen,) = [g for g in base_k["configMapGenerator"] if g["name"] == "model-placement-config"]
    assert gen["files"] == ["config.yaml=config/model-placement.yaml"]
    # Both servers read it at the documented path.
    items = resources()
    for dep_name, ctr_name in (("model-placement-webhook", "webhook"), ("model-placement-scheduler", "extender")):
        dep = one("Deployment", dep_name, items)
        c = container(dep, ctr_name)
        assert flags(c["args"])["config"] == "/etc/model-placement/config.yaml"
        volume, key = mount_source(dep, c, "/etc/model-placement/config.yaml")
        assert volume["configMap"]["name"] == "model-placement-config" and key == "config.yaml"


def test_settings_config_loads_with_the_real_settings_model() -> None:
    settings = load_settings(BASE / "config" / "model-placement.yaml", env={})
    assert settings.scheduler_name == SCHEDULER_NAME


def test_webhook_deployment_service_and_pdb() -> None:
    items = resources()
    dep = one("Deployment", "model-placement-webhook", items)
    pod = dep["spec"]["template"]["spec"]
    assert dep["spec"]["replicas"] == 3
    assert pod["serviceAccountName"] == "model-placement-webhook"
    terms = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert any(
        t["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
        and label_selector_matches(t["podAffinityTerm"]["labelSelector"], dep["spec"]["template"]["metadata"]["labels"])
        for t in terms
    )
    c = container(dep, "webhook")
    assert next(a for a in c["args"] if not a.startswith("-")) == "webhook"  # global flags may come first
    f = flags(c["args"])
    assert f["port"] == "8443" and f["in-cluster"] is True and "insecure-http" not in f
    for flag in ("tls-cert", "tls-key"):
        volume, key = mount_source(dep, c, str(f[flag]))
        assert volume["secret"]["secretName"] == TLS_SECRET and key in TLS_KEYS
    (port,) = c["ports"]
    assert port["containerPort"] == 8443
    for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
        get = c[probe]["httpGet"]
        assert (get["path"], get["scheme"], get["port"]) == (path, "HTTPS", port["name"])
    svc = one("Service", WEBHOOK_SERVICE, items)
    assert svc["metadata"]["namespace"] == NAMESPACE
    (sport,) = svc["spec"]["ports"]
    assert sport["port"] == 443 and sport["targetPort"] in (port["name"], 8443)
    pod_labels = dep["spec"]["template"]["metadata"]["labels"]
    assert label_selector_matches({"matchLabels": svc["spec"]["selector"]}, pod_labels)
    pdb = one("PodDisruptionBudget", "model-placement-webhook", items)
    assert pdb["spec"]["minAvailable"] == 1
    assert label_selector_matches(pdb["spec"]["selector"], dep["spec"]["template"]["metadata"]["labels"])
    scheduler = one("Deployment", "model-placement-scheduler", items)
    assert not label_selector_matches(pdb["spec"]["selector"], scheduler["spec"]["template"]["metadata"]["labels"])


def test_deployments_are_hardened() -> None:
    deployments = docs_of("Deployment")
    assert {d["metadata"]["name"] for d in deployments} == {"model-placement-webhook", "model-placement-scheduler"}
    for dep in deployments:
        assert check_hardening(dep) == []
        # The image runs as 65532 (Dockerfile USER); the pod says so too.
        assert dep["spec"]["template"]["spec"]["securityContext"]["runAsUser"] == 65532


def test_volumes_refer_to_objects_that_exist() -> None:
    items = resources()
    generated = {g["name"] for k in kustomization_files() for g in load_all(k)[0].get("configMapGenerator", [])}
    secrets = {g["name"] for k in kustomization_files() for g in load_all(k)[0].get("secretGenerator", [])}
    secrets |= {c["spec"]["secretName"] for c in docs_of("Certificate", items)}
    for dep in docs_of("Deployment", items):
        for vol in dep["spec"]["template"]["spec"].get("volumes", []):
            if "configMap" in vol:
                assert vol["configMap"]["name"] in generated
            if "secret" in vol:
                assert vol["secret"]["secretName"] in secrets
        mounted = {m["name"] for c in containers(dep) for m in c.get("volumeMounts", [])}
        assert mounted == {v["name"] for v in dep["spec"]["template"]["spec"]["volumes"]}


def test_rbac_is_exactly_least_privilege() -> None:
    assert check_rbac(resources()) == []


def test_balloons_policy_example() -> None:
    (doc,) = load_all(EXAMPLES / "balloonspolicy.yaml")
    assert check_balloons_policy(doc) == []
    assert (doc["metadata"]["name"], doc["metadata"]["namespace"]) == ("default", "kube-system")
    # It is what `balloons-policy` writes for the shape it names (a 2-socket node of 2 x 32 cores x 2 threads).
    from placement.balloons import node_balloons_policy
    from placement.config import Settings
    from placement.topology import linux_layout

    generated = node_balloons_policy("x", linux_layout([32, 32], 2, "labels"), Settings(), "kube-system")
    assert doc["spec"] == generated["spec"]
    types = {b["name"]: b for b in doc["spec"]["balloonTypes"]}
    two_numa = {t for t in BALLOON_TYPES_SERVED if int(t.rsplit("tp", 1)[1]) <= 2}
    assert two_numa <= set(types)
    for name in two_numa:
        assert types[name]["hideHyperthreads"] is True and types[name]["preferNewBalloons"] is True
    prefix = settings_config().get("nri_balloon_prefix", "vllm-balloon-tp")
    assert all(t.startswith(prefix) for t in BALLOON_TYPES_SERVED)


def test_example_model_pod_is_a_model_pod() -> None:
    (pod,) = load_all(EXAMPLES / "model-pod.yaml")
    assert validate_strict(pod, LATEST_K8S) is None
    assert set(MODEL_LABELS) & set(pod["metadata"]["labels"])
    assert next(c["name"] for c in pod["spec"]["containers"]) == "main"
    assert "schedulerName" not in pod["spec"], "the webhook sets it"


def test_cert_manager_overlay() -> None:
    k = load_all(OVERLAY / "kustomization.yaml")[0]
    assert "../../base" in k["resources"]
    assert "secretGenerator" not in k and "replacements" not in k
    docs = [d for d in load_all(OVERLAY / "certificates.yaml")]
    issuers = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Issuer"}
    certs = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Certificate"}
    assert all(d["metadata"]["namespace"] == NAMESPACE for d in docs)
    # self-signed Issuer -> CA Certificate -> CA Issuer -> serving Certificate
    (selfsigned,) = [i for i in issuers.values() if "selfSigned" in i["spec"]]
    (ca_cert,) = [c for c in certs.values() if c["spec"].get("isCA")]
    assert ca_cert["spec"]["issuerRef"]["name"] == selfsigned["metadata"]["name"]
    (ca_issuer,) = [i for i in issuers.values() if "ca" in i["spec"]]
    assert ca_issuer["spec"]["ca"]["secretName"] == ca_cert["spec"]["secretName"]
    (serving,) = [c for c in certs.values() if not c["spec"].get("isCA")]
    assert serving["spec"]["issuerRef"]["name"] == ca_issuer["metadata"]["name"]
    assert serving["spec"]["secretName"] == TLS_SECRET
    svc = f"{WEBHOOK_SERVICE}.{NAMESPACE}.svc"
    assert svc in serving["spec"]["dnsNames"]
    assert {"server auth", "client auth"} <= set(serving["spec"]["usages"])
    for cert in certs.values():
        assert set(cert["spec"]) <= {
            "secretName", "commonName", "dnsNames", "duration", "renewBefore", "isCA", "usages", "privateKey",
            "issuerRef", "ipAddresses", "subject", "secretTemplate",
        }
        assert set(cert["spec"]["issuerRef"]) <= {"name", "kind", "group"}
        assert set(cert["spec"].get("privateKey", {})) <= {"algorithm", "size", "encoding", "rotationPolicy"}
    # Both webhook configurations get the CA injected from the serving Certificate.
    patched = {}
    for p in k["patches"]:
        doc = yaml.safe_load(p["patch"])
        patched[doc["kind"]] = doc["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
    expected = f"{NAMESPACE}/{serving['metadata']['name']}"
    assert patched == {"MutatingWebhookConfiguration": expected, "ValidatingWebhookConfiguration": expected}


def test_images_are_overridable_in_both_entry_points() -> None:
    for kfile in (MANIFESTS / "kustomization.yaml", OVERLAY / "kustomization.yaml"):
        names = {i["name"] for i in load_all(kfile)[0].get("images", [])}
        assert "model-placement" in names, kfile
    ours = {c["image"] for d in docs_of("Deployment") for c in containers(d) if "kube-scheduler" not in c["image"]}
    assert {i.split(":")[0] for i in ours} == {"model-placement"}


# ------------------------------------------------------------------------------------------------ kustomize builds

def _kustomize(path: Path) -> list[dict[str, Any]]:
    # The kubectl of the kube peer (the release tests/e2e runs), not whatever is on PATH: its built-in kustomize is
    # the one the manifests are checked with, and it is there on every machine that runs the tests.
    out = subprocess.run(
        [str(build("kube")), "kubectl", "kustomize", str(path)], check=True, capture_output=True, text=True,
        timeout=120,
    ).stdout
    return [d for d in yaml.safe_load_all(out) if d is not None]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    work = tmp_path_factory.mktemp("kustomize") / "manifests"
    shutil.copytree(MANIFESTS, work, ignore=shutil.ignore_patterns("tls.crt", "tls.key", "ca.crt"))
    pem = b"-----BEGIN CERTIFICATE-----\nMIIBdummy\n-----END CERTIFICATE-----\n"
    for name in TLS_KEYS:
        (work / "certs" / name).write_bytes(pem.replace(b"dummy", name.encode().replace(b".", b"")))
    return {
        "default": _kustomize(work),
        "base": _kustomize(work / "base"),
        "cert-manager": _kustomize(work / "overlays" / "cert-manager"),
        "ca.crt": [{"pem": (work / "certs" / "ca.crt").read_bytes()}],
    }


@pytest.mark.parametrize("variant", ["default", "base", "cert-manager"])
def test_kustomize_output_validates_strictly(built: dict[str, list[dict[str, Any]]], variant: str) -> None:
    docs = built[variant]
    problems = [e for d in docs if builtin(d) for e in [validate_strict(d, LATEST_K8S)] if e]
    assert not problems, "\n".join(problems)
    items = [(Path(variant), d) for d in docs]
    assert check_rbac(items) == []
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        assert check_webhook_configuration(one(kind, "model-placement", items)) == []
    # Generated ConfigMap names (hash suffixed) are what the Deployments mount.
    configmaps = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ConfigMap"}
    for dep in docs_of("Deployment", items):
        for vol in dep["spec"]["template"]["spec"]["volumes"]:
            if "configMap" in vol:
                assert vol["configMap"]["name"] in configmaps
    (sched_cm,) = [cm for cm in configmaps.values() if "kube-scheduler.yaml" in cm.get("data", {})]
    assert check_scheduler_config(yaml.safe_load(sched_cm["data"]["kube-scheduler.yaml"])) == []
    kinds = [d["kind"] for d in docs]
    assert kinds[0] == "Namespace", "the namespace must be created first"


def test_kustomize_default_fills_ca_bundle(built: dict[str, list[dict[str, Any]]]) -> None:
    docs = built["default"]
    items = [(Path("default"), d) for d in docs]
    secret = one("Secret", TLS_SECRET, items)
    assert secret["type"] == "kubernetes.io/tls" and set(secret["data"]) == TLS_KEYS
    ca_pem = built["ca.crt"][0]["pem"]
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        for wh in one(kind, "model-placement", items)["webhooks"]:
            assert base64.b64decode(wh["clientConfig"]["caBundle"]) == ca_pem, wh["name"]


def test_kustomize_cert_manager_injects_ca(built: dict[str, list[dict[str, Any]]]) -> None:
    docs = built["cert-manager"]
    items = [(Path("cert-manager"), d) for d in docs]
    assert not [d for d in docs if d["kind"] == "Secret"], "cert-manager creates the TLS Secret"
    certificates = {f"{d['metadata']['namespace']}/{d['metadata']['name']}" for d in docs if d["kind"] == "Certificate"}
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        doc = one(kind, "model-placement", items)
        assert doc["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] in certificates
        # No caBundle in the applied object, or every `kubectl apply` would overwrite the injected one.
        assert all("caBundle" not in wh["clientConfig"] for wh in doc["webhooks"])


# --------------------------------------------------------------------------------------------- Dockerfile & ignore


def test_dockerfile() -> None:
    text = (ROOT / "Dockerfile").read_text()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("#")]
    stages = [ln.split()[1:] for ln in lines if ln.upper().startswith("FROM ")]
    assert len(stages) >= 2, "multi-stage build"
    # One base for every stage, so the virtualenv's interpreter path stays valid (tests/image builds it on a stand-in).
    assert {stage[0] for stage in stages} == {"${PYTHON_IMAGE}"}
    final = text[text.rindex("\nFROM "):]
    assert "COPY --from=builder /opt/venv /opt/venv" in final
    assert not re.search(r"apt-get|apk |gcc|build-essential|pip install", final), "no build tools in the final stage"
    (user,) = re.findall(r"^USER (\S+)$", final, re.M)
    uid = user.split(":")[0]
    assert uid.isdigit() and int(uid) != 0, "non-root numeric user"
    assert 'ENTRYPOINT ["model-placement"]' in final
    # Every package the distribution contains is copied into the build context.
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    for pattern in project["tool"]["setuptools"]["packages"]["find"]["include"]:
        package = pattern.rstrip("*")
        assert f"COPY {package} ./{package}" in text, package
        assert f"!{package}/" in (ROOT / ".dockerignore").read_text()


def test_dockerignore_is_an_allow_list() -> None:
    lines = [ln.strip() for ln in (ROOT / ".dockerignore").read_text().splitlines()]
    rules = [ln for ln in lines if ln and not ln.startswith("#")]
    assert rules[0] == "*", "start by excluding everything (keeps keys in manifests/certs out of the context)"
    assert not any(r.startswith("!manifests") or r.startswith("!tests") or r == "!." for r in rules)


# ------------------------------------------------------------------------------- the checkers can fail (mutations)


def test_strict_schema_validation_rejects_unknown_fields() -> None:
    dep = copy.deepcopy(one("Deployment", "model-placement-webhook"))
    assert validate_strict(dep, LATEST_K8S) is None
    dep["spec"]["template"]["spec"]["containers"][0]["securityContext"]["readOnlyRootFS"] = True
    assert validate_strict(dep, LATEST_K8S)
    wh = copy.deepcopy(one("MutatingWebhookConfiguration", "model-placement"))
    wh["webhooks"][0]["timeoutSeconds"] = "5s"
    assert validate_strict(wh, LATEST_K8S)


def test_checkers_reject_broken_inputs() -> None:
    cfg = copy.deepcopy(scheduler_config())
    cfg["extenders"][0]["enableHttps"] = cfg["extenders"][0].pop("enableHTTPS")
    assert any("enableHttps" in e for e in check_scheduler_config(cfg))
    cfg = copy.deepcopy(scheduler_config())
    cfg["extenders"][0]["tlsConfig"] = {"caFiles": "x"}
    cfg["extenders"][0]["ignorable"] = True
    cfg["extenders"][0]["httpTimeout"] = 5
    assert len(check_scheduler_config(cfg)) == 4

    (policy,) = load_all(EXAMPLES / "balloonspolicy.yaml")
    bad = copy.deepcopy(policy)
    bad["spec"]["balloonTypes"][1]["hideHyperThreads"] = True
    bad["spec"]["reservedCPUs"] = 4
    assert len(check_balloons_policy(bad)) == 2

    mwc = copy.deepcopy(one("MutatingWebhookConfiguration", "model-placement"))
    mwc["webhooks"][0]["namespaceSelector"]["matchExpressions"][0]["values"] = ["kube-system"]
    mwc["webhooks"][0]["rules"][0]["resources"] = ["pods", "services"]
    mwc["webhooks"][0]["reinvocationPolicy"] = "Never"
    mwc["webhooks"][0]["timeoutSeconds"] = 31
    assert len(check_webhook_configuration(mwc)) == 4

    items = resources()
    for i, (path, doc) in enumerate(items):
        if doc["kind"] == "ClusterRole" and doc["metadata"]["name"] == "model-placement:cluster-state-reader":
            doc = copy.deepcopy(doc)
            doc["rules"][0]["verbs"].append("delete")
            items[i] = (path, doc)
    assert check_rbac(items)

    dep = copy.deepcopy(one("Deployment", "model-placement-scheduler"))
    dep["spec"]["template"]["spec"]["containers"][1]["securityContext"]["allowPrivilegeEscalation"] = True
    del dep["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert len(check_hardening(dep)) == 2
