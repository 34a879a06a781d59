"""POST /mutate over TLS, as kube-apiserver calls it and reads the answer: real-format AdmissionReviews
(ReplicaSet/KServe with generateName, `kubectl run`, two nodeSelectorTerms, init + sidecar containers,
pre-1.24 without metadata.namespace), every response checked the way `VerifyAdmissionResponse` does
(uid, apiVersion/kind, patch only with patchType), the base64 patch applied with `jsonpatch`, and the
resulting pod asserted: annotations, Guaranteed QoS by the kubelet's own rules, node affinity.
Reinvocation, a property test (the patch always applies; twice equals once), bad input, the deadline."""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import aiohttp
import jsonpatch
import pytest
from hypothesis import HealthCheck, assume, event, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from prometheus_client import REGISTRY

from placement.cluster import ClusterState
from placement.config import Settings
from placement.ledger import PLACEMENT
from placement.quantity import cpu_milli, memory_bytes
from server.app import Runtime
from server.sources import demo_text, load_objects
from tests.support.payloads import fixture_json
from tests.support.servers import serving
from tests.support.webhook import (
    AMX,
    BALLOON,
    CPUS,
    NUMA,
    REASON,
    REQUESTED,
    TP,
    TYPE,
    Answer,
    MakeWebhook,
    Obj,
    Webhook,
    decisions,
    objects_without,
    pod_review,
    review,
)
from webhook.patch import PatchError, apply_patch, escape, make_patch
from webhook.review import parse_timeout
from webhook.routes import TIMINGS, fits_every_replica

# The demo fleet mixes SMT widths (cpu-nosmt has SMT off): a doubled request is kept on nodes of SMT width 2.
SMT2 = {"key": "feature.node.kubernetes.io/cpu-hardware_multithreading", "operator": "NotIn", "values": ["false"]}
# Where the contract lets the webhook write: the only paths its patches may touch.
WRITABLE = ("/metadata/annotations", "/spec/affinity", "/spec/schedulerName", "/spec/containers/",
            "/spec/initContainers/")


# ------------------------------------------------------------------------------------- the apiserver side


















# ------------------------------------------------------------------------------------- the kubelet side


def qos_class(pod: Obj) -> str:
    """kubelet's GetPodQOS (pkg/apis/core/v1/helper/qos/qos.go) over containers AND init containers, after
    the apiserver's defaulting (a request missing where a limit is set takes the limit)."""
    requests: dict[str, int] = {}
    limits: dict[str, int] = {}
    guaranteed = True
    spec = pod["spec"]
    for c in [*spec.get("containers", []), *spec.get("initContainers", [])]:
        res = c.get("resources") or {}
        req = dict(res.get("requests") or {})
        lim = res.get("limits") or {}
        for name, value in lim.items():
            req.setdefault(name, value)
        for name, value in req.items():
            if name in ("cpu", "memory"):
                amount = cpu_milli(value) if name == "cpu" else memory_bytes(value)
                if amount > 0:
                    requests[name] = requests.get(name, 0) + amount
        found = set()
        for name, value in lim.items():
            if name in ("cpu", "memory"):
                amount = cpu_milli(value) if name == "cpu" else memory_bytes(value)
                if amount > 0:
                    found.add(name)
                    limits[name] = limits.get(name, 0) + amount
        if found != {"cpu", "memory"}:
            guaranteed = False
    if not requests and not limits:
        return "BestEffort"
    if guaranteed and requests == limits:
        return "Guaranteed"
    return "Burstable"


def container(pod: Obj, name: str) -> Obj:
    spec = pod["spec"]
    return next(c for c in [*spec.get("containers", []), *spec.get("initContainers", [])] if c["name"] == name)


def cpu_of(pod: Obj, name: str) -> tuple[str, str]:
    res = container(pod, name)["resources"]
    return res["requests"]["cpu"], res["limits"]["cpu"]


def terms(pod: Obj) -> list[Obj]:
    required = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    return required["nodeSelectorTerms"]  # type: ignore[no-any-return]


def assert_only_contract_paths(ops: list[Obj]) -> None:
    for op in ops:
        assert op["path"] == "/metadata/annotations" or op["path"].startswith(WRITABLE), op
        if op["path"].startswith(("/spec/containers/", "/spec/initContainers/")):
            assert "/resources" in op["path"], op
        assert op["op"] in ("add", "replace"), op


async def assert_reinvocation_is_empty(wh: Webhook, pod: Obj, namespace: str = "llm") -> None:
    again = await wh.mutate(pod_review(pod, "reinvocation-" + str(id(pod)), namespace))
    assert again.allowed and again.ops == [] and "patch" not in again.response and not again.warnings


# ------------------------------------------------------------------------------------- issue 3: the pods


async def test_replicaset_created_kserve_pod_with_generate_name_is_pinned(wh: Webhook) -> None:
    sent = review("ar-pod-kserve-rs.json")
    assert "name" not in sent["request"] and "name" not in sent["request"]["object"]["metadata"]
    answer = await wh.mutate(sent)
    assert answer.allowed and not answer.warnings
    assert_only_contract_paths(answer.ops)
    pod = answer.pod
    ann = pod["metadata"]["annotations"]
    assert ann[TYPE] == "nri-balloons" and REASON not in ann
    assert ann[TP] == "1"
    assert ann[BALLOON + "kserve-container"] == "vllm-balloon-tp1"
    # cpu: 16 in a balloon that hides hyperthreads means 16 cores for 16 threads: the plugin gives a balloon
    # ceil(request) logical CPUs, so the request becomes 32, and the user's figure is kept.
    assert ann[CPUS] == "32" and ann[REQUESTED] == "16"
    model = pod["spec"]["containers"][0]
    assert model["resources"]["requests"]["cpu"] == "32" and model["resources"]["limits"]["cpu"] == "32"
    # Existing annotations stay, including one whose key has a slash.
    assert ann["sidecar.istio.io/inject"] == "false" and ann["serving.kserve.io/deploymentMode"] == "RawDeployment"
    assert terms(pod) == [{"matchExpressions": [AMX, SMT2]}]
    # Nothing we do not own changed: no name, same generateName, namespace, labels, and containers but for the
    # model container's CPU.
    original = sent["request"]["object"]
    assert "name" not in pod["metadata"] and pod["metadata"]["generateName"] == original["metadata"]["generateName"]
    assert pod["metadata"]["labels"] == original["metadata"]["labels"]
    unchanged = copy.deepcopy(original["spec"]["containers"])
    unchanged[0]["resources"]["requests"]["cpu"] = unchanged[0]["resources"]["limits"]["cpu"] = "32"
    assert pod["spec"]["containers"] == unchanged
    paths = {op["path"] for op in answer.ops}
    assert "/metadata/annotations/cpu-policy.model-manager.io~1type" in paths
    assert "/metadata/annotations/balloon.balloons.resource-policy.nri.io~1container.kserve-container" in paths
    await assert_reinvocation_is_empty(wh, pod)


