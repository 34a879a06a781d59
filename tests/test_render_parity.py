"""`render` is the server's dry run: 50 pods, valid and invalid, rendered by the console script and sent to a
running `serve` as the apiserver sends them (/mutate, its patch applied by the reference RFC 6902 library,
/validate of the patched pod, then /filter over every node and /prioritize over those that pass). Verdicts,
patches, messages, warnings and node verdicts must be identical, the nodes render says kube-scheduler would not
offer included: on the demo fleet and on the demo fleet with taints and a cordon."""

from __future__ import annotations

import base64
import copy
import http.client
import json
import random
import subprocess
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
import yaml

from tests.support.payloads import TOLERATIONS, tainted
from tests.support.process import ROOT, ServerProcess, command

DEMO = ROOT / "placement/demo/cluster.yaml"
TP1 = ROOT / "examples/kserve-tp1-pod.yaml"


def pods(count: int = 50, seed: int = 15) -> list[dict[str, Any]]:
    """Model pods with every kind of input the webhook judges, right and wrong, and a few non-model pods."""
    rng = random.Random(seed)
    tolerating = random.Random(seed + 1)  # its own stream: the other inputs stay as they were
    base = yaml.safe_load(TP1.read_text())
    out = []
    for i in range(count):
        pod = copy.deepcopy(base)
        meta, container = pod["metadata"], pod["spec"]["containers"][0]
        meta.pop("generateName")
        meta["name"] = f"parity-{i:02d}"
        ann = meta.setdefault("annotations", {})
        ann["model-manager.io/tensor-parallel-size"] = rng.choice(["1", "1", "2", "2", "4", "8", "3", "zero"])
        cpu = rng.choice(["8", "16", "24", "32", "64", "500m", "abc", None])
        resources: dict[str, Any] = {"requests": {"memory": "64Gi"}, "limits": {"memory": "64Gi"}}
        if cpu is not None:
            resources["requests"]["cpu"] = resources["limits"]["cpu"] = cpu
        if rng.random() < 0.15:
            resources = {"requests": {"cpu": cpu or "8"}}  # no memory: kubelet-static refuses it
        container["resources"] = resources
        policy = rng.choice([None, None, "kubelet-static", "best-effort", "nri-balloons", "fastest"])
        if policy:
            ann["model-manager.io/cpu-policy"] = policy
        if rng.random() < 0.2:
            ann["model-manager.io/require-amx"] = rng.choice(["false", "true", "maybe"])
        if rng.random() < 0.1:
            ann["model-manager.io/nri-balloon"] = rng.choice(["vllm-balloon-tp1", "no-such-balloon"])
        if rng.random() < 0.1:
            ann["model-manager.io/preflight"] = rng.choice(["warn", "skip"])
        if rng.random() < 0.08:
            meta["namespace"] = "kube-system"
        if rng.random() < 0.1:
            meta["labels"] = {"app": "not-a-model"}
        if tolerating.random() < 0.4:
            pod["spec"]["tolerations"] = copy.deepcopy(tolerating.choice(TOLERATIONS))
        if tolerating.random() < 0.2:
            ann["model-manager.io/node"] = tolerating.choice(["cpu-a1", "cpu-b1", "cpu-icx"])
        out.append(pod)
    return out


def review(obj: dict[str, Any], uid: str) -> dict[str, Any]:
    """What kube-apiserver sends for `kubectl create` of a pod (admission.k8s.io/v1)."""
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": uid, "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
        "requestResource": {"group": "", "version": "v1", "resource": "pods"},
        "name": obj["metadata"]["name"], "namespace": obj["metadata"]["namespace"], "operation": "CREATE",
        "userInfo": {"username": "kubernetes-admin", "groups": ["system:masters"]},
        "object": obj, "oldObject": None, "dryRun": False,
        "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"}}}


def post(conn: http.client.HTTPConnection, path: str, body: Any) -> Any:
    conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    data = resp.read()
    assert resp.status == 200, data
    return json.loads(data)


