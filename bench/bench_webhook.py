"""Benchmark: POST /mutate over TLS with keep-alive, 32 concurrent clients, the pods the real apiserver sends.

Baseline, measured in the same run and the same conditions: a bare aiohttp handler that parses the
same AdmissionReview and returns the same JSON. Each server runs in its own process (the client in
this one), so the two cores are shared the same way in both runs; our server tunes its GC as
`model-placement webhook` does.

The bodies are the AdmissionReview the real kube-apiserver sent for a ReplicaSet-created KServe pod
(tests/fixtures/recorded/, written by tests/e2e/record.py), varied as the apiserver varies them between the
replicas of one ReplicaSet: the request uid, the ServiceAccount token volume `kube-api-access-<5 random
characters>` (and its volumeMounts), managedFields' time (to the second); names are generated after
admission, so there are none. Streams: the replicas of one ReplicaSet, with the webhook's replica memo and
without it (its hit rate is read from the server's /metrics), and pods of 500 different models (a label each).

    python bench/bench_webhook.py [--requests 6000] [--clients 32] [--rounds 3]

The arms take turns, `--rounds` times (a machine growing busier or quieter favours none); medians.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import ROOT, WEBHOOK_HOST, admission_review, get_tls, metric, pct, serve_webhook


async def _load(port: int, ca: str, bodies: list[bytes], requests: int, clients: int) -> tuple[float, list[float], int]:
    ctx = ssl.create_default_context(cafile=ca)
    latencies: list[float] = []
    errors = 0
    connector = aiohttp.TCPConnector(limit=clients, ssl=ctx)
    url = f"https://127.0.0.1:{port}/mutate?timeout=10s"
    headers = {"Content-Type": "application/json"}
    async with aiohttp.ClientSession(connector=connector) as session:
        sent = iter(bodies)

        async def one() -> None:
            nonlocal errors
            body = next(sent)
            t0 = time.perf_counter()
            async with session.post(url, data=body, headers=headers, server_hostname=WEBHOOK_HOST) as resp:
                payload = await resp.read()
                if resp.status != 200 or (b'"response"' not in payload and b'"request"' not in payload):
                    errors += 1
            latencies.append(time.perf_counter() - t0)

        for _ in range(clients):  # warm up every connection (TLS handshakes are not what we measure)
            await one()
        latencies.clear()
        todo = iter(range(requests))

        async def worker() -> None:
            for _ in todo:
                await one()

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(clients)))
        elapsed = time.perf_counter() - started
    return elapsed, latencies, errors


def measure(mode: str, requests: int, clients: int, tls_dir: Path, distinct: bool = False) -> dict[str, float]:
    port_file = tls_dir / f"{mode}.port"
    port_file.unlink(missing_ok=True)  # a second run of the same server must not read the first one's port
    proc = subprocess.Popen([sys.executable, __file__, "--serve", mode, str(tls_dir / "tls.crt"),
                             str(tls_dir / "tls.key"), str(port_file)], cwd=ROOT)
    try:
        for _ in range(200):
            if port_file.exists() and port_file.read_text():
                break
            time.sleep(0.05)
        port = int(port_file.read_text())
        bodies = [orjson.dumps(admission_review(i, distinct)) for i in range(requests + clients)]
        elapsed, lat, errors = asyncio.run(_load(port, str(tls_dir / "ca.crt"), bodies, requests, clients))
        reused = memo_reused(port, str(tls_dir / "ca.crt")) if mode.startswith("ours") else 0.0
    finally:
        proc.terminate()
        proc.wait(10)
    return {"rps": requests / elapsed, "p50_ms": statistics.median(lat) * 1e3,
            "p99_ms": pct(lat, 99) * 1e3, "errors": errors,
            "memo_hits": reused / (requests + clients)}


def memo_reused(port: int, ca: str) -> float:
    """How many replicas the server answered with a remembered patch (its replica-memo counter)."""
    text = get_tls(port, "/metrics", ca)
    return metric(text, "model_placement_mutation_replica_memo_total", "result").get("reused", 0.0)


ARMS = (("bare", False), ("ours", False), ("ours-no-memo", False), ("ours", True))  # (mode, 500 models)
LABELS = {("bare", False): "bare aiohttp parse+echo", ("ours", False): "model-placement, replicas",
          ("ours-no-memo", False): "  the same, no replica memo", ("ours", True): "model-placement, 500 models"}


def run(requests: int, clients: int, rounds: int) -> list[dict[str, object]]:
    from certs import write_bundle

    runs: dict[tuple[str, bool], list[dict[str, float]]] = {arm: [] for arm in ARMS}
    with tempfile.TemporaryDirectory() as tmp:
        tls_dir = Path(tmp)
        write_bundle("model-placement-webhook", "model-placement", tls_dir)
        for _ in range(rounds):
            for mode, distinct in ARMS:
                runs[(mode, distinct)].append(measure(mode, requests, clients, tls_dir, distinct=distinct))
    bare = [m["rps"] for m in runs[("bare", False)]]
    rows: list[dict[str, object]] = []
    for (mode, distinct), measured in runs.items():
        row: dict[str, object] = {"variant": LABELS[(mode, distinct)],
                                  **{key: statistics.median(m[key] for m in measured) for key in measured[0]}}
        if mode != "bare":
            row["ratio"] = statistics.median(m["rps"] / b for m, b in zip(measured, bare))
            row["goal"] = 0.8 if distinct else None
        rows.append(row)
    return rows


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--serve":
        serve_webhook(*sys.argv[2:6])
        return
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=6000)
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    load = os.getloadavg()[0]
    rows = run(args.requests, args.clients, args.rounds)
    print(f"load average {load:.1f} before, {os.getloadavg()[0]:.1f} after; medians of {args.rounds} rounds")
    print(f"{'variant':<30} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'errors':>6} {'memo hits':>9}  ratio to bare")
    for r in rows:
        ratio = "baseline" if "ratio" not in r else f"{r['ratio']:.2f}" + (
            f" (goal ≥ {r['goal']})" if r.get("goal") else "")
        print(f"{r['variant']:<30} {r['rps']:>8.0f} {r['p50_ms']:>8.2f} {r['p99_ms']:>8.2f} "
              f"{r['errors']:>6.0f} {100 * float(r['memo_hits']):>8.0f}%  {ratio}")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
