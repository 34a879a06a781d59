"""/bind: hold the pod's cores in the ledger first, then bind it through the API.

`ExtenderBindingArgs` carry only the pod's name, namespace and uid, so the demand comes from the pod
seen at /filter (kept by uid), else from the cluster state, else (when connected) from the API. The
cores are assumed *before* the API call and before answering, so the next scheduling cycle cannot be
promised them; a failed binding releases them. With a `--cluster` snapshot there is no API: the bind
only updates the ledger. Every failure is an `{"Error": …}` answer, never an exception.
"""

from __future__ import annotations

import asyncio
import functools
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from extender.filter import Judge, PodRef
from extender.wire import BindArgs
from placement.demand import is_model_pod, pod_display_name, read_model_pod
from server.app import Runtime

# kube-scheduler gives the whole extender call 5 s by default (httpTimeout): answer before that.
API_TIMEOUT = (2.0, 4.0)  # (connect, read) seconds


@dataclass(frozen=True, slots=True)
class Bound:
    error: str  # empty: bound
    result: str  # metrics label: bound | assumed | unknown-node | already-bound | no-fit | unknown-pod | api-error


class _Refused(Exception):
    def __init__(self, result: str, error: str) -> None:
        super().__init__(error)
        self.result = result


async def _get_pod(runtime: Runtime, args: BindArgs) -> dict[str, Any]:
    from server.kubeapi import get_json  # the kubernetes client: only when connected

    path = f"/api/v1/namespaces/{quote(args.namespace, safe='')}/pods/{quote(args.pod_name, safe='')}"
    loop = asyncio.get_running_loop()
    call = functools.partial(get_json, runtime.api_client, path, timeout=API_TIMEOUT)
    return await loop.run_in_executor(None, call)  # type: ignore[no-any-return]


async def _pod(runtime: Runtime, judge: Judge, args: BindArgs) -> PodRef:
    """The pod being bound, with its demand."""
    ref = judge.seen(args.uid)
    if ref is not None:
        if (ref.namespace, ref.name) != (args.namespace, args.pod_name):
            raise _Refused("unknown-pod", f"pod {args.pod} has uid {args.uid}, which /filter saw as pod {ref.display}")
        return ref
    rec = runtime.cluster.pods.get(args.uid)
    if rec is not None and (rec.namespace, rec.name) == (args.namespace, args.pod_name):
        return Judge.ref(rec.uid, rec.namespace, rec.name, f"{rec.namespace}/{rec.name}", "", rec.model)
    if runtime.api_client is None:
        raise _Refused("unknown-pod", f"pod {args.pod} ({args.uid}) was not seen at /filter and the "
                                      "extender has no API connection to read it")
    try:
        pod = await _get_pod(runtime, args)
    except Exception as exc:  # the apiserver's own message
        raise _Refused("unknown-pod", f"cannot read pod {args.pod}: {exc}") from None
    meta = pod.get("metadata") or {}
    if meta.get("uid") != args.uid:
        raise _Refused("unknown-pod", f"pod {args.pod} now has uid {meta.get('uid')}, not {args.uid}: it was re-created")
    if (pod.get("spec") or {}).get("nodeName"):
        raise _Refused("already-bound", f"pod {args.pod} is already bound to node {pod['spec']['nodeName']}")
    demand = read_model_pod(pod, runtime.settings) if is_model_pod(meta.get("labels"), runtime.settings) else None
    ref = Judge.ref(args.uid, args.namespace, args.pod_name, pod_display_name(pod),
                    str(meta.get("resourceVersion") or ""), demand)
    judge.remember(ref)
    return ref


async def bind(runtime: Runtime, judge: Judge, args: BindArgs) -> Bound:
    cluster = runtime.cluster
    rec = cluster.pods.get(args.uid)
    if rec is not None and rec.node is not None:
        return Bound(f"pod {args.pod} is already bound to node {rec.node}", "already-bound")
    if cluster.ledger(args.node) is None:
        return Bound(f"node {args.node} is not known to the extender (not in its cache yet, or deleted)",
                     "unknown-node")
    try:
        ref = await _pod(runtime, judge, args)
    except _Refused as exc:
        return Bound(str(exc), exc.result)
    assumed = False
    if ref.demand is not None:
        if ref.unreadable is not None:
            return Bound(ref.unreadable, "no-fit")
        # Nothing awaits between this fit and the hold: no other request can slip in between.
        fit = cluster.assume(args.uid, args.namespace, args.pod_name, ref.demand, args.node)
        if not fit.ok:
            result = fit.check if fit.check in ("unknown-node", "already-bound") else "no-fit"
            return Bound(fit.reason, result)
        assumed = True
    if runtime.api_client is None:
        # A snapshot has no watch to confirm the binding, and no API to make it: the ledger is the record.
        if assumed:
            cluster.confirm(args.uid)
        return Bound("", "bound")
    from server.kubeapi import bind_pod

    loop = asyncio.get_running_loop()
    call = functools.partial(bind_pod, runtime.api_client, args.namespace, args.pod_name, args.uid,
                             args.node, timeout=API_TIMEOUT)
    try:
        await loop.run_in_executor(None, call)
    except Exception as exc:
        if assumed:
            cluster.forget(args.uid)
        return Bound(str(exc) or type(exc).__name__, "api-error")
    return Bound("", "bound")
