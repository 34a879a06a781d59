"""Live cluster state: list + watch Nodes, Pods, BalloonsPolicies, NodeResourceTopologies into a ClusterState.

One background thread per kind (the official client is synchronous) lists in pages, then watches from the list's
resourceVersion, reading raw JSON. Everything it reads is handed to the asyncio loop thread in batches, so the
state is only ever touched from that one thread.

Keeping the state complete and never under-counting (an under-counted ledger promises the same cores twice):

- The first list of a kind is ``replace(kind, <first page>)`` followed by ``apply(kind, "ADDED", …)`` for later
  pages: one page of raw pods is ~10 MB of Python objects, 150,000 of them would be ~3 GB.
- A relist (after 410 Gone) is diffed against what was delivered before: unchanged objects (same
  resourceVersion) are skipped, changed ones become ``MODIFIED``, new ones ``ADDED`` and, once the last page is
  in, those no longer listed ``DELETED``. The state stays a superset of the truth while the relist is under way.
- A CRD that is not installed (404) is ``replace(kind, [])``, counts as synced, and is looked for again later.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

import orjson
import urllib3
from kubernetes import client

from server import kubeapi

log = logging.getLogger("model_placement.kubesource")

Obj = dict[str, Any]


class Sink(Protocol):
    """What ``placement.cluster.ClusterState`` offers this module."""

    def replace(self, kind: str, objects: list[Obj]) -> None: ...

    def apply(self, kind: str, event: str, obj: Obj) -> None: ...


@dataclass(frozen=True)
class Resource:
    kind: str
    api_version: str
    path: str  # the all-namespaces collection
    crd: bool  # optional: a 404 means "not installed"

    def key(self, meta: Obj) -> str:
        """The identity ClusterState keys this kind by (pods: uid; others: [namespace/]name)."""
        if self.kind == "Pod":
            return meta["uid"]
        ns = meta.get("namespace")
        return f"{ns}/{meta['name']}" if ns else meta["name"]


RESOURCES: tuple[Resource, ...] = (
    Resource("Node", "v1", "/api/v1/nodes", crd=False),
    Resource("Pod", "v1", "/api/v1/pods", crd=False),
    Resource("BalloonsPolicy", "config.nri/v1alpha1", "/apis/config.nri/v1alpha1/balloonspolicies", crd=True),
    Resource("NodeResourceTopology", "topology.node.k8s.io/v1alpha2",
             "/apis/topology.node.k8s.io/v1alpha2/noderesourcetopologies", crd=True),
)
KINDS: tuple[str, ...] = tuple(r.kind for r in RESOURCES)


class Expired(Exception):
    """410 Gone: the resourceVersion to resume from is compacted away; only a relist helps."""


class NotInstalled(Exception):
    """404 on a CRD's collection."""


class Stopped(Exception):
    """stop() was called: unwind the worker thread quietly."""


class Backoff:
    """Capped exponential backoff with jitter: ``base·2ⁿ`` up to ``cap``, each delay drawn from [½d, d]."""

    def __init__(self, base: float = 0.2, cap: float = 30.0, *, rng: Callable[[], float] = random.random) -> None:
        self.base = base
        self.cap = cap
        self.attempt = 0
        self._rng = rng

    def next(self) -> float:
        d = min(self.cap, self.base * (2.0 ** min(self.attempt, 64)))
        self.attempt += 1
        return d * (1.0 - 0.5 * self._rng())

    def reset(self) -> None:
        self.attempt = 0


# One delivered item: (key, resourceVersion, object). Pages and watch events travel as lists of these.
Item = tuple[str, str, Obj]
Event = tuple[str, str, str, Obj]  # (type, key, resourceVersion, object)


class Page(NamedTuple):
    """One page of a list, as the list worker hands it on."""

    items: list[Item]
    first: bool
    last: bool
    resource_version: str
    # The items' managedFields, taken off them but freed with the page: freed one by one while the rest of the page
    # lives, they would leave holes all over it that the next pages are parsed into, and scattered pages are slower
    # to parse and to free.
    stripped: list[Any]


