"""SIGTERM during load: readiness goes false first, every request the server accepted gets a complete
answer, then the process exits 0 within its grace period."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import aiohttp
import orjson

from tests.support.payloads import fixture_json

ROOT = Path(__file__).resolve().parents[1]


async def _port_of(proc: subprocess.Popen[bytes]) -> int:
    assert proc.stderr is not None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        line = await asyncio.to_thread(proc.stderr.readline)
        if not line:
            break
        entry = json.loads(line)
        if entry.get("msg") == "listening":
            # Keep reading its log, or a full pipe would stall the server mid-request.
            threading.Thread(target=proc.stderr.read, daemon=True).start()
            return int(entry["path"].rsplit(":", 1)[1])
    raise AssertionError("server never said it was listening")


async def test_sigterm_during_load_answers_every_accepted_request() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "cli", "serve", "--insecure-http", "--host", "127.0.0.1", "--port", "0",
         "--drain-seconds", "0.5", "--shutdown-grace-seconds", "10"],
        cwd=ROOT, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL)
    try:
        port = await _port_of(proc)
        base = f"http://127.0.0.1:{port}"
        body = orjson.dumps(fixture_json("admissionreview-v1-pod-create.json"))
        answered = 0
        lost: list[str] = []
        drain_replies: list[tuple[int, str]] = []
        endpoints_removed = asyncio.Event()  # what the endpoints controller does once readiness fails

        # A fresh connection per request, so a refused connection means "never accepted".
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as session:
            async def client() -> None:
                nonlocal answered
                while not endpoints_removed.is_set():
                    try:
                        async with session.post(f"{base}/mutate", data=body,
                                                headers={"Content-Type": "application/json"}) as resp:
                            payload = await resp.json()
                            assert resp.status == 200 and payload["response"]["allowed"] is True
                            answered += 1
                    except (TimeoutError, aiohttp.ClientError) as exc:
                        lost.append(repr(exc))

            async def terminate() -> None:
                await asyncio.sleep(1.0)
                proc.send_signal(signal.SIGTERM)
                for _ in range(50):
                    async with session.get(f"{base}/readyz") as resp:
                        drain_replies.append((resp.status, resp.headers.get("Connection", "")))
                        if resp.status == 503:
                            break
                    await asyncio.sleep(0.02)
                endpoints_removed.set()

            await asyncio.gather(*(client() for _ in range(16)), terminate())
            # Then the listener closes: new connections are refused.
            refused = False
            for _ in range(100):
                try:
                    async with session.get(f"{base}/healthz"):
                        pass
                except aiohttp.ClientConnectorError:
                    refused = True
                    break
                await asyncio.sleep(0.05)
        code = await asyncio.to_thread(proc.wait, 15)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
    assert lost == []  # every request sent before the endpoint went away got its answer
    assert answered > 50
    assert drain_replies[-1] == (503, "close")  # readiness false, keep-alive refused while draining
    assert refused  # then the listener closed
    assert code == 0
