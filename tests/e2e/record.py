"""Record what the real kube-apiserver sends our webhook and the real kube-scheduler sends our extender.

    python3 -m tests.e2e.record [--out tests/fixtures/recorded]

Starts the e2e control plane on a small fleet with a recording proxy in front of each of our servers (the webhook
clientConfig URLs and the extender's urlPrefix point at the proxy), then does what a user does: applies a
KServe-shaped Deployment (its pods come from the ReplicaSet controller) and a bare model pod. Each first request of
a kind is written with our answer as `<name>.json`: {"path", "request", "response"}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import ssl
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

from aiohttp import ClientSession, TCPConnector, web

from tests.e2e.cluster import LOOPBACK, ROOT, Cluster, free_port, wait_until
from tests.e2e.fleet import KSERVE_DEPLOYMENT, MODEL_NS, PLACED_NS, fleet

OUT = ROOT / "tests" / "fixtures" / "recorded"


def fixture_name(path: str, body: dict[str, Any]) -> str | None:
    """The file a request is recorded in, or None for kinds not recorded."""
    verb = path.split("?", 1)[0].strip("/")
    if verb in ("mutate", "validate"):
        req = body.get("request", {})
        kind = req.get("kind", {}).get("kind", "")
        if kind == "Pod":
            owners = (req.get("object", {}).get("metadata", {}).get("ownerReferences") or [{}])
            made_by = "replicaset" if owners[0].get("kind") == "ReplicaSet" else "bare"
            return f"admissionreview-{verb}-pod-{made_by}"
        return f"admissionreview-{verb}-{kind.lower()}"
    if verb in ("filter", "prioritize"):
        return f"extender-{verb}-args"
    if verb == "bind":
        return "extender-bind-args"
    return None


class Proxy:
    """A front in the same scheme as the server it forwards to one of our servers and keeps the first request and
    answer of each kind."""

    def __init__(self, cluster: Cluster, which: str) -> None:
        self.cluster, self.which = cluster, which
        self.records: dict[str, dict[str, Any]] = {}
        self.port = free_port()

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        upstream = f"{self.cluster.url(self.which)}{request.path_qs}"
        async with self.session.post(upstream, data=body, headers={"Content-Type": "application/json"}) as resp:
            answer = await resp.read()
            status = resp.status
        name = fixture_name(request.path_qs, json.loads(body))
        if name and name not in self.records:
            self.records[name] = {"path": request.path_qs, "request": json.loads(body),
                                  "response": json.loads(answer)}
        return web.Response(body=answer, status=status, content_type="application/json")

    async def serve(self) -> None:
        self.session = ClientSession(connector=TCPConnector(ssl=self.cluster.client_tls(self.which) or False))
        app = web.Application(client_max_size=64 << 20)
        app.router.add_post("/{verb:.*}", self.handle)
        serving = None
        if self.cluster.scheme(self.which) == "https":
            serving = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            serving.load_cert_chain(self.cluster.tls.cert_file, self.cluster.tls.key_file)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, LOOPBACK, self.port, ssl_context=serving).start()


class Proxies:
    """The two fronts, served from a loop thread of their own."""

    def __init__(self, cluster: Cluster) -> None:
        self.by_name = {which: Proxy(cluster, which) for which in ("webhook", "extender")}
        cluster.front = {which: p.port for which, p in self.by_name.items()}
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()

    def serve(self) -> None:
        for proxy in self.by_name.values():
            asyncio.run_coroutine_threadsafe(proxy.serve(), self.loop).result(30)

    def recorded(self) -> dict[str, dict[str, Any]]:
        return {name: rec for p in self.by_name.values() for name, rec in p.records.items()}


def record(out: Path) -> list[Path]:
    with tempfile.TemporaryDirectory(prefix="mp-record-") as tmp:
        cluster = Cluster(Path(tmp))
        proxies = Proxies(cluster)
        try:
            cluster.start()
            cluster.install()
            proxies.serve()  # with the TLS bundle install() made
            cluster.kubectl("apply", "-f", str(ROOT / "manifests" / "examples" / "balloonspolicy.yaml"))
            cluster.create_namespace(MODEL_NS, enabled=True)
            cluster.create_namespace(PLACED_NS, enabled=False)
            nodes, placed = fleet(scale=0.005)
            cluster.create_nodes(nodes)
            cluster.create_pods(placed)
            cluster.start_model_placement("webhook")
            cluster.start_model_placement("extender")
            cluster.start_scheduler()
            cluster.kubectl("apply", "-f", "-", input=KSERVE_DEPLOYMENT)
            cluster.kubectl("-n", MODEL_NS, "apply", "-f", str(ROOT / "manifests" / "examples" / "model-pod.yaml"))
            wanted = {"admissionreview-mutate-pod-replicaset", "admissionreview-validate-pod-replicaset",
                      "admissionreview-mutate-pod-bare", "admissionreview-validate-pod-bare",
                      "admissionreview-validate-deployment", "extender-filter-args", "extender-prioritize-args",
                      "extender-bind-args"}
            wait_until("every kind of request recorded", lambda: wanted <= set(proxies.recorded()), timeout=120)
        except BaseException:
            print(cluster.tails(), file=sys.stderr)
            raise
        finally:
            cluster.stop()
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, rec in sorted(proxies.recorded().items()):
        path = out / f"{name}.json"
        path.write_text(json.dumps(rec, indent=2) + "\n")
        written.append(path)
    return written


def main() -> int:
    p = argparse.ArgumentParser(prog="python3 -m tests.e2e.record", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args()
    for path in record(args.out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
