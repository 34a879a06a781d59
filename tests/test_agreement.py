"""The webhook and the extender never disagree: for random model pods on the demo fleet, /validate (in
enforce mode) admits exactly when /filter finds at least one feasible node among the nodes
kube-scheduler's own NodeAffinity filter would send it."""

from __future__ import annotations

import base64
import copy
import random
from pathlib import Path
from typing import Any

import aiohttp
import jsonpatch

from placement.eligibility import Eligibility
from placement.cluster import ClusterState
from server.app import Runtime
from tests.conftest import fixture_json
from tests.support.servers import serving

CASES = 160


def random_pod(rng: random.Random, i: int, nodes: list[str]) -> dict[str, Any]:
    pod = copy.deepcopy(fixture_json("admissionreview-v1-pod-create.json")["request"]["object"])
    meta, main = pod["metadata"], pod["spec"]["containers"][0]
    meta["labels"] = {"serving.kserve.io/inferenceservice": f"model-{i}"}  # a model of its own each time
    annotations: dict[str, str] = {}
    tp = rng.choice([1, 1, 1, 2, 2, 4, 8])
    main["args"] = ["--model", "/mnt/models", "--tensor-parallel-size", str(tp)]
    cpu = str(rng.choice([2, 4, 8, 12, 16, 20, 24, 28, 30, 32, 40, 48, 64, 88, 96]))
    main["resources"] = {"requests": {"cpu": cpu, "memory": "16Gi"}, "limits": {"cpu": cpu, "memory": "16Gi"}}
    if rng.random() < 0.25:
        annotations["model-manager.io/cpu-policy"] = "kubelet-static"
    if rng.random() < 0.2:
        annotations["model-manager.io/require-amx"] = "false"
    if rng.random() < 0.15:
        annotations["model-manager.io/node"] = rng.choice(nodes)
    if rng.random() < 0.1:
        pod["spec"]["nodeSelector"] = {"feature.node.kubernetes.io/memory-numa.node_count": rng.choice(["2", "4"])}
    meta["annotations"] = annotations
    return pod


async def test_validate_admits_exactly_when_filter_finds_a_node(demo: ClusterState, tmp_path: Path) -> None:
    rng = random.Random(20261202)
    names = sorted(demo.nodes)
    admitted = refused = 0
    async with serving(Runtime(demo.settings, demo), "serve", tmp_path) as srv, aiohttp.ClientSession() as http:
        kw = srv.request_kwargs()

        async def post(path: str, body: Any) -> Any:
            async with http.post(f"{srv.url}{path}", json=body, **kw) as resp:
                assert resp.status == 200, await resp.text()
                return await resp.json()

        for i in range(CASES):
            pod = random_pod(rng, i, names)
            review = fixture_json("admissionreview-v1-pod-create.json")
            review["request"]["uid"] = f"mutate-{i}"
            review["request"]["object"] = pod
            answer = (await post("/mutate", review))["response"]
            if answer.get("patch"):
                pod = jsonpatch.apply_patch(pod, jsonpatch.JsonPatch.from_string(
                    base64.b64decode(answer["patch"]).decode()))
            # What the apiserver does between the two webhooks: the generated name, the uid.
            pod["metadata"]["name"] = f"{pod['metadata']['generateName']}{i:05d}"
            pod["metadata"]["uid"] = f"uid-{i}"
            review["request"].update(uid=f"validate-{i}", name=pod["metadata"]["name"], object=pod)
            verdict = (await post("/validate", review))["response"]

            # kube-scheduler's own filters (NodeAffinity, nodeSelector) decide what reaches the extender.
            candidates = [n for n in names if node_matches(pod["spec"], n, demo.nodes[n].labels)]
            filtered = await post("/filter", {"Pod": pod, "Nodes": None, "NodeNames": candidates})
            feasible = filtered["NodeNames"] or []
            assert verdict["allowed"] == bool(feasible), (
                i, verdict.get("status", {}).get("message"), feasible, filtered["FailedNodes"],
                filtered["FailedAndUnresolvableNodes"])
            admitted += verdict["allowed"]
            refused += not verdict["allowed"]
    # Both answers occurred often enough for the agreement to mean something.
    print(f"agreement: {admitted} admitted, {refused} refused, all matching /filter")
    assert admitted > CASES // 5 and refused > CASES // 5, (admitted, refused)
