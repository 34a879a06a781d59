"""Shared fixtures: the demo fleet, real-format payloads from tests/fixtures/, our servers over TLS (the extender
and the webhook) and a local apiserver stand-in with a client of it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from kubernetes import client

from placement.cluster import ClusterState
from placement.config import Settings
from server.app import Runtime
from server.sources import demo_text, load_objects
from tests.support.extender import Ext, MakeExt
from tests.support.fakeapi import FakeApiServer
from tests.support.payloads import FIXTURES, TAINTS, TOLERATIONS, fixture_json, fixture_text, tainted
from tests.support.servers import serving
from tests.support.webhook import MakeWebhook, Webhook

__all__ = ["FIXTURES", "TAINTS", "TOLERATIONS", "fixture_json", "fixture_text", "tainted"]

Obj = dict[str, Any]


@pytest.fixture
def settings() -> Settings:
    return Settings()


@pytest.fixture
def demo_objects() -> list[dict[str, Any]]:
    return load_objects(demo_text())


@pytest.fixture
def demo(demo_objects: list[dict[str, Any]], settings: Settings) -> ClusterState:
    return ClusterState.from_objects(demo_objects, settings)


# ---------------------------------------------------------------------------------------- the extender

@pytest.fixture
async def make_ext(tmp_path: Path) -> AsyncIterator[MakeExt]:
    stack: list[Any] = []

    async def make(objects: list[Obj], settings: Settings | None = None, **runtime_kw: Any) -> Ext:
        settings = settings or Settings()
        runtime = Runtime(settings, ClusterState.from_objects(objects, settings), **runtime_kw)
        cm = serving(runtime, "extender", tmp_path / f"srv{len(stack)}")
        served = await cm.__aenter__()
        session = aiohttp.ClientSession()
        stack.append((cm, session))
        return Ext(served, session)

    yield make
    for cm, session in reversed(stack):
        await session.close()
        await cm.__aexit__(None, None, None)


@pytest.fixture
async def ext(make_ext: MakeExt, demo_objects: list[Obj]) -> Ext:
    return await make_ext(demo_objects)  # type: ignore[no-any-return]


# ---------------------------------------------------------------------------------------- the webhook

@pytest.fixture
async def make_webhook(tmp_path: Path) -> AsyncIterator[MakeWebhook]:
    async with AsyncExitStack() as stack:
        count = 0

        async def make(objects: list[Obj] | None = None, settings: Settings | None = None) -> Webhook:
            nonlocal count
            count += 1
            settings = settings or Settings()
            objects = load_objects(demo_text()) if objects is None else objects
            runtime = Runtime(settings, ClusterState.from_objects(objects, settings))
            served = await stack.enter_async_context(serving(runtime, "webhook", tmp_path / f"srv{count}"))
            session = await stack.enter_async_context(aiohttp.ClientSession())
            return Webhook(served, session)

        yield make


@pytest.fixture
async def wh(make_webhook: MakeWebhook) -> Webhook:
    return await make_webhook()  # type: ignore[no-any-return]


# ---------------------------------------------------------------------------------------- the apiserver

@pytest.fixture
def fake() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        yield server


@pytest.fixture
def api(fake: FakeApiServer) -> Iterator[client.ApiClient]:
    api_client = client.ApiClient(client.Configuration(host=fake.url))
    yield api_client
    api_client.close()


# The demo fleet in a fake apiserver.
@pytest.fixture
def fake_demo() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        for obj in load_objects(demo_text()):
            server.add(obj["kind"], obj)
        yield server


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """pytest-xdist's workers take whole files, in order, so that a file's module fixtures start once; tests/e2e
    goes whole to one worker, as its tests share one control plane per session. (The xdist_group mark cannot say
    this under pytest 9.2, where xdist 3.8's rewrite of the node id no longer takes.)"""
    from xdist.scheduler import LoadFileScheduling

    class ByFile(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return "tests/e2e" if path.startswith("tests/e2e/") else path

    return ByFile(config, log)
