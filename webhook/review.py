"""AdmissionReview v1 in, AdmissionReview v1 out: parsing, the response shapes the apiserver accepts,
warnings it will not truncate, and the `?timeout=Ns` it sends. Pure: no I/O, no cluster state.

Rules from the apiserver (`VerifyAdmissionResponse`): same apiVersion/kind back, `response.uid` copied
from `request.uid`, `allowed` always present, `patch` (base64 of an RFC 6902 list) only together with
`patchType: JSONPatch`, and nothing of either from a validating webhook.
"""

from __future__ import annotations

import base64
import re
import textwrap
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

API_VERSION = "admission.k8s.io/v1"
KIND = "AdmissionReview"
PATCH_TYPE = "JSONPatch"

# A pod is ~12 levels deep, a Deployment ~16; the core copies objects recursively, so a hostile
# object nested hundreds deep must be refused before it gets there.
MAX_OBJECT_DEPTH = 64
# The apiserver's warning recorder (k8s.io/apiserver pkg/endpoints/filters/warning.go, v0.35) adds every
# webhook's warnings, deduplicated, as `Warning:` headers, whole while their total stays within 4096 runes; the
# warning that would pass 4096 switches it to truncating: every warning, those already added too, is cut to 256
# runes, and those past the 4096th rune are dropped. A warning of at most 256 runes is therefore never cut,
# whatever other webhooks add, and ours together stay within 4096, so none is dropped by our own doing.
WARNING_MAX = 256  # truncateItemRunes
WARNINGS_TOTAL = 4096  # truncateAtTotalRunes
DEFAULT_TIMEOUT = 10.0  # timeoutSeconds default in admissionregistration/v1
MAX_TIMEOUT = 30.0  # the largest timeoutSeconds the apiserver accepts


class ReviewError(ValueError):
    """The body is not a usable AdmissionReview. With `uid` we can still answer in the wire format;
    without it only an HTTP 400 is possible."""

    def __init__(self, message: str, uid: str | None = None) -> None:
        super().__init__(message)
        self.uid = uid


@dataclass(frozen=True, slots=True)
class Review:
    uid: str
    group: str  # request.kind: what the object is (after matchPolicy conversion)
    version: str
    kind: str
    sub_resource: str
    name: str  # empty for a generateName CREATE as seen by mutating webhooks
    namespace: str  # request.namespace: authoritative even before 1.24
    operation: str
    object: Any  # None when absent (DELETE, CONNECT, or a broken caller)
    dry_run: bool

    @property
    def object_meta(self) -> Mapping[str, Any]:
        meta = self.object.get("metadata") if isinstance(self.object, Mapping) else None
        return meta if isinstance(meta, Mapping) else {}


def _show(value: Any, limit: int = 60) -> str:
    """A value for a message, never a megabyte of it."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""


def parse_review(body: Any) -> Review:
    """Read an `admission.k8s.io/v1` AdmissionReview; raise ReviewError naming the first problem."""
    if not isinstance(body, Mapping):
        raise ReviewError(f"request body is not an AdmissionReview: expected a JSON object, got {_json_type(body)}")
    if body.get("kind") != KIND:
        raise ReviewError(f"request body is not an AdmissionReview: kind is {_show(body.get('kind'))}, "
                          f"expected {KIND!r}")
    if body.get("apiVersion") != API_VERSION:
        raise ReviewError(f"AdmissionReview apiVersion {_show(body.get('apiVersion'))} is not supported; "
                          f"send {API_VERSION} (admissionReviewVersions: [\"v1\"])")
    request = body.get("request")
    if not isinstance(request, Mapping):
        raise ReviewError("AdmissionReview has no request object" if request is None
                          else f"AdmissionReview request is a JSON {_json_type(request)}, expected an object")
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        raise ReviewError("AdmissionReview request.uid is missing or not a non-empty string")
    obj = request.get("object")
    if obj is not None and not isinstance(obj, Mapping):
        raise ReviewError(f"request.object is a JSON {_json_type(obj)}, expected an object", uid)
    if obj is not None and too_deep(obj, MAX_OBJECT_DEPTH):
        raise ReviewError(f"request.object is nested deeper than {MAX_OBJECT_DEPTH} levels", uid)
    group, version, kind = _gvk(request.get("kind"), obj)
    return Review(
        uid=uid,
        group=group,
        version=version,
        kind=kind,
        sub_resource=_str(request.get("subResource")),
        name=_str(request.get("name")),
        namespace=_str(request.get("namespace")),
        operation=_str(request.get("operation")),
        object=obj,
        dry_run=request.get("dryRun") is True,
    )


def _gvk(gvk: Any, obj: Mapping[str, Any] | None) -> tuple[str, str, str]:
    """request.kind; when a caller leaves it out, what the object says of itself."""
    if isinstance(gvk, Mapping) and _str(gvk.get("kind")):
        return _str(gvk.get("group")), _str(gvk.get("version")), _str(gvk.get("kind"))
    if obj is None:
        return "", "", ""
    group, _, version = _str(obj.get("apiVersion")).rpartition("/")
    return group, version, _str(obj.get("kind"))


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def too_deep(value: Any, limit: int) -> bool:
    """Level by level, so a hostile document cannot exhaust the interpreter's stack while we look."""
    level = [value]
    for _ in range(limit):
        below = []
        for item in level:
            # JSON decodes to dict and list: exact type checks are far cheaper than the Mapping ABC.
            for child in (item.values() if type(item) is dict else item):
                if type(child) is dict or type(child) is list:
                    below.append(child)
        if not below:
            return False
        level = below
    return True


