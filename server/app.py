"""What every server shares: the runtime (settings + cluster state + its source), health, readiness,
metrics, request parsing with limits, structured request logs, TLS and graceful shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from placement.cluster import KINDS, ClusterState
from placement.config import Settings
from server import metrics

log = logging.getLogger("model_placement.server")

ADMISSION_BODY_LIMIT = 3 * 1024 * 1024  # the apiserver's own request limit
EXTENDER_BODY_LIMIT = 256 * 1024 * 1024  # a full 5,000-node NodeList with room to spare


@dataclass
class Runtime:
    """State shared by the handlers of one process. Touched only from the event loop thread."""

    settings: Settings
    cluster: ClusterState
    source: Any = None  # a KubeSource when connected to a cluster; None for a --cluster snapshot
    api_client: Any = None  # kubernetes.client.ApiClient for pods/binding, when connected
    api: Any = None  # server.kubeapi.LoopApi over api_client, while the extender app runs
    draining: bool = False
    extender_body_limit: int = EXTENDER_BODY_LIMIT
    # The whole of one extender call (/bind, /preempt) must end within kube-scheduler's httpTimeout.
    call_budget: float = 4.5
    background: list[asyncio.Task[Any]] = field(default_factory=list)

    @property
    def ready(self) -> bool:
        if self.draining:
            return False
        return self.source is None or bool(self.source.synced)

    def unsynced(self) -> list[str]:
        """Kinds whose first full list is not applied yet: until none remain, the cluster state is partial."""
        if self.source is None or self.source.synced:
            return []
        done = set(self.source.synced_kinds())
        return [kind for kind in KINDS if kind not in done]


RUNTIME: web.AppKey[Runtime] = web.AppKey("runtime", Runtime)
COMPONENT: web.AppKey[str] = web.AppKey("component", str)


class BadRequest(Exception):
    """A request we cannot read; the message names the problem and goes back to the caller."""


async def read_json(request: web.Request, limit: int) -> Any:
    ctype = request.headers.get("Content-Type", "application/json").split(";")[0].strip().lower()
    if ctype != "application/json":
        raise BadRequest(f"Content-Type must be application/json, got {ctype!r}")
    if request.content_length is not None and request.content_length > limit:
        raise BadRequest(f"request body of {request.content_length} bytes exceeds the limit of {limit} bytes")
    if request.content_length is not None:  # the usual case: one read, already checked against the limit
        body: bytes | bytearray = await request.read()
    else:  # chunked: count as it comes, so an endless body is cut off at the limit
        body = bytearray()
        async for chunk in request.content.iter_chunked(1 << 16):
            body += chunk
            if len(body) > limit:
                raise BadRequest(f"request body exceeds the limit of {limit} bytes")
    if not body:
        raise BadRequest("request body is empty; expected a JSON object")
    try:
        # orjson refuses nesting deeper than 1024 levels: that is our depth guard.
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"request body is not valid JSON: {exc}") from None


def json_response(payload: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(payload), status=status, content_type="application/json")


def bad_request(message: str) -> web.Response:
    return json_response({"error": message}, status=400)


@web.middleware
async def observe(request: web.Request,
                  handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
    """Count, time and guard every request: an unexpected exception is a logged 500 with no traceback
    in the body; a draining server closes keep-alive connections so clients move on."""
    component = request.app[COMPONENT]
    route = request.match_info.route.resource.canonical if request.match_info.route.resource else "unmatched"
    started = time.perf_counter()
    try:
        response = await handler(request)
        outcome = str(response.status)
    except web.HTTPException as exc:
        outcome = str(exc.status)
        raise
    except BadRequest as exc:
        response, outcome = bad_request(str(exc)), "400"
    except Exception:
        log.exception("unhandled error", extra={"component": component, "path": request.path})
        response, outcome = json_response({"error": "internal error; see the server log"}, 500), "500"
    finally:
        metrics.LATENCY.labels(component, route).observe(time.perf_counter() - started)
    metrics.REQUESTS.labels(component, route, outcome).inc()
    if request.app[RUNTIME].draining:
        response.force_close()
    return response


async def healthz(request: web.Request) -> web.Response:
    return web.Response(text="ok")


async def readyz(request: web.Request) -> web.Response:
    runtime = request.app[RUNTIME]
    if runtime.ready:
        return web.Response(text="ready")
    why = "shutting down" if runtime.draining else "cluster state not synced yet"
    return web.Response(text=why, status=503)


async def metrics_handler(request: web.Request) -> web.Response:
    metrics.refresh_ledger_totals(request.app[RUNTIME].cluster)
    return web.Response(body=generate_latest(), headers={"Content-Type": CONTENT_TYPE_LATEST})


def base_app(runtime: Runtime, component: str, client_max_size: int) -> web.Application:
    app = web.Application(middlewares=[observe], client_max_size=client_max_size)
    app[RUNTIME] = runtime
    app[COMPONENT] = component
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics_handler)
    return app


async def serve(
    app: web.Application,
    host: str,
    port: int,
    ssl_context: Any = None,
    stop: asyncio.Event | None = None,
    drain_seconds: float = 2.0,
    shutdown_timeout: float = 20.0,
    on_listening: Callable[[int], None] | None = None,
) -> None:
    """Serve until SIGTERM/SIGINT (or `stop`), then shut down gracefully: readiness goes false
    first, in-flight requests finish, keep-alive connections are closed, then return."""
    runtime = app[RUNTIME]
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=shutdown_timeout, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port, ssl_context=ssl_context, reuse_address=True)
    await site.start()
    sockets = getattr(site._server, "sockets", None)  # an asyncio.Server's; None before start
    bound = sockets[0].getsockname()[1] if sockets else port
    log.info("listening", extra={"component": app[COMPONENT], "path": f"{'https' if ssl_context else 'http'}://{host}:{bound}"})
    if on_listening:
        on_listening(bound)
    await stop.wait()
    runtime.draining = True
    log.info("draining: readiness is false, finishing in-flight requests", extra={"component": app[COMPONENT]})
    # Let the endpoints controller take us out of the Service before we stop accepting.
    await asyncio.sleep(drain_seconds)
    await runner.cleanup()
    log.info("stopped", extra={"component": app[COMPONENT]})
