"""Property-based fuzzing of every POST endpoint — /mutate, /validate, /filter, /prioritize, /bind — over
HTTPS against ONE running server (component `serve`, the demo fleet), the way a hostile or broken client
would call it: random JSON, and the real-format fixtures mutated (keys deleted, types swapped, absurd
quantities, unicode, deep nesting, annotation keys with `/` and `~`, wrong kinds, nulls everywhere,
duplicate containers, bodies at and past the size limits, odd Content-Types, chunked bodies).

Whatever arrives: never a 5xx, never a traceback in a body; an AdmissionReview with a usable uid is always
answered in the wire format with that uid (checked by `Answer`, which reads it as the apiserver does); a
/mutate patch always applies with `jsonpatch` to the object that was sent; /validate never patches; the
extender always answers in its wire shape; and canary requests get the same answers after the fuzzing as
before it. The cases run per endpoint are printed and a minimum is asserted.

`MP_FUZZ_EXAMPLES=N` (default 300) sets the hypothesis examples per endpoint; every example sends at least
one request to its endpoint.
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import re
import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from placement.cluster import ClusterState
from placement.config import Settings
from server.app import ADMISSION_BODY_LIMIT, Runtime
from server.sources import demo_text, load_objects
from tests.support.extender import DEMO_NODES, FILTER_KEYS, model_pod, plain_pod
from tests.support.payloads import FIXTURES, fixture_json
from tests.support.servers import Served, serving
from tests.support.webhook import Answer, json_paths

Obj = dict[str, Any]

EXAMPLES = int(os.environ.get("MP_FUZZ_EXAMPLES", "300"))
EXTENDER_LIMIT = 4 * 1024 * 1024  # configurable (--extender-body-limit); small here so its edge is cheap to hit
LIMITS = {"/mutate": ADMISSION_BODY_LIMIT, "/validate": ADMISSION_BODY_LIMIT, "/filter": EXTENDER_LIMIT,
          "/prioritize": EXTENDER_LIMIT, "/bind": EXTENDER_LIMIT}
SENT: Counter[str] = Counter()  # requests sent per endpoint, whole module
STATUS: Counter[tuple[str, int]] = Counter()


# ------------------------------------------------------------------------------------------- the server


class Background:
    """The `serve` app over TLS on its own event loop thread; hypothesis drives it synchronously."""

    def __init__(self, tmp: Path) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="fuzz-server", daemon=True)
        self.thread.start()
        self.stack = AsyncExitStack()
        self.served, self.session = self.run(self._start(tmp))

    def run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=60)

    async def _start(self, tmp: Path) -> tuple[Served, aiohttp.ClientSession]:
        settings = Settings()
        runtime = Runtime(settings, ClusterState.from_objects(load_objects(demo_text()), settings),
                          extender_body_limit=EXTENDER_LIMIT)
        served = await self.stack.enter_async_context(serving(runtime, "serve", tmp))
        session = await self.stack.enter_async_context(aiohttp.ClientSession())
        return served, session

    async def _post(self, path: str, body: bytes, content_type: str | None, chunked: bool) -> tuple[int, str, str]:
        headers = {"Content-Type": content_type} if content_type is not None else {}

        async def pieces() -> Any:
            for i in range(0, len(body), 1 << 16):
                yield body[i:i + (1 << 16)]

        data: Any = pieces() if chunked else body
        async with self.session.post(self.served.url + path, data=data, headers=headers,
                                     skip_auto_headers=["Content-Type"],
                                     **self.served.request_kwargs()) as resp:  # type: ignore[arg-type]
            return resp.status, resp.content_type, await resp.text()

    def post(self, path: str, body: bytes, content_type: str | None = "application/json",
             chunked: bool = False) -> tuple[int, str, str]:
        endpoint = path.split("?")[0]
        SENT[endpoint] += 1
        status, ctype, text = self.run(self._post(path, body, content_type, chunked))
        STATUS[(endpoint, status)] += 1
        assert status < 500, text
        assert "Traceback" not in text and 'File "' not in text, text[:2000]
        assert ctype == "application/json", (status, ctype, text[:500])
        if status != 200:
            assert status == 400, (status, text[:500])
            error = json.loads(text)["error"]
            assert isinstance(error, str) and error
        return status, ctype, text

    def ledgers(self) -> list[Obj]:
        async def read() -> list[Obj]:
            return [ledger.to_json() for ledger in self.served.runtime.cluster.ledgers()]
        return self.run(read())  # type: ignore[no-any-return]

    def close(self) -> None:
        self.run(self.stack.aclose())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        self.loop.close()


# ------------------------------------------------------------------------------------------- canaries


def _ar(name: str) -> Obj:
    return copy.deepcopy(fixture_json(name))  # type: ignore[no-any-return]


def _ext_args(pod: Obj, names: list[str]) -> bytes:
    return orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": names})


def _tp3_deployment() -> Obj:
    sent = _ar("ar-deployment-create.json")
    template = sent["request"]["object"]["spec"]["template"]["metadata"]
    template.setdefault("annotations", {})["model-manager.io/tensor-parallel-size"] = "3"
    return sent


# Requests whose answers do not depend on what the fuzzing binds (capacity changes; these never look at it).
CANARIES: list[tuple[str, bytes]] = [
    ("/mutate?timeout=10s", orjson.dumps(_ar("ar-pod-kserve-rs.json"))),
    ("/mutate?timeout=10s", orjson.dumps(_ar("ar-pod-kubectl-run.json"))),
    ("/validate?timeout=10s", orjson.dumps(_tp3_deployment())),  # refused whatever is free: TP 3
    ("/filter", _ext_args(plain_pod("canary-web"), DEMO_NODES)),
    ("/prioritize", _ext_args(plain_pod("canary-web"), DEMO_NODES)),
    ("/filter", _ext_args(model_pod("canary-tp16", tp=16, cpus=16), DEMO_NODES)),
    ("/bind", orjson.dumps({"PodName": "canary", "PodNamespace": "llm", "PodUID": "canary-uid", "Node": "nowhere"})),
]


def canary_answers(server: Background) -> list[Any]:
    out = []
    for path, body in CANARIES:
        status, _, text = server.post(path, body)
        assert status == 200, text
        out.append(json.loads(text))
    return out


def assert_still_serving(server: Background, baseline: list[Any]) -> None:
    """The same answers as before the fuzzing, and a fresh small model pod is filtered, scored and bound."""
    assert canary_answers(server) == baseline
    assert baseline[0]["response"]["patchType"] == "JSONPatch"
    assert "1, 2, 4 or 8" in baseline[2]["response"]["status"]["message"]
    pod = model_pod(f"canary-{uuid.uuid4().hex[:8]}", tp=1, cpus=2)
    status, _, text = server.post("/filter", _ext_args(pod, DEMO_NODES))
    passed = json.loads(text)["NodeNames"]
    assert status == 200 and passed, text
    status, _, text = server.post("/prioritize", _ext_args(pod, passed))
    assert status == 200, text
    check_prioritize(json.loads(_ext_args(pod, passed)), text)
    meta = pod["metadata"]
    bind = {"PodName": meta["name"], "PodNamespace": meta["namespace"], "PodUID": meta["uid"], "Node": passed[0]}
    status, _, text = server.post("/bind", orjson.dumps(bind))
    assert status == 200 and json.loads(text) == {"Error": ""}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Background, list[Any]]]:
    bg = Background(tmp_path_factory.mktemp("fuzz"))
    try:
        yield bg, canary_answers(bg)
    finally:
        bg.close()


# ------------------------------------------------------------------------------------------- payloads


DEMO_NODE_OBJECTS = [o for o in load_objects(demo_text()) if o.get("kind") == "Node"]
AR_SEEDS = [fixture_json(p.name) for p in sorted(FIXTURES.glob("*.json"))
            if p.name.startswith(("ar-", "admissionreview-"))]


def _extender_seeds() -> list[Obj]:
    nodecache = fixture_json("extender-args-nodecache.json")
    nodelist = fixture_json("extender-args-nodelist.json")
    on_demo = copy.deepcopy(nodecache)
    on_demo["NodeNames"] = list(DEMO_NODES)
    list_demo = copy.deepcopy(nodelist)
    list_demo["Nodes"]["items"] = copy.deepcopy(DEMO_NODE_OBJECTS)
    tp2 = {"Pod": model_pod("fuzz-tp2", tp=2, cpus=16), "Nodes": None, "NodeNames": list(DEMO_NODES)}
    web = {"Pod": plain_pod("fuzz-web"), "Nodes": None, "NodeNames": list(DEMO_NODES)}
    return [nodecache, nodelist, on_demo, list_demo, tp2, web]


EXT_SEEDS = _extender_seeds()
BIND_SEED = fixture_json("extender-bind-args.json")
UIDS = [f"fuzz-uid-{i}" for i in range(6)]  # few: only the first bind of each can take cores

# Sentinels replaced in the serialized text: nesting json.dumps cannot write, bytes no JSON value holds.
_SENTINEL = re.compile(r'"\\u0000(DEEP|DEEPOBJ|SURROGATE|BIG)(\d+)\\u0000"')
ODD_NUMBERS = [0, -1, -8, 2**63, 2**64 + 1, -(2**70), 1e300, -1e300, 1.5e-300, 0.1, 3.14159, 10**30]
QUANTITIES = ["1e400", "1e308", "-8", "-0", "0", "", " ", "abc", "8Ki", "8 ", " 8", "+8", "0x10", "1_000", "1.5.5",
              "NaN", "Infinity", "-Infinity", "99999999999999999999999999999", "8" * 400, "٣", "\uff18", "8m", "1E3",
              "0.0000001", "100000000000000000000000000000000000000000m", "16", "64Gi", "1Ei", "9Ei", "2.5e10",
              "e5", ".", "-", "1/2", "8\u00a0", "\u2163"]
TP_KEYS = ["model-manager.io/tensor-parallel-size", "cpu-policy.model-manager.io/tensor-parallel-size",
           "model-manager.io/cpu-policy", "model-manager.io/nri-balloon", "model-manager.io/container",
           "model-manager.io/node", "model-manager.io/preflight", "model-manager.io/require-amx"]
ANNOTATION_KEYS = ["a/b", "~", "~0", "~1", "/", "//", "a~1b", "x/y/z~0~1", "", "~/~/", "sidecar.istio.io/inject",
                   "model-manager.io/tensor-parallel-size~", "balloon.balloons.resource-policy.nri.io/container.m/n",
                   "balloon.balloons.resource-policy.nri.io/container.~0", "ключ/значение", "🙂/~", *TP_KEYS]
KINDS = ["Pod", "pod", "Deployment", "StatefulSet", "ReplicaSet", "Node", "Binding", "AdmissionReview", "",
         "Pod ", "DaemonSet", "Job", "CronJob", "ExtenderArgs"]
CONTENT_TYPES = ["application/json"] * 50 + [
    "application/json; charset=utf-8", "Application/JSON", "application/json;charset=UTF-16", "text/plain",
    "application/x-www-form-urlencoded", "application/json-patch+json", "application/yaml", "", None]
TIMEOUTS = ["10s"] * 6 + ["30s", "1m0s", "1h", "1ms", "0s", "0", "-1s", "abc", "", "1.5s", "999999999999s", "10"]

UNICODE = st.text(st.characters(exclude_categories=("Cs",)), max_size=40)
JSON_LEAF = (st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
             | UNICODE | st.sampled_from(QUANTITIES))
JSON_KEYS = UNICODE | st.sampled_from(["request", "uid", "object", "kind", "apiVersion", "metadata", "spec",
                                       "containers", "Pod", "Nodes", "NodeNames", "PodUID", "PodName", "Node",
                                       "items", "annotations", "labels", "resources", "requests", "cpu"])
RANDOM_JSON = st.recursive(JSON_LEAF, lambda inner: st.lists(inner, max_size=5)
                           | st.dictionaries(JSON_KEYS, inner, max_size=5), max_leaves=30)


def _get(doc: Any, path: tuple[Any, ...]) -> Any:
    for key in path:
        doc = doc[key]
    return doc


def _odd_value(draw: st.DrawFn, like: Any) -> Any:
    """A value of another JSON type than `like`, or an absurd one of the same."""
    choices: list[Any] = [None, True, False, draw(st.sampled_from(ODD_NUMBERS)), draw(UNICODE),
                          draw(st.sampled_from(QUANTITIES)), [], {}, [like], {"": like}, draw(RANDOM_JSON)]
    return draw(st.sampled_from(choices))


def _dicts_with(doc: Any, key: str) -> list[tuple[Any, ...]]:
    return [p for p in json_paths(doc) if isinstance(_get(doc, p), dict) and key in _get(doc, p)] + \
        ([()] if isinstance(doc, dict) and key in doc else [])


@st.composite
def mutated(draw: st.DrawFn, seeds: list[Obj], limit: int) -> tuple[Any, bytes]:
    """A real payload with 1–5 hostile changes: the parsed document and the exact bytes sent."""
    doc = orjson.loads(orjson.dumps(draw(st.sampled_from(seeds))))
    big = False
    for _ in range(draw(st.sampled_from([1, 1, 2, 2, 3, 4, 5]))):
        paths = list(json_paths(doc))
        how = draw(st.sampled_from(["delete", "null", "swap", "quantity", "unicode", "deep", "annotation", "kind",
                                    "null-subtree", "duplicate-containers", "big", "uid", "number"]))
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        *parent_path, last = path
        parent = _get(doc, tuple(parent_path))
        if how == "delete" and isinstance(parent, dict):
            del parent[last]
        elif how == "null":
            parent[last] = None
        elif how == "swap":
            parent[last] = _odd_value(draw, parent[last])
        elif how == "quantity":
            places = [p for p in paths if len(p) > 1 and p[-2] in ("requests", "limits")] + \
                [p for p in paths if p[-1] in TP_KEYS or p[-1] in ("replicas", "cpu", "memory")]
            where = draw(st.sampled_from(places)) if places else path
            _get(doc, where[:-1])[where[-1]] = draw(st.sampled_from(QUANTITIES) | st.sampled_from(ODD_NUMBERS))
        elif how == "unicode":
            strings = [p for p in paths if isinstance(_get(doc, p), str)] or [path]
            where = draw(st.sampled_from(strings))
            # now and then a lone surrogate, which no JSON text may hold: the whole body is unreadable
            lone = draw(st.sampled_from([False] * 7 + [True]))
            _get(doc, where[:-1])[where[-1]] = "\x00SURROGATE0\x00" if lone else draw(UNICODE)
        elif how == "deep":
            depth = draw(st.sampled_from([10, 63, 64, 65, 100, 253, 254, 255, 300, 600, 1000, 1023, 1025, 5000]))
            parent[last] = f"\x00{draw(st.sampled_from(['DEEP', 'DEEPOBJ']))}{depth}\x00"
        elif how == "annotation":
            metas = _dicts_with(doc, "metadata") or [()]
            meta_owner = _get(doc, draw(st.sampled_from(metas)))
            if isinstance(meta_owner, dict):
                meta = meta_owner.get("metadata")
                if not isinstance(meta, dict):
                    meta = meta_owner["metadata"] = {}
                field = draw(st.sampled_from(["annotations", "labels"]))
                if not isinstance(meta.get(field), dict):
                    meta[field] = {}
                for _ in range(draw(st.integers(1, 4))):
                    key = draw(st.sampled_from(ANNOTATION_KEYS) | UNICODE)
                    meta[field][key] = draw(st.sampled_from(["1", "2", "4", "3", "true", "main", ""]) | UNICODE
                                            | st.sampled_from(QUANTITIES) | st.just(None) | st.integers())
        elif how == "kind":
            kinds = [p for p in paths if p[-1] in ("kind", "apiVersion")] or [path]
            where = draw(st.sampled_from(kinds))
            value = draw(st.sampled_from(KINDS) | st.sampled_from(["v1", "apps/v1", "admission.k8s.io/v1beta1"]))
            _get(doc, where[:-1])[where[-1]] = value if draw(st.booleans()) else {"kind": value}
        elif how == "null-subtree":
            target = _get(doc, path)
            p = draw(st.sampled_from([0.3, 0.7, 1.0]))
            rnd = draw(st.randoms(use_true_random=False))
            for sub in list(json_paths(target)):
                try:
                    holder = _get(target, sub[:-1])
                    if rnd.random() < p:
                        holder[sub[-1]] = None
                except (KeyError, IndexError, TypeError):
                    pass  # an ancestor is null already
        elif how == "duplicate-containers":
            specs = _dicts_with(doc, "containers") or [()]
            spec = _get(doc, draw(st.sampled_from(specs)))
            containers = spec.get("containers") if isinstance(spec, dict) else None
            if isinstance(containers, list) and containers:
                times = draw(st.sampled_from([1, 2, 50]))
                spec["containers"] = containers + [copy.deepcopy(containers[0]) for _ in range(times)]
        elif how == "big" and not big:
            big = True
            target = draw(st.sampled_from([limit - 1, limit, limit + 1, limit - 200, 1 << 20, 1 << 16]))
            parent[last] = f"\x00BIG{target}\x00"
        elif how == "uid":
            uids = [p for p in paths if p[-1] in ("uid", "PodUID")] or [path]
            where = draw(st.sampled_from(uids))
            _get(doc, where[:-1])[where[-1]] = draw(st.sampled_from(["", " ", "x" * 10_000, "../../etc"]) | UNICODE
                                                    | st.just(None) | st.integers() | st.just(["u"]))
        elif how == "number":
            parent[last] = draw(st.sampled_from(ODD_NUMBERS))
    return doc, encode(doc, draw(st.booleans()), draw(st.sampled_from(["x", "é", "€", "𝄞"])))


def encode(doc: Any, ascii_only: bool, filler: str) -> bytes:
    text = json.dumps(doc, ensure_ascii=ascii_only)
    pending: list[int] = []

    def expand(match: re.Match[str]) -> str:
        what, n = match.group(1), int(match.group(2))
        if what == "DEEP":
            return "[" * n + "]" * n
        if what == "DEEPOBJ":
            return '{"a":' * n + "1" + "}" * n
        if what == "SURROGATE":
            return '"\\ud800x"'
        pending.append(n)
        return "\x00BIG\x00"

    text = _SENTINEL.sub(expand, text)
    if not pending:
        return text.encode()
    rest = len(text.encode()) - len("\x00BIG\x00") + 2  # the quotes stay
    room = max(0, pending[0] - rest)
    pad = filler * (room // len(filler.encode())) + "x" * (room % len(filler.encode()))
    return text.replace("\x00BIG\x00", '"' + pad + '"', 1).encode()


@st.composite
def request_body(draw: st.DrawFn, seeds: list[Obj], limit: int) -> tuple[Any, bytes]:
    """Mostly mutated real payloads; else random JSON, a real envelope around random JSON, or raw bytes."""
    shape = draw(st.sampled_from(["mutated"] * 6 + ["random", "wrapped", "bytes", "seed"]))
    if shape == "mutated":
        return draw(mutated(seeds, limit))  # type: ignore[no-any-return]
    if shape == "seed":
        doc = draw(st.sampled_from(seeds))
        return doc, orjson.dumps(doc)
    if shape == "random":
        doc = draw(RANDOM_JSON)
        return doc, json.dumps(doc, ensure_ascii=draw(st.booleans())).encode()
    if shape == "wrapped":
        doc = orjson.loads(orjson.dumps(draw(st.sampled_from(seeds))))
        paths = [p for p in json_paths(doc) if isinstance(_get(doc, p), dict)]
        if paths:
            path = draw(st.sampled_from(paths))
            _get(doc, path[:-1])[path[-1]] = draw(RANDOM_JSON)
        return doc, json.dumps(doc).encode()
    raw = draw(st.binary(max_size=200) | st.sampled_from(
        [b"", b"{", b"[]", b"null", b'"x"', b"{}", b"\xff\xfe{}", b"{\"a\":1,}", b"\xef\xbb\xbf{}", b"1e400",
         b"{\"kind\":\"AdmissionReview\",\"kind\":1}", b" " * 1000]))
    return None, raw


def transport(draw: st.DrawFn) -> tuple[str | None, bool]:
    return draw(st.sampled_from(CONTENT_TYPES)), draw(st.booleans())


def _loads(body: bytes) -> Any:
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        return _UNREADABLE


_UNREADABLE = object()


def readable(body: bytes, content_type: str | None, limit: int) -> Any:
    """What the server can read of this request (its JSON), or _UNREADABLE when it must answer 400."""
    media = (content_type if content_type is not None else "application/json").split(";")[0].strip().lower()
    if media != "application/json" or not body or len(body) > limit:
        return _UNREADABLE
    return _loads(body)


# ------------------------------------------------------------------------------------------- checks


def usable_uid(doc: Any) -> str | None:
    """The uid a webhook must echo: an admission.k8s.io/v1 AdmissionReview whose request.uid is a string."""
    if not isinstance(doc, dict) or doc.get("kind") != "AdmissionReview" or doc.get("apiVersion") != \
            "admission.k8s.io/v1":
        return None
    request = doc.get("request")
    uid = request.get("uid") if isinstance(request, dict) else None
    return uid if isinstance(uid, str) and uid else None


def check_admission(path: str, sent: Any, status: int, text: str) -> None:
    uid = usable_uid(sent)
    if uid is None:  # unreadable, or no AdmissionReview to answer: only a 400 can say why
        assert status == 400, text[:500]
        return
    assert status == 200, f"an AdmissionReview with uid {uid!r} must get an AdmissionReview: {text[:500]}"
    answer = Answer(sent, status, "application/json", text, mutating=path == "/mutate")  # the apiserver's checks
    if path == "/mutate":
        assert answer.allowed, "the mutating webhook is not the gate: it never refuses"
    if answer.ops:
        patched = answer.pod  # jsonpatch applies it to exactly the object sent
        assert isinstance(patched, dict)


def _str_map(value: Any) -> bool:
    return isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())


def candidates(sent: Obj) -> list[str]:
    """The nodes the extender must judge, in order: keys matched as Go matches them (case-folded, the last
    one wins), NodeNames first, then the NodeList's nodes not already named."""
    fields = {k.casefold(): v for k, v in sent.items() if k.casefold() in ("nodenames", "nodes")}
    names = fields.get("nodenames")
    nodes = fields.get("nodes")
    listed = [i["metadata"]["name"] for i in nodes.get("items") or ()] if isinstance(nodes, dict) else []
    if names is None:
        return listed
    return [*names, *(n for n in listed if n not in set(names))]


