"""/bind connected to a cluster (the fake apiserver): cores assumed before the API call and released
when it fails; the pod read from the API when /filter did not see it; concurrent binds race only in the
ledger, never at the apiserver."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from kubernetes import client

from tests.support.extender import Ext, MakeExt, model_pod, pair, plain_pod
from tests.support.fakeapi import FakeApiServer

Obj = dict[str, Any]


@pytest.fixture
async def connected(make_ext: MakeExt, demo_objects: list[Obj], api: client.ApiClient) -> Ext:
    return await make_ext(demo_objects, api_client=api)  # type: ignore[no-any-return]


def holders(ext: Ext, node: str) -> list[tuple[str, bool]]:
    ledger = ext.cluster.ledger(node)
    assert ledger is not None
    return sorted((h.pod, h.assumed) for h in ledger.holdings.values() if h.pod.startswith("llm-inference/"))


async def test_bind_goes_through_the_api_after_the_cores_are_assumed(connected: Ext, fake: FakeApiServer) -> None:
    pod = fake.add("Pod", model_pod())
    assert (await connected.filter(pod, ["cpu-a1"]))["NodeNames"] == ["cpu-a1"]
    seen_during_call: list[list[tuple[str, bool]]] = []
    original = fake._bind

    async def spy(request: Any, namespace: str, name: str) -> Any:
        seen_during_call.append(holders(connected, "cpu-a1"))  # the extender's loop is idle, awaiting us
        return await original(request, namespace, name)

    fake._bind = spy  # type: ignore[method-assign]
    assert await connected.bind(pod, "cpu-a1") == ""
    assert seen_during_call == [[("llm-inference/qwen3-0-6b-predictor-7d9f8c6b5-x2k9q", True)]]
    assert fake.get("Pod", pod["metadata"]["name"], "llm-inference")["spec"]["nodeName"] == "cpu-a1"
    assert holders(connected, "cpu-a1") == [("llm-inference/qwen3-0-6b-predictor-7d9f8c6b5-x2k9q", True)]


async def test_a_failed_api_binding_releases_the_cores_and_answers_the_apiservers_message(
        connected: Ext, fake: FakeApiServer) -> None:
    pod = model_pod()  # filtered, but the apiserver has no such pod: 404
    free = connected.cluster.ledger("cpu-a1").free()  # type: ignore[union-attr]
    await connected.filter(pod, ["cpu-a1"])
    error = await connected.bind(pod, "cpu-a1")
    assert 'pods "qwen3-0-6b-predictor-7d9f8c6b5-x2k9q" not found' in error and "404" in error
    assert connected.cluster.ledger("cpu-a1").free() == free and holders(connected, "cpu-a1") == []  # type: ignore[union-attr]
    assert connected.cluster.pods.get(pod["metadata"]["uid"]) is None
    # 409 from the apiserver: someone else bound it meanwhile.
    other = model_pod("bound-elsewhere")
    other["spec"]["nodeName"] = "cpu-a2"
    fake.add("Pod", other)
    await connected.filter(other, ["cpu-a1"])
    error = await connected.bind(other, "cpu-a1")
    assert "409 Conflict" in error and 'is already assigned to node "cpu-a2"' in error
    assert holders(connected, "cpu-a1") == []


async def test_a_pod_not_seen_at_filter_is_read_from_the_api(connected: Ext, fake: FakeApiServer) -> None:
    pod = fake.add("Pod", model_pod("direct", tp=2, cpus=32))
    assert await connected.bind(pod, "cpu-a1") == ""
    assert holders(connected, "cpu-a1") == [("llm-inference/direct", True)]
    assert [c for n in connected.cluster.ledger("cpu-a1").to_json()["numa"] for c in [n["free"]]] == [21, 21]  # type: ignore[union-attr]
    gone = model_pod("gone")
    assert 'cannot read pod llm-inference/gone' in await connected.bind(gone, "cpu-a1")
    recreated = fake.add("Pod", model_pod("recreated", uid="uid-new"))
    stale = dict(recreated, metadata=dict(recreated["metadata"], uid="uid-old"))
    assert "it was re-created" in await connected.bind(stale, "cpu-a1")


async def test_non_model_pods_are_bound_without_touching_cores(connected: Ext, fake: FakeApiServer) -> None:
    pod = fake.add("Pod", plain_pod())
    await connected.filter(pod, ["cpu-a1"])
    assert await connected.bind(pod, "cpu-a1") == ""
    assert fake.get("Pod", pod["metadata"]["name"], "shop")["spec"]["nodeName"] == "cpu-a1"
    assert holders(connected, "cpu-a1") == []


async def test_concurrent_binds_reach_the_apiserver_once(connected: Ext, fake: FakeApiServer) -> None:
    a, b = (fake.add("Pod", p) for p in pair())
    await asyncio.gather(connected.filter(a, ["cpu-a1"]), connected.filter(b, ["cpu-a1"]))
    calls: list[str] = []
    gate = threading.Event()
    original = fake._bind

    async def slow(request: Any, namespace: str, name: str) -> Any:
        calls.append(name)
        await asyncio.get_running_loop().run_in_executor(None, gate.wait, 5)
        return await original(request, namespace, name)

    fake._bind = slow  # type: ignore[method-assign]
    binds = asyncio.gather(connected.bind(a, "cpu-a1"), connected.bind(b, "cpu-a1"))
    await asyncio.sleep(0.3)  # the first is parked at the apiserver, holding its assumed cores
    gate.set()
    errors = await binds
    assert sorted(bool(e) for e in errors) == [False, True] and len(calls) == 1
    winner = "first" if not errors[0] else "second"
    assert fake.get("Pod", winner, "llm-inference")["spec"]["nodeName"] == "cpu-a1"
    assert holders(connected, "cpu-a1") == [(f"llm-inference/{winner}", True)]


def test_pods_kept_for_bind_are_bounded() -> None:
    from extender import filter as flt
    from placement.cluster import ClusterState
    from placement.config import Settings

    judge = flt.Judge(ClusterState(Settings()))
    for i in range(flt.MAX_PODS + 10):
        judge.read_pod(plain_pod(f"p-{i}"))
    assert judge.seen("uid-p-0") is None and judge.seen(f"uid-p-{flt.MAX_PODS + 9}") is not None
    assert len(judge._pods) == flt.MAX_PODS