def _strip(obj: Obj) -> Any:
    """Take the managedFields off (the bulk of a typical object's metadata, and nothing reads them); returns them."""
    return obj["metadata"].pop("managedFields", None)


def _item(res: Resource, obj: Obj) -> Item:
    meta = obj["metadata"]
    return res.key(meta), meta.get("resourceVersion", ""), obj


def _ident(rv: str, obj: Obj) -> tuple[str, str, str | None, str | None]:
    meta = obj["metadata"]
    return rv, meta.get("name", ""), meta.get("namespace"), meta.get("uid")


def _tombstone(res: Resource, ident: tuple[str, str, str | None, str | None]) -> Obj:
    """The DELETED object for something a relist no longer shows: identity only (the sink keeps the rest)."""
    rv, name, namespace, uid = ident
    meta: Obj = {"name": name, "resourceVersion": rv}
    if namespace:
        meta["namespace"] = namespace
    if uid:
        meta["uid"] = uid
    return {"apiVersion": res.api_version, "kind": res.kind, "metadata": meta}


def _abort(resp: urllib3.BaseHTTPResponse) -> None:
    """Close ``resp`` so that a read blocked on it in another thread returns now (close() alone won't wake it)."""
    with contextlib.suppress(Exception):  # not connected any more, or an older urllib3
        resp.shutdown()
    with contextlib.suppress(Exception):
        resp.close()


def _read_all(resp: urllib3.BaseHTTPResponse) -> bytes:
    try:
        data = resp.read()
    except BaseException:
        _abort(resp)
        raise
    resp.release_conn()
    return data


def _chunks(resp: urllib3.BaseHTTPResponse) -> Iterator[bytes]:
    """The body as it arrives: one HTTP chunk at a time (the apiserver flushes every watch event)."""
    if resp.chunked:
        yield from resp.read_chunked(None)
    else:
        while data := resp.read1(65536):
            yield data


def _open_list(
    open_: Callable[[Resource, dict[str, Any]], urllib3.BaseHTTPResponse], res: Resource, page_size: int
) -> Iterator[Page]:
    """A consistent list in pages; starts over if continue expires."""
    cont: str | None = None
    while True:
        query: dict[str, Any] = {"limit": page_size}
        if cont:
            query["continue"] = cont
        try:
            resp = open_(res, query)
        except Expired as exc:
            if cont is None:
                raise kubeapi.KubeApiError(410, "Expired", str(exc), context=f"GET {res.path}") from None
            log.info("list continuation of %s expired, listing again", res.kind, extra={"kind": res.kind})
            cont = None  # start over: a list stitched from two snapshots would be inconsistent
            continue
        doc = orjson.loads(_read_all(resp))
        meta = doc.get("metadata") or {}
        objects = doc.get("items") or ()
        del doc
        stripped = [_strip(o) for o in objects]
        first, cont = "continue" not in query, meta.get("continue") or None
        page = Page([_item(res, o) for o in objects], first, cont is None, meta.get("resourceVersion", ""), stripped)
        del objects, stripped
        yield page
        del page  # the consumer's once yielded (see KubeSource._list)
        if cont is None:
            return


def _check(res: Resource, resp: urllib3.BaseHTTPResponse) -> urllib3.BaseHTTPResponse:
    """Pass a 200 through; turn anything else into Expired / NotInstalled / KubeApiError (body consumed)."""
    if resp.status == 200:
        return resp
    body = _read_all(resp)
    if resp.status == 404 and res.crd:
        raise NotInstalled(res.path)
    if resp.status == 410:
        raise Expired(kubeapi.KubeApiError.from_response(resp, body).message)
    raise kubeapi.KubeApiError.from_response(resp, body, context=f"GET {res.path}")