def check_filter(sent: Obj, text: str) -> None:
    answer = json.loads(text)
    assert isinstance(answer, dict) and set(answer) == FILTER_KEYS, answer
    assert isinstance(answer["Error"], str)
    failed, unresolvable = answer["FailedNodes"], answer["FailedAndUnresolvableNodes"]
    assert _str_map(failed) and _str_map(unresolvable)
    names, nodes = answer["NodeNames"], answer["Nodes"]
    assert names is None or (isinstance(names, list) and all(isinstance(n, str) for n in names))
    assert nodes is None or (isinstance(nodes, dict) and isinstance(nodes["items"], list))
    assert names is not None or nodes is not None
    passed = [*(names or []), *(i["metadata"]["name"] for i in (nodes or {}).get("items", []))]
    # every candidate judged, each in exactly one of the three answers
    assert set(passed) | set(failed) | set(unresolvable) == set(candidates(sent))
    assert not set(passed) & set(failed) and not set(passed) & set(unresolvable) and not set(failed) & set(unresolvable)


def check_prioritize(sent: Obj, text: str) -> None:
    answer = json.loads(text)
    assert isinstance(answer, list)
    for host in answer:
        assert set(host) == {"Host", "Score"} and isinstance(host["Host"], str)
        assert isinstance(host["Score"], int) and not isinstance(host["Score"], bool) and 1 <= host["Score"] <= 10
    # Only the candidates above the lowest score, in the order sent, each once (kube-scheduler adds 0 to the rest).
    listed, names = [h["Host"] for h in answer], candidates(sent)
    assert listed == [n for n in names if n in set(listed)]


