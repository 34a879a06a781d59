"""A local stand-in for kube-apiserver, speaking its list / watch / binding wire format.

Serves Nodes, Pods, BalloonsPolicies (config.nri/v1alpha1, namespaced CRD) and NodeResourceTopologies
(topology.node.k8s.io/v1alpha2, cluster-scoped CRD):

- ``GET <collection>?limit=&continue=``: a ``<Kind>List`` with ``metadata.resourceVersion`` and, while more
  remain, ``metadata.continue``; pages come from a snapshot taken at the first page, as etcd would serve them.
- ``GET <collection>?watch=true&resourceVersion=N&allowWatchBookmarks=true&timeoutSeconds=T``: a chunked stream
  of ``{"type": …, "object": …}\\n`` lines, replaying history after N, then live; an ``ERROR`` event carrying a
  410 ``Status`` when N is older than the compacted revision.
- ``GET <collection>/<name>`` and ``POST /api/v1/namespaces/{ns}/pods/{name}/binding``.

Objects are kept only as pre-serialized JSON so that 150,000 pods cost little more than their bytes.
The server runs its own event loop in a daemon thread; the control methods are thread-safe and synchronous, so
tests (sync or async) and the official client's blocking calls can all use it. ``python -m
tests.support.fakeapi --nodes N --pods M`` serves a synthetic cluster from a separate process (the benchmark).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import bisect
import itertools
import sys
import threading
import uuid
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import yaml
from aiohttp import web


@dataclass(frozen=True)
class Resource:
    kind: str
    group: str  # "" for core
    version: str
    plural: str
    namespaced: bool
    crd: bool

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def prefix(self) -> str:
        return f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"


RESOURCES: dict[str, Resource] = {
    r.kind: r
    for r in (
        Resource("Node", "", "v1", "nodes", namespaced=False, crd=False),
        Resource("Pod", "", "v1", "pods", namespaced=True, crd=False),
        Resource("BalloonsPolicy", "config.nri", "v1alpha1", "balloonspolicies", namespaced=True, crd=True),
        Resource(
            "NodeResourceTopology", "topology.node.k8s.io", "v1alpha2", "noderesourcetopologies",
            namespaced=False, crd=True,
        ),
        Resource("PodDisruptionBudget", "policy", "v1", "poddisruptionbudgets", namespaced=True, crd=False),
    )
}
_BY_PATH: dict[tuple[str, str], Resource] = {(r.prefix, r.plural): r for r in RESOURCES.values()}


def status(code: int, reason: str, message: str, details: dict[str, Any] | None = None) -> dict[str, Any]:
    """A ``meta/v1 Status`` as the apiserver writes it."""
    body: dict[str, Any] = {
        "kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Success" if code < 400 else "Failure", "code": code,
    }
    if code >= 400:
        body["message"] = message
        body["reason"] = reason
        body["details"] = details or {}
    return body


def _key(namespace: str | None, name: str) -> str:
    return f"{namespace}/{name}" if namespace else name


@dataclass(eq=False)
class _Watcher:
    kind: str
    namespace: str | None
    bookmarks: bool
    transport: asyncio.BaseTransport | None = None
    queue: asyncio.Queue[Any] = field(default_factory=asyncio.Queue)

    @property
    def live(self) -> bool:
        """Its client is still connected (a handler notices a hang-up only a moment later)."""
        return self.transport is not None and not self.transport.is_closing()


_DROP = object()  # end the stream abruptly, mid-line
_CLOSE = object()  # end the stream cleanly (as on timeoutSeconds)


class FakeApiServer:
    """In-memory apiserver. ``start()`` it, point ``kubernetes.client.Configuration(host=url)`` at ``url``."""

    def __init__(self, *, record: bool = True, max_snapshots: int = 64) -> None:
        self._objects: dict[str, dict[str, bytes]] = {k: {} for k in RESOURCES}
        self._sorted: dict[str, list[str] | None] = {k: None for k in RESOURCES}
        self._history: list[tuple[int, str, str | None, bytes]] = []  # (rv, kind, namespace, event line)
        self._history_rvs: list[int] = []
        self._installed: dict[str, bool] = {k: True for k in RESOURCES}
        self._fail_next_watch: dict[str, str] = {}
        self._fail_next_list: dict[str, tuple[int, int]] = {}
        self._held_lists: dict[str, asyncio.Event] = {}
        self.evictions: list[str] = []  # namespace/name of every eviction asked for, allowed or not
        self.status_patches: list[tuple[str, list[dict[str, Any]]]] = []  # namespace/name and conditions patched
        self._watchers: set[_Watcher] = set()
        self._snapshots: dict[str, tuple[int, list[bytes]]] = {}
        self._snapshot_ids = itertools.count(1)
        self._max_snapshots = max_snapshots
        self.rv = 1
        self.compacted_rv = 0
        self.record = record
        # Bounded, but above what a 10,000-request load test makes the servers send (binds, evictions, PDB reads).
        self.requests: deque[tuple[str, str, dict[str, str]]] = deque(maxlen=200_000)
        self.authorization: deque[str | None] = deque(maxlen=10_000)  # the Authorization header of each request
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self.port = 0

    # ----------------------------------------------------------------------------------------- lifecycle

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, port: int = 0) -> FakeApiServer:
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                loop.run_until_complete(self._serve(port))
            except BaseException as exc:  # surfaced to start()'s caller
                failure.append(exc)
                ready.set()
                return
            ready.set()
            loop.run_forever()
            loop.run_until_complete(self._shutdown())
            loop.close()

        self._thread = threading.Thread(target=run, name="fakeapi", daemon=True)
        self._thread.start()
        ready.wait()
        if failure:
            raise failure[0]
        return self

    def stop(self) -> None:
        if self._loop is None or self._thread is None:
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        self._loop = None

    def __enter__(self) -> FakeApiServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def _serve(self, port: int) -> None:
        app = web.Application(client_max_size=16 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=0.5,
                                     handler_cancellation=True)  # notice a client hanging up, as Go does
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", port, backlog=128)
        await site.start()
        self.port = self._runner.addresses[0][1]

    async def _shutdown(self) -> None:
        for w in list(self._watchers):
            w.queue.put_nowait(_CLOSE)
        if self._runner is not None:
            await self._runner.cleanup()

    def _call(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` on the server's loop (all state lives there) and return its result."""
        if self._loop is None:
            return fn()  # not started: plain single-threaded use (seeding before start)
        if threading.current_thread() is self._thread:
            return fn()

        async def call() -> Any:
            return fn()

        return asyncio.run_coroutine_threadsafe(call(), self._loop).result(timeout=30)

    # ----------------------------------------------------------------------------------------- controls

    def add(self, kind: str, obj: dict[str, Any]) -> dict[str, Any]:
        """Create (or replace) an object, filling in apiVersion/kind/uid/creationTimestamp; returns it as stored."""
        return self._call(lambda: self._put(kind, obj, create=True))

    def update(self, kind: str, obj: dict[str, Any]) -> dict[str, Any]:
        return self._call(lambda: self._put(kind, obj, create=False))

    def delete(self, kind: str, name: str, namespace: str | None = None) -> None:
        self._call(lambda: self._delete(kind, name, namespace))

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        raw = self._call(lambda: self._objects[kind].get(_key(namespace, name)))
        return orjson.loads(raw) if raw is not None else None

    def load(self, kind: str, objects: Iterable[dict[str, Any]]) -> int:
        """Bulk seed without history (as if these objects predate the compacted revision)."""

        def run() -> int:
            n = 0
            res = RESOURCES[kind]
            store = self._objects[kind]
            for obj in objects:
                self.rv += 1
                self._complete(res, obj)
                meta = obj["metadata"]
                store[_key(meta.get("namespace"), meta["name"])] = orjson.dumps(obj)
                n += 1
            self._sorted[kind] = None
            self.compacted_rv = self.rv
            return n

        return self._call(run)

    def load_serialized(self, kind: str, items: Iterable[tuple[str, bytes]]) -> int:
        """Bulk seed already-serialized objects ``(key, json)`` (the benchmark's fast path; no rv rewriting)."""

        def run() -> int:
            store = self._objects[kind]
            n = 0
            for key, raw in items:
                store[key] = raw
                n += 1
            self._sorted[kind] = None
            self.rv += 1
            self.compacted_rv = self.rv
            return n

        return self._call(run)

    def drop_watches(self, kind: str | None = None) -> int:
        """Cut open watch streams mid-line, as a dying apiserver or LB would. Returns how many."""
        return self._call(lambda: self._signal(kind, _DROP))

    def close_watches(self, kind: str | None = None) -> int:
        """End open watch streams cleanly, as ``timeoutSeconds`` expiring would."""
        return self._call(lambda: self._signal(kind, _CLOSE))

    def fail_next_watch(self, kind: str, how: str = "event") -> None:
        """The next watch of ``kind`` answers 410: ``"event"`` (an ERROR event in a 200 stream) or ``"http"``."""
        assert how in ("event", "http")
        self._call(lambda: self._fail_next_watch.__setitem__(kind, how))

    def fail_next_lists(self, kind: str, n: int, code: int = 500) -> None:
        """The next ``n`` list requests for ``kind`` answer ``code`` with a Status."""
        self._call(lambda: self._fail_next_list.__setitem__(kind, (n, code)))

    def hold_lists(self, kind: str) -> None:
        """List requests for ``kind`` go unanswered until ``release_lists``: a list that has not finished."""
        self._call(lambda: self._held_lists.setdefault(kind, asyncio.Event()))

    def release_lists(self, kind: str) -> None:
        def run() -> None:
            held = self._held_lists.pop(kind, None)
            if held is not None:
                held.set()

        self._call(run)

    def expire_continue_tokens(self) -> None:
        """Forget list snapshots: a list continued after this gets 410 Expired, as after etcd compaction."""
        self._call(self._snapshots.clear)

    def inject(self, kind: str, line: bytes) -> int:
        """Write a raw line into the open watch streams of ``kind`` (an ERROR event, garbage…)."""

        def run() -> int:
            targets = [w for w in self._watchers if w.live and w.kind == kind]
            for w in targets:
                w.queue.put_nowait(line)
            return len(targets)

        return self._call(run)

    def compact(self) -> int:
        """Forget history: any watch from an older resourceVersion now gets 410 Expired."""

        def run() -> int:
            self.compacted_rv = self.rv
            self._history.clear()
            self._history_rvs.clear()
            return self.rv

        return self._call(run)

    def set_installed(self, kind: str, installed: bool) -> None:
        """Install or remove a CRD; removing it ends its watches and makes its endpoints 404."""

        def run() -> None:
            self._installed[kind] = installed
            if not installed:
                self._signal(kind, _CLOSE)

        self._call(run)

    def bookmark(self, kind: str | None = None) -> int:
        """Send a BOOKMARK at the current resourceVersion to watchers that asked for bookmarks."""

        def run() -> int:
            n = 0
            for w in self._watchers:
                if w.live and w.bookmarks and (kind is None or w.kind == kind):
                    res = RESOURCES[w.kind]
                    line = orjson.dumps({
                        "type": "BOOKMARK",
                        "object": {"kind": res.kind, "apiVersion": res.api_version,
                                   "metadata": {"resourceVersion": str(self.rv)}},
                    }) + b"\n"
                    w.queue.put_nowait(line)
                    n += 1
            return n

        return self._call(run)

    def bump(self, n: int = 1) -> int:
        """Advance the global resourceVersion as writes to other resources would."""

        def run() -> int:
            self.rv += n
            return self.rv

        return self._call(run)

    def watch_count(self, kind: str | None = None) -> int:
        """Open watch streams (of ``kind``) whose client is still connected."""
        return self._call(lambda: sum(1 for w in self._watchers if w.live and (kind is None or w.kind == kind)))

    def requests_for(self, kind: str, *, watch: bool | None = None) -> list[dict[str, str]]:
        res = RESOURCES[kind]
        path = f"{res.prefix}/{res.plural}"
        out = []
        for _method, p, query in list(self.requests):
            if p == path and (watch is None or (query.get("watch") == "true") == watch):
                out.append(query)
        return out

    # ----------------------------------------------------------------------------------------- state (loop thread)

    def _complete(self, res: Resource, obj: dict[str, Any]) -> None:
        obj["apiVersion"] = res.api_version
        obj["kind"] = res.kind
        meta = obj.setdefault("metadata", {})
        if res.namespaced:
            meta.setdefault("namespace", "default")
        else:
            meta.pop("namespace", None)
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
        meta["resourceVersion"] = str(self.rv)

    def _put(self, kind: str, obj: dict[str, Any], *, create: bool) -> dict[str, Any]:
        res = RESOURCES[kind]
        obj = orjson.loads(orjson.dumps(obj))  # private copy
        meta = obj.setdefault("metadata", {})
        key = _key(meta.get("namespace", "default") if res.namespaced else None, meta["name"])
        old = self._objects[kind].get(key)
        if not create and old is None:
            raise KeyError(f"{kind} {key} not found")
        if old is not None:
            old_meta = orjson.loads(old)["metadata"]
            meta.setdefault("uid", old_meta["uid"])
            meta.setdefault("creationTimestamp", old_meta["creationTimestamp"])
        self.rv += 1
        self._complete(res, obj)
        raw = orjson.dumps(obj)
        self._objects[kind][key] = raw
        if old is None:
            self._sorted[kind] = None
        self._emit(res, "MODIFIED" if old is not None else "ADDED", meta.get("namespace"), raw)
        return obj

    def _delete(self, kind: str, name: str, namespace: str | None) -> None:
        res = RESOURCES[kind]
        key = _key(namespace or ("default" if res.namespaced else None), name)
        raw = self._objects[kind].pop(key)
        self._sorted[kind] = None
        self.rv += 1
        obj = orjson.loads(raw)
        obj["metadata"]["resourceVersion"] = str(self.rv)
        self._emit(res, "DELETED", obj["metadata"].get("namespace"), orjson.dumps(obj))

    def _emit(self, res: Resource, event: str, namespace: str | None, raw: bytes) -> None:
        line = b'{"type":"' + event.encode() + b'","object":' + raw + b"}\n"
        self._history.append((self.rv, res.kind, namespace, line))
        self._history_rvs.append(self.rv)
        for w in self._watchers:
            if w.kind == res.kind and (w.namespace is None or w.namespace == namespace):
                w.queue.put_nowait(line)

    def _signal(self, kind: str | None, what: object) -> int:
        n = 0
        for w in self._watchers:
            if kind is None or w.kind == kind:
                w.queue.put_nowait(what)
                n += w.live
        return n

    def _keys(self, kind: str) -> list[str]:
        keys = self._sorted[kind]
        if keys is None:
            keys = self._sorted[kind] = sorted(self._objects[kind])
        return keys

    # ----------------------------------------------------------------------------------------- HTTP

    @staticmethod
    def _json(code: int, body: dict[str, Any] | bytes) -> web.Response:
        raw = body if isinstance(body, bytes) else orjson.dumps(body)
        return web.Response(status=code, body=raw, content_type="application/json")

    def _error(self, code: int, reason: str, message: str, details: dict[str, Any] | None = None) -> web.Response:
        return self._json(code, status(code, reason, message, details))

    def _route(self, path: str) -> tuple[Resource, str | None, str | None, str | None] | None:
        """``path`` → (resource, namespace, name, subresource), or None."""
        parts = path.strip("/").split("/")
        if parts[:1] == ["api"] and len(parts) >= 3:
            prefix, rest = f"/api/{parts[1]}", parts[2:]
        elif parts[:1] == ["apis"] and len(parts) >= 4:
            prefix, rest = f"/apis/{parts[1]}/{parts[2]}", parts[3:]
        else:
            return None
        namespace = None
        if len(rest) >= 3 and rest[0] == "namespaces":
            namespace, rest = rest[1], rest[2:]
        if not rest:
            return None
        res = _BY_PATH.get((prefix, rest[0]))
        if res is None or (namespace is not None and not res.namespaced) or len(rest) > 3:
            return None
        name = rest[1] if len(rest) >= 2 else None
        sub = rest[2] if len(rest) == 3 else None
        return res, namespace, name, sub

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        query = dict(request.query)
        if self.record:
            self.requests.append((request.method, request.path, query))
            self.authorization.append(request.headers.get("Authorization"))
        route = self._route(request.path)
        if route is None or not self._installed[route[0].kind]:
            return self._error(404, "NotFound", "the server could not find the requested resource")
        res, namespace, name, sub = route
        if request.method == "POST" and res.kind == "Pod" and sub == "binding" and namespace and name:
            return await self._bind(request, namespace, name)
        if request.method == "POST" and res.kind == "Pod" and sub == "eviction" and namespace and name:
            return await self._evict(request, namespace, name)
        if request.method == "PATCH" and res.kind == "Pod" and sub == "status" and namespace and name:
            return await self._patch_status(request, namespace, name)
        if request.method != "GET" or sub is not None:
            return self._error(405, "MethodNotAllowed",
                               "the server does not allow this method on the requested resource")
        if name is not None:
            raw = self._objects[res.kind].get(_key(namespace, name))
            if raw is None:
                return self._error(404, "NotFound", f'{res.plural} "{name}" not found',
                                   {"name": name, "kind": res.plural})
            return self._json(200, raw)
        if query.get("watch") in ("true", "1"):
            return await self._watch(request, res, namespace, query)
        held = self._held_lists.get(res.kind)
        if held is not None:
            await held.wait()
        return self._list(res, namespace, query)

    def _list(self, res: Resource, namespace: str | None, query: dict[str, str]) -> web.Response:
        failing = self._fail_next_list.get(res.kind)
        if failing:
            n, code = failing
            self._fail_next_list[res.kind] = (n - 1, code) if n > 1 else None  # type: ignore[assignment]
            return self._error(code, "InternalError",
                               "an error on the server has prevented the request from succeeding")
        limit = int(query.get("limit") or 0)
        token = query.get("continue")
        if token:
            try:
                snap_id, start = orjson.loads(base64.urlsafe_b64decode(token))
                rv, items = self._snapshots[snap_id]
            except (ValueError, KeyError, TypeError):
                return self._error(410, "Expired", "The provided continue parameter is too old to display a "
                                   "consistent list result. You can start a new list without the continue "
                                   "parameter.")
        else:
            keys = self._keys(res.kind)
            if namespace is not None:
                lo = bisect.bisect_left(keys, namespace + "/")
                hi = bisect.bisect_left(keys, namespace + "0")  # "0" sorts right after "/"
                keys = keys[lo:hi]
            store = self._objects[res.kind]
            items = [store[k] for k in keys]
            rv, start, snap_id = self.rv, 0, ""
        end = len(items) if limit <= 0 else min(len(items), start + limit)
        meta = b'{"resourceVersion":"' + str(rv).encode() + b'"'
        if end < len(items):
            if not snap_id:
                snap_id = str(next(self._snapshot_ids))
                self._snapshots[snap_id] = (rv, items)
                while len(self._snapshots) > self._max_snapshots:
                    self._snapshots.pop(next(iter(self._snapshots)))
            tok = base64.urlsafe_b64encode(orjson.dumps([snap_id, end])).decode()
            meta += b',"continue":"' + tok.encode() + b'","remainingItemCount":' + str(len(items) - end).encode()
        elif snap_id:
            self._snapshots.pop(snap_id, None)
        body = b"".join((
            b'{"kind":"', res.kind.encode(), b'List","apiVersion":"', res.api_version.encode(),
            b'","metadata":', meta, b'},"items":[', b",".join(items[start:end]), b"]}",
        ))
        return self._json(200, body)

    async def _watch(
        self, request: web.Request, res: Resource, namespace: str | None, query: dict[str, str]
    ) -> web.StreamResponse:
        rv_s = query.get("resourceVersion", "")
        fail = self._fail_next_watch.pop(res.kind, None)
        expired = fail is not None or (rv_s not in ("", "0") and int(rv_s) < self.compacted_rv)
        message = f"too old resource version: {rv_s or 0} ({max(self.compacted_rv, 1)})"
        if expired and fail == "http":
            return self._error(410, "Expired", message)
        resp = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        if expired:
            await resp.write(orjson.dumps({"type": "ERROR", "object": status(410, "Expired", message)}) + b"\n")
            await resp.write_eof()
            return resp

        w = _Watcher(res.kind, namespace, query.get("allowWatchBookmarks") in ("true", "1"), request.transport)
        if rv_s in ("", "0"):  # "any version": synthetic ADDED for the current state, then live
            store = self._objects[res.kind]
            backlog = [b'{"type":"ADDED","object":' + store[k] + b"}\n" for k in self._keys(res.kind)
                       if namespace is None or k.startswith(namespace + "/")]
        else:
            i = bisect.bisect_right(self._history_rvs, int(rv_s))
            backlog = [line for _rv, kind, ns, line in self._history[i:]
                       if kind == res.kind and (namespace is None or ns == namespace)]
        self._watchers.add(w)  # registered with no await since the backlog snapshot: no gap, no duplicate
        loop = asyncio.get_running_loop()
        deadline = loop.time() + float(query.get("timeoutSeconds") or 1800)
        try:
            for line in backlog:
                await resp.write(line)
            while (remaining := deadline - loop.time()) > 0:
                try:
                    item = await asyncio.wait_for(w.queue.get(), remaining)
                except TimeoutError:
                    break
                if item is _CLOSE:
                    break
                if item is _DROP:
                    await resp.write(b'{"type":"MODIFIED","object":{"kind":"')
                    if request.transport is not None:
                        request.transport.abort()
                    return resp
                batch = [item]
                pending = w.queue._queue  # type: ignore[attr-defined]
                while pending and pending[0] is not _CLOSE and pending[0] is not _DROP:
                    batch.append(w.queue.get_nowait())
                await resp.write(b"".join(batch))
            await resp.write_eof()
        except (ConnectionError, RuntimeError):
            pass  # the client went away
        finally:
            self._watchers.discard(w)
        return resp

    async def _bind(self, request: web.Request, namespace: str, name: str) -> web.Response:
        try:
            binding = orjson.loads(await request.read())
            target = binding["target"]
            meta = binding.get("metadata") or {}
        except (ValueError, KeyError, TypeError):
            return self._error(400, "BadRequest", "not a Binding object")
        if binding.get("kind", "Binding") != "Binding":
            return self._error(400, "BadRequest", f"not a Binding object: {binding.get('kind')}")
        if meta.get("name") != name:
            return self._error(400, "BadRequest", "name in URL does not match name in Binding object")
        if target.get("kind", "Node") not in ("", "Node") or not target.get("name"):
            return self._error(422, "Invalid", f'Binding.core "{name}" is invalid: target.name: Required value',
                               {"name": name, "kind": "Binding"})
        key = _key(namespace, name)
        raw = self._objects["Pod"].get(key)
        if raw is None:
            return self._error(404, "NotFound", f'pods "{name}" not found', {"name": name, "kind": "pods"})
        pod = orjson.loads(raw)
        conflict = None
        if meta.get("uid") and meta["uid"] != pod["metadata"]["uid"]:
            conflict = (f"StorageError: invalid object, Code: 4, Key: /registry/pods/{key}, ResourceVersion: 0, "
                        f"AdditionalErrorMsg: Precondition failed: UID in precondition: {meta['uid']}, "
                        f"UID in object meta: {pod['metadata']['uid']}")
        elif pod["metadata"].get("deletionTimestamp"):
            conflict = f"pod {name} is being deleted, cannot be assigned to a host"
        elif pod.get("spec", {}).get("nodeName"):
            conflict = f'pod {name} is already assigned to node "{pod["spec"]["nodeName"]}"'
        if conflict:
            return self._error(409, "Conflict",
                               f'Operation cannot be fulfilled on pods/binding "{name}": {conflict}',
                               {"name": name, "kind": "pods/binding"})
        pod.setdefault("spec", {})["nodeName"] = target["name"]
        # The Binding's annotations are merged into the pod's in the same write (setPodNodeAndMetadata).
        if meta.get("annotations"):
            pod["metadata"]["annotations"] = {**(pod["metadata"].get("annotations") or {}), **meta["annotations"]}
        conditions = pod.setdefault("status", {}).setdefault("conditions", [])
        conditions[:] = [c for c in conditions if c.get("type") != "PodScheduled"]
        conditions.append({"type": "PodScheduled", "status": "True", "lastProbeTime": None,
                           "lastTransitionTime": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")})
        self._put("Pod", pod, create=False)
        return self._json(201, status(201, "", ""))


    async def _patch_status(self, request: web.Request, namespace: str, name: str) -> web.Response:
        """A strategic merge patch of pods/status, as far as the extender sends one: status.conditions merged by
        type (the patchMergeKey of PodStatus.conditions); metadata.uid must match (it is immutable)."""
        if request.content_type != "application/strategic-merge-patch+json":
            return self._error(415, "UnsupportedMediaType",
                               f"the body of the request was in an unknown format: {request.content_type}")
        try:
            patch = orjson.loads(await request.read())
            conditions = (patch.get("status") or {}).get("conditions") or []
            uid = (patch.get("metadata") or {}).get("uid")
        except (ValueError, AttributeError):
            return self._error(400, "BadRequest", "not a strategic merge patch")
        raw = self._objects["Pod"].get(_key(namespace, name))
        if raw is None:
            return self._error(404, "NotFound", f'pods "{name}" not found', {"name": name, "kind": "pods"})
        pod = orjson.loads(raw)
        if uid and uid != pod["metadata"]["uid"]:
            return self._error(422, "Invalid", f'Pod "{name}" is invalid: metadata.uid: Invalid value: "{uid}": '
                               "field is immutable", {"name": name, "kind": "Pod"})
        have = pod.setdefault("status", {}).setdefault("conditions", [])
        for condition in conditions:
            have[:] = [c for c in have if c.get("type") != condition.get("type")]
            have.append(condition)
        self.status_patches.append((f"{namespace}/{name}", conditions))
        return self._json(200, self._put("Pod", pod, create=False))

    async def _evict(self, request: web.Request, namespace: str, name: str) -> web.Response:
        """policy/v1 Eviction: 429 while a PodDisruptionBudget of the pod (matchLabels only) allows no
        disruption, else the budget is spent and the pod deleted (no grace period here)."""
        try:
            eviction = orjson.loads(await request.read())
        except ValueError:
            return self._error(400, "BadRequest", "not an Eviction object")
        if eviction.get("kind") != "Eviction" or (eviction.get("metadata") or {}).get("name") != name:
            return self._error(400, "BadRequest", "name in URL does not match name in Eviction object")
        self.evictions.append(f"{namespace}/{name}")
        raw = self._objects["Pod"].get(_key(namespace, name))
        if raw is None:
            return self._error(404, "NotFound", f'pods "{name}" not found', {"name": name, "kind": "pods"})
        pod = orjson.loads(raw)
        want = ((eviction.get("deleteOptions") or {}).get("preconditions") or {}).get("uid")
        if want and want != pod["metadata"]["uid"]:
            return self._error(409, "Conflict", f'Operation cannot be fulfilled on Pod "{name}": the UID in the '
                               f"precondition ({want}) does not match the UID in record ({pod['metadata']['uid']}). "
                               "The object might have been deleted and then recreated")
        labels = pod["metadata"].get("labels") or {}
        budgets = []
        for key in self._keys("PodDisruptionBudget"):
            pdb = orjson.loads(self._objects["PodDisruptionBudget"][key])
            selector = (pdb.get("spec") or {}).get("selector") or {}
            if pdb["metadata"]["namespace"] == namespace and all(
                    labels.get(k) == v for k, v in (selector.get("matchLabels") or {}).items()):
                budgets.append(pdb)
        for pdb in budgets:
            if int((pdb.get("status") or {}).get("disruptionsAllowed") or 0) < 1:
                return self._error(429, "TooManyRequests", "Cannot evict pod as it would violate the pod's "
                                   "disruption budget.", {"causes": [{"reason": "DisruptionBudget", "message":
                                   f"The disruption budget {pdb['metadata']['name']} needs more healthy pods"}]})
        for pdb in budgets:
            pdb["status"]["disruptionsAllowed"] -= 1
            self._put("PodDisruptionBudget", pdb, create=False)
        self._delete("Pod", name, namespace)
        return self._json(201, status(201, "", ""))


# --------------------------------------------------------------------------------------------- synthetic objects

_T0 = datetime(2025, 1, 6, 8, 0, 0, tzinfo=UTC)


def _ts(seconds: int) -> str:
    return (_T0 + timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")


def node_obj(name: str, *, cpus: int = 128, numa: int = 2, amx: bool = True, labels: dict[str, str] | None = None,
             images: int = 0) -> dict[str, Any]:
    """A worker Node as a kubelet on a 2-socket Xeon reports it (NFD labels included)."""
    lab = {
        "beta.kubernetes.io/arch": "amd64", "beta.kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64", "kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
        "node.kubernetes.io/instance-type": "bare-metal",
        "feature.node.kubernetes.io/cpu-hardware_multithreading": "true",
        "feature.node.kubernetes.io/cpu-security.amx.enabled": "true" if amx else "false",
        "feature.node.kubernetes.io/memory-numa": "true" if numa > 1 else "false",
        "feature.node.kubernetes.io/memory-numa.node_count": str(numa),
        "feature.node.kubernetes.io/cpu-model.vendor_id": "Intel",
    }
    lab.update(labels or {})
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {
            "name": name, "labels": lab,
            "annotations": {"node.alpha.kubernetes.io/ttl": "0",
                            "volumes.kubernetes.io/controller-managed-attach-detach": "true"},
            "creationTimestamp": _ts(0),
        },
        "spec": {"podCIDR": "10.244.0.0/24", "podCIDRs": ["10.244.0.0/24"]},
        "status": {
            "capacity": {"cpu": str(cpus), "memory": "527988736Ki", "pods": "250",
                         "ephemeral-storage": "1875382960Ki", "hugepages-1Gi": "0", "hugepages-2Mi": "0"},
            "allocatable": {"cpu": str(cpus), "memory": "527886336Ki", "pods": "250",
                            "ephemeral-storage": "1728341186299", "hugepages-1Gi": "0", "hugepages-2Mi": "0"},
            "conditions": [
                {"type": t, "status": "False", "reason": f"Kubelet{r}", "message": m,
                 "lastHeartbeatTime": _ts(3600), "lastTransitionTime": _ts(60)}
                for t, r, m in (
                    ("MemoryPressure", "HasSufficientMemory", "kubelet has sufficient memory available"),
                    ("DiskPressure", "HasNoDiskPressure", "kubelet has no disk pressure"),
                    ("PIDPressure", "HasSufficientPID", "kubelet has sufficient PID available"),
                )
            ] + [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                  "message": "kubelet is posting ready status", "lastHeartbeatTime": _ts(3600),
                  "lastTransitionTime": _ts(60)}],
            "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}, {"type": "Hostname", "address": name}],
            "nodeInfo": {"architecture": "amd64", "containerRuntimeVersion": "containerd://1.7.22",
                         "kernelVersion": "6.8.0-49-generic", "kubeletVersion": "v1.31.2",
                         "kubeProxyVersion": "v1.31.2", "operatingSystem": "linux",
                         "osImage": "Ubuntu 24.04.1 LTS", "machineID": uuid.uuid4().hex,
                         "systemUUID": str(uuid.uuid4()), "bootID": str(uuid.uuid4())},
            "images": [{"names": [f"registry.example.com/img-{i}@sha256:{'0' * 64}",
                                  f"registry.example.com/img-{i}:v1"], "sizeBytes": 100_000_000 + i}
                       for i in range(images)],
        },
    }


def pod_obj(name: str, *, namespace: str = "default", node: str | None = None, cpu: str = "500m",
            memory: str = "512Mi", model: str | None = None, tp: int | None = None, phase: str = "Running",
            uid: str | None = None, created: int = 0) -> dict[str, Any]:
    """A Pod as the apiserver returns it: ReplicaSet-owned, a sidecar, managedFields, full status (~4 KB)."""
    labels = {"app.kubernetes.io/name": name.rsplit("-", 2)[0], "app.kubernetes.io/part-of": "serving",
              "pod-template-hash": "7c9d8f6b5d"}
    annotations = {"kubectl.kubernetes.io/restartedAt": _ts(created)}
    args = ["--port", "8000"]
    if model:
        labels["model-manager.io/model"] = model
        args = ["--model", model, "--port", "8000"]
        if tp:
            args += ["--tensor-parallel-size", str(tp)]
    uid = uid or str(uuid.uuid4())
    container = {
        "name": "main", "image": "registry.example.com/serving/vllm-cpu:v0.6.4", "imagePullPolicy": "IfNotPresent",
        "args": args, "ports": [{"name": "http", "containerPort": 8000, "protocol": "TCP"}],
        "env": [{"name": "VLLM_CPU_KVCACHE_SPACE", "value": "40"}],
        "resources": {"requests": {"cpu": cpu, "memory": memory}, "limits": {"cpu": cpu, "memory": memory}},
        "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File",
    }
    sidecar = {
        "name": "metrics", "image": "registry.example.com/obs/exporter:1.8.2", "imagePullPolicy": "IfNotPresent",
        "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "128Mi"}},
        "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File",
    }
    spec: dict[str, Any] = {
        "containers": [container, sidecar], "restartPolicy": "Always", "terminationGracePeriodSeconds": 30,
        "dnsPolicy": "ClusterFirst", "serviceAccountName": "default", "serviceAccount": "default",
        "securityContext": {}, "schedulerName": "default-scheduler", "priority": 0,
        "enableServiceLinks": True, "preemptionPolicy": "PreemptLowerPriority",
        "tolerations": [{"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute",
                         "tolerationSeconds": 300}],
        "volumes": [{"name": "kube-api-access-x7k2p", "projected": {"defaultMode": 420, "sources": [
            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
            {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}}]}}],
    }
    if node:
        spec["nodeName"] = node
    started = _ts(created + 5)
    status_: dict[str, Any] = {"phase": phase, "qosClass": "Burstable", "startTime": started}
    if node:
        status_.update({
            "hostIP": "10.0.0.1", "podIP": "10.244.1.7", "podIPs": [{"ip": "10.244.1.7"}],
            "conditions": [{"type": t, "status": "True", "lastProbeTime": None, "lastTransitionTime": started}
                           for t in ("Initialized", "Ready", "ContainersReady", "PodScheduled")],
            "containerStatuses": [
                {"name": c["name"], "state": {"running": {"startedAt": started}}, "lastState": {}, "ready": True,
                 "restartCount": 0, "image": c["image"], "imageID": f"{c['image']}@sha256:{'ab' * 32}",
                 "containerID": f"containerd://{uuid.uuid4().hex}{uuid.uuid4().hex}", "started": True}
                for c in (container, sidecar)],
        })
    else:
        status_.update({"phase": "Pending", "conditions": []})
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": name, "generateName": name.rsplit("-", 1)[0] + "-", "namespace": namespace, "uid": uid,
            "resourceVersion": "1", "creationTimestamp": _ts(created), "labels": labels, "annotations": annotations,
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": name.rsplit("-", 1)[0],
                                 "uid": str(uuid.uuid4()), "controller": True, "blockOwnerDeletion": True}],
            "managedFields": [
                {"manager": "kube-controller-manager", "operation": "Update", "apiVersion": "v1",
                 "time": _ts(created), "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {
                     "f:generateName": {}, "f:labels": {".": {}, "f:app.kubernetes.io/name": {},
                                                        "f:pod-template-hash": {}},
                     "f:ownerReferences": {".": {}, f'k:{{"uid":"{uid}"}}': {}}},
                     "f:spec": {"f:containers": {'k:{"name":"main"}': {".": {}, "f:args": {}, "f:image": {},
                                                                     "f:name": {}, "f:resources": {}}},
                                "f:dnsPolicy": {}, "f:restartPolicy": {}, "f:schedulerName": {}}}},
                {"manager": "kubelet", "operation": "Update", "apiVersion": "v1", "time": started,
                 "fieldsType": "FieldsV1", "subresource": "status", "fieldsV1": {"f:status": {
                     "f:conditions": {'k:{"type":"Ready"}': {".": {}, "f:status": {}, "f:type": {}}},
                     "f:containerStatuses": {}, "f:hostIP": {}, "f:phase": {}, "f:podIP": {}, "f:startTime": {}}}},
            ],
        },
        "spec": spec,
        "status": status_,
    }