# -- the shape of what the core reads ------------------------------------------------------------------
# The apiserver only sends objects that decoded into their Go types, so these never fail for it; they are
# checked anyway so that anything else gets a sentence naming the field, not a crash in the core.

class _StrMap:
    """A map of strings (labels, annotations, nodeSelector)."""


class _Quantities:
    """requests / limits: quantity strings (or numbers, which Quantity also accepts)."""


class _Struct(dict[str, Any]):
    """An object Go holds by value (ObjectMeta, PodSpec, ResourceRequirements…): never null on the wire.
    A plain dict in a shape is a pointer (Affinity, NodeAffinity…), which may be null."""


STR_MAP, QUANTITIES = _StrMap(), _Quantities()
_REQUIREMENT = _Struct(key=str, operator=str, values=[str])
_TOLERATION = _Struct(key=str, operator=str, value=str, effect=str)
_OWNER = _Struct(kind=str, name=str, controller=bool)
_CONTAINER = _Struct(name=str, command=[str], args=[str], restartPolicy=str,
                     resources=_Struct(requests=QUANTITIES, limits=QUANTITIES))
_POD_SPEC = _Struct(
    containers=[_CONTAINER], initContainers=[_CONTAINER], nodeSelector=STR_MAP, nodeName=str, schedulerName=str,
    tolerations=[_TOLERATION], affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [_Struct(matchExpressions=[_REQUIREMENT], matchFields=[_REQUIREMENT])]}}},
)
_META = _Struct(name=str, generateName=str, namespace=str, labels=STR_MAP, annotations=STR_MAP,
                ownerReferences=[_OWNER])
POD_SHAPE = _Struct(metadata=_META, spec=_POD_SPEC)
WORKLOAD_SHAPE = _Struct(metadata=_META, spec=_Struct(replicas=int, template=_Struct(metadata=_META, spec=_POD_SPEC)))
# spec.template and spec.worker are pointers (*corev1.PodSpec): null is allowed.
LLMISVC_SHAPE = _Struct(metadata=_META, spec=_Struct(replicas=int, labels=STR_MAP, annotations=STR_MAP,
                                                     template=dict(_POD_SPEC), worker=dict(_POD_SPEC)))


# The core asks every node whether a pod's nodeSelector and required node affinity admit it, and walks
# every container: a model pod far beyond any real one would hold the event loop for seconds to minutes
# (2,000 affinity terms on 500 nodes: 6 s; 30,000 containers: 4 s), past the apiserver's timeout.
MAX_SELECTOR_REQUIREMENTS = 128  # nodeSelector entries, nodeSelectorTerms and their requirements, together
MAX_CONTAINERS = 128  # containers and init containers, together
# /mutate adds up to two requirements to every term (the AMX expression, the node pin), and /validate judges
# the mutated pod: it allows for them, so that no pod /mutate pinned is refused for what /mutate added.
MUTATION_GROWTH = 3


def cost_problem(pod: Mapping[str, Any], mutated: bool = False) -> str | None:
    """Why judging this (shape-checked) model pod would cost too much, as a sentence; None when it won't.
    `mutated`: the pod as /validate sees it, after /mutate."""
    spec = pod.get("spec") or {}
    containers = len(spec.get("containers") or ()) + len(spec.get("initContainers") or ())
    if containers > MAX_CONTAINERS:
        return f"it has {containers} containers and init containers; model-placement judges at most {MAX_CONTAINERS}"
    required = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    terms = required.get("nodeSelectorTerms") or ()
    count = len(spec.get("nodeSelector") or {}) + len(terms) + sum(
        len(t.get("matchExpressions") or ()) + len(t.get("matchFields") or ()) for t in terms)
    limit = MAX_SELECTOR_REQUIREMENTS * (MUTATION_GROWTH if mutated else 1)
    if count > limit:
        return (f"its nodeSelector and required node affinity hold {count} terms and requirements; "
                f"model-placement judges at most {limit}")
    return None


