"""No verdicts from a half-listed cluster: the extender process, started against an apiserver whose pod list has
not finished, refuses every verb with a reason (kube-scheduler calls the sidecar whatever its readiness says),
then answers normally once every kind is listed."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import urllib3

from tests.support.extender import args_nodecache, bind_args, model_pod
from tests.support.fakeapi import FakeApiServer, kubeconfig
from tests.support.process import ServerProcess

NODES = ["cpu-a1", "cpu-a2", "cpu-full"]


def post(http: urllib3.PoolManager, url: str, body: bytes) -> tuple[int, Any]:
    resp = http.request("POST", url, body=body, headers={"Content-Type": "application/json"}, timeout=10)
    return resp.status, json.loads(resp.data)


def metric(http: urllib3.PoolManager, base: str, verb: str) -> float:
    text = http.request("GET", f"{base}/metrics").data.decode()
    prefix = f'model_placement_extender_unsynced_answers_total{{verb="{verb}"}} '
    return sum(float(line[len(prefix):]) for line in text.splitlines() if line.startswith(prefix))


def test_every_verb_refuses_until_the_pod_list_is_in_then_answers(fake_demo: FakeApiServer, tmp_path: Path) -> None:
    pod = fake_demo.add("Pod", model_pod("gate-0", tp=2, cpus=16))
    fake_demo.hold_lists("Pod")
    proc = ServerProcess(["extender", "--kubeconfig", str(kubeconfig(tmp_path, fake_demo.url)), "--insecure-http",
                          "--host", "127.0.0.1", "--port", "0", "--drain-seconds", "0"])
    http = urllib3.PoolManager()
    base = proc.url
    try:
        # Nodes and policies are listed by now, pods are not: every node would look emptier than it is.
        deadline = time.monotonic() + 20
        while not any(n["node"] == "cpu-a2"
                      for n in json.loads(http.request("GET", f"{base}/debug/nodes").data)["nodes"]):
            assert time.monotonic() < deadline, proc.lines[-5:]
            time.sleep(0.05)
        assert http.request("GET", f"{base}/readyz").status == 503

        status, answer = post(http, f"{base}/filter", args_nodecache(pod, NODES))
        assert status == 200 and answer["NodeNames"] is None and answer["FailedNodes"] is None
        assert "has not finished listing Pod" in answer["Error"] and "retries" in answer["Error"]
        status, answer = post(http, f"{base}/bind", bind_args(pod, "cpu-a1"))
        assert status == 200 and "has not finished listing Pod" in answer["Error"]
        assert fake_demo.get("Pod", "gate-0", "llm-inference")["spec"].get("nodeName") is None  # nothing was bound
        status, answer = post(http, f"{base}/prioritize", args_nodecache(pod, NODES))
        assert status == 503 and "has not finished listing Pod" in answer["Error"]
        status, answer = post(http, f"{base}/preempt", b'{"Pod":' + json.dumps(pod).encode()
                              + b',"NodeNameToVictims":null,"NodeNameToMetaVictims":{}}')
        assert status == 503 and "has not finished listing Pod" in answer["Error"]
        assert metric(http, base, "filter") == 1 and metric(http, base, "bind") == 1
        # The server's log is read from its stderr by a thread of ours: the last line may not be in yet.
        deadline = time.monotonic() + 20
        while len(proc.logged("not synced")) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        refusals = proc.logged("not synced")
        assert [e["verb"] for e in refusals] == ["filter", "bind", "prioritize", "preempt"]
        assert all(e["kind"] == "Pod" and e["level"] == "warning" for e in refusals)

        fake_demo.release_lists("Pod")
        deadline = time.monotonic() + 20
        while http.request("GET", f"{base}/readyz").status != 200:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        status, answer = post(http, f"{base}/filter", args_nodecache(pod, NODES))
        # Now the demo's pods are counted: cpu-full is full, and says so, per node.
        assert status == 200 and answer["Error"] == "" and answer["NodeNames"] == ["cpu-a1", "cpu-a2"]
        assert list(answer["FailedNodes"]) == ["cpu-full"]
        status, answer = post(http, f"{base}/bind", bind_args(pod, "cpu-a2"))
        assert (status, answer) == (200, {"Error": ""})
        assert fake_demo.get("Pod", "gate-0", "llm-inference")["spec"]["nodeName"] == "cpu-a2"
        assert metric(http, base, "filter") == 1  # no refusal since
    finally:
        fake_demo.release_lists("Pod")
        proc.stop()
    assert proc.problems() == []
