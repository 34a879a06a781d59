"""The webhook and the extender never disagree: for random model pods on the demo fleet, and on the demo fleet
with taints and a cordon, /validate (in enforce mode) admits without reservation exactly when /filter, asked about
every node, finds at least one feasible node; a controller's pod it admits to wait Pending is one /filter turns away
only for what is held now (FailedNodes), never for what no node could ever hold; the nodes /filter says
kube-scheduler would not offer are those its own filters (cordons, taints, nodeSelector, node affinity with the AMX
requirement) refuse."""

from __future__ import annotations

import base64
import copy
import random
from pathlib import Path
from typing import Any

import aiohttp
import jsonpatch
import pytest

from placement.cluster import ClusterState
from placement.config import Settings
from server.app import Runtime
from tests.support.payloads import TOLERATIONS, fixture_json, tainted
from tests.support.servers import serving

CASES = 160
MESSAGE = "cpu-policy.model-manager.io/message"


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
    if rng.random() < 0.4:
        pod["spec"]["tolerations"] = copy.deepcopy(rng.choice(TOLERATIONS))
    meta["annotations"] = annotations
    if rng.random() < 0.5:
        del meta["ownerReferences"]  # a person's pod
    return pod


@pytest.mark.parametrize("fleet", ["demo", "tainted"])
async def test_validate_admits_exactly_when_filter_finds_a_node(fleet: str, demo_objects: list[dict[str, Any]],
                                                               tmp_path: Path) -> None:
    demo = ClusterState.from_objects(tainted(demo_objects) if fleet == "tainted" else demo_objects, Settings())
    rng = random.Random(20261202)
    names = sorted(demo.nodes)
    admitted = refused = waiting = 0
    why: dict[str, int] = {}  # reasons nodes were not offered, by kind
    tolerated = 0  # admitted pods that a tainted node passed for
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

            filtered = await post("/filter", {"Pod": pod, "Nodes": None, "NodeNames": names})
            feasible = filtered["NodeNames"] or []
            message = verdict.get("status", {}).get("message", "")
            waits = "it waits Pending" in pod["metadata"]["annotations"].get(MESSAGE, "")
            assert (verdict["allowed"] and not waits) == bool(feasible), (
                i, message, feasible, filtered["FailedNodes"], filtered["FailedAndUnresolvableNodes"])
            if waits:
                assert verdict["allowed"] and "ownerReferences" in pod["metadata"] and filtered["FailedNodes"], (
                    i, pod["metadata"]["annotations"][MESSAGE], filtered)
                waiting += 1
            unoffered = {n: r for n, r in filtered["FailedAndUnresolvableNodes"].items()
                         if r.startswith(("taint ", "cordoned", "no AMX", "nodeSelector", "required node affinity"))}
            for reason in unoffered.values():
                kind = reason.split(" ")[0]
                why[kind] = why.get(kind, 0) + 1
            if not verdict["allowed"] and len(unoffered) == len(names):
                # Refused because kube-scheduler offers it nothing: the refusal says so, with the reasons.
                assert verdict["status"]["message"].count("kube-scheduler would offer it none of the 9 nodes"), message
                pinned = [r for r in unoffered.values() if "metadata.name In" not in r]  # a pin is named last
                assert max(pinned or unoffered.values(), key=list(unoffered.values()).count) in message, message
            tolerated += any(n in demo.nodes and demo.nodes[n].taints for n in feasible)
            admitted += verdict["allowed"] and not waits
            refused += not verdict["allowed"]
    # Every answer occurred often enough for the agreement to mean something.
    print(f"agreement ({fleet}): {admitted} admitted, {waiting} admitted to wait, {refused} refused, all matching "
          f"/filter; not offered: {why}; {tolerated} admitted with a tainted node feasible")
    # The tainted fleet offers few nodes (and on mixed SMT widths a pod is pinned to one width): an eighth each.
    assert admitted > CASES // 8 and refused > CASES // 8 and waiting > CASES // 20, (admitted, refused, waiting)
    assert why.get("no", 0) > 0  # "no AMX": cpu-icx, for every pod that requires it
    if fleet == "tainted":
        assert why.get("taint", 0) > CASES and why.get("cordoned", 0) > 0 and tolerated > 0, (why, tolerated)
