"""Against a (local) live cluster: `report` / `render --kubeconfig` read it the same way as a file, and a
server is not ready until the first full list of every kind is in, then follows changes."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import urllib3

from tests.support.fakeapi import FakeApiServer, kubeconfig

ROOT = Path(__file__).resolve().parents[1]
KINDS = ("Node", "Pod", "BalloonsPolicy", "NodeResourceTopology")






def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


def test_report_and_render_read_the_live_cluster_as_they_read_a_file(fake_demo: FakeApiServer, tmp_path: Path) -> None:
    config = str(kubeconfig(tmp_path, fake_demo.url))
    live = json.loads(cli("report", "--kubeconfig", config, "-o", "json").stdout)
    offline = json.loads(cli("report", "-o", "json").stdout)
    assert live == offline and len(live) == 9
    rendered = json.loads(cli("render", "examples/deployment-tp2.yaml", "--kubeconfig", config, "-o", "json").stdout)
    assert rendered == json.loads(cli("render", "examples/deployment-tp2.yaml", "-o", "json").stdout)
    # The live answer follows the live cluster: take cpu-b1 away and it is no longer ranked.
    fake_demo.delete("Node", "cpu-b1")
    rendered = json.loads(cli("render", "examples/deployment-tp2.yaml", "--kubeconfig", config, "-o", "json").stdout)
    assert "cpu-b1" not in [r["node"] for r in rendered[0]["ranking"]]


def test_not_ready_until_every_kind_is_listed_then_follows_the_watch(fake_demo: FakeApiServer, tmp_path: Path) -> None:
    fake_demo.fail_next_lists("Pod", 6, code=500)  # the pod list keeps failing for a while
    proc = subprocess.Popen(
        [sys.executable, "-m", "cli", "serve", "--kubeconfig", str(kubeconfig(tmp_path, fake_demo.url)),
         "--insecure-http", "--host", "127.0.0.1", "--port", "0", "--drain-seconds", "0"],
        cwd=ROOT, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    http = urllib3.PoolManager()
    try:
        assert proc.stderr is not None
        port = 0
        while not port:
            entry = json.loads(proc.stderr.readline())
            if entry.get("msg") == "listening":
                port = int(entry["path"].rsplit(":", 1)[1])
        threading.Thread(target=proc.stderr.read, daemon=True).start()
        base = f"http://127.0.0.1:{port}"
        statuses = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            statuses.append(http.request("GET", f"{base}/readyz").status)
            if statuses[-1] == 200:
                break
            time.sleep(0.05)
        assert statuses[0] == 503 and statuses[-1] == 200  # 503 while the pod list failed, then ready
        assert http.request("GET", f"{base}/healthz").status == 200

        def ledger(node: str) -> dict:
            return json.loads(http.request("GET", f"{base}/debug/nodes/{node}").data)

        assert [n["free"] for n in ledger("cpu-a2")["numa"]] == [13, 29]
        # A model pod deleted in the cluster releases its cores within a second or so.
        fake_demo.delete("Pod", "llama3-8b-predictor-6c9f7-abcde", "llm")
        deadline = time.monotonic() + 5
        while [n["free"] for n in ledger("cpu-a2")["numa"]] != [29, 29]:
            assert time.monotonic() < deadline, ledger("cpu-a2")
            time.sleep(0.05)
    finally:
        proc.terminate()
        proc.wait(15)
