"""POST /mutate and POST /validate: read the AdmissionReview, ask `placement`, answer in the wire format.

Thin on purpose: every decision is the core's (`placement.mutation`, `placement.admission`); this module
only maps it onto what the apiserver accepts, logs one line per decision and counts it.

What the two webhooks do with what they cannot judge, and why:
- /mutate is not the gate (`failurePolicy: Ignore`): whatever goes wrong — an unreadable object, a model pod
  the core finds faulty, no time left, a bug — it answers "allowed, unchanged" with a warning. It never
  refuses and never sends a patch it has not applied to the original itself.
- /validate is the gate for pods (`failurePolicy: Fail`): an object that claims to be a model (model label on
  the pod or the pod template) but cannot be read is refused with the reason, since it could never be
  pinned; anything that does not claim to be a model is admitted untouched.
- Deadline: the apiserver sends `?timeout=Ns`. The core is synchronous and, because `ClusterState` is not
  thread-safe, runs on the event loop thread (it is never offloaded). Before starting it we compare what
  is left of the budget (timeout − margin) with what the core typically costs lately; when it does not fit,
  /mutate admits unchanged with a warning, and /validate does what the configured `failurePolicy` would
  do on a timeout — refuse a Pod (503, retry later; `Fail`), admit a Deployment/StatefulSet with a warning
  (`Ignore`: that webhook is advisory) — only sooner and with a message.
- dryRun requests get the same answer: nothing here has side effects (no assumed pods, no writes).
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import statistics
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

from placement.admission import Decision, NotAdmissible, Subject, keep_reason, subject_of, validate, waiting_reason
from placement.cluster import ClusterState
from placement.demand import is_model_pod, pod_display_name
from placement.mutation import Mutation, dropped_text, mutate_pod, skip_reason, without_placement
from placement.preflight import resolve_policy
from server import metrics
from server.app import ADMISSION_BODY_LIMIT, RUNTIME, BadRequest, json_response, read_json
from webhook.patch import PatchError, checked_patch
from webhook.policy import BALLOONS_POLICY, judge_policy
from webhook.review import (
    DEFAULT_TIMEOUT,
    LLMISVC_SHAPE,
    POD_SHAPE,
    WORKLOAD_SHAPE,
    Review,
    ReviewError,
    allow,
    cost_problem,
    deny,
    parse_review,
    parse_timeout,
    shape_problem,
)

log = logging.getLogger("model_placement.webhook")

POD = ("", "Pod")
WORKLOADS = (("apps", "Deployment"), ("apps", "StatefulSet"))
LLMISVC = ("serving.kserve.io", "LLMInferenceService")
SA_NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


# -- the apiserver's deadline ------------------------------------------------------------------------

class Timings:
    """What the core typically costs lately, per webhook: the median of the last runs in a sliding window,
    and only once there are a few. One slow run (the first call after a resync rebuilds every node's
    ledger) predicts nothing and must not turn the next minute of answers into degraded ones; sustained
    slowness does. The window matters too: degraded answers do not run the core, so without it an
    estimate could never come back down."""

    def __init__(self, window: float = 60.0, clock: Callable[[], float] = time.monotonic,
                 keep: int = 16, least: int = 3) -> None:
        self.window = window
        self.clock = clock
        self.least = least
        self.keep = keep
        self._runs: dict[str, deque[tuple[float, float]]] = {}

    def record(self, verb: str, seconds: float) -> None:
        runs = self._runs.setdefault(verb, deque(maxlen=self.keep))
        runs.append((self.clock(), seconds))

    def expected(self, verb: str) -> float:
        runs = self._runs.get(verb)
        if not runs:
            return 0.0
        horizon = self.clock() - self.window
        while runs and runs[0][0] < horizon:
            runs.popleft()
        if len(runs) < self.least:
            return 0.0
        return statistics.median(s for _, s in runs)


@dataclass(frozen=True, slots=True)
class Budget:
    timeout: float  # what the apiserver gives this call
    deadline: float  # when we must have answered: start + timeout − margin
    clock: Callable[[], float] = time.monotonic

    @classmethod
    def start(cls, timeout_param: str | None, clock: Callable[[], float] = time.monotonic) -> Budget:
        timeout = parse_timeout(timeout_param)
        timeout = DEFAULT_TIMEOUT if timeout is None else timeout
        # Room for the network, serialising the answer and the apiserver's own bookkeeping.
        margin = min(1.0, timeout * 0.25)
        return cls(timeout, clock() + timeout - margin, clock)

    def affords(self, seconds: float) -> bool:
        return self.clock() + seconds < self.deadline


@dataclass(frozen=True, slots=True)
class _Patched:
    mutation: Mutation
    ops: list[dict[str, Any]]
    reason: str
    message: str


MAX_REPLICA_BYTES = 64 * 1024
# What the apiserver makes differ between the replicas of one ReplicaSet before the webhooks see them (names are
# generated after admission): the ServiceAccount admission plugin's token volume, kube-api-access-<5 random
# characters>, with its mounts, and managedFields' times. The mutation reads none of them.
SA_TOKEN_VOLUME = "kube-api-access-"
_REPLICA_VARIES = re.compile(r"(/metadata(/managedFields.*)?|/spec(/volumes.*|/(initContainers|containers)"
                             r"(/\d+(/volumeMounts.*)?)?)?)?")  # ...and every path above them: "", /spec, …


def _token_renamed(items: Any) -> Any:
    """`items` (volumes or volumeMounts) with the ServiceAccount token volume's random suffix dropped."""
    if not isinstance(items, list):
        return items
    return [{**i, "name": SA_TOKEN_VOLUME} if isinstance(i, dict) and str(i.get("name", "")).startswith(
        SA_TOKEN_VOLUME) else i for i in items]