def shape_problem(obj: Mapping[str, Any], shape: Mapping[str, Any]) -> str | None:
    """The first field the core reads whose JSON type is wrong, as a sentence; None when all are right.
    `null` is accepted where Go has a pointer, map or slice; not for a struct held by value, nor as an
    array item."""
    return _shape(obj, shape, "")


def _shape(value: Any, shape: Any, path: str) -> str | None:
    if value is None:
        return f"{path} is null, expected an object" if isinstance(shape, _Struct) and path else None
    if isinstance(shape, dict):
        if not isinstance(value, dict):
            return f"{path or 'object'} is a JSON {_json_type(value)}, expected an object"
        for key, sub in shape.items():
            if key not in value:
                continue
            problem = _shape(value[key], sub, f"{path}.{key}" if path else key)
            if problem:
                return problem
        return None
    if isinstance(shape, list):
        if not isinstance(value, list):
            return f"{path} is a JSON {_json_type(value)}, expected an array"
        for i, item in enumerate(value):
            if item is None:  # a Go slice of structs or strings has no nil elements
                return f"{path}[{i}] is null"
            problem = _shape(item, shape[0], f"{path}[{i}]")
            if problem:
                return problem
        return None
    if shape is STR_MAP or shape is QUANTITIES:
        if not isinstance(value, dict):
            return f"{path} is a JSON {_json_type(value)}, expected an object"
        allowed: tuple[type, ...] = (str,) if shape is STR_MAP else (str, int, float)
        for key, item in value.items():
            if isinstance(item, bool) or not isinstance(item, allowed):
                return f"{path}[{key!r}] is a JSON {_json_type(item)}, expected a " + \
                    ("string" if shape is STR_MAP else "quantity")
        return None
    if shape is int and (isinstance(value, bool) or not isinstance(value, int)):
        return f"{path} is a JSON {_json_type(value)}, expected a whole number"
    if shape is str and not isinstance(value, str):
        return f"{path} is a JSON {_json_type(value)}, expected a string"
    if shape is bool and not isinstance(value, bool):
        return f"{path} is a JSON {_json_type(value)}, expected true or false"
    return None


# -- responses -----------------------------------------------------------------------------------------

def _review(response: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": KIND, "response": response}


def allow(uid: str, warnings: Iterable[str] = (), patch: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
    """Allowed; with a patch only when it has operations (an empty patch is no patch)."""
    response: dict[str, Any] = {"uid": uid, "allowed": True}
    if patch:
        response["patchType"] = PATCH_TYPE
        response["patch"] = base64.b64encode(orjson.dumps(list(patch))).decode("ascii")
    rendered = render_warnings(warnings)
    if rendered:
        response["warnings"] = rendered
    return _review(response)


def deny(uid: str, message: str, code: int = 403, warnings: Iterable[str] = ()) -> dict[str, Any]:
    """Refused: the apiserver shows `message` after `admission webhook "<name>" denied the request: `."""
    response: dict[str, Any] = {"uid": uid, "allowed": False, "status": {"code": code, "message": message}}
    rendered = render_warnings(warnings)
    if rendered:
        response["warnings"] = rendered
    return _review(response)


def render_warnings(texts: Iterable[str]) -> list[str]:
    """The one place warnings are written: each text whole in one warning when it fits 256 runes, else in
    as few warnings as its clauses (split at "; ") allow, each ≤ 256 and reading on its own; no control
    characters (the apiserver drops such a warning); unique; at most 4096 runes in all, never a cut one."""
    out: list[str] = []
    total = 0
    for text in texts:
        for piece in _pieces("".join(c for c in " ".join(str(text).split()) if c.isprintable())):
            if piece in out:
                continue
            if total + len(piece) > WARNINGS_TOTAL:
                return out
            out.append(piece)
            total += len(piece)
    return out


def _pieces(text: str) -> list[str]:
    if len(text) <= WARNING_MAX:
        return [text] if text else []
    pieces: list[str] = []
    for clause in text.split("; "):
        if pieces and len(pieces[-1]) + 2 + len(clause) <= WARNING_MAX:
            pieces[-1] += f"; {clause}"
        else:  # a clause longer than a warning (a long list of names) goes between words
            pieces.extend(textwrap.wrap(clause, WARNING_MAX, break_on_hyphens=False))
    return pieces


# -- the apiserver's deadline --------------------------------------------------------------------------

_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
_UNIT = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_timeout(text: str | None) -> float | None:
    """The `timeout` query parameter: a Go duration as client-go renders it (`10s`, `1m0s`, `1.5s`).
    None when absent or unreadable; capped at the apiserver's own maximum."""
    if not text:
        return None
    text = text.strip()
    pos, seconds = 0, 0.0
    while pos < len(text):
        match = _DURATION_PART.match(text, pos)
        if match is None:
            return None
        seconds += float(match.group(1)) * _UNIT[match.group(2)]
        pos = match.end()
    return min(seconds, MAX_TIMEOUT) if pos else None