async def test_bare_kubectl_run_pod_without_annotations_gets_the_map_created(wh: Webhook) -> None:
    sent = review("ar-pod-kubectl-run.json")
    assert "annotations" not in sent["request"]["object"]["metadata"]
    answer = await wh.mutate(sent)
    # The parent map is added whole: an `add` below a missing /metadata/annotations would fail to apply.
    (ann_op,) = [op for op in answer.ops if op["path"].startswith("/metadata/annotations")]
    assert ann_op["op"] == "add" and ann_op["path"] == "/metadata/annotations"
    pod = answer.pod
    # The container is named after the pod: the first container is the model container.
    assert pod["metadata"]["annotations"] == {
        TYPE: "nri-balloons", TP: "1", NUMA: "1", BALLOON + "llama3": "vllm-balloon-tp1", CPUS: "16", REQUESTED: "8"}
    assert pod["metadata"]["labels"] == {"model-manager.io/model": "llama3"}
    await assert_reinvocation_is_empty(wh, pod)


async def test_amx_requirement_lands_in_every_node_selector_term(wh: Webhook) -> None:
    sent = review("ar-pod-two-terms.json")
    answer = await wh.mutate(sent)
    pod = answer.pod
    first, second = terms(pod)
    assert first["matchExpressions"] == [{"key": "node-role.kubernetes.io/cpu-inference", "operator": "Exists"}, AMX,
                                         SMT2]
    assert second["matchExpressions"] == [
        {"key": "kubernetes.io/hostname", "operator": "In", "values": ["cpu-snc4"]}, AMX, SMT2]
    # Preferred terms are not requirements: left as they were.
    assert pod["spec"]["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"] == \
        sent["request"]["object"]["spec"]["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    # The user's expressions are kept in place: only appended to, never replaced.
    assert {op["op"] for op in answer.ops if "/affinity/" in op["path"]} == {"add"}
    ann = pod["metadata"]["annotations"]
    assert (ann[TP], ann[BALLOON + "main"], ann[CPUS]) == ("2", "vllm-balloon-tp2", "32")
    await assert_reinvocation_is_empty(wh, pod)


@pytest.mark.parametrize("how", ["annotation", "settings"])
async def test_init_and_sidecar_containers_make_a_guaranteed_pod_under_kubelet_static(
        make_webhook: MakeWebhook, how: str) -> None:
    sent = review("ar-pod-init-sidecar.json")
    if how == "settings":
        del sent["request"]["object"]["metadata"]["annotations"]["model-manager.io/cpu-policy"]
        wh = await make_webhook(settings=Settings(kubernetes_cpu_policy="kubelet-static"))
    else:
        wh = await make_webhook()
    assert qos_class(sent["request"]["object"]) == "Burstable"
    answer = await wh.mutate(sent)
    assert_only_contract_paths(answer.ops)
    pod = answer.pod
    assert qos_class(pod) == "Guaranteed"
    for c in [*pod["spec"]["containers"], *pod["spec"]["initContainers"]]:
        res = c["resources"]
        assert res["requests"] == res["limits"], c["name"]
    assert cpu_of(pod, "main") == ("16", "16")  # 15 rounded up to whole cores of 2 threads
    assert cpu_of(pod, "fetch-weights") == ("2", "2")  # whole numbers mean exclusive cores: rounded too
    assert cpu_of(pod, "log-shipper") == ("2", "2")  # the restartable sidecar is an init container
    assert cpu_of(pod, "metrics") == ("250m", "250m")  # fractional: stays in the shared pool
    assert container(pod, "main")["resources"]["limits"]["memory"] == "64Gi"
    assert container(pod, "log-shipper")["restartPolicy"] == "Always"
    ann = pod["metadata"]["annotations"]
    assert ann[TYPE] == "kubelet-static" and ann[CPUS] == "16" and REASON not in ann
    assert not any(k.startswith(BALLOON) for k in ann)
    await assert_reinvocation_is_empty(wh, pod)


async def test_kubelet_static_without_smt_keeps_odd_counts(make_webhook: MakeWebhook) -> None:
    wh = await make_webhook(settings=Settings(kubernetes_cpu_policy="kubelet-static", mm_kubelet_threads_per_core=1))
    pod = (await wh.mutate(review("ar-pod-init-sidecar.json"))).pod
    assert (cpu_of(pod, "main"), cpu_of(pod, "fetch-weights")) == (("15", "15"), ("1", "1"))
    assert qos_class(pod) == "Guaranteed"


async def test_sidecar_injected_between_rounds_is_made_guaranteed_on_reinvocation(wh: Webhook) -> None:
    first = (await wh.mutate(review("ar-pod-init-sidecar.json"))).pod
    assert qos_class(first) == "Guaranteed"
    # Another mutating webhook (a service mesh) appends its proxy after our first call.
    first["spec"]["containers"].append({
        "name": "istio-proxy", "image": "istio/proxyv2:1.24.0",
        "resources": {"requests": {"cpu": "1", "memory": "128Mi"}, "limits": {"memory": "1Gi"}}})
    assert qos_class(first) == "Burstable"
    second = await wh.mutate(pod_review(first, "round-1"))
    assert second.ops and all(op["path"].startswith("/spec/containers/2/resources") for op in second.ops)
    pod = second.pod
    assert qos_class(pod) == "Guaranteed"
    assert cpu_of(pod, "istio-proxy") == ("2", "2")
    await assert_reinvocation_is_empty(wh, pod)


async def test_nri_type_missing_from_every_balloons_policy_falls_back_to_best_effort(
        make_webhook: MakeWebhook, demo_objects: list[Obj]) -> None:
    wh = await make_webhook(objects_without(demo_objects, "BalloonsPolicy"))
    pod = (await wh.mutate(review("ar-pod-kserve-rs.json"))).pod
    ann = pod["metadata"]["annotations"]
    assert (ann[TYPE], ann[REASON], ann[TP], ann[CPUS]) == ("best-effort", "nri-resolution-failed", "1", "16")
    assert not any(k.startswith(BALLOON) for k in ann)
    assert terms(pod) == [{"matchExpressions": [AMX]}]  # still wants AMX nodes
    await assert_reinvocation_is_empty(wh, pod)


async def test_nri_disabled_is_best_effort_with_its_reason(make_webhook: MakeWebhook) -> None:
    wh = await make_webhook(settings=Settings(nri_enabled=False))
    pod = (await wh.mutate(review("ar-pod-kserve-rs.json"))).pod
    ann = pod["metadata"]["annotations"]
    assert (ann[TYPE], ann[REASON]) == ("best-effort", "nri-disabled")
    assert not any(k.startswith(BALLOON) for k in ann)


async def test_node_pin_uses_match_fields_in_every_term_and_scheduler_name_is_set(make_webhook: MakeWebhook) -> None:
    wh = await make_webhook(settings=Settings(scheduler_name="model-placement-scheduler"))
    sent = review("ar-pod-two-terms.json")
    sent["request"]["object"]["metadata"]["annotations"]["model-manager.io/node"] = "cpu-snc4"
    answer = await wh.mutate(sent)
    pod = answer.pod
    pin = {"key": "metadata.name", "operator": "In", "values": ["cpu-snc4"]}
    assert [t["matchFields"] for t in terms(pod)] == [[pin], [pin]]
    assert all(AMX in t["matchExpressions"] for t in terms(pod))
    assert pod["spec"]["schedulerName"] == "model-placement-scheduler"
    assert {"op": "replace", "path": "/spec/schedulerName", "value": "model-placement-scheduler"} in answer.ops
    await assert_reinvocation_is_empty(wh, pod)


async def test_require_amx_opt_out_and_explicit_balloon_type(wh: Webhook) -> None:
    sent = review("ar-pod-kubectl-run.json")
    sent["request"]["object"]["metadata"]["annotations"] = {
        "model-manager.io/require-amx": "false", "model-manager.io/nri-balloon": "vllm-balloon-tp2",
        "example.com/path~with/slash": "kept"}
    answer = await wh.mutate(sent)
    pod = answer.pod
    assert terms(pod) == [{"matchExpressions": [SMT2]}]  # no AMX requirement; the SMT width, as on every pod here
    ann = pod["metadata"]["annotations"]
    assert ann[BALLOON + "llama3"] == "vllm-balloon-tp2" and ann["example.com/path~with/slash"] == "kept"
    # Keys are escaped per RFC 6901: `~` first, then `/`.
    assert all("/" not in op["path"].removeprefix("/metadata/annotations/") for op in answer.ops
               if op["path"].startswith("/metadata/annotations/"))
    await assert_reinvocation_is_empty(wh, pod)


def test_patch_escapes_tilde_before_slash_and_creates_parents() -> None:
    src = {"metadata": {"annotations": {"a~b/c": "1", "keep": "x"}}, "spec": {}}
    dst = {"metadata": {"annotations": {"a~b/c": "2", "keep": "x", "x/y~z": "3"}},
           "spec": {"affinity": {"nodeAffinity": {}}}}
    ops = make_patch(src, dst)
    assert ops == [
        {"op": "replace", "path": "/metadata/annotations/a~0b~1c", "value": "2"},
        {"op": "add", "path": "/metadata/annotations/x~1y~0z", "value": "3"},
        {"op": "add", "path": "/spec/affinity", "value": {"nodeAffinity": {}}},
    ]
    assert jsonpatch.apply_patch(src, ops) == dst
    assert escape("~1/") == "~01~1"
    assert make_patch(dst, copy.deepcopy(dst)) == []
    # JSON types, not Python equality: true is not 1, 1 is not "1".
    assert make_patch({"a": 1}, {"a": True}) == [{"op": "replace", "path": "/a", "value": True}]
    assert make_patch({"a": [1, 2, 3]}, {"a": [1]}) == [{"op": "remove", "path": "/a/2"},
                                                        {"op": "remove", "path": "/a/1"}]
    # The whole document (path ""), where jsonpatch is unreliable: RFC 6902 puts the value in its place.
    assert make_patch([1], {"a": 1}) == [{"op": "replace", "path": "", "value": {"a": 1}}]
    assert apply_patch([1], [{"op": "add", "path": "", "value": {"a": 1}}]) == {"a": 1}
    with pytest.raises(PatchError, match="whole document"):
        apply_patch({"a": 1}, [{"op": "remove", "path": ""}])


JSON_DOCS = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.sampled_from(["", "a", "x/y", "~1"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(["a", "b", "x/y", "t~", "0"]),
                                                                inner, max_size=3),
    max_leaves=8)
TOKENS = st.sampled_from(["a", "b", "x~1y", "t~0", "0", "1", "2", "3", "-", "01", "z", "~2"])


@hsettings(max_examples=400, deadline=None)
@given(doc=JSON_DOCS, ops=st.lists(st.fixed_dictionaries(
    {"op": st.sampled_from(["add", "remove", "replace"]), "path": st.lists(TOKENS, min_size=1, max_size=3).map(
        lambda ts: "".join("/" + t for t in ts)), "value": JSON_DOCS}), min_size=1, max_size=3))
def test_our_patch_applier_reads_rfc_6902_as_jsonpatch_does(doc: Any, ops: list[Obj]) -> None:
    """The runtime self-check applies patches with our own applier; here it must agree with the jsonpatch
    package on every document and patch, those that apply and those that must fail, and never touch
    the original."""
    before = copy.deepcopy(doc)
    try:
        # jsonpatch inserts into the very lists an operation carries as its value: give it copies.
        expected: Any = jsonpatch.apply_patch(copy.deepcopy(doc), copy.deepcopy(ops))
    except jsonpatch.InvalidJsonPatch as exc:
        # jsonpatch refuses "-" as the last token of a replace or remove even in an object, where RFC 6901 makes
        # it a member's name; evanphx/json-patch v4.13 (which the apiserver applies) and ours accept it.
        assume("'-' can't be applied" not in str(exc))
        expected = PatchError
    except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException, TypeError, KeyError, IndexError):
        expected = PatchError
    try:
        got: Any = apply_patch(doc, ops)
    except PatchError as exc:
        assert str(exc).startswith("operation ")  # says which operation, and why
        got = PatchError
    event("applies" if got is not PatchError else "fails")
    assert got == expected if got is PatchError or expected is PatchError else json.dumps(got) == json.dumps(expected)
    assert doc == before