class BulkLoadGC:
    """The garbage collector during a bulk load: raised gen-0 threshold, then the loaded state frozen.

    Why: every page parsed is ~50,000 container objects that live just long enough to be promoted to the oldest
    generation, and each full collection then re-scans everything loaded so far; at 60,000 pods that doubles the
    CPU of the sync. With a gen-0 threshold above what is in flight (the page being parsed and up to
    ``max_pending`` posted ones, ~45,000 objects each at 500 pods: a threshold of 100,000 still collected every
    couple of pages, ~3 us per pod), pages die young. Once loaded, ``gc.freeze()`` moves the state (acyclic records
    that refcounting frees) out of the collector's sight for good, so later full collections do not pause the
    event loop to scan 150,000 pods. Process-wide, hence one owner at a time.
    """

    THRESHOLD0 = 1_000_000
    _lock = threading.Lock()
    _owner: object | None = None

    def __init__(self) -> None:
        self._saved: tuple[int, int, int] | None = None

    def begin(self) -> None:
        with BulkLoadGC._lock:
            if BulkLoadGC._owner is not None or self._saved is not None:
                return
            BulkLoadGC._owner = self
            self._saved = gc.get_threshold()
            gc.collect()
            gc.freeze()  # what is alive before the load (modules, settings) is not garbage either
            gc.set_threshold(max(self._saved[0], self.THRESHOLD0), *self._saved[1:])

    def end(self, *, freeze: bool = True) -> None:
        with BulkLoadGC._lock:
            if BulkLoadGC._owner is not self or self._saved is None:
                return
            gc.set_threshold(*self._saved)
            self._saved = None
            BulkLoadGC._owner = None
            if freeze:
                gc.collect()  # once, so that no garbage is frozen with the state
                gc.freeze()

    def __enter__(self) -> BulkLoadGC:
        self.begin()
        return self

    def __exit__(self, *exc: object) -> None:
        self.end()


@dataclass
class _Known:
    """Loop-thread record of what this source has delivered for one kind: for diffing relists and tombstones."""

    delivered: bool = False  # has the sink been given a full or partial list of this kind yet
    synced: bool = False
    relisting: bool = False  # a relist is under way (its pages are diffed, not appended)
    objects: dict[str, tuple[str, str, str | None, str | None]] = field(default_factory=dict)  # key -> _ident
    seen: set[str] = field(default_factory=set)  # keys listed so far by the relist under way


