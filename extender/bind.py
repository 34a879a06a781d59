"""/bind: hold the pod's cores in the ledger first, then bind it through the API, all within one deadline.

`ExtenderBindingArgs` carry only the pod's name, namespace and uid, so the demand comes from the pod
seen at /filter (kept by uid), else from the cluster state, else (when connected) from the API. The
cores are held *before* the API call and before answering (already at /prioritize when it was this
node: `holds`), so the next scheduling cycle cannot be promised them; a binding the apiserver refused
releases them. kube-scheduler gives the whole call `httpTimeout`: every API call gets what is left of
one deadline, and an answer is sent before it passes. The API calls run on the event loop
(`server.kubeapi.LoopApi`), not in worker threads. With a `--cluster` snapshot there is no API: the
bind only updates the ledger. Every failure is an `{"Error": …}` answer, never an exception.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import orjson

from extender.filter import Judge, PodRef
from extender.holds import Holds
from extender.wire import BindArgs
from placement.assume import AssumeCache
from placement.cluster import ClusterState
from placement.demand import is_model_pod, pod_display_name, read_model_pod
from placement.ledger import PLACEMENT
from server.app import Runtime

CONNECT_TIMEOUT = 1.0  # the apiserver is a connection away; the rest of the budget is for its answer


class OutOfTime(Exception):
    """The deadline of the extender call passed before an API call answered."""


async def api_call(call: Callable[..., Any], deadline: float, *args: Any) -> Any:
    """`call(*args, timeout=…)` in a worker thread, given what is left until `deadline` (time.monotonic);
    OutOfTime when it is spent (the thread may still finish the request: its outcome is then unknown)."""
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise OutOfTime
    loop = asyncio.get_running_loop()
    job = loop.run_in_executor(None, functools.partial(call, *args, timeout=(min(CONNECT_TIMEOUT, remaining),
                                                                             remaining)))
    try:
        return await asyncio.wait_for(job, remaining)
    except TimeoutError:
        raise OutOfTime from None


T = TypeVar("T")


async def loop_call(call: Callable[..., Awaitable[T]], deadline: float, *args: Any) -> T:
    """`call(*args, timeout=…, connect_timeout=…)` on the event loop, given what is left until `deadline`;
    OutOfTime when it is spent (the apiserver may still act on the request: its outcome is then unknown)."""
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise OutOfTime
    try:
        return await call(*args, timeout=remaining, connect_timeout=CONNECT_TIMEOUT)
    except TimeoutError:
        raise OutOfTime from None


@dataclass(frozen=True, slots=True)
class Bound:
    error: str  # empty: bound
    result: str  # metrics label: bound | unknown-node | already-bound | no-fit | unknown-pod | api-error | timeout


class _Refused(Exception):
    def __init__(self, result: str, error: str) -> None:
        super().__init__(error)
        self.result = result


def _late(args: BindArgs, runtime: Runtime, what: str) -> str:
    return (f"{what} for pod {args.pod} on node {args.node} did not answer within the {runtime.call_budget:g} s "
            "this call may take (kube-scheduler's httpTimeout less a margin); the scheduler will retry the pod")


async def _pod(runtime: Runtime, judge: Judge, args: BindArgs, deadline: float) -> PodRef:
    """The pod being bound, with its demand."""
    ref = judge.seen(args.uid)
    if ref is not None:
        if (ref.namespace, ref.name) != (args.namespace, args.pod_name):
            raise _Refused("unknown-pod", f"pod {args.pod} has uid {args.uid}, which /filter saw as pod {ref.display}")
        return ref
    rec = runtime.cluster.pods.get(args.uid)
    if rec is not None and (rec.namespace, rec.name) == (args.namespace, args.pod_name):
        return Judge.ref(rec.uid, rec.namespace, rec.name, f"{rec.namespace}/{rec.name}", "", rec.model)
    if runtime.api is None:
        raise _Refused("unknown-pod", f"pod {args.pod} ({args.uid}) was not seen at /filter and the "
                                      "extender has no API connection to read it")
    from server.kubeapi import pod_path  # the kubernetes client: only when connected

    try:
        pod = orjson.loads(await loop_call(runtime.api.call, deadline, "GET", pod_path(args.namespace, args.pod_name)))
    except OutOfTime:
        raise _Refused("timeout", _late(args, runtime, "reading the pod")) from None
    except Exception as exc:  # the apiserver's own message
        raise _Refused("unknown-pod", f"cannot read pod {args.pod}: {exc}") from None
    meta = pod.get("metadata") or {}
    if meta.get("uid") != args.uid:
        raise _Refused("unknown-pod",
                       f"pod {args.pod} now has uid {meta.get('uid')}, not {args.uid}: it was re-created")
    if (pod.get("spec") or {}).get("nodeName"):
        raise _Refused("already-bound", f"pod {args.pod} is already bound to node {pod['spec']['nodeName']}")
    demand = read_model_pod(pod, runtime.settings) if is_model_pod(meta.get("labels"), runtime.settings) else None
    ref = Judge.ref(args.uid, args.namespace, args.pod_name, pod_display_name(pod),
                    str(meta.get("resourceVersion") or ""), demand)
    judge.remember(ref)
    return ref


def _placement(cluster: ClusterState, uid: str, ref: PodRef) -> dict[str, str] | None:
    """The annotation that persists where the pod's balloon was decided to go, for whoever rebuilds a ledger from
    a pod list (a relist, a restart, a standby extender, `--cluster`): the plugin's placement depends on the
    order of creates and deletes, which a list does not carry."""
    if ref.demand is None:
        return None
    text = AssumeCache(cluster).placement(uid)
    return {PLACEMENT: text} if text is not None else None


async def bind(runtime: Runtime, judge: Judge, holds: Holds, args: BindArgs, deadline: float) -> Bound:
    """`deadline` (time.monotonic) is when kube-scheduler's budget for this call, less a margin, runs out."""
    cluster = runtime.cluster
    assumed_pods = AssumeCache(cluster)
    if cluster.ledger(args.node) is None:
        holds.release(args.uid)
        return Bound(f"node {args.node} is not known to the extender (not in its cache yet, or deleted)",
                     "unknown-node")
    held = holds.take(args.uid, args.node)
    rec = cluster.pods.get(args.uid)
    if not held and rec is not None and rec.node is not None:
        return Bound(f"pod {args.pod} is already bound to node {rec.node}", "already-bound")
    try:
        ref = await _pod(runtime, judge, args, deadline)
    except _Refused as exc:
        if held:
            assumed_pods.forget(args.uid)
        return Bound(str(exc), exc.result)
    assumed = held
    if ref.demand is not None and not held:
        if ref.unreadable is not None:
            return Bound(ref.unreadable, "no-fit")
        # Nothing awaits between this fit and the hold: no other request can slip in between.
        fit = assumed_pods.assume(args.uid, args.namespace, args.pod_name, ref.demand, args.node)
        if not fit.ok:
            result = fit.check if fit.check in ("unknown-node", "already-bound") else "no-fit"
            return Bound(fit.reason, result)
        assumed = True
    if runtime.api is None:
        # A snapshot has no watch to confirm the binding, and no API to make it: the ledger is the record.
        if assumed:
            assumed_pods.confirm(args.uid)
        return Bound("", "bound")
    from server.kubeapi import bind_pod

    try:
        await loop_call(bind_pod, deadline, runtime.api, args.namespace, args.pod_name, args.uid, args.node,
                        _placement(cluster, args.uid, ref))
    except OutOfTime:
        # The apiserver may yet bind it: the cores stay assumed until the watch shows the pod, or they expire.
        return Bound(_late(args, runtime, "the binding"), "timeout")
    except Exception as exc:
        if assumed:
            assumed_pods.forget(args.uid)
        return Bound(str(exc) or type(exc).__name__, "api-error")
    return Bound("", "bound")
