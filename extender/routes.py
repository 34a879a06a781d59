"""The extender's HTTP routes: POST /filter, /prioritize, /preempt, /bind (kube-scheduler's wire format)
and GET /debug/nodes[/NAME] (the ledger as JSON).

kube-scheduler treats any status but 200 as a failed call and does not read the body, so its log says
only "failed filter with extender at URL …, code 400": the reason of a 400 is in *our* log line.

Until every kind is listed from the apiserver the cluster state is partial (every node looks emptier
than it is), and kube-scheduler calls the sidecar on loopback whatever our readiness says: every verb
then refuses to judge. /filter and /bind answer 200 with `Error` set (the attempt fails and the pod is
retried with backoff); /prioritize and /preempt, whose answers have no `Error` field, answer 503
(kube-scheduler ignores a failed prioritize, and a failed preempt leaves the pod to its next attempt).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from contextlib import suppress
from itertools import chain, islice
from typing import Any

import orjson
from aiohttp import web

from extender import wire
from extender.bind import OutOfTime, bind
from extender.filter import Judge, PodRef, describe_demand, filter_nodes
from extender.holds import Holds
from extender.preempt import Preemption
from extender.score import rank, standouts
from extender.waiting import Waiting, retry_waiting
from placement.cluster import pod_priority
from placement.fit import fmt_free
from server import metrics
from server.app import RUNTIME, BadRequest, json_response, read_json

log = logging.getLogger("model_placement.extender")

JUDGE: web.AppKey[Judge] = web.AppKey("extender_judge", Judge)
HOLDS: web.AppKey[Holds] = web.AppKey("extender_holds", Holds)
PREEMPTION: web.AppKey[Preemption] = web.AppKey("extender_preemption", Preemption)
WAITING: web.AppKey[Waiting] = web.AppKey("extender_waiting", Waiting)
FIRST_REASONS = 3
WARM_SLICE_SECONDS = 0.0005

_PASSED = metrics.FILTER_NODES.labels("passed")
_FAILED = metrics.FILTER_NODES.labels("failed")
_UNRESOLVABLE = metrics.FILTER_NODES.labels("unresolvable")


def add_routes(app: web.Application) -> None:
    app[JUDGE] = Judge(app[RUNTIME].cluster)
    app[HOLDS] = Holds(app[RUNTIME].cluster)
    app[PREEMPTION] = Preemption(app[RUNTIME], app[JUDGE])
    app[WAITING] = Waiting(app[JUDGE])
    app.cleanup_ctx.append(_warm_verdicts)
    app.cleanup_ctx.append(_loop_api)
    app.cleanup_ctx.append(_retry_waiting)  # after _loop_api: stopped before the API client closes
    app.router.add_post("/filter", handle_filter)
    app.router.add_post("/prioritize", handle_prioritize)
    app.router.add_post("/preempt", handle_preempt)
    app.router.add_post("/bind", handle_bind)
    app.router.add_get("/debug/nodes", debug_nodes)
    app.router.add_get("/debug/nodes/{name}", debug_node)


async def _warm_verdicts(app: web.Application) -> AsyncIterator[None]:
    """Between requests, judge the nodes lately asked-for demands have not met yet (`Judge.warm`), in
    slices short enough that a request arriving meanwhile waits at most one."""
    judge = app[JUDGE]

    async def run() -> None:
        while True:
            try:
                more = judge.warm(WARM_SLICE_SECONDS)
            except Exception:  # a bug here must not stop the warming for good, nor the serving
                log.exception("warming verdicts failed", extra={"verb": "filter"})
                more = False
            if more:
                await asyncio.sleep(0)
            else:  # until a demand is first asked about (no await since `warm`: nothing was missed)
                judge.untold.clear()
                await judge.untold.wait()

    task = asyncio.create_task(run())
    yield
    task.cancel()
    with suppress(asyncio.CancelledError):
        await task


async def _loop_api(app: web.Application) -> AsyncIterator[None]:
    """/bind's API calls, on the event loop, while the app runs."""
    runtime = app[RUNTIME]
    if runtime.api_client is None:
        yield
        return
    from server.kubeapi import LoopApi  # aiohttp's client and the kubernetes client: only when connected

    runtime.api = LoopApi(runtime.api_client)
    yield
    await runtime.api.close()
    runtime.api = None


async def _retry_waiting(app: web.Application) -> AsyncIterator[None]:
    """Ask kube-scheduler to retry the pods /filter refused once the watch shows room for them (`extender.waiting`):
    only when connected, since only then does a watch change the ledgers."""
    if app[RUNTIME].api is None:
        yield
        return
    task = asyncio.create_task(retry_waiting(app[RUNTIME], app[WAITING]))
    yield
    task.cancel()
    with suppress(asyncio.CancelledError):
        await task