class KubeSource:
    """Keeps ``state`` in step with the apiserver. ``start()`` on the loop thread; ``stop()`` from any thread.

    ``on_event(kind, type, obj)`` is called on the loop thread after every ``state.apply`` (watch events, later
    pages of the first list, and relist differences); ``replace`` calls are not reported. ``on_synced()`` is called
    on the loop thread once, when the first full list of every kind is in, before the collector freezes the state.
    Counters (dicts keyed by kind, for metrics): ``relists`` (lists forced by 410 Gone), ``watch_restarts``
    (watches reopened without a relist), ``events_applied`` (``apply`` calls), ``objects_listed``, ``errors``
    (failed list/watch attempts), ``apply_errors``; ``resource_versions`` is where each watch resumes.
    """

    def __init__(
        self,
        state: Sink,
        api_client: client.ApiClient,
        *,
        on_event: Callable[[str, str, Obj], None] | None = None,
        on_synced: Callable[[], object] | None = None,
        page_size: int = 500,
        watch_timeout: float = 300.0,
        read_timeout: float = 120.0,
        connect_timeout: float = 10.0,
        list_timeout: float = 120.0,
        backoff_base: float = 0.2,
        backoff_cap: float = 30.0,
        crd_poll_interval: float = 30.0,
        max_pending: int = 4,
        tune_gc: bool = True,
        resources: tuple[Resource, ...] = RESOURCES,
    ) -> None:
        self._state = state
        self._api = api_client
        self._on_event = on_event
        self._on_synced = on_synced
        self.page_size = page_size
        self.watch_timeout = watch_timeout
        self.read_timeout = read_timeout
        self.connect_timeout = connect_timeout
        self.list_timeout = list_timeout
        self.backoff_base = backoff_base
        self.backoff_cap = backoff_cap
        self.crd_poll_interval = crd_poll_interval
        self._resources = resources
        kinds = [r.kind for r in resources]

        self.relists: dict[str, int] = dict.fromkeys(kinds, 0)
        self.watch_restarts: dict[str, int] = dict.fromkeys(kinds, 0)
        self.events_applied: dict[str, int] = dict.fromkeys(kinds, 0)
        self.objects_listed: dict[str, int] = dict.fromkeys(kinds, 0)
        self.errors: dict[str, int] = dict.fromkeys(kinds, 0)
        self.apply_errors: dict[str, int] = dict.fromkeys(kinds, 0)
        self.resource_versions: dict[str, str] = dict.fromkeys(kinds, "")
        self.installed: dict[str, bool] = dict.fromkeys(kinds, True)
        self.last_delays: dict[str, float] = dict.fromkeys(kinds, 0.0)  # the latest backoff delay, for tests/debug

        self._known = {k: _Known() for k in kinds}
        self._healthy = dict.fromkeys(kinds, False)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._synced_event: asyncio.Event | None = None
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._responses: dict[str, urllib3.BaseHTTPResponse] = {}
        self._resp_lock = threading.Lock()
        # worker -> loop handoff: ops queue up here and one loop callback drains them all (never one per event)
        self._inbox: deque[tuple[Any, ...]] = deque()
        self._inbox_lock = threading.Lock()
        self._drain_scheduled = False
        self._slots = threading.Semaphore(max_pending)  # bounds what is parsed but not yet applied
        self._gc = BulkLoadGC() if tune_gc else None

    # ----------------------------------------------------------------------------------------- public

    @property
    def synced(self) -> bool:
        """True once the first full list of every kind has been applied (a CRD not installed counts as empty)."""
        return all(k.synced for k in self._known.values())

    def synced_kinds(self) -> list[str]:
        return [kind for kind, k in self._known.items() if k.synced]

    def start(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Start the watch threads; events are applied on ``loop`` (default: the running loop)."""
        if self._threads:
            raise RuntimeError("KubeSource already started")
        self._loop = loop or asyncio.get_running_loop()
        if self._synced_event is None:
            self._synced_event = asyncio.Event()
        self._stop.clear()
        if self._gc is not None and not self.synced:
            self._gc.begin()
        for res in self._resources:
            t = threading.Thread(target=self._run, args=(res,), name=f"kubesource-{res.kind}", daemon=True)
            self._threads.append(t)
            t.start()

    async def wait_synced(self, timeout: float | None = None) -> bool:
        """Wait (on the loop thread) until ``synced``; False on timeout."""
        if self.synced:
            return True
        assert self._synced_event is not None, "start() first"
        try:
            await asyncio.wait_for(self._synced_event.wait(), timeout)
        except TimeoutError:
            return False
        return True

    def stop(self, timeout: float = 2.0) -> None:
        """End the watches: closes the open responses so blocked reads return at once, then joins the threads."""
        self._stop.set()
        with self._resp_lock:
            responses = list(self._responses.values())
        for resp in responses:
            _abort(resp)
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        alive = [t.name for t in self._threads if t.is_alive()]
        if alive:
            log.warning("kubesource threads still running after stop", extra={"threads": alive})
        self._threads = []
        if self._gc is not None:
            self._gc.end(freeze=False)

    async def aclose(self) -> None:
        """``stop()`` without blocking the loop (e.g. from an aiohttp ``on_cleanup``)."""
        await asyncio.to_thread(self.stop)

    # ----------------------------------------------------------------------------------------- worker threads

    def _run(self, res: Resource) -> None:
        try:
            self._run_kind(res)
        except Stopped:
            pass
        except Exception:  # a bug: say so loudly, the kind stops updating
            log.exception("kubesource %s thread died", res.kind, extra={"kind": res.kind})

    def _run_kind(self, res: Resource) -> None:
        kind = res.kind
        backoff = Backoff(self.backoff_base, self.backoff_cap)
        need_list = True
        expired_in_a_row = 0
        while not self._stop.is_set():
            started = time.monotonic()
            self._healthy[kind] = False
            try:
                if need_list:
                    self._list(res)
                    need_list = False
                    backoff.reset()
                else:
                    self.watch_restarts[kind] += 1
                self._watch(res)
                expired_in_a_row = 0
                if self._healthy[kind] or time.monotonic() - started > 1.0:
                    backoff.reset()
                    continue  # ended cleanly (timeoutSeconds): resume at once
                delay = backoff.next()  # an empty stream closed at once: don't spin
            except Stopped:
                return
            except Expired as exc:
                self.relists[kind] += 1
                need_list = True
                expired_in_a_row += 1
                log.info("%s resourceVersion %s expired, relisting", kind, self.resource_versions[kind],
                         extra={"kind": kind, "resource_version": self.resource_versions[kind], "error": str(exc)})
                if expired_in_a_row == 1:
                    continue
                delay = backoff.next()
            except NotInstalled:
                need_list = True
                self._mark_absent(res)
                delay = self.crd_poll_interval
            except Exception as exc:  # a drop, a timeout, a 5xx, a 403, garbage: retry, slower each time
                if self._stop.is_set():
                    return
                self.errors[kind] += 1
                if self._healthy[kind]:
                    backoff.reset()  # a stream that worked for a while is no reason to slow the reconnect down
                delay = backoff.next()
                log.warning("%s %s failed, retrying in %.2fs: %s", kind, "list" if need_list else "watch", delay,
                            exc, extra={"kind": kind, "error": repr(exc), "delay_s": round(delay, 3),
                                        "resource_version": self.resource_versions[kind]})
            self.last_delays[kind] = delay
            if self._stop.wait(delay):
                return

    def _mark_absent(self, res: Resource) -> None:
        kind = res.kind
        if self.installed[kind]:
            log.warning("%s is not served (CRD not installed?): treating it as empty, checking again every %gs",
                        kind, self.crd_poll_interval, extra={"kind": kind, "path": res.path})
            self.installed[kind] = False
            self._post(("absent", res))

    def _open(self, res: Resource, query: dict[str, Any], timeout: tuple[float, float]) -> urllib3.BaseHTTPResponse:
        if self._stop.is_set():
            raise Stopped
        resp = kubeapi.request(self._api, "GET", res.path, query=query, timeout=timeout)
        with self._resp_lock:
            self._responses[res.kind] = resp
        if self._stop.is_set():  # stop() ran between the request and the registration above
            _abort(resp)
            raise Stopped
        return _check(res, resp)

    def _list(self, res: Resource) -> None:
        """List every page into the sink; leaves the list's resourceVersion in ``resource_versions``."""
        kind = res.kind
        started = time.monotonic()
        count = 0
        timeout = (self.connect_timeout, self.list_timeout)
        for page in _open_list(lambda r, q: self._open(r, q, timeout), res, self.page_size):
            count = len(page.items) if page.first else count + len(page.items)
            if page.last:  # before the last page is posted: whoever sees `synced` sees these too
                self.resource_versions[kind] = page.resource_version
                self.objects_listed[kind] += count
                if not self.installed[kind]:
                    log.info("%s is served now", kind, extra={"kind": kind})
                    self.installed[kind] = True
            self._post(("page", res, page))
            # The page is the loop thread's now: held here it would outlive its application until the next page
            # is parsed, one more page of Python objects (~10 MB) at the peak.
            del page
        seconds = time.monotonic() - started
        log.info("listed %d %s in %.2fs", count, kind, seconds,
                 extra={"kind": kind, "objects": count, "resource_version": self.resource_versions[kind],
                        "seconds": round(seconds, 3)})

    def _watch(self, res: Resource) -> None:
        """One watch from ``resource_versions[kind]`` until the server ends it; raises unless it ends cleanly."""
        kind = res.kind
        query = {
            "watch": True,
            "resourceVersion": self.resource_versions[kind],
            "allowWatchBookmarks": True,
            # randomized like client-go, so that many replicas do not all reconnect at once
            "timeoutSeconds": max(1, int(self.watch_timeout * (1.0 + random.random()))),
        }
        resp = self._open(res, query, (self.connect_timeout, self.read_timeout))
        tail = b""
        try:
            for chunk in _chunks(resp):
                lines = (tail + chunk if tail else chunk).split(b"\n")
                tail = lines.pop()  # an incomplete line waits for the next chunk
                events: list[Event] = []
                for line in lines:
                    if line.strip():
                        self._event(res, orjson.loads(line), events)
                        self._healthy[kind] = True
                if events:
                    self._post(("events", res, events))
        except BaseException:
            _abort(resp)
            if self._stop.is_set():
                raise Stopped from None
            raise
        resp.release_conn()

    def _event(self, res: Resource, ev: Obj, out: list[Event]) -> None:
        etype = ev.get("type")
        obj = ev.get("object") or {}
        if etype in ("ADDED", "MODIFIED", "DELETED"):
            _strip(obj)
            key, rv, obj = _item(res, obj)
            out.append((etype, key, rv, obj))
            self.resource_versions[res.kind] = rv
        elif etype == "BOOKMARK":
            bookmark = (obj.get("metadata") or {}).get("resourceVersion")
            if bookmark:
                self.resource_versions[res.kind] = bookmark
        elif etype == "ERROR":
            code, message = obj.get("code"), obj.get("message", "")
            if code == 410:
                raise Expired(message)
            if code == 404 and res.crd:
                raise NotInstalled(message)
            raise kubeapi.KubeApiError(code or 0, obj.get("reason", ""), message, context=f"watch {res.path}")
        else:
            raise ValueError(f"unexpected watch event type {etype!r}")

    def _post(self, op: tuple[Any, ...]) -> None:
        """Queue ``op`` for the loop thread; waits while ``max_pending`` ops are parsed but not yet applied."""
        while not self._slots.acquire(timeout=0.1):
            if self._stop.is_set():
                raise Stopped
        loop = self._loop
        assert loop is not None
        with self._inbox_lock:
            self._inbox.append(op)
            if self._drain_scheduled:
                return
            self._drain_scheduled = True
        try:
            loop.call_soon_threadsafe(self._drain)
        except RuntimeError:  # the loop is closed: we are shutting down
            self._stop.set()
            raise Stopped from None

    # ----------------------------------------------------------------------------------------- loop thread

    def _drain(self) -> None:
        deadline = time.monotonic() + 0.02  # let request handlers run between slices
        while True:
            with self._inbox_lock:
                if not self._inbox:
                    self._drain_scheduled = False
                    return
                op = self._inbox.popleft()
            try:
                if not self._stop.is_set():
                    self._apply(op)
            except Exception:
                log.exception("applying %s for %s failed", op[0], op[1].kind, extra={"kind": op[1].kind})
            finally:
                self._slots.release()
            if time.monotonic() > deadline:
                assert self._loop is not None
                self._loop.call_soon(self._drain)
                return

    def _apply(self, op: tuple[Any, ...]) -> None:
        what, res = op[0], op[1]
        known = self._known[res.kind]
        if what == "events":
            self._deliver(res, known, op[2])
        elif what == "page":
            self._apply_page(res, known, op[2])
        elif what == "absent":
            self._state.replace(res.kind, [])
            known.objects.clear()
            known.seen.clear()
            known.relisting = False
            known.delivered = True
            self._mark_synced(res.kind, known)

    def _apply_page(self, res: Resource, known: _Known, page: Page) -> None:
        items, first, last = page.items, page.first, page.last
        if first and not known.delivered:
            self._state.replace(res.kind, [obj for _key, _rv, obj in items])
            known.objects = {key: _ident(rv, obj) for key, rv, obj in items}
            known.delivered = True
        elif first:
            known.relisting = True
            known.seen = set()
        if known.relisting:
            seen, objects = known.seen, known.objects
            changes: list[Event] = []
            for key, rv, obj in items:
                seen.add(key)
                prev = objects.get(key)
                if prev is None:
                    changes.append(("ADDED", key, rv, obj))
                elif prev[0] != rv:  # unchanged objects are skipped: re-applying could move a pod's cores
                    changes.append(("MODIFIED", key, rv, obj))
            self._deliver(res, known, changes)
        elif not first:
            self._deliver(res, known, [("ADDED", key, rv, obj) for key, rv, obj in items])
        if last:
            if known.relisting:
                gone = [(key, ident) for key, ident in known.objects.items() if key not in known.seen]
                self._deliver(res, known, [("DELETED", key, i[0], _tombstone(res, i)) for key, i in gone])
                known.relisting = False
                known.seen = set()
            self._mark_synced(res.kind, known)

    def _deliver(self, res: Resource, known: _Known, events: list[Event]) -> None:
        kind, objects, apply, on_event = res.kind, known.objects, self._state.apply, self._on_event
        applied = 0
        for etype, key, rv, obj in events:
            if etype == "DELETED":
                objects.pop(key, None)
            else:
                objects[key] = _ident(rv, obj)
            try:
                apply(kind, etype, obj)
            except Exception:
                self.apply_errors[kind] += 1
                log.exception("state.apply %s %s %s failed", kind, etype, key,
                              extra={"kind": kind, "event": etype, "key": key})
                continue
            applied += 1
            if on_event is not None:
                try:
                    on_event(kind, etype, obj)
                except Exception:
                    log.exception("on_event failed", extra={"kind": kind, "event": etype, "key": key})
        self.events_applied[kind] += applied

    def _mark_synced(self, kind: str, known: _Known) -> None:
        if known.synced:
            return
        known.synced = True
        if self.synced:
            log.info("cluster state synced", extra={"objects": dict(self.objects_listed)})
            if self._on_synced is not None:
                try:
                    self._on_synced()
                except Exception:
                    log.exception("on_synced failed")
            if self._gc is not None:
                self._gc.end()
            if self._synced_event is not None:
                self._synced_event.set()


def list_once(
    state: Sink, api_client: client.ApiClient, *, page_size: int = 500,
    timeout: tuple[float, float] = (10.0, 120.0), resources: tuple[Resource, ...] = RESOURCES,
    tune_gc: bool = True,
) -> dict[str, int]:
    """List every kind into ``state`` once, synchronously (``report`` / ``render --kubeconfig``).

    Returns the object count per kind; a CRD that is not installed is replaced by nothing and counts 0.
    """
    counts: dict[str, int] = {}
    bulk = BulkLoadGC() if tune_gc else None
    if bulk is not None:
        bulk.begin()
    try:
        for res in resources:
            counts[res.kind] = _list_into(state, api_client, res, page_size, timeout)
    finally:
        if bulk is not None:
            bulk.end()
    return counts


def _list_into(state: Sink, api_client: client.ApiClient, res: Resource, page_size: int,
               timeout: tuple[float, float]) -> int:
    def open_(r: Resource, query: dict[str, Any]) -> urllib3.BaseHTTPResponse:
        return _check(r, kubeapi.request(api_client, "GET", r.path, query=query, timeout=timeout))

    n = 0
    try:
        for page in _open_list(open_, res, page_size):
            if page.first:  # also after a restarted list: replace drops what the abandoned attempt added
                state.replace(res.kind, [obj for _key, _rv, obj in page.items])
                n = 0
            else:
                for _key, _rv, obj in page.items:
                    state.apply(res.kind, "ADDED", obj)
            n += len(page.items)
    except NotInstalled:
        log.warning("%s is not served (CRD not installed?): treating it as empty", res.kind,
                    extra={"kind": res.kind, "path": res.path})
        state.replace(res.kind, [])
        return 0
    return n