async def test_pre_1_24_pod_without_metadata_namespace_uses_request_namespace(wh: Webhook) -> None:
    sent = review("ar-pod-pre124-no-namespace.json")
    assert "namespace" not in sent["request"]["object"]["metadata"] and sent["request"]["namespace"] == "llm"
    answer = await wh.mutate(sent)
    assert not any("namespace" in op["path"] for op in answer.ops)
    pod = answer.pod
    assert "namespace" not in pod["metadata"]
    assert pod["metadata"]["annotations"][TYPE] == "nri-balloons"
    await assert_reinvocation_is_empty(wh, pod)
    # The request's namespace is authoritative: a pod sent for kube-system is never touched.
    sent = review("ar-pod-pre124-no-namespace.json", uid="pre124-kube-system")
    sent["request"]["namespace"] = "kube-system"
    answer = await wh.mutate(sent)
    assert answer.allowed and answer.ops == [] and not answer.warnings


async def test_dry_run_gets_the_same_answer_and_changes_nothing(wh: Webhook) -> None:
    live = await wh.mutate(review("ar-pod-kserve-rs.json"))
    cluster = wh.served.runtime.cluster
    before = (cluster.generation, len(cluster.pods), [ledger.free() for ledger in cluster.ledgers()])
    sent = review("ar-pod-kserve-rs.json", uid="dry-run-1")
    sent["request"]["dryRun"] = True
    dry = await wh.mutate(sent)
    assert dry.ops == live.ops and dry.pod == live.pod
    assert (cluster.generation, len(cluster.pods), [ledger.free() for ledger in cluster.ledgers()]) == before


