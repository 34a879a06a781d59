"""The scheduler extender as kube-scheduler calls it: ExtenderArgs as Go marshals them, the pods the tests send,
and `Ext`, our extender app over TLS (the `make_ext` and `ext` fixtures in tests/conftest.py serve one)."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import aiohttp

from placement.cluster import ClusterState
from tests.support.payloads import fixture_json
from tests.support.servers import Served

FILTER_KEYS = {"Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"}


DEMO_NODES = ["cpu-a1", "cpu-a2", "cpu-b1", "cpu-full", "cpu-icx", "cpu-ks1", "cpu-ks2", "cpu-nosmt", "cpu-snc4"]


TP_ANN = "cpu-policy.model-manager.io/tensor-parallel-size"


BALLOON_ANN = "balloon.balloons.resource-policy.nri.io/container.main"


Obj = dict[str, Any]


def go_json(value: Any) -> str:
    """What Go's json.Marshal writes for our test values: compact, field order as declared."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def added(answer: list[Obj], names: list[str]) -> dict[str, int]:
    """What kube-scheduler adds to each candidate from a HostPriorityList (schedule_one.go prioritizeNodes): the
    listed score, nothing for a node left out. The answer must list only candidates, in their order, once."""
    hosts = [h["Host"] for h in answer]
    assert hosts == [n for n in names if n in set(hosts)], (hosts, names)
    return {n: 0 for n in names} | {h["Host"]: h["Score"] for h in answer}


def args_nodecache(pod: Obj, names: list[str]) -> bytes:
    """ExtenderArgs with nodeCacheCapable: true. No json tags: PascalCase keys, nil *NodeList is null."""
    return f'{{"Pod":{go_json(pod)},"Nodes":null,"NodeNames":{go_json(names)}}}'.encode()


def args_nodelist(pod: Obj, nodes: list[Obj]) -> bytes:
    """ExtenderArgs with nodeCacheCapable: false: a v1.NodeList of full Node objects, nil NodeNames is null."""
    return f'{{"Pod":{go_json(pod)},"Nodes":{go_json({"metadata": {}, "items": nodes})},"NodeNames":null}}'.encode()


def bind_args(pod: Obj, node: str) -> bytes:
    meta = pod["metadata"]
    return (f'{{"PodName":{go_json(meta["name"])},"PodNamespace":{go_json(meta["namespace"])},'
            f'"PodUID":{go_json(meta["uid"])},"Node":{go_json(node)}}}').encode()


def model_pod(name: str = "qwen3-0-6b-predictor-7d9f8c6b5-x2k9q", *, tp: int = 1, cpus: int = 8,
              balloon: str | None = None, uid: str | None = None, **annotations: str) -> Obj:
    """The fixture's KServe predictor pod (as the webhook left it), with its name, TP and CPUs changed."""
    pod = copy.deepcopy(fixture_json("extender-args-nodecache.json")["Pod"])
    meta = pod["metadata"]
    meta["name"] = name
    meta["uid"] = uid or f"uid-{name}"
    meta["annotations"][TP_ANN] = str(tp)
    meta["annotations"][BALLOON_ANN] = balloon or f"vllm-balloon-tp{tp}"
    meta["annotations"].update(annotations)
    main = pod["spec"]["containers"][0]
    main["resources"] = {"requests": {"cpu": str(cpus), "memory": "64Gi"},
                         "limits": {"cpu": str(cpus), "memory": "64Gi"}}
    return pod


def kubelet_static_pod(name: str, cpus: int) -> Obj:
    """The fixture's pod as the webhook leaves a kubelet-static one: Guaranteed, no balloon annotation."""
    pod = model_pod(name, cpus=cpus)
    annotations = pod["metadata"]["annotations"]
    del annotations[BALLOON_ANN]
    annotations["cpu-policy.model-manager.io/type"] = "kubelet-static"
    return pod


def aligning_nothing(objects: list[Obj], node: str) -> list[Obj]:
    """`objects` with `node`'s NodeResourceTopology announcing Topology Manager best-effort: its kubelet admits what
    it cannot align, over as many NUMA nodes as it takes."""
    objects = copy.deepcopy(objects)
    nrt = next(o for o in objects if o["kind"] == "NodeResourceTopology" and o["metadata"]["name"] == node)
    nrt["topologyPolicies"] = ["BestEffortContainerLevel"]
    next(a for a in nrt["attributes"] if a["name"] == "topologyManagerPolicy")["value"] = "best-effort"
    return objects


def plain_pod(name: str = "web-5d8f7c6b9-abcde") -> Obj:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "shop", "uid": f"uid-{name}", "labels": {"app": "web"}},
            "spec": {"containers": [{"name": "web", "image": "nginx", "resources": {"requests": {"cpu": "500m"}}}]},
            "status": {}}


class Ext:
    """Our extender app over TLS, and the calls kube-scheduler makes."""

    def __init__(self, served: Served, session: aiohttp.ClientSession) -> None:
        self.served = served
        self.session = session

    @property
    def cluster(self) -> ClusterState:
        return self.served.runtime.cluster

    async def raw(self, path: str, body: bytes, content_type: str | None = "application/json",
                  method: str = "POST") -> tuple[int, Any]:
        headers = {"Content-Type": content_type} if content_type else {}
        async with self.session.request(method, self.served.url + path, data=body, headers=headers,
                                        **self.served.request_kwargs()) as resp:  # type: ignore[arg-type]
            assert resp.content_type == "application/json"
            return resp.status, json.loads(await resp.read())

    async def ok(self, path: str, body: bytes) -> Any:
        status, answer = await self.raw(path, body)
        assert status == 200, answer
        return answer

    async def filter(self, pod: Obj, names: list[str]) -> Obj:
        return await self.ok("/filter", args_nodecache(pod, names))  # type: ignore[no-any-return]

    async def prioritize(self, pod: Obj, names: list[str]) -> dict[str, int]:
        """The score kube-scheduler adds to each of `names` from our answer."""
        return added(await self.ok("/prioritize", args_nodecache(pod, names)), names)

    async def bind(self, pod: Obj, node: str) -> str:
        answer = await self.ok("/bind", bind_args(pod, node))
        assert list(answer) == ["Error"]
        return answer["Error"]  # type: ignore[no-any-return]

    async def get(self, path: str) -> tuple[int, Any]:
        return await self.raw(path, b"", None, "GET")


MakeExt = Callable[..., Any]


def pair() -> tuple[Obj, Obj]:
    """Two pods that each fit cpu-a1 (29 free cores per NUMA node) alone, but not together."""
    return model_pod("first", tp=2, cpus=80), model_pod("second", tp=2, cpus=80)  # 20 cores per NUMA node each