def check_bind(text: str) -> str:
    answer = json.loads(text)
    assert isinstance(answer, dict) and list(answer) == ["Error"] and isinstance(answer["Error"], str)
    return answer["Error"]  # type: ignore[no-any-return]


def send(server: Background, path: str, doc: Any, body: bytes, content_type: str | None, chunked: bool,
         query: str = "") -> tuple[Any, int, str]:
    status, _, text = server.post(path + query, body, content_type, chunked)
    sent = readable(body, content_type, LIMITS[path])
    if sent is _UNREADABLE:
        assert status == 400, f"{path} read an unreadable body: {text[:300]}"
    return sent, status, text


def check_extender(path: str, sent: Any, status: int, text: str) -> None:
    if status != 200:
        return
    if path == "/filter":
        check_filter(sent, text)
    elif path == "/prioritize":
        check_prioritize(sent, text)
    else:
        check_bind(text)


def report(endpoint: str, server: Background, baseline: list[Any], capsys: pytest.CaptureFixture[str],
           before: tuple[int, Counter[tuple[str, int]]]) -> None:
    ran = SENT[endpoint] - before[0]
    statuses = {s: n - before[1][(e, s)] for (e, s), n in sorted(STATUS.items()) if e == endpoint}
    assert_still_serving(server, baseline)
    with capsys.disabled():
        print(f"\nfuzz {endpoint}: {ran} requests over HTTPS ({EXAMPLES} examples), status counts {statuses}")
    assert ran >= EXAMPLES