def replica_form(pod: Mapping[str, Any]) -> dict[str, Any]:
    """The pod less what differs between replicas of one ReplicaSet (`_REPLICA_VARIES`)."""
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    spec = {**spec, "volumes": _token_renamed(spec.get("volumes"))}
    for section in ("initContainers", "containers"):
        if isinstance(spec.get(section), list):
            spec[section] = [{**c, "volumeMounts": _token_renamed(c.get("volumeMounts"))} if isinstance(c, dict)
                             else c for c in spec[section]]
    return {**pod, "metadata": {**meta, "managedFields": None}, "spec": spec}


def fits_every_replica(ops: list[dict[str, Any]]) -> bool:
    """The patch leaves alone what differs between replicas (and every subtree holding it), so it is the patch
    of every replica."""
    return not any(_REPLICA_VARIES.fullmatch(str(op.get(k))) for op in ops for k in ("path", "from") if k in op)


class ReplicaMemo:
    """The patches given lately, by pod. A ReplicaSet's replicas reach /mutate one after the other, identical
    but for what `replica_form` drops, so the second and later ones are answered with the first one's patch
    when that patch touches none of it. The mutation reads one thing of the cluster, the policy resolution
    (is the balloon type defined where the pod can land?): a remembered patch is reused only while
    resolving again gives the same answer."""

    def __init__(self, size: int = 256) -> None:
        self.size = size
        self._patched: OrderedDict[tuple[str, bytes], _Patched] = OrderedDict()

    @staticmethod
    def key(review: Review) -> tuple[str, bytes] | None:
        try:
            text = orjson.dumps(replica_form(review.object))
        except TypeError:  # orjson.JSONEncodeError: not a JSON document we can key on
            return None
        # A typical pod is a few KiB; the bound keeps the memo's memory bounded whatever is sent.
        return (review.namespace, text) if len(text) <= MAX_REPLICA_BYTES else None

    def get(self, key: tuple[str, bytes], cluster: ClusterState) -> _Patched | None:
        patched = self._patched.get(key)
        if patched is None:
            return None
        m = patched.mutation
        assert m.demand is not None and m.resolution is not None
        if resolve_policy(m.demand, cluster.iter_eligible(m.pod["spec"]), cluster.settings.nri_enabled) \
                != m.resolution:
            del self._patched[key]
            metrics.REPLICA_MEMO.labels("stale").inc()
            return None
        self._patched.move_to_end(key)
        metrics.REPLICA_MEMO.labels("reused").inc()
        return patched

    def put(self, key: tuple[str, bytes], patched: _Patched) -> None:
        if not fits_every_replica(patched.ops):
            return
        self._patched[key] = patched
        while len(self._patched) > self.size:
            self._patched.popitem(last=False)


