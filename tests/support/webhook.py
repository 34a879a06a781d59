"""The admission webhook as kube-apiserver calls it: AdmissionReviews, `Answer` (a response read as the apiserver
reads it), `Webhook` (our webhook app over TLS; the `make_webhook` and `wh` fixtures in tests/conftest.py serve
one), and the small clusters and helpers the admission tests share."""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import jsonpatch
from prometheus_client import REGISTRY

from placement.balloons import node_balloons_policy
from placement.config import Settings
from placement.ledger import PLACEMENT, Placed
from placement.topology import linux_layout
from tests.support.payloads import fixture_json
from tests.support.servers import Served

Obj = dict[str, Any]


TYPE = "cpu-policy.model-manager.io/type"


REASON = "cpu-policy.model-manager.io/reason"


TP = "cpu-policy.model-manager.io/tensor-parallel-size"


CPUS = "cpu-policy.model-manager.io/cpus"


REQUESTED = "cpu-policy.model-manager.io/requested-cpu"


NUMA = "cpu-policy.model-manager.io/numa-nodes"


BALLOON = "balloon.balloons.resource-policy.nri.io/container."


AMX = {"key": "feature.node.kubernetes.io/cpu-security.amx.enabled", "operator": "In", "values": ["true"]}


def review(name: str, uid: str | None = None) -> Obj:
    body = copy.deepcopy(fixture_json(name))
    if uid:
        body["request"]["uid"] = uid
    return body  # type: ignore[no-any-return]


def pod_review(pod: Obj, uid: str, namespace: str | None = None, operation: str = "CREATE", **request: Any) -> Obj:
    """An AdmissionReview for `pod` as the apiserver builds one (CreateV1AdmissionReview)."""
    ns = namespace if namespace is not None else (pod.get("metadata") or {}).get("namespace", "llm")
    gvk, gvr = {"group": "", "version": "v1", "kind": "Pod"}, {"group": "", "version": "v1", "resource": "pods"}
    req: Obj = {"uid": uid, "kind": gvk, "resource": gvr, "requestKind": gvk, "requestResource": gvr,
                "namespace": ns, "operation": operation,
                "userInfo": {"username": "kubernetes-admin", "groups": ["system:authenticated"]},
                "object": pod, "oldObject": None, "dryRun": False,
                "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"}}
    if (pod.get("metadata") or {}).get("name"):
        req["name"] = pod["metadata"]["name"]
    req.update(request)
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": req}


class Answer:
    """A response read as the apiserver reads it (admissionreview.go VerifyAdmissionResponse, dispatcher)."""

    def __init__(self, sent: Obj, status: int, content_type: str, text: str, mutating: bool) -> None:
        assert status == 200, text
        assert content_type == "application/json"
        assert "Traceback" not in text
        body = json.loads(text)
        self.sent = sent
        assert (body["apiVersion"], body["kind"]) == (sent["apiVersion"], sent["kind"])
        response = body["response"]
        assert response["uid"] == sent["request"]["uid"]
        assert isinstance(response["allowed"], bool)
        if mutating:
            assert ("patch" in response) == ("patchType" in response), response
        else:
            assert "patch" not in response and "patchType" not in response, "validating webhook may not patch"
        self.ops: list[Obj] = []
        if "patch" in response:
            assert response["patchType"] == "JSONPatch"
            self.ops = json.loads(base64.b64decode(response["patch"], validate=True))
            assert isinstance(self.ops, list) and self.ops, "an empty patch is sent as no patch"
        for warning in response.get("warnings", ()):
            assert isinstance(warning, str) and 0 < len(warning) <= 256
        if not response["allowed"]:
            assert response["status"]["message"] and response["status"]["code"] in (400, 403, 503)
        self.response = response

    @property
    def allowed(self) -> bool:
        return bool(self.response["allowed"])

    @property
    def warnings(self) -> list[str]:
        return list(self.response.get("warnings", []))

    @property
    def warning_text(self) -> str:
        """The warnings read as one text (each is whole: a message over 256 runes comes in its clauses)."""
        return " ".join(self.warnings)

    @property
    def message(self) -> str:
        return str(self.response.get("status", {}).get("message", ""))

    @property
    def code(self) -> int:
        return int(self.response.get("status", {}).get("code", 0))

    @property
    def pod(self) -> Obj:
        """The object after the patch, applied with `jsonpatch` to exactly what was sent."""
        return jsonpatch.apply_patch(self.sent["request"]["object"], self.ops)  # type: ignore[no-any-return]


