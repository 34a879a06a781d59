"""The null extender of tests/peers/nullextender in Python: aiohttp and orjson, as our servers are built, doing
no work: /filter passes every candidate, /prioritize states no preference. bench/bench_scheduler.py runs it as a
fourth arm: what any extender on this stack costs per pod before it judges anything, the floor under ours.

    python bench/null_extender.py --listen 127.0.0.1:PORT
"""

from __future__ import annotations

import argparse

import orjson
from aiohttp import web


async def filter_(request: web.Request) -> web.Response:
    args = orjson.loads(await request.read())
    return web.Response(body=orjson.dumps({"Nodes": None, "NodeNames": args.get("NodeNames"), "FailedNodes": {},
                                           "FailedAndUnresolvableNodes": {}, "Error": ""}),
                        content_type="application/json")


async def prioritize(request: web.Request) -> web.Response:
    orjson.loads(await request.read())
    return web.Response(body=b"[]", content_type="application/json")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--listen", default="127.0.0.1:0")
    args = p.parse_args()
    host, port = args.listen.rsplit(":", 1)
    app = web.Application(client_max_size=256 * 1024 * 1024)
    app.router.add_post("/filter", filter_)
    app.router.add_post("/prioritize", prioritize)
    web.run_app(app, host=host, port=int(port), access_log=None, print=None)


if __name__ == "__main__":
    main()