@dataclass(frozen=True, slots=True)
class Context:
    cluster: ClusterState
    budget: Budget = field(default_factory=lambda: Budget.start(None))
    timings: Timings = field(default_factory=Timings)
    own_namespace: str | None = None  # never touched, whatever the webhook configuration sends
    replicas: ReplicaMemo | None = None


@dataclass(frozen=True, slots=True)
class Outcome:
    review: dict[str, Any]  # the AdmissionReview we answer with
    decision: str  # allowed | denied | warned | skipped | degraded
    reason: str  # a check id or one of a few fixed words: a bounded metric label
    policy: str = "none"
    pod: str = ""
    message: str = ""


TIMINGS: web.AppKey[Timings] = web.AppKey("webhook_timings", Timings)
REPLICAS: web.AppKey[ReplicaMemo] = web.AppKey("webhook_replicas", ReplicaMemo)
OWN_NAMESPACE: web.AppKey[str] = web.AppKey("webhook_own_namespace", str)


def own_namespace() -> str:
    """The namespace we run in: POD_NAMESPACE (downward API) or the service account's namespace file."""
    if os.environ.get("POD_NAMESPACE"):
        return os.environ["POD_NAMESPACE"]
    try:
        return SA_NAMESPACE_FILE.read_text().strip()
    except OSError:
        return ""


def add_routes(app: web.Application) -> None:
    app[TIMINGS] = Timings()
    app[REPLICAS] = ReplicaMemo()
    app[OWN_NAMESPACE] = own_namespace()
    app.router.add_post("/mutate", mutate_handler)
    app.router.add_post("/validate", validate_handler)


# -- shared helpers ----------------------------------------------------------------------------------

_SKIP_LABELS = (("namespace", "protected-namespace"), ("mirror", "mirror-pod"),
                ("pod is being deleted", "deleting"), ("not a model", "not-model-pod"))


def _skip_label(why: str) -> str:
    return next((label for prefix, label in _SKIP_LABELS if why.startswith(prefix)), "skipped")


def _untouchable(review: Review, pod: Mapping[str, Any], ctx: Context) -> str | None:
    """Objects we never change or judge, whatever the webhook configuration sends: protected namespaces
    (the request's namespace is authoritative, even before 1.24), mirror pods, objects being deleted."""
    settings = ctx.cluster.settings
    for ns in {review.namespace, str(review.object_meta.get("namespace") or "")} - {""}:
        if ns in settings.protected_namespaces or ns == ctx.own_namespace:
            return f"namespace {ns} is protected"
    if review.object_meta.get("deletionTimestamp"):
        return "pod is being deleted"
    return skip_reason(pod, review.namespace, ctx.cluster)


def _claims_model(obj: Any, ctx: Context) -> bool:
    """Does the object say it is a model (label on the pod or on the workload's pod template)?"""
    if not isinstance(obj, Mapping):
        return False
    settings = ctx.cluster.settings
    candidates = [obj.get("metadata")]
    spec = obj.get("spec")
    template = spec.get("template") if isinstance(spec, Mapping) else None
    if isinstance(template, Mapping):
        candidates.append(template.get("metadata"))
    for meta in candidates:
        labels = meta.get("labels") if isinstance(meta, Mapping) else None
        if isinstance(labels, Mapping) and is_model_pod(labels, settings):
            return True
    return False


# -- /mutate -----------------------------------------------------------------------------------------