def _judge(request: web.Request) -> Judge:
    return request.app[JUDGE]  # it reads runtime.cluster, which the watch updates in place


def _unsynced(request: web.Request, verb: str) -> str | None:
    """Why this call must not be judged yet (a partial cluster state), logged and counted; None: go ahead."""
    waiting = request.app[RUNTIME].unsynced()
    if not waiting:
        return None
    message = (f"the extender has not finished listing {', '.join(waiting)} from the apiserver, so every node "
               f"would look emptier than it is; refusing to {verb} until then (kube-scheduler retries the pod)")
    metrics.UNSYNCED.labels(verb).inc()
    log.warning("not synced", extra={"verb": verb, "decision": "not-synced", "kind": ",".join(waiting),
                                     "reason": message})
    return message


async def _read(request: web.Request, verb: str, parse: Any) -> Any:
    try:
        return parse(await read_json(request, request.app[RUNTIME].extender_body_limit))
    except BadRequest as exc:
        log.warning("bad request", extra={"verb": verb, "error": str(exc), "path": request.path})
        raise


async def _read_args(request: web.Request, verb: str, judge: Judge) -> tuple[wire.ExtenderArgs, PodRef]:
    def parse(body: Any) -> tuple[wire.ExtenderArgs, PodRef]:
        args = wire.parse_args(body)
        return args, judge.read_pod(args.pod)

    return await _read(request, verb, parse)


def _free_of(request: web.Request, node: str) -> str:
    ledger = request.app[RUNTIME].cluster.ledger(node)
    return fmt_free(ledger, ledger.free()) if ledger is not None else "not in the cache"


def _respond(payload: Any, started: float) -> tuple[web.Response, float]:
    response = json_response(payload)
    ms = (time.perf_counter() - started) * 1000
    response.headers["Server-Timing"] = f"app;dur={ms:.3f}"
    return response, ms


async def handle_filter(request: web.Request) -> web.Response:
    started = time.perf_counter()
    unsynced = _unsynced(request, "filter")
    if unsynced is not None:
        return json_response(wire.filter_error(unsynced))
    judge = _judge(request)
    args, ref = await _read_args(request, "filter", judge)
    holds = request.app[HOLDS]
    holds.expire()
    if ref.demand is not None:
        holds.release(ref.uid)  # a new attempt at this pod: whatever its last one held is over
    asked = judge.fits_asked
    out = filter_nodes(judge, ref, args.names)
    request.app[WAITING].after_filter(ref, args.names, out)
    if len(out.passed) == 1 and ref.demand is not None:
        holds.hold(ref, out.passed[0])  # kube-scheduler picks the only feasible node without /prioritize
    elif out.decision == "fits-nowhere":
        request.app[PREEMPTION].consider(ref, args.pod, list(out.failed))
        out.failed = request.app[PREEMPTION].say_blocked(ref, out.failed)
    try:
        response, ms = _respond(wire.filter_result(args, out.passed, out.failed, out.unresolvable), started)
    except orjson.JSONEncodeError as exc:
        # The NodeList form echoes the passing Node objects: orjson reads 1,024 levels but writes only 254.
        # No v1.Node nests that deep, so the request is at fault, not the answer.
        message = f"ExtenderArgs.Nodes cannot be answered with: {exc} (a v1.NodeList is never nested this deep)"
        log.warning("bad request", extra={"verb": "filter", "error": message, "path": request.path})
        raise BadRequest(message) from None
    _PASSED.inc(len(out.passed))
    _FAILED.inc(len(out.failed))
    _UNRESOLVABLE.inc(len(out.unresolvable))
    # The answer's reasons name no node; the log line says which nodes, and what each has free.
    first = [f"{node}: {why} ({_free_of(request, node)})"
             for node, why in islice(chain(out.unresolvable.items(), out.failed.items()), FIRST_REASONS)]
    log.info("filter", extra={
        "verb": "filter", "pod": ref.display, "nodes_in": len(args.names), "nodes_out": len(out.passed),
        "first_reasons": first or None, "decision": out.decision, "duration_ms": round(ms, 3),
        "demand": describe_demand(ref.demand) if ref.demand is not None else None,
        "count": judge.fits_asked - asked})  # fits computed; the other nodes' verdicts were cached
    if log.isEnabledFor(logging.DEBUG):
        for outcome, reasons in (("FailedAndUnresolvableNodes", out.unresolvable), ("FailedNodes", out.failed)):
            for node, why in reasons.items():
                log.debug("filtered out", extra={"verb": "filter", "pod": ref.display, "node": node,
                                                 "decision": outcome, "reason": why, "free": _free_of(request, node)})
    return response