def _untouched_cases() -> list[tuple[str, Callable[[Obj], None]]]:
    def meta(body: Obj) -> Obj:
        return body["request"]["object"]["metadata"]  # type: ignore[no-any-return]

    def no_model_label(body: Obj) -> None:
        meta(body)["labels"] = {"app": "web"}

    def kube_system(body: Obj) -> None:
        meta(body)["namespace"] = body["request"]["namespace"] = "kube-system"

    def own_namespace(body: Obj) -> None:
        meta(body)["namespace"] = body["request"]["namespace"] = "model-placement"

    def mirror(body: Obj) -> None:
        meta(body)["annotations"]["kubernetes.io/config.mirror"] = "0f3c1d2e"

    def deleting(body: Obj) -> None:
        meta(body)["deletionTimestamp"] = "2026-12-01T10:00:00Z"

    def update(body: Obj) -> None:
        body["request"]["operation"] = "UPDATE"
        body["request"]["oldObject"] = copy.deepcopy(body["request"]["object"])

    def status_subresource(body: Obj) -> None:
        body["request"]["subResource"] = "status"

    def a_deployment(body: Obj) -> None:
        body["request"] = review("ar-deployment-create.json", uid=body["request"]["uid"])["request"]

    return [("non-model pod", no_model_label), ("kube-system", kube_system), ("our namespace", own_namespace),
            ("mirror pod", mirror), ("being deleted", deleting), ("UPDATE", update),
            ("subresource", status_subresource), ("not a pod", a_deployment)]


async def test_pods_we_never_touch_are_admitted_without_patch_or_warning(wh: Webhook) -> None:
    for label, change in _untouched_cases():
        sent = review("ar-pod-kserve-rs.json", uid=f"untouched-{label}")
        change(sent)
        answer = await wh.mutate(sent)
        assert answer.allowed and answer.ops == [] and not answer.warnings, label


# ------------------------------------------------------------------------------------- bad input


MALFORMED: list[tuple[str, bytes, str | None, str]] = [
    ("bad JSON", b'{"apiVersion": "admission.k8s.io/v1", ', "application/json", "not valid JSON"),
    ("empty body", b"", "application/json", "empty"),
    ("a list", b"[1, 2]", "application/json", "expected a JSON object, got array"),
    ("not a review", b'{"apiVersion": "v1", "kind": "Pod"}', "application/json", "kind is 'Pod'"),
    ("v1beta1", b'{"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview", "request": {"uid": "u"}}',
     "application/json", "'admission.k8s.io/v1beta1' is not supported"),
    ("no request", b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}', "application/json",
     "has no request"),
    ("request not an object", b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": [1]}',
     "application/json", "request is a JSON array"),
    ("no uid", b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"object": {}}}',
     "application/json", "request.uid is missing"),
    ("uid a number", b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"uid": 7}}',
     "application/json", "request.uid is missing"),
    ("nested 5000 deep", b'{"a":' * 5000 + b"1" + b"}" * 5000, "application/json", "not valid JSON"),
    ("wrong Content-Type", json.dumps(review("ar-pod-kserve-rs.json")).encode(), "text/plain",
     "Content-Type must be application/json"),
    ("over 3 MiB", b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"uid": "u", "x": "'
     + b"x" * (3 * 1024 * 1024) + b'"}}', "application/json", "exceeds the limit of 3145728 bytes"),
]


@pytest.mark.parametrize("path", ["/mutate", "/validate"])
async def test_unusable_bodies_are_400_with_a_message_and_the_server_keeps_serving(wh: Webhook, path: str) -> None:
    for label, body, ctype, phrase in MALFORMED:
        status, content_type, text = await wh.raw(path, body, ctype)
        assert status == 400 and content_type == "application/json", label
        answer = json.loads(text)
        assert list(answer) == ["error"] and phrase in answer["error"], (label, answer)
        assert "Traceback" not in text
        await wh.still_serving()