def mutate_review(review: Review, ctx: Context) -> Outcome:
    uid = review.uid
    if (review.group, review.kind) != POD or review.operation != "CREATE" or review.sub_resource:
        return Outcome(allow(uid), "skipped", "not-judged")
    pod = review.object
    if pod is None:
        text = "model-placement: request.object is missing; admitted unchanged"
        return Outcome(allow(uid, [text]), "skipped", "unreadable", message=text)
    problem = shape_problem(pod, POD_SHAPE)
    if problem:
        text = f"model-placement cannot read this pod ({problem}); admitted unchanged"
        return Outcome(allow(uid, [text]), "skipped", "unreadable", message=text)
    name = pod_display_name(pod, review.namespace)
    key = ctx.replicas.key(review) if ctx.replicas is not None else None
    patched = ctx.replicas.get(key, ctx.cluster) if ctx.replicas is not None and key is not None else None
    if patched is not None and waiting_reason(patched.mutation, ctx.cluster, review.namespace):
        patched = None  # room has gone since: the pod needs the reason it will wait kept on it
    if patched is not None:  # an identical pod was patched lately: every check below gave it this answer
        return Outcome(allow(uid, _dropped(name, patched.mutation), patch=patched.ops), "allowed", patched.reason,
                       patched.mutation.resolution.policy, name, patched.message)  # type: ignore[union-attr]
    why = _untouchable(review, pod, ctx)
    if why:
        return Outcome(allow(uid), "skipped", _skip_label(why), pod=name, message=why)
    too_large = cost_problem(pod)
    if too_large:
        text = f"model-placement left {name} unchanged, without CPU pinning: {too_large}"
        return Outcome(allow(uid, [text]), "degraded", "too-large", pod=name, message=text)
    if not ctx.budget.affords(ctx.timings.expected("mutate")):
        text = (f"model-placement: no time left within the apiserver's {ctx.budget.timeout:g}s timeout; "
                f"{name} admitted unchanged, without CPU pinning")
        return Outcome(allow(uid, [text]), "degraded", "timeout", pod=name, message=text)
    started = time.monotonic()
    try:
        mutation = mutate_pod(pod, ctx.cluster, review.namespace)
        waiting = waiting_reason(mutation, ctx.cluster, review.namespace)
    except Exception as exc:
        log.exception("mutation failed", extra={"verb": "mutate", "pod": name, "uid": uid})
        text = f"model-placement could not compute the pinning for {name} ({type(exc).__name__}); admitted unchanged"
        return Outcome(allow(uid, [text]), "degraded", "internal-error", pod=name, message=text)
    finally:
        ctx.timings.record("mutate", time.monotonic() - started)
    demand, resolution = mutation.demand, mutation.resolution
    if demand is None or resolution is None:
        why = mutation.skipped or "not a model pod"
        return Outcome(allow(uid), "skipped", _skip_label(why), pod=name, message=why)
    if waiting:
        mutation = keep_reason(mutation, waiting)
    # Writing our annotations onto a faulty pod would hide the fault from /validate (the resolved TP annotation
    # takes precedence over the user's): it is left as sent, but for a placement it may not carry, and /validate
    # explains.
    target = without_placement(pod)[0] if demand.problems else mutation.pod
    try:
        ops = checked_patch(pod, target)
    except PatchError as exc:
        log.error("patch self-check failed", extra={"verb": "mutate", "pod": name, "uid": uid, "error": str(exc)})
        text = f"model-placement could not build a valid patch for {name}; admitted unchanged"
        return Outcome(allow(uid, [text]), "degraded", "patch-error", resolution.policy, name, text)
    dropped = _dropped(name, mutation)
    if demand.problems:
        text = f"model-placement left {name} unchanged: {'; '.join(demand.problems)}"
        return Outcome(allow(uid, [text, *dropped], patch=ops), "warned", "pod-spec", resolution.policy, name, text)
    reason = resolution.reason or ("patched" if ops else "unchanged")
    message = "; ".join([(f"{len(ops)} patch operations" if ops else "already pinned"), *dropped,
                         *([waiting] if waiting else [])])
    if ctx.replicas is not None and key is not None and not waiting:
        ctx.replicas.put(key, _Patched(mutation, ops, reason, message))
    return Outcome(allow(uid, dropped, patch=ops), "allowed", reason, resolution.policy, name, message)


