"""Start a server process: settings, cluster state and its source, TLS, routes, background loops."""

from __future__ import annotations

import argparse
import asyncio
import gc
import ipaddress
import logging
from typing import Any

from aiohttp import web

from placement.assume import AssumeCache
from placement.cluster import ClusterState
from placement.config import Settings
from server import metrics
from server.app import ADMISSION_BODY_LIMIT, EXTENDER_BODY_LIMIT, Runtime, base_app, serve
from server.inputs import InputError
from server.sources import cluster_log, snapshot_state

log = logging.getLogger("model_placement.server")


def build_app(runtime: Runtime, component: str) -> web.Application:
    """`component` is webhook, extender or serve (both route sets in one app)."""
    limit = max(ADMISSION_BODY_LIMIT, runtime.extender_body_limit)
    app = base_app(runtime, component, client_max_size=limit)
    if component in ("webhook", "serve"):
        from webhook.routes import add_routes as add_webhook

        add_webhook(app)
    if component in ("extender", "serve"):
        from extender.routes import add_routes as add_extender

        add_extender(app)
    return app


async def _rebuild_ledgers(runtime: Runtime, every: float = 0.02, batch: int = 50) -> None:
    # A policy change marks every ledger stale; rebuilding a few at a time between requests keeps a
    # scheduling cycle from paying for all of them (5,000 ledgers take seconds).
    while True:
        await asyncio.sleep(every if runtime.cluster.rebuild_dirty(batch) else every * 25)


def tune_gc() -> None:
    """The cluster state is hundreds of thousands of long-lived objects: freeze them out of the
    collector's sight, and make full collections rare, or they pause the loop for tens of ms. A generation-1
    collection every second young one, not every tenth: it walks what the young ones kept since the last (the
    extender's verdict memos grow between requests), and ten's worth paused a /filter 9-19 ms in
    bench/bench_extender.py's tail, two's 5-10 ms, for less collector time in all."""
    gc.collect()
    gc.freeze()
    gen0, _, _ = gc.get_threshold()
    gc.set_threshold(max(gen0, 7000), 2, 1000)


async def _expire_assumed(runtime: Runtime, every: float) -> None:
    while True:
        await asyncio.sleep(every)
        metrics.ASSUMED_EXPIRED.inc(len(AssumeCache(runtime.cluster).expire()))


async def _publish_source_metrics(runtime: Runtime, every: float = 5.0) -> None:
    while True:
        source = runtime.source
        for kind, value in getattr(source, "relists", {}).items():
            metrics.RELISTS.labels(kind).set(value)
        for kind, value in getattr(source, "watch_restarts", {}).items():
            metrics.WATCH_RESTARTS.labels(kind).set(value)
        synced = set(source.synced_kinds()) if source is not None else None
        for kind in ("Node", "Pod", "BalloonsPolicy", "NodeResourceTopology"):
            metrics.SYNCED.labels(kind).set(1 if synced is None or kind in synced else 0)
        await asyncio.sleep(every)


def _loopback(host: str | None) -> bool:
    try:
        return ipaddress.ip_address(host or "").is_loopback
    except ValueError:
        return host == "localhost"


def make_runtime(args: argparse.Namespace, settings: Settings) -> Runtime:
    limit = args.extender_body_limit or EXTENDER_BODY_LIMIT
    if args.kubeconfig or args.in_cluster:
        from server.inputs import api_client

        client = api_client(args.kubeconfig, args.in_cluster)
        return Runtime(settings, ClusterState(settings, log=cluster_log), api_client=client, extender_body_limit=limit)
    state = snapshot_state(args, settings)
    # Every ledger built now, as the live source does once its first list is in (on_synced below), so that run()'s
    # tune_gc freezes them with the rest: left lazy, a new model's first /filter calls of 500 names on issue 39's
    # 5,000-node --cluster file built a few hundred ledgers each (208, 184, 167 ms of CPU; 7, 3, 2 ms built first).
    state.ledgers()
    return Runtime(settings, state, extender_body_limit=limit)


async def run(args: argparse.Namespace, settings: Settings, stop: asyncio.Event | None = None) -> int:
    component = args.command
    tls: Any = None
    if args.insecure_http:
        if args.tls_cert or args.tls_key:
            log.warning("--insecure-http given: ignoring --tls-cert/--tls-key")
        if not _loopback(args.host):
            # Plain HTTP is safe only where nothing but the pod itself can connect (the scheduler's sidecar).
            log.warning("plain HTTP on a non-loopback address: anyone who reaches it can call the server",
                        extra={"reason": f"--insecure-http with --host {args.host}"})
    else:
        if not (args.tls_cert and args.tls_key):
            raise InputError("TLS is required: give --tls-cert and --tls-key (or --insecure-http for plain HTTP)")
        from certs import server_ssl_context

        tls = server_ssl_context(args.tls_cert, args.tls_key, args.client_ca, interval=args.cert_check_seconds)
        metrics.CERT_NOT_AFTER.set(tls.not_after.timestamp())
    runtime = make_runtime(args, settings)
    if getattr(args, "scheduler_config", None):
        from extender.schedconfig import budget_from_file

        runtime.call_budget = budget_from_file(args.scheduler_config)
        log.info("extender calls answer within kube-scheduler's httpTimeout", extra={
            "path": args.scheduler_config, "duration_ms": round(runtime.call_budget * 1000)})
    # Before the source starts: its bulk load restores the thresholds it found once the first list is in.
    tune_gc()
    if runtime.api_client is not None:
        from server.kubesource import KubeSource

        # Every ledger built once the first list is in, before the collector freezes the state: left to be built
        # lazily, the first scheduling cycles paid for them (the first /filter of 500 names on a 100,000-pod fleet
        # took 170 ms) and they stayed in the collector's sight.
        runtime.source = KubeSource(runtime.cluster, runtime.api_client, on_synced=runtime.cluster.ledgers)
        runtime.source.start()
    app = build_app(runtime, component)
    if tls is not None:
        await tls.start()
    runtime.background += [
        asyncio.create_task(_expire_assumed(runtime, max(1.0, settings.assume_ttl_seconds / 4))),
        asyncio.create_task(_publish_source_metrics(runtime)),
        asyncio.create_task(_rebuild_ledgers(runtime)),
    ]
    try:
        await serve(app, args.host, args.port, tls.context if tls else None, stop=stop,
                    drain_seconds=args.drain_seconds, shutdown_timeout=args.shutdown_grace_seconds)
    finally:
        for task in runtime.background:
            task.cancel()
        if tls is not None:
            await tls.stop()
        if runtime.source is not None:
            await asyncio.to_thread(runtime.source.stop)
    return 0