async def handle_prioritize(request: web.Request) -> web.Response:
    started = time.perf_counter()
    unsynced = _unsynced(request, "prioritize")
    if unsynced is not None:
        return json_response(wire.bind_result(unsynced), status=503)
    judge = _judge(request)
    args, ref = await _read_args(request, "prioritize", judge)
    holds = request.app[HOLDS]
    holds.release(ref.uid)
    scores, best_node = rank(judge, ref, args.names)
    if best_node is not None:
        holds.hold(ref, best_node)
    listed = standouts(args.names, scores)
    response, ms = _respond(wire.host_priorities(listed), started)
    top = max(scores, default=0)
    best = list(islice((n for n, s in zip(args.names, scores) if s == top), FIRST_REASONS)) if top else []
    log.info("prioritize", extra={
        "verb": "prioritize", "pod": ref.display, "nodes_in": len(args.names),
        "nodes_out": len(listed), "first_reasons": [f"{n}={top}" for n in best] or None,
        "decision": "scored" if ref.demand is not None else "not-a-model-pod", "duration_ms": round(ms, 3)})
    return response


async def handle_preempt(request: web.Request) -> web.Response:
    started = time.perf_counter()
    deadline = time.monotonic() + request.app[RUNTIME].call_budget
    unsynced = _unsynced(request, "preempt")
    if unsynced is not None:
        return json_response(wire.bind_result(unsynced), status=503)
    judge = _judge(request)

    def parse(body: Any) -> tuple[wire.PreemptArgs, PodRef]:
        args = wire.parse_preempt_args(body)
        return args, judge.read_pod(args.pod)

    args, ref = await _read(request, "preempt", parse)
    try:
        priority = pod_priority(args.pod.get("spec") or {})
        kept, dropped = await request.app[PREEMPTION].narrow(ref, priority, args.victims, args.pods, deadline)
    except OutOfTime:
        message = (f"reading PodDisruptionBudgets and victims for {ref.display} took longer than the "
                   f"{request.app[RUNTIME].call_budget:g} s this call may take; kube-scheduler retries the pod")
        log.warning("preempt", extra={"verb": "preempt", "pod": ref.display, "decision": "timeout", "error": message})
        return json_response(wire.bind_result(message), status=503)
    response, ms = _respond(wire.preempt_result(kept), started)
    metrics.PREEMPTIONS.labels("scheduler", "kept").inc(len(kept))
    metrics.PREEMPTIONS.labels("scheduler", "dropped").inc(len(dropped))
    log.info("preempt", extra={
        "verb": "preempt", "pod": ref.display, "nodes_in": len(args.victims), "nodes_out": len(kept),
        "first_reasons": [f"{n}: {len(u)} victims, {len(set(u) & set(args.victims[n]))} of the scheduler's "
                          f"{len(args.victims[n])}" for n, u in islice(kept.items(), 3)]
        + [f"{n}: {why}" for n, why in islice(dropped.items(), 3)] or None,
        "decision": "narrowed" if kept else "no-candidate", "duration_ms": round(ms, 3)})
    return response


async def handle_bind(request: web.Request) -> web.Response:
    started = time.perf_counter()
    runtime = request.app[RUNTIME]
    deadline = time.monotonic() + runtime.call_budget
    unsynced = _unsynced(request, "bind")
    if unsynced is not None:
        return json_response(wire.bind_result(unsynced))
    args = await _read(request, "bind", wire.parse_bind_args)
    outcome = await bind(runtime, _judge(request), request.app[HOLDS], args, deadline)
    response, ms = _respond(wire.bind_result(outcome.error), started)
    metrics.BIND.labels(outcome.result).inc()
    level = logging.WARNING if outcome.error else logging.INFO
    log.log(level, "bind", extra={
        "verb": "bind", "pod": args.pod, "uid": args.uid, "node": args.node, "decision": outcome.result,
        "error": outcome.error or None, "duration_ms": round(ms, 3)})
    return response


async def debug_nodes(request: web.Request) -> web.Response:
    cluster = request.app[RUNTIME].cluster
    return json_response({"nodes": [ledger.to_json() for ledger in cluster.ledgers()]})


async def debug_node(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    ledger = request.app[RUNTIME].cluster.ledger(name)
    if ledger is None:
        return json_response({"error": f"node {name} is not known to the extender"}, status=404)
    return json_response(ledger.to_json())