def _dropped(name: str, mutation: Mutation) -> list[str]:
    """The warning for the annotations the mutation dropped, if any."""
    return [dropped_text(name, mutation.dropped)] if mutation.dropped else []


# -- /validate ---------------------------------------------------------------------------------------

def validate_review(review: Review, ctx: Context) -> Outcome:
    uid = review.uid
    key = (review.group, review.kind)
    if key == BALLOONS_POLICY:
        return _policy_outcome(review, ctx)
    judged = (key == POD and review.operation == "CREATE") or \
        (key in (*WORKLOADS, LLMISVC) and review.operation in ("CREATE", "UPDATE"))
    if not judged or review.sub_resource:
        return Outcome(allow(uid), "skipped", "not-judged")
    obj = review.object
    if obj is None:
        text = f"{review.operation} of a {review.kind} without request.object: nothing to judge"
        return Outcome(deny(uid, text, code=400), "denied", "unreadable", message=text)
    if not obj.get("kind"):
        obj = {**obj, "kind": review.kind}
    label = f"{review.kind} {review.namespace or '-'}/{review.name or review.object_meta.get('name') or '*'}"
    problem = shape_problem(obj, POD_SHAPE if key == POD else LLMISVC_SHAPE if key == LLMISVC else WORKLOAD_SHAPE)
    if problem:
        return _unreadable(uid, obj, label, problem, ctx)
    try:
        subject = subject_of(obj, review.namespace)
    except NotAdmissible as exc:
        return _unreadable(uid, obj, label, str(exc), ctx)
    label = _label(subject, obj, review)
    why = _untouchable(review, subject.pod, ctx)
    if why:
        return Outcome(allow(uid), "skipped", _skip_label(why), pod=label, message=why)
    too_large = cost_problem(subject.pod, mutated=True)
    if too_large:
        return _unreadable(uid, obj, label, too_large, ctx)
    if not ctx.budget.affords(ctx.timings.expected("validate")):
        return _out_of_time(uid, subject, label, ctx)
    started = time.monotonic()
    try:
        decision = validate(subject, ctx.cluster, require_mutated=True, update=review.operation == "UPDATE")
    except Exception as exc:
        log.exception("pre-flight failed", extra={"verb": "validate", "pod": label, "uid": uid})
        return _unreadable(uid, obj, label, f"pre-flight failed ({type(exc).__name__})", ctx)
    finally:
        ctx.timings.record("validate", time.monotonic() - started)
    notes = list(_notes(decision))
    if not decision.mode:  # not a model pod, or one the core leaves alone
        return Outcome(allow(uid), "skipped", _skip_label(decision.message or "not a model pod"), pod=label,
                       message=decision.message)
    if not decision.allowed:
        return Outcome(deny(uid, decision.message, warnings=notes), "denied", decision.check, decision.policy,
                       label, decision.message)
    if decision.check == "skipped":
        return Outcome(allow(uid, notes), "skipped", "preflight-skipped", decision.policy, label)
    if decision.message:  # warn mode: what enforce would have refused, whole, then the notes
        return Outcome(allow(uid, [decision.message, *notes]), "warned", decision.check,
                       decision.policy, label, decision.message)
    return Outcome(allow(uid, notes), "allowed", decision.reason, decision.policy, label, "; ".join(notes))


def _policy_outcome(review: Review, ctx: Context) -> Outcome:
    started = time.monotonic()
    try:
        judged = judge_policy(review, ctx.cluster, ctx.budget.affords(ctx.timings.expected("policy")))
    finally:
        ctx.timings.record("policy", time.monotonic() - started)
    return Outcome(judged.review, judged.decision, judged.reason, "nri-balloons", judged.label, judged.message)


def _notes(decision: Decision) -> tuple[str, ...]:
    """What the core adds to a verdict (e.g. the best-effort fallback), untruncated."""
    if decision.verdict is not None:
        return decision.verdict.notes
    return decision.warnings


def _label(subject: Subject, obj: Mapping[str, Any], review: Review) -> str:
    if subject.kind == "Pod":
        return pod_display_name(obj, review.namespace)
    return f"{subject.kind} {subject.namespace}/{review.name or (obj.get('metadata') or {}).get('name') or '*'}"