def _with_uid_cases() -> list[tuple[str, Callable[[Obj], None], str]]:
    def obj(body: Obj) -> Obj:
        return body["request"]["object"]  # type: ignore[no-any-return]

    def main(body: Obj) -> Obj:
        return obj(body)["spec"]["containers"][0]  # type: ignore[no-any-return]

    def set_cpu(value: Any) -> Callable[[Obj], None]:
        def change(body: Obj) -> None:
            main(body)["resources"] = {"requests": {"cpu": value}, "limits": {"cpu": value}}
        return change

    def set_tp(value: str) -> Callable[[Obj], None]:
        def change(body: Obj) -> None:
            obj(body)["metadata"]["annotations"]["model-manager.io/tensor-parallel-size"] = value
        return change

    def nest(body: Obj) -> None:
        deep: Obj = {}
        here = deep
        for _ in range(100):
            here["x"] = {}
            here = here["x"]
        obj(body)["spec"]["containers"][0]["env"] = deep

    def drop(body: Obj) -> None:
        del body["request"]["object"]

    def scalar(body: Obj) -> None:
        body["request"]["object"] = "a pod"

    def weird(path: str, value: Any) -> Callable[[Obj], None]:
        def change(body: Obj) -> None:
            *parents, last = path.split(".")
            here = obj(body)
            for p in parents:
                here = here[int(p)] if isinstance(here, list) else here[p]
            here[last] = value
        return change

    return [
        ("cpu -3", set_cpu("-3"), "negative"), ("cpu abc", set_cpu("abc"), "not a Kubernetes quantity"),
        ("cpu 1e400", set_cpu("1e400"), "cpu"), ("cpu number", set_cpu(16.5), ""),
        ("TP 0", set_tp("0"), "tensor-parallel-size 0"), ("TP 3", set_tp("3"), "tensor-parallel-size 3"),
        ("TP x", set_tp("x"), "'x'"), ("nested 100 deep", nest, "nested deeper than 64 levels"),
        ("no object", drop, "request.object is missing"),
        ("object a string", scalar, "request.object is a JSON string"),
        ("containers a string", weird("spec.containers", "main"), "spec.containers is a JSON string"),
        ("container a number", weird("spec.containers", [7]), "spec.containers[0] is a JSON number"),
        ("spec a list", weird("spec", []), "spec is a JSON array"),
        ("metadata a list", weird("metadata", [1]), "metadata is a JSON array"),
        ("annotations a list", weird("metadata.annotations", ["a"]), "metadata.annotations is a JSON array"),
        ("annotation a number", weird("metadata.annotations", {"model-manager.io/tensor-parallel-size": 2}),
         "['model-manager.io/tensor-parallel-size'] is a JSON number, expected a string"),
        ("annotations null", weird("metadata.annotations", None), ""),
        ("resources a string", weird("spec.containers.0.resources", "lots"), "resources is a JSON string"),
        ("cpu true", weird("spec.containers.0.resources", {"requests": {"cpu": True}}), "expected a quantity"),
        ("affinity a string", weird("spec.affinity", "near"), "spec.affinity is a JSON string"),
        ("terms a dict", weird("spec.affinity", {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                                                                  {"nodeSelectorTerms": {"a": 1}}}}),
         "nodeSelectorTerms is a JSON object, expected an array"),
        ("labels a list", weird("metadata.labels", ["serving.kserve.io/inferenceservice"]),
         "metadata.labels is a JSON array"),
        ("args numbers", weird("spec.containers.0.args", ["--tensor-parallel-size", 2]), "args[1] is a JSON number"),
        ("tolerations true", weird("spec.tolerations", True), "spec.tolerations is a JSON boolean"),
        ("toleration key a number", weird("spec.tolerations", [{"key": 7, "operator": "Exists"}]),
         "spec.tolerations[0].key is a JSON number"),
        ("ownerReferences true", weird("metadata.ownerReferences", True), "metadata.ownerReferences is a JSON boolean"),
        ("controller a string", weird("metadata.ownerReferences", [{"kind": "ReplicaSet", "name": "r",
                                                                   "controller": "true"}]),
         "metadata.ownerReferences[0].controller is a JSON string, expected true or false"),
    ]


async def test_bad_objects_with_a_uid_are_admitted_unchanged_or_get_a_patch_that_applies(
        wh: Webhook, caplog: pytest.LogCaptureFixture) -> None:
    for label, change, phrase in _with_uid_cases():
        sent = review("ar-pod-kserve-rs.json", uid=f"bad-{label}")
        change(sent)
        answer = await wh.mutate(sent)  # 200, a well-formed review, uid echoed: checked in Answer
        assert answer.allowed, label
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR], label  # no crash caught
        if answer.ops:
            answer.pod  # noqa: B018 - it applies (jsonpatch raises otherwise)
        if phrase:
            assert answer.ops == [] and phrase in answer.warning_text, (label, answer.warnings)
        await wh.still_serving()


# ------------------------------------------------------------------------------------- the deadline


def test_timeout_parameter_is_read_as_a_go_duration() -> None:
    assert parse_timeout("10s") == 10 and parse_timeout("1m0s") == 30 and parse_timeout("1.5s") == 1.5
    assert parse_timeout("500ms") == 0.5 and parse_timeout("0s") == 0
    assert parse_timeout("") is None and parse_timeout("ten") is None and parse_timeout("10") is None


async def test_no_time_left_admits_unchanged_with_a_warning(wh: Webhook) -> None:
    answer = await wh.mutate(review("ar-pod-kserve-rs.json"), timeout="0s")
    assert answer.allowed and answer.ops == []
    assert "timeout" in answer.warning_text and "admitted unchanged" in answer.warning_text
    # One slow run (a resync's ledger rebuild) predicts nothing: the next call still runs.
    timings = wh.served.app[TIMINGS]
    timings.record("mutate", 3.0)
    assert (await wh.mutate(review("ar-pod-kserve-rs.json", uid="one-spike"), timeout="2s")).ops
    # The core typically costs 3 s lately: a 2 s budget cannot take it, a 10 s one can.
    for _ in range(4):
        timings.record("mutate", 3.0)
    tight = review("ar-pod-kserve-rs.json", uid="tight")
    tight["request"]["object"]["metadata"]["labels"]["release"] = "canary"  # not a replica of the pod above
    answer = await wh.mutate(tight, timeout="2s")
    assert answer.ops == [] and "2s timeout" in answer.warning_text
    answer = await wh.mutate(review("ar-pod-kserve-rs.json", uid="roomy"), timeout="10s")
    assert answer.ops and not answer.warnings