@dataclass
class Webhook:
    """Our webhook app over TLS, and the calls kube-apiserver makes."""

    served: Served
    session: aiohttp.ClientSession

    async def raw(self, path: str, body: bytes, content_type: str | None = "application/json",
                  query: str = "?timeout=10s") -> tuple[int, str, str]:
        headers = {"Content-Type": content_type} if content_type else {}
        async with self.session.post(self.served.url + path + query, data=body, headers=headers,
                                     **self.served.request_kwargs()) as resp:  # type: ignore[arg-type]
            return resp.status, resp.content_type, await resp.text()

    async def call(self, path: str, sent: Obj, timeout: str = "10s") -> Answer:
        status, ctype, text = await self.raw(path, json.dumps(sent).encode(), query=f"?timeout={timeout}")
        return Answer(sent, status, ctype, text, mutating=path == "/mutate")

    async def mutate(self, sent: Obj, timeout: str = "10s") -> Answer:
        return await self.call("/mutate", sent, timeout)

    async def validate(self, sent: Obj, timeout: str = "10s") -> Answer:
        return await self.call("/validate", sent, timeout)

    async def still_serving(self) -> None:
        answer = await self.mutate(review("ar-pod-kserve-rs.json"))
        assert answer.pod["metadata"]["annotations"][TYPE] == "nri-balloons"


MakeWebhook = Callable[..., Any]


def objects_without(objects: list[Obj], kind: str) -> list[Obj]:
    return [o for o in objects if o.get("kind") != kind]


def decisions(**labels: str) -> float:
    return REGISTRY.get_sample_value("model_placement_admission_decisions_total", labels) or 0.0


async def admitted(wh: Webhook, sent: Obj, timeout: str = "10s") -> Answer:
    """What the validating webhook sees of a pod CREATE: the mutated pod, with its generated name."""
    mutated = await wh.mutate(sent)
    pod = mutated.pod
    meta = pod["metadata"]
    if not meta.get("name") and meta.get("generateName"):
        meta["name"] = meta["generateName"] + "x7k2p"
    request = copy.deepcopy(sent["request"])
    request.update(uid=request["uid"] + "-validate", name=meta["name"], object=pod)
    return await wh.validate({**sent, "request": request}, timeout)


def refused(answer: Answer, *phrases: str) -> str:
    assert answer.allowed is False and answer.code == 403, answer.response
    for phrase in phrases:
        assert phrase in answer.message, (phrase, answer.message)
    return answer.message


def node(name: str, numa: int = 2, cores: int = 32) -> Obj:
    """A Xeon node described by NFD labels: `numa` NUMA nodes of `cores` cores × 2 threads, AMX."""
    cpus = str(numa * cores * 2)
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {
                "kubernetes.io/hostname": name, AMX["key"]: "true",
                "feature.node.kubernetes.io/cpu-hardware_multithreading": "true",
                "feature.node.kubernetes.io/memory-numa.node_count": str(numa)}},
            "spec": {}, "status": {"capacity": {"cpu": cpus}, "allocatable": {"cpu": cpus}}}


def balloons_policy(*nodes: str) -> Obj:
    """The default BalloonsPolicy `balloons-policy` writes for a 2-NUMA node of 32 cores × 2 threads: 12 reserved
    CPUs (3 cores per NUMA node), per-NUMA types and TP 1/2 composites."""
    policy = node_balloons_policy("solo", linux_layout([32, 32], 2, "labels"), Settings(), "kube-system")
    policy["metadata"]["name"] = "default"
    policy["status"] = {"nodes": {n: {"status": "Success", "generation": 1} for n in nodes}}
    return policy


def running(name: str, on: str, model: str, cpus: int, created: str = "2026-11-30T09:00:00Z", numa: int = 0) -> Obj:
    """A model pod already pinned by us and running on `on`, on NUMA node `numa` (where our /bind recorded it)."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "llm", "uid": f"uid-{name}", "creationTimestamp": created,
                         "labels": {"model-manager.io/model": model},
                         "annotations": {TYPE: "nri-balloons", TP: "1", CPUS: str(cpus * 2),
                                         "cpu-policy.model-manager.io/requested-cpu": str(cpus),
                                         BALLOON + "main": "vllm-balloon-tp1",
                                         PLACEMENT: Placed(on, ((numa, cpus),), ("vllm-balloon-tp1",)).annotation()}},
            "spec": {"nodeName": on, "containers": [{"name": "main", "resources": {
                "requests": {"cpu": str(cpus * 2), "memory": "64Gi"},
                "limits": {"cpu": str(cpus * 2), "memory": "64Gi"}}}]},
            "status": {"phase": "Running"}}


def json_paths(value: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    if prefix:
        yield prefix
    children = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, child in children:
        yield from json_paths(child, (*prefix, key))
