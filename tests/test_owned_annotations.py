"""What model-placement owns on a pod (issue 42): the install's ValidatingAdmissionPolicies against what the ledger
really reads.

Every annotation whose change changes what the ledger holds for a running pod (a model pod bound by our /bind, and
a pod that is no model pod but carries the plugin's balloon annotation) must be one the policy refuses to change;
the policy's own model-pod test is the webhooks'; its exemption is our scheduler's ServiceAccount. The policies are
run by the real API server in tests/e2e/test_owned.py."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import yaml

from placement import demand as demandmod
from placement.assume import AssumeCache
from placement.balloons import NUMA_TYPE
from placement.cluster import ClusterState
from placement.config import Settings
from placement.demand import BALLOON_KEY, BALLOON_POD, BALLOON_PREFIX, read_model_pod
from placement.ledger import PLACEMENT, Placed
from placement.mutation import mutate_pod
from server.sources import demo_text, load_objects

ROOT = Path(__file__).resolve().parent.parent
BASE = ROOT / "manifests" / "base"
NODE = "cpu-a2"  # the demo's 2 × 32-core node under the generated policy
OWNED_POLICY = "model-placement-owned-annotations"
TYPES_POLICY = "model-placement-model-balloon-types"

Obj = dict[str, Any]


def documents(name: str) -> list[Obj]:
    return [d for d in yaml.safe_load_all((BASE / name).read_text()) if d]


def policy(name: str) -> Obj:
    return next(d for d in documents("admissionpolicy.yaml")
                if d["kind"] == "ValidatingAdmissionPolicy" and d["metadata"]["name"] == name)


def variable(pol: Obj, name: str) -> str:
    return " ".join(next(v["expression"] for v in pol["spec"]["variables"] if v["name"] == name).split())


def owned() -> tuple[set[str], str]:
    """The annotation names the policy refuses to change, and the prefix of the plugin's keys it refuses too."""
    pol = policy(OWNED_POLICY)
    names = set()
    for group in ("placement", "outputs", "inputs"):
        names |= set(re.findall(r"'([^']+)'", variable(pol, group)))
    (prefix,) = set(re.findall(r"k\.startsWith\('([^']+)'\)", variable(pol, "balloons")))
    return names, prefix


def is_owned(key: str) -> bool:
    names, prefix = owned()
    return key in names or key == prefix.rstrip("/") or key.startswith(prefix)


# -- what the ledger reads -------------------------------------------------------------------------------------------

def resources(cpu: str) -> Obj:
    return {"requests": {"cpu": cpu, "memory": "8Gi"}, "limits": {"cpu": cpu, "memory": "8Gi"}}


def running(cluster: ClusterState) -> tuple[Obj, Obj]:
    """A model pod with a sidecar, mutated and bound by our /bind (its placement persisted), and a pod that is no
    model pod with one container annotated to a model balloon type, both running on NODE."""
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "m", "namespace": "llm", "uid": "uid-m", "labels": {"model-manager.io/model": "m"},
                        "annotations": {"example.com/owner": "team-a"}},
           "spec": {"containers": [
               {"name": "vllm", "args": ["--tensor-parallel-size", "1"], "resources": resources("8")},
               {"name": "agent", "resources": resources("2")}]}}
    pod = mutate_pod(pod, cluster).pod
    demand = read_model_pod(pod, cluster.settings)
    assert AssumeCache(cluster).assume("uid-m", "llm", "m", demand, NODE).ok
    text = AssumeCache(cluster).placement("uid-m")
    assert text is not None
    pod["metadata"]["annotations"][PLACEMENT] = text
    pod["spec"]["nodeName"], pod["status"] = NODE, {"phase": "Running"}
    cluster.apply("Pod", "ADDED", pod)
    other = {"apiVersion": "v1", "kind": "Pod",
             "metadata": {"name": "squatter", "namespace": "tenant", "uid": "uid-s",
                          "annotations": {BALLOON_PREFIX + "agent": "vllm-balloon-tp1"}},
             "spec": {"nodeName": NODE, "containers": [{"name": "agent", "resources": resources("8")},
                                                       {"name": "log", "resources": resources("1")}]},
             "status": {"phase": "Running"}}
    cluster.apply("Pod", "ADDED", other)
    return pod, other


def view(cluster: ClusterState) -> Any:
    ledger = cluster.ledger(NODE)
    assert ledger is not None
    return (ledger.to_json(), ledger.instance_key, sorted(
        (h.uid, h.balloon_type, h.per_numa, h.types, h.memory, h.unknown) for h in ledger.holdings.values()),
            sorted(ledger.shared.items()))


def keys() -> set[str]:
    """Every annotation model-placement or the balloons plugin names, and one of nobody's."""
    names = {v for k, v in vars(demandmod).items() if k.isupper() and isinstance(v, str)
             and "model-manager.io/" in v}
    return names | {PLACEMENT, BALLOON_KEY, BALLOON_POD, "example.com/owner"} | {
        BALLOON_PREFIX + c for c in ("vllm", "agent", "log")}


VALUES = ("2", "4", "kubelet-static", "best-effort", "vllm-balloon-tp2", "vllm-balloon-tp1", "default", "agent", "log",
          "false", "cpu-a1", "8", Placed(NODE, ((1, 8),), ("vllm-balloon-tp1", "vllm-numa-1")).annotation())


