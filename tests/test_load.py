"""Load on loopback: 3,000 mixed requests at 64 concurrency against `model-placement serve` (a real
subprocess, TLS, cluster state from the fake apiserver through the real KubeSource), while the serving
certificate rotates three times (kubelet's `..data` symlink swap, reload polled every 0.2 s) and the watch
source drops twice (the second time with the history compacted, so the watches must relist).

Each of 600 pending model pods goes through what the apiserver and the scheduler do with it: /mutate,
/validate, /filter over the 12 nodes, /prioritize over the nodes that passed, /bind to the best one (the binding
goes through the fake apiserver). 64 pods are in flight at once, so binds race for the same cores, and the
fleet holds only about a third of what is asked for. A pod /validate refuses still goes on to the extender,
as a pod admitted before the fleet filled up would: the extender must not rely on admission.

Asserted: zero errors (every answer 200 and well-formed), zero double allocations (no NUMA node's holdings
exceed its capacity; every pod whose bind succeeded holds exactly its footprint, once, on the node the fake
apiserver recorded; every refused pod holds nothing and is unbound), the state converged after the drops
(objects added and deleted while the watches were down are seen), every rotation reached new connections,
no error in the server's log, and a clean exit on SIGTERM. Duration and throughput are printed.
`MP_LOAD_REQUESTS` changes the request count (a multiple of 5; the fleet grows with it, one node per 250 requests,
so that it always holds about a third of what is asked: `MP_LOAD_REQUESTS=10000` is the 40-node run this test made
before it was cut to a CI-sized one, 130 s on this 2-core machine).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import ssl
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from cryptography.hazmat.primitives.serialization import Encoding

from certs import Issued, make_ca, make_serving_cert
from placement.cluster import ClusterState
from placement.config import Settings
from placement.mutation import mutate_pod
from tests.support.extender import FILTER_KEYS
from tests.support.fakeapi import FakeApiServer, balloons_policy_obj, kubeconfig, node_obj, nrt_obj, pod_obj
from tests.support.placed import bound_by_us
from tests.support.process import ServerProcess
from tests.support.servers import NAMESPACE, SERVER_NAME, SERVICE
from tests.support.tls import client_context, handshakes
from tests.support.webhook import Answer, pod_review

REQUESTS = int(os.environ.get("MP_LOAD_REQUESTS", "3000"))
CONCURRENCY = 64
NODES = [f"node-{i:02d}" for i in range(max(4, REQUESTS // 250))]
MODEL_NS = "llm"
FOOTPRINT = {1: 2, 2: 4}  # TP -> cpu: N as written: N cores (the webhook requests 2N CPUs on these SMT-2 nodes)

Obj = dict[str, Any]


# ------------------------------------------------------------------------------------------- the fleet


def pending_pods(n: int) -> list[Obj]:
    pods = []
    for i in range(n):
        tp = 1 + i % 2
        # Replicas of five models (admission counts a model's own pods as free: a rolling update), and
        # one-off models, which /validate refuses once nothing fits.
        model = f"llama-{i % 5}" if i % 4 else f"solo-{i}"
        pod = pod_obj(f"load-{i:05d}", namespace=MODEL_NS, model=model, tp=tp, cpu=str(FOOTPRINT[tp]),
                      memory="16Gi", created=10_000 + i)
        pod["metadata"]["uid"] = f"load-uid-{i:05d}"
        pods.append(pod)
    return pods


def seed(fake: FakeApiServer, pods: list[Obj]) -> list[Obj]:
    """Two-socket nodes (62 model cores each after 2 reserved), a model pod and a web pod running on
    each, and the pending pods. Returns the running model pods."""
    fleet = [node_obj(n) for n in NODES] + [nrt_obj(n) for n in NODES] + [balloons_policy_obj()]
    fake.load("Node", fleet[:len(NODES)])
    fake.load("NodeResourceTopology", fleet[len(NODES):-1])
    fake.load("BalloonsPolicy", fleet[-1:])
    # Bound by our extender before this process started: each carries its recorded placement.
    running = bound_by_us([*fleet, *(pod_obj(f"serving-{i:02d}-7c9d8f6b5d-abcde", namespace=MODEL_NS, node=n,
                                             model="qwen", tp=2, cpu="8", memory="32Gi", created=i)
                                     for i, n in enumerate(NODES))])[len(fleet):]
    web = [pod_obj(f"web-{i:02d}-5d8f7c6b9-fghij", namespace="shop", node=n, created=i) for i, n in enumerate(NODES)]
    # The apiserver stores each pending pod as our mutating webhook left it (the load sends /mutate the pod as written).
    state = ClusterState.from_objects([*fleet, *running, *web], Settings())
    fake.load("Pod", running + web + [mutate_pod(p, state, MODEL_NS).pod for p in pods])
    return running


# ------------------------------------------------------------------------------------------- certificates


class SecretVolume:
    """A kubelet-style secret volume: tls.crt/tls.key are links through `..data`, swapped atomically."""

    def __init__(self, root: Path, ca: Issued) -> None:
        self.root, self.ca, self.version = root, ca, 0
        root.mkdir(parents=True)
        self.fingerprints = [self._write()]
        for name in ("tls.crt", "tls.key"):
            os.symlink(f"..data/{name}", root / name)
        os.symlink("..v0", root / "..data")

    def _write(self) -> str:
        leaf = make_serving_cert(self.ca, SERVICE, NAMESPACE, extra_sans=("localhost", "127.0.0.1"))
        out = self.root / f"..v{self.version}"
        out.mkdir()
        (out / "tls.crt").write_bytes(leaf.cert_pem)
        (out / "tls.key").write_bytes(leaf.key_pem)
        return hashlib.sha256(leaf.cert.public_bytes(Encoding.DER)).hexdigest()

    def rotate(self) -> str:
        self.version += 1
        self.fingerprints.append(self._write())
        os.symlink(f"..v{self.version}", self.root / "..data_tmp")
        os.replace(self.root / "..data_tmp", self.root / "..data")
        return self.fingerprints[-1]


async def presented(port: int, ctx: ssl.SSLContext) -> str:
    """The fingerprint of the certificate a new connection is served."""
    _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx, server_hostname=SERVER_NAME)
    der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    writer.close()
    return hashlib.sha256(der).hexdigest()


# ------------------------------------------------------------------------------------------- the server


# ------------------------------------------------------------------------------------------- the load


class Load:
    def __init__(self, base: str, ctx: ssl.SSLContext, session: aiohttp.ClientSession) -> None:
        self.base, self.ctx, self.session = base, ctx, session
        self.done = 0
        self.errors: list[str] = []
        self.by_verb: Counter[str] = Counter()
        self.bound: dict[str, str] = {}  # uid -> node, bind answered ""
        self.refused: dict[str, str] = {}  # uid -> why (no node passed, or the bind's Error)
        self.denied = 0  # /validate refusals (the fleet fills up)

    async def post(self, verb: str, body: bytes) -> tuple[int, str]:
        headers = {"Content-Type": "application/json"}
        if self.done % 16 == 0:  # churn: some connections close, so new handshakes meet the rotations
            headers["Connection"] = "close"
        path = f"/{verb}?timeout=10s" if verb in ("mutate", "validate") else f"/{verb}"
        async with self.session.post(self.base + path, data=body, headers=headers, ssl=self.ctx,
                                     server_hostname=SERVER_NAME) as resp:
            text = await resp.text()
            status = resp.status
        self.done += 1
        self.by_verb[verb] += 1
        return status, text

    async def lifecycle(self, pod: Obj) -> None:
        """One pod as the apiserver and kube-scheduler see it; any deviation is recorded as an error."""
        uid = pod["metadata"]["uid"]
        try:
            sent = pod_review({k: v for k, v in pod.items() if k != "status"}, f"m-{uid}", MODEL_NS)
            status, text = await self.post("mutate", orjson.dumps(sent))
            mutated = Answer(sent, status, "application/json", text, mutating=True)
            assert mutated.allowed and mutated.ops, text
            sent = pod_review(mutated.pod, f"v-{uid}", MODEL_NS)
            status, text = await self.post("validate", orjson.dumps(sent))
            self.denied += not Answer(sent, status, "application/json", text, mutating=False).allowed

            pod = mutated.pod  # what the apiserver stores, and the scheduler sends
            args = orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": NODES})
            status, text = await self.post("filter", args)
            result = json.loads(text)
            assert status == 200 and set(result) == FILTER_KEYS and result["Error"] == "", text
            passed = result["NodeNames"]
            assert set(passed) | set(result["FailedNodes"]) | set(result["FailedAndUnresolvableNodes"]) == set(NODES)
            status, text = await self.post("prioritize", orjson.dumps({"Pod": pod, "Nodes": None,
                                                                       "NodeNames": passed or NODES[:3]}))
            scores = json.loads(text)
            candidates = passed or NODES[:3]
            listed = [h["Host"] for h in scores]
            assert status == 200 and listed == [n for n in candidates if n in set(listed)], text
            assert all(isinstance(h["Score"], int) and 1 <= h["Score"] <= 10 for h in scores), text
            # kube-scheduler binds to the best node (a node left out scores 0); with none passing it would not
            # bind, but a scheduler that binds anyway must be refused, so that case is sent too.
            node = max(scores, key=lambda h: h["Score"])["Host"] if scores else candidates[0]
            meta = pod["metadata"]
            status, text = await self.post("bind", orjson.dumps({
                "PodName": meta["name"], "PodNamespace": meta["namespace"], "PodUID": uid, "Node": node}))
            answer = json.loads(text)
            assert status == 200 and list(answer) == ["Error"] and isinstance(answer["Error"], str), text
            if answer["Error"]:
                self.refused[uid] = answer["Error"]
            else:
                self.bound[uid] = node
        except Exception as exc:
            self.errors.append(f"{uid}: {type(exc).__name__}: {str(exc)[:300]}")


async def chaos(load: Load, fake: FakeApiServer, volume: SecretVolume, port: int, ctx: ssl.SSLContext,
                running: list[Obj]) -> list[str]:
    """Rotations and watch drops at set points of the run; returns what happened, in order."""
    events: list[str] = []

    async def at(fraction: float) -> None:
        while load.done < REQUESTS * fraction:
            await asyncio.sleep(0.01)

    async def rotate() -> None:
        new = await asyncio.to_thread(volume.rotate)
        started = time.monotonic()
        while (seen := await presented(port, ctx)) != new:
            assert time.monotonic() - started < 10, f"rotation {volume.version} not served: still {seen[:12]}"
            await asyncio.sleep(0.05)
        events.append(f"rotation {volume.version} served after {time.monotonic() - started:.2f}s "
                      f"at request {load.done}")

    await at(0.15)
    await rotate()
    await at(0.3)
    dropped = await asyncio.to_thread(fake.drop_watches)
    await asyncio.to_thread(fake.add, "Node", node_obj("late-1", amx=False))  # while the watches are down
    events.append(f"drop 1: {dropped} watches cut mid-line at request {load.done}; node late-1 added")
    await at(0.5)
    await rotate()
    await at(0.6)
    for kind in ("Node", "Pod"):  # their resourceVersion is gone when they come back: they must relist
        await asyncio.to_thread(fake.fail_next_watch, kind)
    dropped = await asyncio.to_thread(fake.drop_watches)
    await asyncio.to_thread(fake.add, "Node", node_obj("late-2", amx=False))
    gone = running[0]["metadata"]
    await asyncio.to_thread(fake.delete, "Pod", gone["name"], gone["namespace"])
    await asyncio.to_thread(fake.compact)
    events.append(f"drop 2: {dropped} watches cut at request {load.done}, Node and Pod watches answered 410 on "
                  f"return, history compacted; node late-2 added, pod {gone['name']} deleted")
    await at(0.8)
    await rotate()
    return events


# ------------------------------------------------------------------------------------------- the test


@pytest.fixture
def fake() -> Iterator[FakeApiServer]:
    with FakeApiServer(record=True) as server:
        yield server


async def debug_nodes(session: aiohttp.ClientSession, base: str, ctx: ssl.SSLContext) -> list[Obj]:
    async with session.get(base + "/debug/nodes", ssl=ctx, server_hostname=SERVER_NAME) as resp:
        assert resp.status == 200
        return (await resp.json())["nodes"]  # type: ignore[no-any-return]


def holdings(nodes: list[Obj]) -> dict[str, list[tuple[str, int, int, bool]]]:
    """uid -> [(node, NUMA id, cores, assumed)], over the whole ledger."""
    out: dict[str, list[tuple[str, int, int, bool]]] = {}
    for node in nodes:
        for numa in node["numa"]:
            for h in numa["held"]:
                out.setdefault(h["uid"], []).append((node["node"], numa["numa"], h["cores"], h["assumed"]))
    return out


async def test_mixed_requests_under_rotation_and_watch_drops(fake: FakeApiServer, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    assert REQUESTS % 5 == 0
    pods = pending_pods(REQUESTS // 5)
    running = seed(fake, pods)
    ca = make_ca("load-test-ca")
    (tmp_path / "ca.crt").write_bytes(ca.cert_pem)
    volume = SecretVolume(tmp_path / "tls", ca)
    server = ServerProcess(["serve", "--kubeconfig", str(kubeconfig(tmp_path, fake.url)),
                     "--tls-cert", str(volume.root / "tls.crt"), "--tls-key", str(volume.root / "tls.key"),
                     "--cert-check-seconds", "0.2", "--host", "127.0.0.1", "--port", "0",
                     "--drain-seconds", "0.2"], env={"POD_NAMESPACE": "model-placement"})
    try:
        base = f"https://127.0.0.1:{server.port}"
        ctx = client_context(tmp_path / "ca.crt")
        connector = aiohttp.TCPConnector(limit=CONCURRENCY)
        async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=30)) as session:
            for _ in range(300):  # ready once every kind is listed
                async with session.get(base + "/readyz", ssl=ctx, server_hostname=SERVER_NAME) as resp:
                    if resp.status == 200:
                        break
                await asyncio.sleep(0.05)
            else:
                raise AssertionError("never ready")

            load = Load(base, ctx, session)
            queue: asyncio.Queue[Obj] = asyncio.Queue()
            for pod in pods:
                queue.put_nowait(pod)

            async def worker() -> None:
                while not queue.empty():
                    await load.lifecycle(queue.get_nowait())

            started = time.perf_counter()
            chaos_task = asyncio.create_task(chaos(load, fake, volume, server.port, client_context(
                tmp_path / "ca.crt"), running))
            await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
            duration = time.perf_counter() - started
            events = await chaos_task

            # Converged: the watches are back, what changed while they were down is seen, every binding
            # the extender made is confirmed by the watch (no assumption left).
            deleted_uid = running[0]["metadata"]["uid"]
            for _ in range(200):
                nodes = await debug_nodes(session, base, ctx)
                held = holdings(nodes)
                names = {n["node"] for n in nodes}
                if {"late-1", "late-2"} <= names and deleted_uid not in held and \
                        not any(a for places in held.values() for *_, a in places):
                    break
                await asyncio.sleep(0.05)
            else:
                raise AssertionError(f"state never converged: nodes {sorted(names)[-3:]}, "
                                     f"assumed {[u for u, p in held.items() if any(a for *_, a in p)][:5]}")
    finally:
        try:
            code = server.stop()
        finally:
            server.kill()

    rate = load.done / duration
    rotations = Counter(handshakes(ctx))
    with capsys.disabled():
        print(f"\nload: {load.done} requests ({dict(load.by_verb)}) at {CONCURRENCY} concurrency in {duration:.1f}s"
              f" = {rate:.0f} req/s; {len(load.bound)} pods bound, {len(load.refused)} refused at /bind, "
              f"{load.denied} denied at /validate; handshakes per certificate: "
              f"{[rotations.get(f, 0) for f in volume.fingerprints]}")
        for line in events:
            print(f"  {line}")

    assert load.errors == [], f"{len(load.errors)} errors, first: {load.errors[:5]}"
    assert load.done == REQUESTS
    assert len(load.bound) + len(load.refused) == len(pods)
    assert load.bound and load.refused  # the fleet filled up: binds raced for the last cores

    # Zero double allocations, against the ledger the extender answers from.
    for node in nodes:
        for numa in node["numa"]:
            assert sum(h["cores"] for h in numa["held"]) <= numa["capacity"] and numa["free"] >= 0, \
                (node["node"], numa["numa"])
    tp_of = {p["metadata"]["uid"]: 1 + i % 2 for i, p in enumerate(pods)}
    for uid, node in load.bound.items():
        places = held.get(uid, [])
        assert {n for n, *_ in places} == {node}, (uid, node, places)
        assert len(places) == tp_of[uid] and len({numa for _, numa, *_ in places}) == tp_of[uid], places
        assert sum(c for _, _, c, _ in places) == FOOTPRINT[tp_of[uid]], (uid, places)
    assert not set(load.refused) & set(held)
    assert [u for u, places in held.items() if len({n for n, *_ in places}) != 1] == []  # one node per pod
    for pod in running[1:]:  # the pods that ran all along are still accounted, where they run
        places = held[pod["metadata"]["uid"]]
        assert {n for n, *_ in places} == {pod["spec"]["nodeName"]} and sum(c for _, _, c, _ in places) == 4

    # ... and against the bindings the (fake) apiserver recorded.
    recorded = {p["metadata"]["uid"]: p["spec"].get("nodeName") for p in
                (fake.get("Pod", p["metadata"]["name"], MODEL_NS) for p in pods) if p is not None}
    assert {u: n for u, n in recorded.items() if n} == load.bound

    # Both drops were real: the Pod watch reconnected, and relisted after the compaction.
    assert len(fake.requests_for("Pod", watch=True)) >= 3
    assert len([q for q in fake.requests_for("Pod", watch=False) if not q.get("continue")]) >= 2
    assert len(events) == 5 and all(rotations.get(f) for f in volume.fingerprints), rotations

    assert server.problems() == []
    assert code == 0
