"""A model pod /filter turned away for want of room now is asked to be retried once the extender's own watch shows
the room: the extender writes its CoresFree condition into the pod's status (the update that requeues it in
kube-scheduler, which otherwise waits up to five minutes when its informer saw the room before ours did). Run as an
operator runs it: `serve --kubeconfig` against the fake apiserver, which the watch follows."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import urllib3

from extender.waiting import CONDITION
from server.sources import demo_text, load_objects
from tests.support.extender import aligning_nothing, args_nodecache, kubelet_static_pod, model_pod
from tests.support.fakeapi import FakeApiServer, kubeconfig
from tests.support.placed import bound_by_us
from tests.support.process import ServerProcess


@pytest.fixture
def fake() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        for obj in bound_by_us(load_objects(demo_text())):
            server.add(obj["kind"], obj)
        yield server


def serve(fake: FakeApiServer, tmp_path: Path, env: dict[str, str] | None = None) -> ServerProcess:
    """`serve --kubeconfig` against `fake`, once it answers /readyz."""
    server = ServerProcess(["serve", "--kubeconfig", str(kubeconfig(tmp_path, fake.url)), "--insecure-http",
                            "--host", "127.0.0.1", "--port", "0", "--drain-seconds", "0"], env=env)
    http = urllib3.PoolManager()
    deadline = time.monotonic() + 30
    while http.request("GET", f"{server.url}/readyz").status != 200 and time.monotonic() < deadline:
        time.sleep(0.05)
    return server


def patched(fake: FakeApiServer) -> dict[str, list[dict[str, Any]]]:
    return {name: conditions for name, conditions in fake.status_patches}


def test_a_pod_refused_for_room_now_is_asked_to_be_retried_once_the_watch_shows_the_room(
        fake: FakeApiServer, tmp_path: Path) -> None:
    server = serve(fake, tmp_path)
    http = urllib3.PoolManager()
    try:
        deadline = time.monotonic() + 30
        # cpu-full has 3 and 1 free cores on its NUMA nodes: two replicas of a 16-core model wait, and a pod no
        # node of that shape can ever hold is turned away for good.
        first, second = (fake.add("Pod", model_pod(f"wait-{i}", cpus=32)) for i in range(2))
        never = fake.add("Pod", model_pod("never", cpus=200))
        for pod in (first, second, never):
            answer = http.request("POST", f"{server.url}/filter", body=args_nodecache(pod, ["cpu-full"]),
                                  headers={"Content-Type": "application/json"}).json()
            assert answer["NodeNames"] == [], answer
        time.sleep(0.5)
        assert fake.status_patches == []  # nothing changed: nobody is asked to retry
        # One of qwen-14b's pods leaves (22 cores on one NUMA node): room for one replica, not two.
        fake.delete("Pod", "qwen-14b-predictor-7f6d5-klmno", "llm")
        while not fake.status_patches and time.monotonic() < deadline + 10:
            time.sleep(0.05)
        time.sleep(0.5)  # a second, wrong, ask would come within the poll interval
        asked = patched(fake)
        assert list(asked) == ["llm-inference/wait-0"], asked  # the oldest waiter, once; never the never-pod
        (condition,) = asked["llm-inference/wait-0"]
        assert condition["type"] == CONDITION and condition["status"] == "True", condition
        assert condition["message"].startswith("the cores it needs are free on cpu-full (NUMA 0:"), condition
        pod = fake.get("Pod", "wait-0", "llm-inference")
        assert pod is not None and [c["type"] for c in pod["status"]["conditions"]] == [CONDITION]
        line = next(e for e in server.lines if e.get("verb") == "retry")
        assert line["pod"] == "llm-inference/wait-0" and line["node"] == "cpu-full" and line["decision"] == "asked"
        assert "model_placement_extender_retries_asked_total{result=\"asked\"} 1.0" in \
            http.request("GET", f"{server.url}/metrics").data.decode()
        assert not server.problems(), server.problems()
    finally:
        assert server.stop() == 0


def test_a_pod_waiting_for_a_numa_local_node_is_asked_to_be_retried_when_its_wait_is_over(tmp_path: Path) -> None:
    """No event marks the end of a pod's wait for a node that keeps each rank on its own NUMA node: the extender
    asks kube-scheduler to retry it then, or the pod would sit Pending until the scheduler's five-minute flush."""
    with FakeApiServer() as fake:
        # cpu-ks2 under best-effort would run 30 CPUs over two of its NUMA nodes; cpu-ks1 (single-numa-node) has
        # 22 and 24 CPUs free with two pods of 40 running.
        ran = [kubelet_static_pod(name, 40) for name in ("ks-a", "ks-b")]
        for pod in ran:
            pod["spec"]["nodeName"], pod["status"] = "cpu-ks1", {"phase": "Running"}
        for obj in bound_by_us([*aligning_nothing(load_objects(demo_text()), "cpu-ks2"), *ran]):
            fake.add(obj["kind"], obj)
        server = serve(fake, tmp_path, env={"MM_SPLIT_WAIT_SECONDS": "3"})
        http = urllib3.PoolManager()
        try:
            pod = kubelet_static_pod("ks-30", 30)
            pod["metadata"]["creationTimestamp"] = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            pod = fake.add("Pod", pod)

            def filtered() -> list[str]:
                answer = http.request("POST", f"{server.url}/filter", body=args_nodecache(pod, ["cpu-ks1", "cpu-ks2"]),
                                      headers={"Content-Type": "application/json"}).json()
                return list(answer["NodeNames"])

            assert filtered() == []
            asked_at = time.monotonic()
            while not fake.status_patches and time.monotonic() < asked_at + 15:
                time.sleep(0.05)
            (condition,) = patched(fake)["llm-inference/ks-30"]
            assert condition["message"].startswith("the cores it needs are free on cpu-ks2"), condition
            assert 1 < time.monotonic() - asked_at < 10  # when its wait ended, not at once and not at the flush
            assert filtered() == ["cpu-ks2"]
            assert not server.problems(), server.problems()
        finally:
            assert server.stop() == 0