def _unreadable(uid: str, obj: Any, label: str, problem: str, ctx: Context) -> Outcome:
    if not _claims_model(obj, ctx):
        return Outcome(allow(uid), "skipped", "not-model-pod", pod=label, message=problem)
    text = f"{label} is labelled as a model but model-placement cannot read it: {problem}"
    return Outcome(deny(uid, text, code=400), "denied", "unreadable", pod=label, message=text)


def _out_of_time(uid: str, subject: Subject, label: str, ctx: Context) -> Outcome:
    timeout = ctx.budget.timeout
    if subject.kind == "Pod":
        text = (f"model-placement could not run the CPU pre-flight for {label} within the apiserver's "
                f"{timeout:g}s timeout; the pod is refused as the webhook's failurePolicy: Fail would. Retry.")
        return Outcome(deny(uid, text, code=503), "degraded", "timeout", pod=label, message=text)
    text = (f"model-placement skipped the CPU pre-flight for {label}: no time left within the apiserver's "
            f"{timeout:g}s timeout; its pods are still checked when they are created")
    return Outcome(allow(uid, [text]), "degraded", "timeout", pod=label, message=text)


# -- HTTP --------------------------------------------------------------------------------------------

async def mutate_handler(request: web.Request) -> web.Response:
    return await _serve(request, "mutate", mutate_review)


async def validate_handler(request: web.Request) -> web.Response:
    return await _serve(request, "validate", validate_review)


def _unreadable_review(verb: str, uid: str, problem: str) -> Outcome:
    if verb == "mutate":
        text = f"model-placement: {problem}; admitted unchanged"
        return Outcome(allow(uid, [text]), "skipped", "unreadable", message=text)
    return Outcome(deny(uid, f"model-placement cannot read this request: {problem}", code=400),
                   "denied", "unreadable", message=problem)


async def _serve(request: web.Request, verb: str, judge: Callable[[Review, Context], Outcome]) -> web.Response:
    started = time.monotonic()
    budget = Budget.start(request.query.get("timeout"))
    review: Review | None = None
    try:
        # A client that trickles its body must not hold a connection past the apiserver's own deadline.
        patience = max(budget.timeout, 1.0)
        try:
            async with asyncio.timeout(patience):
                body = await read_json(request, ADMISSION_BODY_LIMIT)
        except TimeoutError:
            raise BadRequest(f"request body not received within {patience:g}s") from None
        review = parse_review(body)
    except (BadRequest, ReviewError) as exc:
        uid = exc.uid if isinstance(exc, ReviewError) else None
        if uid is None:
            log.warning(str(exc), extra={"verb": verb, "decision": "bad-request", "status": 400,
                                         "duration_ms": _ms(started)})
            raise BadRequest(str(exc)) from None
        outcome = _unreadable_review(verb, uid, str(exc))
    else:
        runtime = request.app[RUNTIME]
        ctx = Context(runtime.cluster, budget, request.app[TIMINGS], request.app[OWN_NAMESPACE] or None,
                      request.app[REPLICAS])
        outcome = judge(review, ctx)
    _record(verb, outcome, review, started)
    return json_response(outcome.review)


def _ms(started: float) -> float:
    return round((time.monotonic() - started) * 1000, 2)


def _record(verb: str, outcome: Outcome, review: Review | None, started: float) -> None:
    metrics.ADMISSION.labels(webhook=verb, policy=outcome.policy, decision=outcome.decision,
                             reason=outcome.reason).inc()
    response = outcome.review["response"]
    level = logging.WARNING if outcome.decision in ("denied", "degraded") else logging.INFO
    log.log(level, outcome.message or f"{verb}: {outcome.decision}", extra={
        "verb": verb, "pod": outcome.pod or None, "decision": outcome.decision, "reason": outcome.reason,
        "check": outcome.reason if outcome.decision in ("denied", "warned") else None,
        "policy": outcome.policy, "duration_ms": _ms(started), "uid": response["uid"],
        "kind": review.kind if review else None, "warnings": len(response.get("warnings", ())) or None,
    })