FUZZ = hsettings(max_examples=EXAMPLES, deadline=None, database=None,
                 suppress_health_check=list(HealthCheck))


# ------------------------------------------------------------------------------------------- tests


@pytest.mark.parametrize("path", ["/mutate", "/validate"])
def test_fuzz_admission(server: tuple[Background, list[Any]], path: str, capsys: pytest.CaptureFixture[str]) -> None:
    bg, baseline = server
    before = SENT[path], Counter(STATUS)

    @FUZZ
    @given(case=request_body(AR_SEEDS + EXT_SEEDS[:1], ADMISSION_BODY_LIMIT), data=st.data())
    def fuzz(case: tuple[Any, bytes], data: st.DataObject) -> None:
        doc, body = case
        content_type, chunked = transport(data.draw)
        query = "?timeout=" + data.draw(st.sampled_from(TIMEOUTS))
        sent, status, text = send(bg, path, doc, body, content_type, chunked, query)
        check_admission(path, sent, status, text)

    fuzz()
    report(path, bg, baseline, capsys, before)


@pytest.mark.parametrize("path", ["/filter", "/prioritize"])
def test_fuzz_filter_and_prioritize(server: tuple[Background, list[Any]], path: str,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    bg, baseline = server
    before = SENT[path], Counter(STATUS)

    @FUZZ
    @given(case=request_body([*EXT_SEEDS, BIND_SEED, AR_SEEDS[0]], EXTENDER_LIMIT), data=st.data())
    def fuzz(case: tuple[Any, bytes], data: st.DataObject) -> None:
        doc, body = case
        content_type, chunked = transport(data.draw)
        sent, status, text = send(bg, path, doc, body, content_type, chunked)
        check_extender(path, sent, status, text)

    fuzz()
    report(path, bg, baseline, capsys, before)


def test_fuzz_bind(server: tuple[Background, list[Any]], capsys: pytest.CaptureFixture[str]) -> None:
    """Mutated ExtenderBindingArgs alone, and after /filter has seen a (mutated) model pod under that uid, so
    that the bind reaches the ledger with whatever demand the pod carried. At the end no NUMA node holds more
    than its capacity."""
    bg, baseline = server
    before = SENT["/bind"], Counter(STATUS)
    bind_seeds = [BIND_SEED, {**BIND_SEED, "Node": "cpu-a1"}, {**BIND_SEED, "Node": "cpu-snc4"}]

    @FUZZ
    @given(data=st.data())
    def fuzz(data: st.DataObject) -> None:
        if data.draw(st.booleans()):
            pod = model_pod(f"fuzz-{data.draw(st.integers(0, 3))}", uid=data.draw(st.sampled_from(UIDS)),
                            tp=data.draw(st.sampled_from([1, 2, 4])), cpus=data.draw(st.sampled_from([2, 8, 16])))
            doc, body = data.draw(mutated([{"Pod": pod, "Nodes": None, "NodeNames": list(DEMO_NODES)}],
                                          EXTENDER_LIMIT))
            sent, status, text = send(bg, "/filter", doc, body, "application/json", False)
            check_extender("/filter", sent, status, text)
            meta = pod["metadata"]
            seed = {"PodName": meta["name"], "PodNamespace": meta["namespace"], "PodUID": meta["uid"],
                    "Node": data.draw(st.sampled_from([*DEMO_NODES, "nowhere"]))}
            doc, body = seed, orjson.dumps(seed)
            if data.draw(st.booleans()):
                doc, body = data.draw(mutated([seed], EXTENDER_LIMIT))
        else:
            doc, body = data.draw(request_body(bind_seeds + EXT_SEEDS[:1], EXTENDER_LIMIT))
        content_type, chunked = transport(data.draw)
        sent, status, text = send(bg, "/bind", doc, body, content_type, chunked)
        check_extender("/bind", sent, status, text)

    fuzz()
    for ledger in bg.ledgers():
        for numa in ledger["numa"]:
            held = sum(h["cores"] for h in numa["held"])
            assert held <= numa["capacity"] and numa["free"] >= 0, (ledger["node"], numa)
    report("/bind", bg, baseline, capsys, before)


def test_a_node_list_nested_deeper_than_can_be_echoed_is_a_400_not_a_500(server: tuple[Background, list[Any]]) -> None:
    """Found by the fuzzing above: orjson reads 1,024 levels but writes only 254, and the NodeList form of
    /filter echoes the passing Node objects (here the NodeList's own metadata)."""
    bg, baseline = server
    args = copy.deepcopy(EXT_SEEDS[3])  # the fixture's NodeList form, with the demo fleet's nodes
    args["Nodes"]["metadata"] = "\x00DEEPOBJ300\x00"
    status, _, text = bg.post("/filter", encode(args, True, "x"))
    assert status == 400 and "never nested this deep" in json.loads(text)["error"]
    args["Nodes"]["metadata"] = "\x00DEEPOBJ200\x00"
    status, _, text = bg.post("/filter", encode(args, True, "x"))
    # 200 with a NodeList answer; whether a node passes depends on what the fuzzing bound before.
    answer = json.loads(text)
    assert status == 200 and isinstance(answer["Nodes"]["items"], list) and answer["NodeNames"] is None
    assert canary_answers(bg) == baseline


def test_a_million_tiny_replicas_are_answered_within_the_apiservers_timeout(
        server: tuple[Background, list[Any]]) -> None:
    """Found by probing what the fuzzing cannot reach by chance: the pre-flight placed replicas one by one
    while the event loop waited, 31 s for a million 1m best-effort copies. It now stops at a bound and
    admits the workload with a note (its pods are still checked one by one), or refuses with the count
    when fewer fit."""
    bg, baseline = server
    for cpu, allowed in (("1m", True), ("1", False)):
        sent = _ar("ar-deployment-create.json")
        template = sent["request"]["object"]["spec"]["template"]
        sent["request"]["object"]["spec"]["replicas"] = 1_000_000
        template["metadata"].setdefault("annotations", {})["model-manager.io/cpu-policy"] = "best-effort"
        for container in template["spec"]["containers"]:
            container.setdefault("resources", {}).setdefault("requests", {})["cpu"] = cpu
        status, _, text = bg.post("/validate?timeout=10s", orjson.dumps(sent))
        answer = Answer(sent, status, "application/json", text, mutating=False)
        assert answer.allowed is allowed
        if allowed:
            assert "placed the first 2,000 of 1,000,000 replicas" in answer.warning_text
        else:
            assert "of 1000000 replicas fit at once" in answer.message
    assert canary_answers(bg) == baseline


def _with_terms(name: str, terms: int, uid: str) -> Obj:
    sent = _ar(name)
    sent["request"]["uid"] = uid
    spec = sent["request"]["object"]["spec"]
    spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": f"example.com/zone-{i}", "operator": "NotIn", "values": ["x"]}]}
        for i in range(terms)]}}}
    return sent


