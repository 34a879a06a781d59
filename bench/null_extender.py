"""The null extender of tests/peers/nullextender in Python: aiohttp and orjson, as our servers are built, doing
no work: /filter passes every candidate, /prioritize states no preference. bench/bench_scheduler.py runs it as an
arm of its own: what any extender on this stack costs per pod before it judges anything, the floor under ours.
With `--kubeconfig` it also serves /bind and binds the pod through the apiserver as ours does (server.kubeapi's
LoopApi and bind_pod, the same client code): the floor of an extender that, like ours, records its own bindings.

    python bench/null_extender.py --listen 127.0.0.1:PORT [--kubeconfig FILE]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


async def filter_(request: web.Request) -> web.Response:
    args = orjson.loads(await request.read())
    return web.Response(body=orjson.dumps({"Nodes": None, "NodeNames": args.get("NodeNames"), "FailedNodes": {},
                                           "FailedAndUnresolvableNodes": {}, "Error": ""}),
                        content_type="application/json")


async def prioritize(request: web.Request) -> web.Response:
    orjson.loads(await request.read())
    return web.Response(body=b"[]", content_type="application/json")


BIND_TIMEOUT = 5.0  # seconds: the manifests' httpTimeout


def binder(kubeconfig: str) -> tuple[web.Application, Any]:
    """/bind as ours makes its API call, with no ledger, hold or annotation: the Binding alone."""
    from kubernetes import config

    from server.kubeapi import LoopApi, bind_pod

    api_client = config.new_client_from_config(config_file=kubeconfig)
    apis: list[LoopApi] = []

    async def bind(request: web.Request) -> web.Response:
        args = orjson.loads(await request.read())
        try:
            await bind_pod(apis[0], args["PodNamespace"], args["PodName"], args["PodUID"], args["Node"],
                           timeout=BIND_TIMEOUT, connect_timeout=1.0)
            error = ""
        except Exception as exc:  # the apiserver's own message, as ours answers it
            error = str(exc) or type(exc).__name__
        return web.Response(body=orjson.dumps({"Error": error}), content_type="application/json")

    async def on_startup(_: web.Application) -> None:
        apis.append(LoopApi(api_client))  # on the loop, as the extender makes it

    return bind, on_startup


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--listen", default="127.0.0.1:0")
    p.add_argument("--kubeconfig", default=None, help="also serve /bind, binding through this apiserver")
    args = p.parse_args()
    host, port = args.listen.rsplit(":", 1)
    app = web.Application(client_max_size=256 * 1024 * 1024)
    app.router.add_post("/filter", filter_)
    app.router.add_post("/prioritize", prioritize)
    if args.kubeconfig:
        bind, on_startup = binder(args.kubeconfig)
        app.router.add_post("/bind", bind)
        app.on_startup.append(on_startup)
    web.run_app(app, host=host, port=int(port), access_log=None, print=None)


if __name__ == "__main__":
    main()