def test_every_annotation_whose_change_moves_a_running_pods_cores_is_one_the_policy_refuses_to_change() -> None:
    demo = load_objects(demo_text())
    pods = running(ClusterState.from_objects(demo, Settings()))

    def rebuilt(*changed: Obj) -> Any:  # a ledger from a list: what a relist, restart or standby extender reads
        by_uid = {p["metadata"]["uid"]: p for p in (*pods, *changed)}
        return view(ClusterState.from_objects([*demo, *by_uid.values()], Settings()))

    before = rebuilt()
    moves: set[str] = set()
    for pod in pods:
        for key in sorted(keys()):
            for value in (None, *VALUES):
                changed = copy.deepcopy(pod)
                annotations = changed["metadata"].setdefault("annotations", {})
                if annotations.get(key) == value or (value is None and key not in annotations):
                    continue
                if value is None:
                    del annotations[key]
                else:
                    annotations[key] = value
                if rebuilt(changed) != before:
                    moves.add(key)
    # The probe is not idle: these do move cores (a placement, our resolved policy and TP, the user's rank counts
    # and model container, the plugin's routing, of the model pod and of the other one).
    assert moves >= {PLACEMENT, demandmod.OUT_TYPE, demandmod.OUT_TP, demandmod.ANN_TP, demandmod.ANN_PP,
                     demandmod.ANN_DP, demandmod.ANN_CONTAINER, BALLOON_PREFIX + "vllm", BALLOON_PREFIX + "agent",
                     BALLOON_POD, BALLOON_KEY}, moves
    assert {k for k in moves if not is_owned(k)} == set(), moves
    assert not is_owned("example.com/owner") and not is_owned(demandmod.OUT_CPUS)


# -- the policies' own terms ------------------------------------------------------------------------------------------

def test_the_policy_exempts_exactly_our_schedulers_service_account() -> None:
    deployment = next(d for d in documents("scheduler-deployment.yaml") if d["kind"] == "Deployment")
    account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
    namespace = deployment["metadata"]["namespace"]
    (condition,) = [c for c in policy(OWNED_POLICY)["spec"]["matchConditions"] if "userInfo" in c["expression"]]
    assert condition["expression"] == f"request.userInfo.username != 'system:serviceaccount:{namespace}:{account}'"
    # The extender's Binding and status writes are what it exempts: both are matched, and so is every pod update.
    (rule,) = policy(OWNED_POLICY)["spec"]["matchConstraints"]["resourceRules"]
    assert set(rule["resources"]) == {"pods", "pods/status", "pods/binding"}
    assert set(rule["operations"]) == {"CREATE", "UPDATE"}
    assert not any("userInfo" in c["expression"] for c in policy(TYPES_POLICY)["spec"]["matchConditions"])


def test_the_policies_deny_and_fail_closed() -> None:
    bindings = {d["spec"]["policyName"]: d for d in documents("admissionpolicy.yaml")
                if d["kind"] == "ValidatingAdmissionPolicyBinding"}
    assert set(bindings) == {OWNED_POLICY, TYPES_POLICY}
    for name, binding in bindings.items():
        assert binding["spec"]["validationActions"] == ["Deny"]
        assert policy(name)["spec"]["failurePolicy"] == "Fail"
    # The one way to widen the model balloon types by namespace, as docs/install.md tells it.
    (expr,) = bindings[TYPES_POLICY]["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"]
    assert expr == {"key": "model-placement.io/model-balloon-types", "operator": "NotIn", "values": ["any-pod"]}
    assert "model-placement.io/model-balloon-types=any-pod" in (ROOT / "docs" / "install.md").read_text()
    assert "admissionpolicy.yaml" in yaml.safe_load((BASE / "kustomization.yaml").read_text())["resources"]


def test_a_model_pod_is_what_the_webhooks_send_us() -> None:
    """The policy's model pod is the mutating webhook's (matchConditions) on the same object, and on the old one."""
    webhook = next(d for d in documents("mutatingwebhookconfiguration.yaml"))["webhooks"][0]
    (cond,) = [c for c in webhook["matchConditions"] if c["name"] == "model-pod"]
    expected = " ".join(cond["expression"].split())
    pol = policy(TYPES_POLICY)
    assert variable(pol, "modelPod") == expected
    assert variable(pol, "wasModelPod") == "request.operation == 'UPDATE' && " + expected.replace("object.",
                                                                                                    "oldObject.")
    # The namespace is one the webhooks serve: opted in, never a protected one.
    selector = webhook["namespaceSelector"]
    (label, value), = selector["matchLabels"].items()
    assert f"'{label}' in namespaceObject.metadata.labels" in variable(pol, "optedIn")
    assert f"namespaceObject.metadata.labels['{label}'] == '{value}'" in variable(pol, "optedIn")
    (names,) = [e["values"] for e in selector["matchExpressions"] if e["key"] == "kubernetes.io/metadata.name"]
    assert f"!(request.namespace in {names!r})".replace('"', "'") in variable(pol, "optedIn")


def test_the_model_balloon_types_are_the_ones_model_placement_generates() -> None:
    prefixes = set(re.findall(r"'([^']+)'", variable(policy(TYPES_POLICY), "modelBalloonTypes")))
    assert prefixes == {Settings().nri_balloon_prefix, NUMA_TYPE}