def replica_memo(result: str) -> float:
    return REGISTRY.get_sample_value("model_placement_mutation_replica_memo_total", {"result": result}) or 0.0


def recorded_replica(serial: int) -> Obj:
    """The AdmissionReview the real kube-apiserver sent for a ReplicaSet's pod (tests/e2e/record.py), as it sends
    the `serial`-th replica: its own uid, ServiceAccount token volume suffix and managedFields time."""
    body = copy.deepcopy(fixture_json("recorded/admissionreview-mutate-pod-replicaset.json")["request"])
    body["request"]["uid"] = f"replica-{serial}"
    pod = body["request"]["object"]
    name = f"kube-api-access-{'bcdfg'[serial % 5]}x{serial:03d}"
    pod["spec"]["volumes"][0]["name"] = pod["spec"]["containers"][0]["volumeMounts"][0]["name"] = name
    pod["metadata"]["managedFields"][0]["time"] = f"2026-12-03T08:41:{serial % 60:02d}Z"
    return body


async def test_replicas_get_the_first_ones_patch_until_the_policy_resolution_changes(
        wh: Webhook, make_webhook: MakeWebhook) -> None:
    """A ReplicaSet's pods arrive alike but for their token volume's name and managedFields: later replicas reuse
    the first one's patch (which touches neither), as long as NRI still resolves where they can land; once it does
    not, they are mutated afresh (best-effort)."""
    reused, stale = replica_memo("reused"), replica_memo("stale")
    first = await wh.mutate(recorded_replica(1))
    second = await wh.mutate(recorded_replica(2))
    assert second.response["uid"] == "replica-2" and second.ops == first.ops
    assert replica_memo("reused") == reused + 1
    alone = await (await make_webhook()).mutate(recorded_replica(2))  # a webhook that never saw replica 1
    assert second.pod == alone.pod and second.pod["metadata"]["annotations"][TYPE] == "nri-balloons"
    assert second.pod["spec"]["volumes"][0]["name"] == "kube-api-access-dx002"
    cluster = wh.served.runtime.cluster
    for obj in load_objects(demo_text()):
        if obj["kind"] == "BalloonsPolicy":  # the plugin is gone from the fleet
            cluster.apply("BalloonsPolicy", "DELETED", obj)
    third = await wh.mutate(recorded_replica(3))
    ann = third.pod["metadata"]["annotations"]
    assert (ann[TYPE], ann[REASON]) == ("best-effort", "nri-resolution-failed")
    assert not any(k.startswith(BALLOON) for k in ann)
    assert replica_memo("stale") == stale + 1 and replica_memo("reused") == reused + 1


# ------------------------------------------------------------------------------------- issue 42: where a pod sits

PLACEMENT_PATH = "/metadata/annotations/" + escape(PLACEMENT)
CLAIM = '{"node":"cpu-a1","numa":{"0":16},"types":["vllm-balloon-tp1","vllm-numa-0"]}'


def claiming(sent: Obj) -> Obj:
    """The review with a placement of the pod's creator's on the pod."""
    meta = sent["request"]["object"]["metadata"]
    meta["annotations"] = {**(meta.get("annotations") or {}), PLACEMENT: CLAIM}
    return sent


async def test_a_placement_on_a_new_pod_is_dropped_with_a_warning_naming_it(wh: Webhook) -> None:
    answer = await wh.mutate(claiming(review("ar-pod-kserve-rs.json")))
    assert answer.allowed and {"op": "remove", "path": PLACEMENT_PATH} in answer.ops
    (warning,) = answer.warnings
    assert warning.startswith(f"model-placement removed annotation {PLACEMENT} from ") and "extender" in warning
    # Otherwise pinned as the same pod without it is: the rest of the patch is the same.
    plain = await wh.mutate(review("ar-pod-kserve-rs.json"))
    assert answer.pod == plain.pod and PLACEMENT not in answer.pod["metadata"]["annotations"]
    assert [op for op in answer.ops if op["path"] != PLACEMENT_PATH] == plain.ops
    await assert_reinvocation_is_empty(wh, answer.pod)


async def test_a_faulty_pod_is_left_as_sent_but_for_a_placement(wh: Webhook) -> None:
    sent = claiming(review("ar-pod-kubectl-run.json"))
    sent["request"]["object"]["metadata"]["annotations"]["model-manager.io/tensor-parallel-size"] = "3"
    answer = await wh.mutate(sent)
    assert answer.allowed and answer.ops == [{"op": "remove", "path": PLACEMENT_PATH}]
    assert "tensor-parallel-size 3" in answer.warnings[0] and PLACEMENT in answer.warnings[1]


async def test_replicas_that_carry_a_placement_each_lose_it_with_the_warning(wh: Webhook) -> None:
    reused = replica_memo("reused")
    first = await wh.mutate(claiming(recorded_replica(1)))
    second = await wh.mutate(claiming(recorded_replica(2)))
    assert replica_memo("reused") == reused + 1 and second.ops == first.ops
    assert {"op": "remove", "path": PLACEMENT_PATH} in second.ops and second.warnings == first.warnings
    assert PLACEMENT in second.warnings[0]


def test_a_patch_that_touches_what_replicas_differ_in_is_not_reused() -> None:
    assert fits_every_replica([{"op": "replace", "path": "/spec/containers/0/resources/limits/cpu", "value": "32"}])
    for path in ("", "/spec", "/metadata", "/spec/containers/0", "/spec/volumes/0/name",
                 "/spec/initContainers/1/volumeMounts", "/metadata/managedFields/0"):
        assert not fits_every_replica([{"op": "add", "path": path, "value": {}}]), path


