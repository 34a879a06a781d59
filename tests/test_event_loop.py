"""The servers' event loop: uvloop's when the `uvloop` extra is installed (`--event-loop auto`, the default), asyncio's
own when declined or absent; the log's `listening` line says which, and the server answers the same on either."""

from __future__ import annotations

import json
import sys

import pytest
import urllib3

from server.cli import main
from tests.support.process import ServerProcess
from tests.test_extender import args_nodecache, model_pod


@pytest.mark.parametrize(("choice", "loop"), [("asyncio", "asyncio"), ("uvloop", "uvloop"), ("auto", "uvloop")])
def test_the_extender_runs_and_answers_on_the_loop_asked_for(choice: str, loop: str) -> None:
    if loop == "uvloop":
        pytest.importorskip("uvloop")
    proc = ServerProcess(["extender", "--insecure-http", "--host", "127.0.0.1", "--port", "0", "--drain-seconds", "0",
                          "--event-loop", choice])
    try:
        (listening,) = proc.logged("listening")
        assert listening["loop"] == loop
        resp = urllib3.PoolManager().request(
            "POST", f"{proc.url}/filter", body=args_nodecache(model_pod("loop-0", tp=1, cpus=8), ["cpu-a1", "cpu-b1"]),
            headers={"Content-Type": "application/json"}, timeout=10)
        assert resp.status == 200 and json.loads(resp.data)["NodeNames"] == ["cpu-a1", "cpu-b1"]
    finally:
        assert proc.stop() == 0


def test_without_uvloop_auto_falls_back_and_asking_for_it_says_how_to_get_it(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from server.cli import loop_factory

    monkeypatch.setitem(sys.modules, "uvloop", None)  # import uvloop now raises ImportError, as when not installed
    assert loop_factory("auto") is None
    assert main(["extender", "--insecure-http", "--host", "127.0.0.1", "--port", "0", "--event-loop", "uvloop"]) == 2
    assert capsys.readouterr().err.strip() == ("model-placement: --event-loop uvloop: uvloop is not installed "
                                               "(pip install 'model-placement[uvloop]')")
