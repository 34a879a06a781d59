"""KubeSource and kubeapi against a local apiserver stand-in, through the official kubernetes client."""

from __future__ import annotations

import asyncio
import gc
import threading
import time
from collections.abc import Callable
from typing import Any

import orjson
import pytest
from kubernetes import client

from placement.cluster import ClusterState
from placement.config import Settings
from server.kubeapi import AUTH_SECONDS, BindError, KubeApiError, LoopApi, bind_pod, get_json, make_api_client
from server.kubesource import Backoff, BulkLoadGC, KubeSource, list_once
from tests.support.fakeapi import FakeApiServer, balloons_policy_obj, node_obj, nrt_obj, pod_obj, status

Obj = dict[str, Any]


class RecordingSink:
    """Records every call; keeps the current objects per kind by the key ClusterState uses."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, str]] = []  # (kind, "replace"|event, key)
        self.objects: dict[str, dict[str, Obj]] = {}
        self.thread_ids: set[int] = set()

    @staticmethod
    def key(kind: str, obj: Obj) -> str:
        meta = obj["metadata"]
        if kind == "Pod":
            return meta["uid"]
        return f"{meta['namespace']}/{meta['name']}" if meta.get("namespace") else meta["name"]

    def replace(self, kind: str, objects: list[Obj]) -> None:
        self.thread_ids.add(threading.get_ident())
        self.calls.append((kind, "replace", str(len(objects))))
        self.objects[kind] = {self.key(kind, o): o for o in objects}

    def apply(self, kind: str, event: str, obj: Obj) -> None:
        self.thread_ids.add(threading.get_ident())
        key = self.key(kind, obj)
        self.calls.append((kind, event, key))
        if event == "DELETED":
            self.objects[kind].pop(key, None)
        else:
            self.objects[kind][key] = obj

    def names(self, kind: str) -> set[str]:
        return {o["metadata"]["name"] for o in self.objects.get(kind, {}).values()}

    def since(self, n: int, kind: str) -> list[tuple[str, str]]:
        return [(ev, key) for k, ev, key in self.calls[n:] if k == kind]


async def eventually(cond: Callable[[], bool], timeout: float = 5.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)






def seed(fake: FakeApiServer) -> dict[str, Obj]:
    """3 nodes, 7 pods in 3 namespaces (2 model pods), 2 BalloonsPolicies, 3 NRTs."""
    pods = {}
    for i in range(3):
        fake.add("Node", node_obj(f"node-{i}"))
        fake.add("NodeResourceTopology", nrt_obj(f"node-{i}"))
    for i in range(7):
        model = "llama" if i in (1, 4) else None
        pod = fake.add("Pod", pod_obj(f"pod-{i}", namespace=f"ns-{i % 3}", node=f"node-{i % 3}", model=model,
                                      cpu="8" if model else "500m", created=i))
        pods[pod["metadata"]["name"]] = pod
    fake.add("BalloonsPolicy", balloons_policy_obj("default"))
    fake.add("BalloonsPolicy", balloons_policy_obj("node.node-1"))
    return pods


MakeSource = Callable[..., KubeSource]


@pytest.fixture
async def make_source(api: client.ApiClient) -> Any:
    sources: list[KubeSource] = []

    def make(state: Any, **kw: Any) -> KubeSource:
        opts: dict[str, Any] = dict(page_size=3, backoff_base=0.02, backoff_cap=0.2, crd_poll_interval=0.1,
                                    watch_timeout=60, read_timeout=10, tune_gc=False)
        opts.update(kw)
        src = KubeSource(state, api, **opts)
        src.start()
        sources.append(src)
        return src

    yield make
    for src in sources:
        src.stop()


def cluster() -> ClusterState:
    return ClusterState(Settings())


async def synced(fake: FakeApiServer, make_source: MakeSource) -> tuple[ClusterState, KubeSource]:
    """The seeded cluster, listed into a fresh ClusterState."""
    seed(fake)
    state = cluster()
    src = make_source(state)
    assert await src.wait_synced(5)
    return state, src


# ------------------------------------------------------------------------------------------------- sync


async def test_initial_sync_is_paginated_and_complete(fake: FakeApiServer, make_source: MakeSource) -> None:
    pods = seed(fake)
    state = cluster()
    src = make_source(state)
    assert not src.synced
    assert await src.wait_synced(5)
    assert src.synced and sorted(src.synced_kinds()) == sorted(["Node", "Pod", "BalloonsPolicy",
                                                                 "NodeResourceTopology"])
    assert set(state.nodes) == {"node-0", "node-1", "node-2"}
    assert set(state.pods) == {p["metadata"]["uid"] for p in pods.values()}
    assert set(state.policies) == {("kube-system", "default"), ("kube-system", "node.node-1")}
    assert set(state.nrts) == {"node-0", "node-1", "node-2"}
    assert src.objects_listed == {"Node": 3, "Pod": 7, "BalloonsPolicy": 2, "NodeResourceTopology": 3}
    # 7 pods in pages of 3: three requests, the later ones with the continue token of the first
    lists = fake.requests_for("Pod", watch=False)
    assert [q.get("limit") for q in lists] == ["3", "3", "3"]
    assert "continue" not in lists[0] and all("continue" in q for q in lists[1:])
    # and then a watch from the list's resourceVersion, with bookmarks and a server-side timeout
    await eventually(lambda: fake.requests_for("Pod", watch=True), what="pod watch")
    watch = fake.requests_for("Pod", watch=True)[0]
    assert watch["resourceVersion"] == src.resource_versions["Pod"] != ""
    assert watch["allowWatchBookmarks"] == "true" and int(watch["timeoutSeconds"]) >= 60
    # model pods are accounted in the ledger of their node
    ledger = state.ledger("node-1")
    assert ledger is not None and sum(ledger.free()) < sum(cluster_free(fake, "node-1"))


def cluster_free(fake: FakeApiServer, node: str) -> tuple[int, ...]:
    """Free cores per NUMA node of ``node`` with no pods on it."""
    empty = ClusterState(Settings())
    empty.replace("Node", [fake.get("Node", node)])
    ledger = empty.ledger(node)
    assert ledger is not None
    return ledger.free()


async def test_first_list_is_replace_then_added_on_the_loop_thread(fake: FakeApiServer,
                                                                   make_source: MakeSource) -> None:
    seed(fake)
    sink = RecordingSink()
    src = make_source(sink)
    assert await src.wait_synced(5)
    pod_calls = sink.since(0, "Pod")
    assert pod_calls[0] == ("replace", "3") and [ev for ev, _ in pod_calls[1:]] == ["ADDED"] * 4
    assert sink.thread_ids == {threading.get_ident()}  # only ever touched from the loop thread
    assert all("managedFields" not in o["metadata"] for o in sink.objects["Pod"].values())


async def test_converges_after_adds_updates_deletes(fake: FakeApiServer, make_source: MakeSource) -> None:
    pods = seed(fake)
    state = cluster()
    seen: list[tuple[str, str]] = []
    src = make_source(state, on_event=lambda kind, ev, obj: seen.append((kind, ev)))
    assert await src.wait_synced(5)
    applied = dict(src.events_applied)

    new = fake.add("Pod", pod_obj("new-model", namespace="ns-9", model="mistral", cpu="16"))  # pending
    fake.add("Node", node_obj("node-3"))
    moved = dict(pods["pod-0"])
    moved["status"] = dict(moved["status"], phase="Succeeded")
    fake.update("Pod", moved)
    fake.delete("Pod", "pod-2", "ns-2")
    fake.delete("Node", "node-0")
    fake.delete("BalloonsPolicy", "node.node-1", "kube-system")
    fake.add("NodeResourceTopology", nrt_obj("node-3", numa=4, cpus_per_numa=32))
    uid_new = new["metadata"]["uid"]
    uid_0, uid_2 = pods["pod-0"]["metadata"]["uid"], pods["pod-2"]["metadata"]["uid"]

    await eventually(lambda: uid_2 not in state.pods and "node-3" in state.nrts and "node-0" not in state.nodes
                     and state.pods.get(uid_0) is not None and state.pods[uid_0].phase == "Succeeded"
                     and uid_new in state.pods and ("kube-system", "node.node-1") not in state.policies,
                     what="state to converge")
    assert set(state.nodes) == {"node-1", "node-2", "node-3"}
    assert state.ledger("node-0") is None  # a node that disappears drops its ledger
    assert not state.pods[uid_0].active  # a terminated pod releases its cores
    assert state.pods[uid_new].node is None and state.pods[uid_new].model is not None

    fake.update("Pod", dict(fake.get("Pod", "new-model", "ns-9"), spec=dict(new["spec"], nodeName="node-3")))
    await eventually(lambda: state.pods[uid_new].node == "node-3", what="binding to show")
    assert src.events_applied["Pod"] == applied["Pod"] + 4
    assert ("Pod", "DELETED") in seen and ("Node", "ADDED") in seen
    assert src.relists == dict.fromkeys(src.relists, 0)


# ------------------------------------------------------------------------------------------------- disconnects


async def test_watch_dropped_mid_stream_resumes_without_relist(fake: FakeApiServer,
                                                                make_source: MakeSource) -> None:
    seed(fake)
    sink = RecordingSink()
    src = make_source(sink)
    assert await src.wait_synced(5)
    await eventually(lambda: fake.watch_count() == 4, what="four watches")
    assert fake.drop_watches() == 4  # each stream is cut in the middle of a line
    a = fake.add("Pod", pod_obj("during-gap", namespace="ns-1"))
    await eventually(lambda: a["metadata"]["uid"] in sink.objects["Pod"], what="event from the gap")
    fake.delete("Pod", "during-gap", "ns-1")
    await eventually(lambda: a["metadata"]["uid"] not in sink.objects["Pod"], what="delete after reconnect")
    assert src.relists["Pod"] == 0 and src.watch_restarts["Pod"] >= 1 and src.errors["Pod"] >= 1
    assert src.apply_errors == dict.fromkeys(src.apply_errors, 0)  # the half line was never applied
    resumed = fake.requests_for("Pod", watch=True)[1]
    assert int(resumed["resourceVersion"]) >= int(fake.requests_for("Pod", watch=True)[0]["resourceVersion"])


async def test_watch_ended_by_server_timeout_resumes_at_once(fake: FakeApiServer, make_source: MakeSource) -> None:
    state, src = await synced(fake, make_source)
    await eventually(lambda: fake.watch_count("Node") == 1, what="node watch")
    fake.close_watches("Node")
    await eventually(lambda: src.watch_restarts["Node"] == 1 and fake.watch_count("Node") == 1, what="re-watch")
    assert src.errors["Node"] == 0 and src.relists["Node"] == 0
    fake.add("Node", node_obj("node-7"))
    await eventually(lambda: "node-7" in state.nodes, what="new node")


@pytest.mark.parametrize("how", ["event", "http"])
async def test_410_relists_and_applies_only_the_difference(fake: FakeApiServer, make_source: MakeSource,
                                                           how: str) -> None:
    pods = seed(fake)
    sink = RecordingSink()
    src = make_source(sink)
    assert await src.wait_synced(5)
    await eventually(lambda: fake.watch_count("Pod") == 1, what="pod watch")
    mark = len(sink.calls)

    fake.fail_next_watch("Pod", how)
    fake.drop_watches("Pod")  # changes below happen while no watch is open
    fake.delete("Pod", "pod-3", "ns-0")
    changed = dict(pods["pod-5"], status=dict(pods["pod-5"]["status"], phase="Failed"))
    fake.update("Pod", changed)
    added = fake.add("Pod", pod_obj("after-410", namespace="ns-0"))

    await eventually(lambda: src.relists["Pod"] == 1 and len(sink.objects["Pod"]) == 7, what="relist")
    await eventually(lambda: len(sink.since(mark, "Pod")) >= 3, what="relist diff")
    got = sorted(sink.since(mark, "Pod"))
    assert got == sorted([("DELETED", pods["pod-3"]["metadata"]["uid"]),
                          ("MODIFIED", pods["pod-5"]["metadata"]["uid"]),
                          ("ADDED", added["metadata"]["uid"])])  # unchanged pods are not re-applied
    assert sink.objects["Pod"][pods["pod-5"]["metadata"]["uid"]]["status"]["phase"] == "Failed"
    # and the watch resumes from the relist
    fake.delete("Pod", "after-410", "ns-0")
    await eventually(lambda: added["metadata"]["uid"] not in sink.objects["Pod"], what="delete after relist")


async def test_compacted_history_gives_410_and_relist(fake: FakeApiServer, make_source: MakeSource) -> None:
    state, src = await synced(fake, make_source)
    await eventually(lambda: fake.watch_count("Node") == 1, what="node watch")
    fake.drop_watches("Node")
    fake.add("Node", node_obj("node-8"))
    fake.compact()  # the watch's resourceVersion is now too old
    await eventually(lambda: "node-8" in state.nodes and src.relists["Node"] == 1, what="relist after compaction")
    assert set(state.nodes) == {"node-0", "node-1", "node-2", "node-8"}


async def test_relist_deletes_what_is_gone(fake: FakeApiServer, make_source: MakeSource) -> None:
    state, src = await synced(fake, make_source)
    await eventually(lambda: fake.watch_count("Node") == 1, what="node watch")
    fake.drop_watches("Node")
    fake.delete("Node", "node-2")
    fake.compact()
    await eventually(lambda: src.relists["Node"] == 1 and "node-2" not in state.nodes, what="tombstone")
    assert state.ledger("node-2") is None


async def test_bookmarks_advance_resource_version_without_events(fake: FakeApiServer,
                                                                 make_source: MakeSource) -> None:
    seed(fake)
    sink = RecordingSink()
    src = make_source(sink)
    assert await src.wait_synced(5)
    await eventually(lambda: fake.watch_count("Node") == 1, what="node watch")
    calls, applied = len(sink.calls), dict(src.events_applied)
    rv = fake.bump(5)
    assert fake.bookmark("Node") == 1
    await eventually(lambda: src.resource_versions["Node"] == str(rv), what="bookmark")
    assert len(sink.calls) == calls and src.events_applied == applied
    fake.drop_watches("Node")
    await eventually(lambda: len(fake.requests_for("Node", watch=True)) == 2, what="re-watch")
    assert fake.requests_for("Node", watch=True)[1]["resourceVersion"] == str(rv)


# ------------------------------------------------------------------------------------------------- CRDs, errors


async def test_missing_crd_is_empty_and_synced_then_appears(fake: FakeApiServer, make_source: MakeSource) -> None:
    seed(fake)
    fake.set_installed("BalloonsPolicy", False)
    fake.set_installed("NodeResourceTopology", False)
    state = cluster()
    src = make_source(state)
    assert await src.wait_synced(5)
    assert state.policies == {} and state.nrts == {}
    assert src.installed["BalloonsPolicy"] is False and src.installed["Node"] is True
    assert state.ledger("node-1") is not None  # nodes still get ledgers (profile reserved CPUs, label topology)

    fake.set_installed("BalloonsPolicy", True)
    await eventually(lambda: len(state.policies) == 2, what="CRD objects to arrive")
    fake.add("BalloonsPolicy", balloons_policy_obj("group.gpu"))
    await eventually(lambda: ("kube-system", "group.gpu") in state.policies, what="watch on the new CRD")
    assert src.installed["BalloonsPolicy"] is True

    fake.set_installed("BalloonsPolicy", False)  # uninstalled again: its objects are gone
    await eventually(lambda: state.policies == {}, what="CRD removal")
    assert src.installed["BalloonsPolicy"] is False


async def test_list_errors_back_off_capped_then_sync(fake: FakeApiServer, make_source: MakeSource) -> None:
    seed(fake)
    fake.fail_next_lists("Node", 6, 500)
    state = cluster()
    src = make_source(state, backoff_base=0.01, backoff_cap=0.05)
    assert await src.wait_synced(5)
    assert src.errors["Node"] == 6
    assert 0 < src.last_delays["Node"] <= 0.05


def test_backoff_doubles_is_capped_jittered_and_resets() -> None:
    top = Backoff(0.2, 30.0, rng=lambda: 0.0)
    assert [round(top.next(), 3) for _ in range(10)] == [0.2, 0.4, 0.8, 1.6, 3.2, 6.4, 12.8, 25.6, 30.0, 30.0]
    assert all(top.next() == 30.0 for _ in range(100))
    low = Backoff(0.2, 30.0, rng=lambda: 1.0)
    assert [round(low.next(), 3) for _ in range(3)] == [0.1, 0.2, 0.4]
    top.reset()
    assert top.next() == 0.2


async def test_watch_error_other_than_410_or_garbage_reconnects_without_relist(
        fake: FakeApiServer, make_source: MakeSource) -> None:
    state, src = await synced(fake, make_source)
    await eventually(lambda: fake.watch_count("Node") == 1, what="node watch")
    error = {"type": "ERROR", "object": status(500, "InternalError", "etcdserver: request timed out")}
    # A watch is counted once opened and written to once live: inject until the one open watch takes the line (CI's
    # floors run, beside two fleet benchmark arms, once injected between the two).
    await eventually(lambda: fake.inject("Node", orjson.dumps(error) + b"\n") == 1, what="the error delivered")
    await eventually(lambda: src.errors["Node"] == 1 and len(fake.requests_for("Node", watch=True)) == 2
                     and fake.watch_count("Node") == 1, what="reconnect")
    await eventually(lambda: fake.inject("Node", b"<html>502 Bad Gateway</html>\n") == 1, what="garbage delivered")
    await eventually(lambda: src.errors["Node"] == 2 and len(fake.requests_for("Node", watch=True)) == 3
                     and fake.watch_count("Node") == 1, what="reconnect")
    assert src.relists["Node"] == 0
    fake.add("Node", node_obj("node-5"))
    await eventually(lambda: "node-5" in state.nodes, what="events after reconnect")


async def test_event_split_across_chunks_is_reassembled(fake: FakeApiServer, make_source: MakeSource) -> None:
    seed(fake)
    sink = RecordingSink()
    src = make_source(sink)
    assert await src.wait_synced(5)
    await eventually(lambda: fake.watch_count("Node") == 1, what="node watch")
    node = node_obj("node-split", images=40)  # ~12 KB
    node["metadata"].update(uid="uid-split", resourceVersion=str(fake.bump()))
    line = orjson.dumps({"type": "ADDED", "object": node}) + b"\n"
    pieces = [line[:7], line[7:5000], line[5000:-1], line[-1:]]
    for piece in pieces:  # one HTTP chunk each
        fake.inject("Node", piece)
        await asyncio.sleep(0.02)
    await eventually(lambda: "node-split" in sink.objects["Node"], what="reassembled event")
    assert len(sink.objects["Node"]["node-split"]["status"]["images"]) == 40
    assert src.errors["Node"] == 0 and src.resource_versions["Node"] == node["metadata"]["resourceVersion"]


# ------------------------------------------------------------------------------------------------- stop


async def test_stop_is_prompt(fake: FakeApiServer, api: client.ApiClient) -> None:
    seed(fake)
    src = KubeSource(cluster(), api, read_timeout=600, watch_timeout=600, tune_gc=False)
    src.start()
    assert await src.wait_synced(5)
    await eventually(lambda: fake.watch_count() == 4, what="watches")
    assert_stops_before_its_timeouts(src)
    assert not any(t.name.startswith("kubesource-") for t in threading.enumerate())
    await eventually(lambda: fake.watch_count() == 0, what="server to see the streams closed")


async def test_stop_while_apiserver_down() -> None:
    down = client.ApiClient(client.Configuration(host="http://127.0.0.1:9"))  # nothing listens there
    src = KubeSource(cluster(), down, backoff_base=120.0, backoff_cap=120.0, tune_gc=False)
    src.start()
    await asyncio.sleep(0.1)
    assert not src.synced
    assert_stops_before_its_timeouts(src)


# ------------------------------------------------------------------------------------------------- one-shot, bind


def test_list_once_reads_everything(fake: FakeApiServer, api: client.ApiClient) -> None:
    pods = seed(fake)
    fake.set_installed("NodeResourceTopology", False)
    state = cluster()
    counts = list_once(state, api, page_size=2, tune_gc=False)
    assert counts == {"Node": 3, "Pod": 7, "BalloonsPolicy": 2, "NodeResourceTopology": 0}
    assert set(state.pods) == {p["metadata"]["uid"] for p in pods.values()}
    assert state.nrts == {}


def test_list_once_restarts_when_continue_expires(fake: FakeApiServer, api: client.ApiClient) -> None:
    seed(fake)

    class ExpiringSink(RecordingSink):
        def replace(self, kind: str, objects: list[Obj]) -> None:
            super().replace(kind, objects)
            if kind == "Pod" and len(self.since(0, "Pod")) == 1:  # between the first and the second page
                fake.expire_continue_tokens()

    sink = ExpiringSink()
    list_once(sink, api, page_size=3, tune_gc=False)
    assert len(sink.objects["Pod"]) == 7
    assert [ev for ev, _ in sink.since(0, "Pod")].count("replace") == 2  # the list started over


async def test_bind_pod_and_conflicts(fake: FakeApiServer, api: client.ApiClient, make_source: MakeSource) -> None:
    seed(fake)
    pending = fake.add("Pod", pod_obj("to-bind", namespace="ns-1", model="llama", cpu="8"))
    uid = pending["metadata"]["uid"]
    state = cluster()
    src = make_source(state)
    assert await src.wait_synced(5)

    loop_api = LoopApi(api)

    async def bind(namespace: str, name: str, pod_uid: str | None, node: str) -> None:
        await bind_pod(loop_api, namespace, name, pod_uid, node, timeout=5, connect_timeout=1)

    await bind("ns-1", "to-bind", uid, "node-2")
    await eventually(lambda: state.pods[uid].node == "node-2", what="binding in the watch")
    assert fake.get("Pod", "to-bind", "ns-1")["spec"]["nodeName"] == "node-2"

    with pytest.raises(BindError) as conflict:
        await bind("ns-1", "to-bind", uid, "node-1")
    assert conflict.value.status == 409 and conflict.value.reason == "Conflict"
    assert 'pod to-bind is already assigned to node "node-2"' in str(conflict.value)
    assert str(conflict.value).startswith("binding pod ns-1/to-bind to node node-1 failed: 409 Conflict")

    other = fake.add("Pod", pod_obj("recreated", namespace="ns-1"))
    with pytest.raises(BindError) as stale:
        await bind("ns-1", "recreated", "not-" + other["metadata"]["uid"], "node-1")
    assert stale.value.status == 409 and "Precondition failed: UID" in stale.value.message

    with pytest.raises(BindError) as missing:
        await bind("ns-1", "no-such-pod", None, "node-1")
    assert missing.value.status == 404 and 'pods "no-such-pod" not found' in str(missing.value)
    await loop_api.close()


def test_get_json_raises_with_status_message(fake: FakeApiServer, api: client.ApiClient) -> None:
    fake.set_installed("BalloonsPolicy", False)
    with pytest.raises(KubeApiError) as err:
        get_json(api, "/apis/config.nri/v1alpha1/balloonspolicies")
    assert err.value.status == 404 and "could not find the requested resource" in str(err.value)
    assert get_json(api, "/api/v1/nodes")["kind"] == "NodeList"


async def test_bulk_load_gc_is_raised_during_sync_and_restored(fake: FakeApiServer, api: client.ApiClient) -> None:
    seed(fake)
    before = gc.get_threshold()
    frozen = gc.get_freeze_count()
    src = KubeSource(cluster(), api, tune_gc=True)
    try:
        src.start()
        assert gc.get_threshold()[0] >= BulkLoadGC.THRESHOLD0
        assert await src.wait_synced(5)
        assert gc.get_threshold() == before
        assert gc.get_freeze_count() > frozen  # the synced state is out of the collector's sight
        with BulkLoadGC() as outer, BulkLoadGC():  # one owner at a time; the inner one is a no-op
            assert gc.get_threshold()[0] >= BulkLoadGC.THRESHOLD0
            outer.end(freeze=False)
            assert gc.get_threshold() == before
    finally:
        src.stop()
        gc.unfreeze()
    assert gc.get_threshold() == before


def token_kubeconfig(tmp_path: Any, fake: FakeApiServer) -> Any:
    """A kubeconfig for the fake apiserver whose user authenticates with the token s3cret."""
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(f"""
apiVersion: v1
kind: Config
clusters: [{{name: fake, cluster: {{server: "{fake.url}"}}}}]
users: [{{name: me, user: {{token: s3cret}}}}]
contexts: [{{name: fake, context: {{cluster: fake, user: me}}}}]
current-context: fake
""")
    return kubeconfig


def test_make_api_client_from_kubeconfig_sends_its_token(fake: FakeApiServer, tmp_path: Any) -> None:
    seed(fake)
    api_client = make_api_client(str(token_kubeconfig(tmp_path, fake)), False)
    try:
        state = cluster()
        assert list_once(state, api_client, tune_gc=False)["Node"] == 3
    finally:
        api_client.close()
    assert set(fake.authorization) == {"Bearer s3cret"}


async def test_the_loop_client_sends_the_token_and_rereads_a_rotated_one(fake: FakeApiServer, tmp_path: Any) -> None:
    """/bind goes through LoopApi: it must authenticate as the watches do, and pick up a ServiceAccount token the
    kubelet rotated (the client's refresh hook) without a restart, while asking the client for it seldom."""
    seed(fake)
    api_client = make_api_client(str(token_kubeconfig(tmp_path, fake)), False)
    now = [0.0]
    loop_api = LoopApi(api_client, clock=lambda: now[0])
    try:
        fake.authorization.clear()
        nodes = orjson.loads(await loop_api.call("GET", "/api/v1/nodes", timeout=5, connect_timeout=1))
        assert nodes["kind"] == "NodeList"
        assert list(fake.authorization) == ["Bearer s3cret"]

        def rotate(cfg: client.Configuration) -> None:  # as the in-cluster loader's hook does
            cfg.api_key["BearerToken"] = "Bearer rotated"

        api_client.configuration.refresh_api_key_hook = rotate
        await loop_api.call("GET", "/api/v1/nodes", timeout=5, connect_timeout=1)
        now[0] += AUTH_SECONDS
        await loop_api.call("GET", "/api/v1/nodes", timeout=5, connect_timeout=1)
        assert list(fake.authorization) == ["Bearer s3cret", "Bearer s3cret", "Bearer rotated"]
    finally:
        await loop_api.close()
        api_client.close()


async def test_the_first_cycle_finds_every_ledger_built_and_out_of_the_collectors_sight(
        fake: FakeApiServer, api: client.ApiClient) -> None:
    # Left to be built lazily, the first /filter of 500 names on a 100,000-pod fleet built 500 ledgers (170 ms),
    # and ledgers built after the freeze stayed for the collector to walk.
    seed(fake)
    state = cluster()
    src = KubeSource(state, api, tune_gc=True, on_synced=state.ledgers)
    try:
        src.start()
        assert await src.wait_synced(5)
        tracked = {id(obj) for obj in gc.get_objects()}  # the frozen are in no generation
        ledgers = [state.ledger(name) for name in state.nodes]
        assert ledgers and not any(id(ledger) in tracked for ledger in ledgers)
    finally:
        src.stop()
        gc.unfreeze()


async def test_a_server_keeps_its_collector_thresholds_through_the_first_list(
        fake: FakeApiServer, tmp_path: Any, caplog: pytest.LogCaptureFixture) -> None:
    from cli.main import parser
    from cli.runner import run

    seed(fake)
    caplog.set_level("INFO", logger="model_placement.kubesource")
    before = gc.get_threshold()
    args = parser().parse_args(["extender", "--kubeconfig", str(token_kubeconfig(tmp_path, fake)), "--insecure-http",
                                "--host", "127.0.0.1", "--port", "0", "--drain-seconds", "0"])
    stop = asyncio.Event()
    task = asyncio.create_task(run(args, Settings(), stop))
    try:
        await eventually(lambda: any(r.getMessage() == "cluster state synced" for r in caplog.records),
                         what="the first list in")
        # tune_gc's (full collections rare: on a big fleet they pause the loop for tens of ms), not the thresholds
        # the bulk load found before it
        assert gc.get_threshold() == (max(before[0], 7000), 2, 1000)
    finally:
        stop.set()
        await task
        gc.unfreeze()
        gc.set_threshold(*before)


def assert_stops_before_its_timeouts(src: KubeSource) -> None:
    """stop() returns without waiting out a watch or a read (600 s) or a back-off (120 s): given 30 s, a
    deadline for a hang, not a measure of speed."""
    stopper = threading.Thread(target=src.stop)
    stopper.start()
    stopper.join(30)
    assert not stopper.is_alive(), "KubeSource.stop() still waiting after 30 s"