@pytest.mark.parametrize("fleet", ["demo", "tainted"])
def test_render_and_the_server_agree_on_50_pods(fleet: str, tmp_path: Path) -> None:
    sent = pods()
    manifest = tmp_path / "pods.yaml"
    manifest.write_text(yaml.safe_dump_all(sent, sort_keys=False))  # kubectl keeps the order it read
    cluster = DEMO
    if fleet == "tainted":
        cluster = tmp_path / "tainted.yaml"
        demo = yaml.safe_load(DEMO.read_text())
        cluster.write_text(yaml.safe_dump({**demo, "items": tainted(demo["items"])}))
    out = subprocess.run([*command(), "render", str(manifest), "--cluster", str(cluster), "-o", "json"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode in (0, 3) and "Traceback" not in out.stderr, out.stderr
    rendered = json.loads(out.stdout)
    assert len(rendered) == len(sent)

    server = ServerProcess(["serve", "--insecure-http", "--host", "127.0.0.1", "--port", "0",
                            "--cluster", str(cluster)])
    verdicts = set()
    unoffered = set()
    try:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        for i, (pod, entry) in enumerate(zip(sent, rendered)):
            mutated = post(conn, "/mutate", review(pod, f"m-{i}"))["response"]
            ops = json.loads(base64.b64decode(mutated["patch"])) if "patch" in mutated else []
            assert entry["patch"] == ops, pod["metadata"]
            assert entry["mutation"]["warnings"] == mutated.get("warnings", [])
            patched = jsonpatch.apply_patch(pod, ops)
            assert entry["mutated"] == patched
            validated = post(conn, "/validate", review(patched, f"v-{i}"))["response"]
            verdict = entry["verdict"]
            assert verdict["allowed"] == validated["allowed"], (pod["metadata"], verdict, validated)
            assert verdict["message"] == validated.get("status", {}).get("message", "")
            assert verdict["warnings"] == validated.get("warnings", [])
            verdicts.add((verdict["allowed"], verdict["reason"]))
            assert out.returncode == 3 or verdict["allowed"]
            if "ranking" not in entry:
                continue
            every = sorted(r["node"] for r in entry["ranking"]) + [f["node"] for f in entry["filtered"]] + \
                [x["node"] for x in entry["excluded"]]
            assert len(set(every)) == len(every) == 9  # each node once: ranked, filtered or not offered
            args = {"Pod": patched, "Nodes": None, "NodeNames": every}
            filtered = post(conn, "/filter", args)
            assert sorted(filtered["NodeNames"]) == sorted(r["node"] for r in entry["ranking"])
            assert filtered["FailedNodes"] | filtered["FailedAndUnresolvableNodes"] == \
                {f["node"]: f["reason"] for f in entry["filtered"] + entry["excluded"]}
            unoffered |= {x["reason"].split(" ")[0] for x in entry["excluded"]}
            # Admitted but offered no node by kube-scheduler (warn, skip): render refuses it all the same.
            if not entry["ranking"] and not entry["filtered"]:
                assert entry["exit"] == 3 and out.returncode == 3
            prioritized = post(conn, "/prioritize", {**args, "NodeNames": filtered["NodeNames"]})
            scores = {h["Host"]: h["Score"] for h in prioritized}
            # render shows each node's own score; /prioritize lowers them all by the lowest, leaving out the nodes at 0.
            floor = min((r["score"] for r in entry["ranking"]), default=0)
            assert scores == {r["node"]: r["score"] - floor for r in entry["ranking"] if r["score"] > floor}
    finally:
        assert server.stop() == 0
    # The 50 pods reach every kind of answer: admitted, refused by several checks, left alone.
    assert {allowed for allowed, _ in verdicts} == {True, False}
    assert len({reason for allowed, reason in verdicts if not allowed}) >= 4, verdicts
    assert any(reason.startswith("not-model") or reason == "protected-namespace" for _, reason in verdicts), verdicts
    assert "no" in unoffered  # no AMX on cpu-icx
    if fleet == "tainted":
        assert {"taint", "cordoned"} <= unoffered, unoffered
        assert "no-eligible-node" in {reason for allowed, reason in verdicts if not allowed}, verdicts