# ------------------------------------------------------------------------------------- logs and metrics




async def test_one_log_line_and_one_count_per_decision(make_webhook: MakeWebhook, demo_objects: list[Obj],
                                                       caplog: pytest.LogCaptureFixture) -> None:
    wh = await make_webhook(objects_without(demo_objects, "BalloonsPolicy"))
    caplog.set_level(logging.INFO, logger="model_placement.webhook")
    fallback = {"webhook": "mutate", "policy": "best-effort", "decision": "allowed", "reason": "nri-resolution-failed"}
    skipped = {"webhook": "mutate", "policy": "none", "decision": "skipped", "reason": "protected-namespace"}
    before = decisions(**fallback), decisions(**skipped)
    await wh.mutate(review("ar-pod-kserve-rs.json"))
    sent = review("ar-pod-kserve-rs.json", uid="in-kube-system")
    sent["request"]["namespace"] = sent["request"]["object"]["metadata"]["namespace"] = "kube-system"
    await wh.mutate(sent)
    assert (decisions(**fallback) - before[0], decisions(**skipped) - before[1]) == (1, 1)
    lines = [r for r in caplog.records if r.name == "model_placement.webhook"]
    assert len(lines) == 2
    first = lines[0]
    assert (first.verb, first.decision, first.reason, first.policy) == (  # type: ignore[attr-defined]
        "mutate", "allowed", "nri-resolution-failed", "best-effort")
    assert first.pod == "llm/llama3-8b-predictor-6c9f7d8b4-*"  # type: ignore[attr-defined]
    assert first.uid == "0f7f3c9e-5b1a-4d0e-9a47-3f1c2b6d8e01" and first.duration_ms >= 0  # type: ignore[attr-defined]


# ------------------------------------------------------------------------------------- property test


class BackgroundWebhook:
    """The webhook over TLS on an event loop in a thread, for synchronous (hypothesis) tests. Cluster
    swaps happen on that loop, between requests: the state is only ever touched from its thread."""

    def __init__(self, tmp: Path) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.stack = AsyncExitStack()
        self.wh: Webhook = self.run(self._start(tmp))

    def run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=30)

    async def _start(self, tmp: Path) -> Webhook:
        settings = Settings()
        runtime = Runtime(settings, ClusterState.from_objects(load_objects(demo_text()), settings))
        served = await self.stack.enter_async_context(serving(runtime, "webhook", tmp))
        return Webhook(served, await self.stack.enter_async_context(aiohttp.ClientSession()))

    def use(self, cluster: ClusterState) -> None:
        async def swap() -> None:
            self.wh.served.runtime.cluster = cluster
            self.wh.served.runtime.settings = cluster.settings
        self.run(swap())

    def mutate(self, sent: Obj) -> Answer:
        return self.run(self.wh.mutate(sent))  # type: ignore[no-any-return]

    def close(self) -> None:
        self.run(self.stack.aclose())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        self.loop.close()


@pytest.fixture(scope="module")
def background(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BackgroundWebhook]:
    bg = BackgroundWebhook(tmp_path_factory.mktemp("webhook"))
    yield bg
    bg.close()


def _clusters() -> list[ClusterState]:
    objects = load_objects(demo_text())
    out = []
    for settings, objs in [
        (Settings(), objects),
        (Settings(kubernetes_cpu_policy="kubelet-static"), objects),
        (Settings(kubernetes_cpu_policy="kubelet-static", mm_kubelet_threads_per_core=1), objects),
        (Settings(nri_enabled=False, scheduler_name="model-placement-scheduler"), objects),
        (Settings(require_amx=False), objects_without(objects, "BalloonsPolicy")),
    ]:
        out.append(ClusterState.from_objects(copy.deepcopy(objs), settings))
    return out


CLUSTERS = _clusters()
NAMES = st.text("abcxyz019-", max_size=8).map(lambda s: "m" + s)  # DNS-label-like, cheap to draw
KEY_CHARS = st.sampled_from("abcxyz.-_/~0189")
KEYS = st.text(KEY_CHARS, min_size=1, max_size=16)
CPU = st.sampled_from(["1", "2", "3", "8", "15", "16", "250m", "1500m", "0.5", "2000m", "7"])
MEMORY = st.sampled_from(["128Mi", "1Gi", "64Gi", "100M"])
NODE_NAMES = ["cpu-a1", "cpu-a2", "cpu-b1", "cpu-full", "cpu-icx", "cpu-nosmt", "cpu-snc4", "nowhere"]


@st.composite
def resources(draw: st.DrawFn, cpu_required: bool = False) -> Obj:
    out: Obj = {}
    for section in ("requests", "limits"):
        values: Obj = {}
        if draw(st.booleans()) or (cpu_required and section == "requests"):
            values["cpu"] = draw(CPU)
        if draw(st.booleans()):
            values["memory"] = draw(MEMORY)
        if draw(st.booleans()):
            values["ephemeral-storage"] = "1Gi"
        if values or draw(st.booleans()):
            out[section] = values
    return out


@st.composite
def requirement(draw: st.DrawFn) -> Obj:
    op = draw(st.sampled_from(["In", "NotIn", "Exists", "DoesNotExist"]))
    req: Obj = {"key": draw(st.sampled_from(["kubernetes.io/hostname", "node-role.kubernetes.io/cpu-inference",
                                             "feature.node.kubernetes.io/cpu-security.amx.enabled"])),
                "operator": op}
    if op in ("In", "NotIn"):
        req["values"] = draw(st.lists(st.sampled_from([*NODE_NAMES, "true", "false"]), min_size=1, max_size=3))
    return req


@st.composite
def affinity(draw: st.DrawFn) -> Any:
    shape = draw(st.sampled_from(["none", "empty", "node-empty", "required", "required+preferred", "pod"]))
    if shape == "none":
        return None
    if shape == "empty":
        return {}
    if shape == "node-empty":
        return {"nodeAffinity": {}}
    if shape == "pod":
        return {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}}
    node: Obj = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {k: v for k, v in (("matchExpressions", draw(st.lists(requirement(), max_size=2))),
                           ("matchFields", draw(st.lists(st.just(
                               {"key": "metadata.name", "operator": "In", "values": ["cpu-a1"]}), max_size=1))))
         if v or draw(st.booleans())}
        for _ in range(draw(st.integers(1, 3)))]}}
    if shape == "required+preferred":
        node["preferredDuringSchedulingIgnoredDuringExecution"] = [
            {"weight": 5, "preference": {"matchExpressions": [draw(requirement())]}}]
    return {"nodeAffinity": node}