def balloons_policy_obj(
    name: str = "default", namespace: str = "kube-system", *, reserved: str = "cpuset:0,1,64,65",
    balloon_types: Iterable[str] = ("vllm-balloon-tp1", "vllm-balloon-tp2"),
    nodes_status: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The policy `balloons-policy` generates for `node_obj`'s 2-NUMA shape (32 cores x 2 threads each), with the
    given reserved cpuset and only the named model types (and the per-NUMA types they are made of)."""
    from placement.balloons import model_balloon_types
    from placement.topology import CPUSet, linux_layout

    wanted = set(balloon_types)
    types = model_balloon_types(linux_layout([32, 32], 2, "labels"), "vllm-balloon-tp")
    used = {c["balloonType"] for t in types if t["name"] in wanted for c in t.get("components", ())}
    size = len(CPUSet.parse(reserved.removeprefix("cpuset:"))) if reserved.startswith("cpuset:") else 0
    obj: dict[str, Any] = {
        "apiVersion": "config.nri/v1alpha1", "kind": "BalloonsPolicy",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"reservedResources": {"cpu": reserved}, "pinCPU": True, "pinMemory": True,
                 "balloonTypes": [{"name": "reserved", "namespaces": ["*"], **({"minCPUs": size} if size else {})}]
                 + [t for t in types if t["name"] in wanted | used]},
    }
    if nodes_status:
        obj["status"] = {"nodes": {n: {"status": s, "generation": 1} for n, s in nodes_status.items()}}
    return obj


def nrt_obj(node: str, *, numa: int = 2, cpus_per_numa: int = 64) -> dict[str, Any]:
    """An NFD topology-updater NodeResourceTopology: one ``Node`` zone per NUMA node."""
    return {
        "apiVersion": "topology.node.k8s.io/v1alpha2", "kind": "NodeResourceTopology",
        "metadata": {"name": node},
        "attributes": [{"name": "topologyManagerPolicy", "value": "single-numa-node"},
                       {"name": "topologyManagerScope", "value": "container"}],
        "zones": [{"name": f"node-{i}", "type": "Node",
                   "costs": [{"name": f"node-{j}", "value": 10 if i == j else 21} for j in range(numa)],
                   "resources": [{"name": "cpu", "capacity": str(cpus_per_numa),
                                  "allocatable": str(cpus_per_numa - 3), "available": str(cpus_per_numa - 3)}]}
                  for i in range(numa)],
    }


def synthetic_pod_name(i: int) -> tuple[str, str]:
    """(namespace, name) of the i-th pod of ``synthetic_cluster``."""
    return f"team-{i % 50:02d}", f"svc-{i % 997:03d}-7c9d8f6b5d-{i:06d}"


def synthetic_cluster(n_nodes: int, n_pods: int, *, model_every: int = 20) -> dict[str, list[tuple[str, bytes]]]:
    """A serialized fleet for the benchmark: ``{kind: [(key, json)]}``; pods spread over nodes and 50 namespaces."""
    out: dict[str, list[tuple[str, bytes]]] = {k: [] for k in RESOURCES}
    node_names = [f"node-{i:05d}" for i in range(n_nodes)]
    for i, name in enumerate(node_names):
        obj = node_obj(name, images=8)
        obj["metadata"]["uid"] = str(uuid.UUID(int=i + 1))
        obj["metadata"]["resourceVersion"] = "1"
        out["Node"].append((name, orjson.dumps(obj)))
        out["NodeResourceTopology"].append((name, orjson.dumps(nrt_obj(name))))
    out["BalloonsPolicy"].append(("kube-system/default", orjson.dumps(balloons_policy_obj())))
    template = pod_obj("tmpl-5d8f7c6b9-abcde", node="node-00000")
    for i in range(n_pods):
        ns, name = synthetic_pod_name(i)
        node = node_names[i % n_nodes] if n_nodes else None
        if i % model_every == 0:  # 16 cores over 2 NUMA nodes; spread so that no node is overcommitted
            node = node_names[(i // model_every) % n_nodes] if n_nodes else None
            obj = pod_obj(name, namespace=ns, node=node, cpu="16", memory="64Gi", model=f"llama-{i % 7}", tp=2,
                          created=i)
        else:
            # cheap variant of the template: same shape and size, distinct identity
            obj = orjson.loads(orjson.dumps(template))
            meta = obj["metadata"]
            meta.update(name=name, namespace=ns, uid=str(uuid.UUID(int=(1 << 64) + i)), creationTimestamp=_ts(i))
            obj["spec"]["nodeName"] = node
        out["Pod"].append((f"{ns}/{name}", orjson.dumps(obj)))
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=0)
    parser.add_argument("--pods", type=int, default=0)
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    server = FakeApiServer(record=False)
    for kind, items in synthetic_cluster(args.nodes, args.pods).items():
        server.load_serialized(kind, items)
    server.start(args.port)
    print(f"PORT {server.port}", flush=True)
    try:
        sys.stdin.read()  # serve until the parent closes our stdin (or dies)
    finally:
        server.stop()


if __name__ == "__main__":
    main()


def kubeconfig(tmp_path: Path, url: str) -> Path:
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "fake",
        "clusters": [{"name": "fake", "cluster": {"server": url}}],
        "users": [{"name": "ops", "user": {"token": "not-a-secret"}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "ops"}}],
    }))
    return path