def test_a_model_pod_too_costly_to_judge_is_left_alone_by_mutate_and_refused_by_validate(
        server: tuple[Background, list[Any]]) -> None:
    """Found by probing: every node is asked whether the pod's affinity admits it, so 2,000 terms on 500 nodes
    held the event loop 4.5 s in /mutate and 8.5 s in /validate (20,000 terms: 38 s and 72 s). A model pod
    beyond the bound is now admitted unchanged by /mutate with a warning and refused by /validate with the
    reason; a pod at the bound is pinned, and its mutated self passes /validate's bound."""
    bg, baseline = server
    sent = _with_terms("ar-pod-kserve-rs.json", 2_000, "too-many-terms")
    for path in ("/mutate", "/validate"):
        status, _, text = bg.post(f"{path}?timeout=10s", orjson.dumps(sent))
        answer = Answer(sent, status, "application/json", text, mutating=path == "/mutate")
        if path == "/mutate":
            assert answer.allowed and answer.ops == [] and "4000 terms and requirements" in answer.warning_text
        else:
            assert not answer.allowed and "4000 terms and requirements" in answer.message

    at_bound = _with_terms("ar-pod-kserve-rs.json", 64, "at-the-bound")  # 64 terms + 64 requirements = 128
    status, _, text = bg.post("/mutate?timeout=10s", orjson.dumps(at_bound))
    mutated = Answer(at_bound, status, "application/json", text, mutating=True)
    assert mutated.allowed and mutated.ops and not mutated.warnings
    pod = mutated.pod
    pod["metadata"]["name"] = pod["metadata"]["generateName"] + "x7k2p"
    validated = {**at_bound, "request": {**at_bound["request"], "uid": "at-the-bound-v", "object": pod}}
    status, _, text = bg.post("/validate?timeout=10s", orjson.dumps(validated))
    assert "terms and requirements" not in text

    plain = _with_terms("ar-pod-kubectl-run.json", 2_000, "not-a-model")  # not ours to judge: untouched
    plain["request"]["object"]["metadata"]["labels"] = {"run": "web"}
    status, _, text = bg.post("/mutate?timeout=10s", orjson.dumps(plain))
    answer = Answer(plain, status, "application/json", text, mutating=True)
    assert answer.allowed and answer.ops == [] and answer.warnings == []
    assert canary_answers(bg) == baseline