@st.composite
def model_pods(draw: st.DrawFn) -> tuple[Obj, str]:
    names = draw(st.lists(NAMES, min_size=1, max_size=3, unique=True))
    model = draw(st.sampled_from([*names, "main", "kserve-container"]))
    if model not in names:
        names = [model, *names[1:]]
    containers = []
    for name in names:
        c: Obj = {"name": name, "image": "vllm/vllm-openai-cpu:v0.10.0"}
        res = draw(resources(cpu_required=name == model))
        if res or draw(st.booleans()):
            c["resources"] = res
        if name == model and draw(st.booleans()):
            c["args"] = ["--model", "/m", draw(st.sampled_from(["--tensor-parallel-size", "-tp"])),
                         draw(st.sampled_from(["1", "2", "4"]))]
        containers.append(c)
    init = []
    for i in range(draw(st.integers(0, 2))):
        c = {"name": f"init-{i}", "image": "busybox"}
        if draw(st.booleans()):
            c["restartPolicy"] = "Always"
        res = draw(resources())
        if res:
            c["resources"] = res
        init.append(c)
    label = draw(st.sampled_from(["model-manager.io/model", "serving.kserve.io/inferenceservice"]))
    meta: Obj = {"labels": {label: draw(NAMES), **draw(st.dictionaries(KEYS, NAMES, max_size=2))}}
    if draw(st.booleans()):
        meta["name"] = draw(NAMES)
    else:
        meta["generateName"] = draw(NAMES) + "-"
    namespace = draw(st.sampled_from(["llm", "research"]))
    if draw(st.booleans()):
        meta["namespace"] = namespace
    annotations = draw(st.one_of(st.none(), st.dictionaries(KEYS, NAMES, max_size=4)))
    if annotations is not None:
        extra = draw(st.fixed_dictionaries({}, optional={
            "model-manager.io/cpu-policy": st.sampled_from(["nri-balloons", "kubelet-static", "best-effort"]),
            "model-manager.io/tensor-parallel-size": st.sampled_from(["1", "2", "4", "8"]),
            "model-manager.io/node": st.sampled_from(NODE_NAMES),
            "model-manager.io/require-amx": st.sampled_from(["false", "true"]),
            "model-manager.io/nri-balloon": st.sampled_from(["vllm-balloon-tp1", "vllm-balloon-tp2", "custom"]),
            "model-manager.io/preflight": st.sampled_from(["enforce", "warn", "skip"]),
            "model-manager.io/container": st.just(model),
        }))
        meta["annotations"] = {**annotations, **extra}
    elif draw(st.booleans()):
        meta["annotations"] = None
    # A valid model pod: whichever container the core takes as the model one requests CPU.
    chosen = ((meta.get("annotations") or {}).get("model-manager.io/container")
              or next((n for n in ("main", "kserve-container") if n in names), names[0]))
    main = next(c for c in containers if c["name"] == chosen)
    main.setdefault("resources", {}).setdefault("requests", {}).setdefault("cpu", draw(CPU))
    spec: Obj = {"containers": containers}
    if init:
        spec["initContainers"] = init
    aff = draw(affinity())
    if aff is not None or draw(st.booleans()):
        spec["affinity"] = aff
    if draw(st.booleans()):
        spec["nodeSelector"] = {"node-role.kubernetes.io/cpu-inference": ""}
    if draw(st.booleans()):
        spec["schedulerName"] = draw(st.sampled_from(["default-scheduler", "custom-scheduler"]))
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}, namespace


@hsettings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(case=model_pods(), cluster=st.sampled_from(CLUSTERS))
def test_property_patch_applies_and_mutating_twice_equals_once(
        background: BackgroundWebhook, case: tuple[Obj, str], cluster: ClusterState) -> None:
    pod, namespace = case
    background.use(cluster)
    first = background.mutate(pod_review(pod, "p-1", namespace))
    assert first.allowed
    assert_only_contract_paths(first.ops)
    once = first.pod  # applies with jsonpatch, to exactly what was sent
    assert once.get("metadata", {}).get("namespace") == pod["metadata"].get("namespace")
    annotations = once["metadata"].get("annotations") or {}
    assert all(isinstance(v, str) for v in annotations.values())
    event(f"type={annotations.get(TYPE, 'unchanged')}, reason={annotations.get(REASON, '-')}, "
          f"warned={bool(first.warnings)}")
    if first.ops:
        assert annotations[TYPE] in ("nri-balloons", "kubelet-static", "best-effort")
        if annotations[TYPE] == "kubelet-static":
            for c in [*once["spec"]["containers"], *once["spec"].get("initContainers", [])]:
                res = c.get("resources") or {}
                for name in ("cpu", "memory"):
                    assert (res.get("requests") or {}).get(name) == (res.get("limits") or {}).get(name)
    second = background.mutate(pod_review(once, "p-2", namespace))
    assert second.ops == [] and second.pod == once


async def test_a_controller_created_pod_that_falls_back_says_why_on_itself(
        make_webhook: MakeWebhook, demo_objects: list[Obj]) -> None:
    # Admission warnings go to the client that created the pod: for a ReplicaSet's pod, kube-controller-manager.
    # What the operator must know is kept on the pod, for `kubectl describe pod`.
    wh = await make_webhook(objects_without(demo_objects, "BalloonsPolicy"))
    answer = await wh.mutate(review("ar-pod-kserve-rs.json"))
    annotations = answer.pod["metadata"]["annotations"]
    assert annotations[TYPE] == "best-effort" and annotations[REASON] == "nri-resolution-failed"
    assert annotations["cpu-policy.model-manager.io/message"] == (
        "runs best-effort without exclusive cores: no eligible node has a running NRI balloons plugin with balloon "
        "type vllm-balloon-tp1.")
    await assert_reinvocation_is_empty(wh, answer.pod)
