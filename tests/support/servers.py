"""Start our real servers on localhost for tests: TLS with a freshly made CA, ephemeral ports."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from certs import server_ssl_context, write_bundle
from cli.runner import build_app
from server.app import Runtime

SERVICE, NAMESPACE = "model-placement-webhook", "model-placement"
SERVER_NAME = f"{SERVICE}.{NAMESPACE}.svc"


@dataclass
class Served:
    url: str  # https://127.0.0.1:PORT
    client_ssl: ssl.SSLContext | None  # verifies with ca.crt, as the apiserver does
    runtime: Runtime
    app: web.Application

    def request_kwargs(self) -> dict[str, object]:
        """aiohttp request kwargs that verify our CA and the service DNS name, as the apiserver does."""
        if self.client_ssl is None:
            return {}
        return {"ssl": self.client_ssl, "server_hostname": SERVER_NAME}


def client_context(ca_file: Path) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(ca_file))
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    return ctx


@asynccontextmanager
async def serving(runtime: Runtime, component: str, tmp_path: Path, tls: bool = True) -> AsyncIterator[Served]:
    app = build_app(runtime, component)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    server_ctx = client_ctx = None
    if tls:
        bundle = write_bundle(SERVICE, NAMESPACE, tmp_path / "tls", extra_sans=("localhost", "127.0.0.1"))
        server_ctx = server_ssl_context(bundle.cert_file, bundle.key_file).context
        client_ctx = client_context(bundle.ca_file)
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=server_ctx)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield Served(f"{'https' if tls else 'http'}://127.0.0.1:{port}", client_ctx, runtime, app)
    finally:
        await runner.cleanup()
