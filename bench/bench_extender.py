"""Benchmark the scheduler extender over HTTP on loopback:  python bench/bench_extender.py [--quick] [--profile]

A synthetic fleet (5,000 nodes, 100,000 pods by default: 2, 4 and 8 NUMA nodes, SMT on and off, model
pods of TP 1/2/4/8 running on them, a BalloonsPolicy per NUMA count with the types `balloons-policy`
generates, one node in ten in a group whose policy lacks the type spanning all its NUMA nodes, nodes whose
NRI plugin reports Failure) is built with the real ClusterState in a server process, which serves the
real extender app. This process sends what kube-scheduler sends, over one keep-alive connection, and
prints p50/p99 round trips (and the server's own time, from its Server-Timing header) per case:

The pending pods are the one the real kube-scheduler sent (tests/fixtures/recorded/extender-filter-args.json),
varied per replica as the apiserver and our webhook would (`pending_pod`).

- the tail, first, from the server's first request on and nothing discarded: 1,000 pods, each /filter with 500
  names then /prioritize with the nodes that passed, replicas of 12 models and, one pod in 200 (`--tail-new`), the
  first of a model never asked about. Goals:
  p99 of the pair <= 5 ms, the first pod of a model <= 25 ms. The server (`--gc server`, the default) loads its
  state as `model-placement extender` does, and adds to its Server-Timing what each request spent in the cyclic
  collector and how many ledgers it built, so the slowest calls say what made them slow; `--profile` adds a
  cProfile of the tail's requests;
- then, after the server idled a few seconds (as a running server does between scheduling cycles, when
  it judges the nodes those models have not met yet), /filter with 500 candidate names (what
  kube-scheduler sends at 5,000 nodes) and with all 5,000; every request is a pod the server has not
  seen (a new uid), a replica of one of the 12 models;
- /prioritize as kube-scheduler calls it, right after /filter with the nodes that passed, and cold;
- /filter for a non-model pod;
- /filter with a full NodeList of 500 nodes (nodeCacheCapable: false), against a bare stdlib
  `json.loads` + `json.dumps` of the same body measured in the same run.

`--fleet mixed` (or `mixed-placed`) `--new-model 100` is issue 39's case instead: a fleet of 1-, 2- and 4-NUMA
nodes of 24-48 cores under one default policy, 20 pods a node, and right after the load one new TP=2 pod asking
/filter + /prioritize 100 times with 500 random names; goal: each call <= 25 ms. `--profile` then profiles those
calls (BENCH_SORT=cumulative BENCH_TOP=40 to read them otherwise).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (
    Client,
    calibration,
    extender_args,
    new_model,
    node_name,
    node_object,
    pct,
    pending_pod,
    plain_pod,
    process_cpu,
    serve_extender,
)


def tail_case(client: Client, rng: random.Random, names: list[str], calls: int, every: int, gap: float,
              pid: int) -> dict[str, Any]:
    """From the server's first request on, nothing discarded: `calls` pods, each /filter then /prioritize with the
    nodes that passed, 500 names each, `gap` seconds between pods. One call in `every` is the first pod of a model
    never asked about (a CPU request of its own); the others are replicas of the 12 usual models or of those new
    ones. Returns the calls."""
    import orjson

    usual: set[tuple[int, int, str]] = set()
    fresh: list[tuple[int, int, str]] = []
    firsts: dict[tuple[int, int, str], int] = {}  # model -> the call of its first pod
    out = []
    cpu = process_cpu(pid)
    for k in range(calls):
        if k % every == every // 2:
            model = new_model(rng, k, new_shape=True)
            fresh.append(model)
        elif fresh and rng.random() < 0.5:
            model = rng.choice(fresh)
        else:
            model = new_model(rng, k)
        first = model not in usual
        usual.add(model)
        since = firsts.setdefault(model, k)
        pod = pending_pod(rng, 1_000_000 + k, model=model)
        f_rt, f_srv, answer = client.post("/filter", orjson.dumps(
            extender_args(pod, rng.sample(names, 500))))
        f_timing = client.timing
        p_rt, p_srv, _ = client.post("/prioritize", orjson.dumps(
            extender_args(pod, answer["NodeNames"])))
        time.sleep(gap)
        out.append({"k": k, "first": first, "since": since, "model": model, "rt": f_rt + p_rt, "filter": f_rt,
                    "prioritize": p_rt,
                    "server": f_srv + p_srv, "cpu": f_timing["cpu"] + client.timing["cpu"],
                    "gc": f_timing["gc"] + client.timing["gc"],
                    "gccpu": f_timing["gccpu"] + client.timing["gccpu"],
                    "gcgen": max(f_timing["gcgen"], client.timing["gcgen"]),
                    "ledgers": f_timing["ledgers"] + client.timing["ledgers"],
                    "fits": f_timing["fits"] + client.timing["fits"]})
    return {"calls": out, "process_cpu": (process_cpu(pid) - cpu) * 1000 / calls, "gap": gap}


def new_model_case(client: Client, rng: random.Random, names: list[str], calls: int, profile: bool) -> bool:
    """Issue 39: right after the load, one TP=2 pod of a model never asked about asks /filter + /prioritize `calls`
    times, 500 random names each (kube-scheduler retrying it, each cycle sampling its candidates). Every call is
    the first this model meets most of its nodes in; goal: each <= 25 ms."""
    import orjson

    if profile:
        client.exchange("/bench/profile", b"start", "text/plain")
    pod = pending_pod(rng, 0, model=(2, 16, "32"))
    rts, servers, cpus, gcs = [], [], [], []
    for _ in range(calls):
        f_rt, f_srv, answer = client.post("/filter", orjson.dumps(
            extender_args(pod, rng.sample(names, 500))))
        f_cpu, f_gc = client.timing["cpu"], client.timing["gc"]
        p_rt, p_srv, _ = client.post("/prioritize", orjson.dumps(
            extender_args(pod, answer["NodeNames"])))
        rts.append(f_rt + p_rt)
        servers.append(f_srv + p_srv)
        cpus.append(f_cpu + client.timing["cpu"])
        gcs.append(f_gc + client.timing["gc"])
    print(f"\none new TP=2 pod, {calls} times /filter + /prioritize with 500 random names; ms")
    ten = {name: ", ".join(f"{r:.1f}" for r in values[:10])
           for name, values in (("rt", rts), ("server", servers), ("cpu", cpus), ("gc", gcs))}
    print(f"  the first ten: {ten['rt']} (server {ten['server']}; its CPU {ten['cpu']}; in the cyclic GC {ten['gc']})")
    print(f"  p50 {pct(rts, 50):.2f}, p99 {pct(rts, 99):.2f}, max {max(rts):.2f}; goal: every call <= 25 ms: "
          f"{'met' if max(rts) <= 25 else 'MISSED'}")
    if profile:
        print("  where the server spent them (cProfile, by own time):")
        text = client.exchange("/bench/profile", b"stop", "text/plain")[1].decode()
        print("\n".join(f"    {line}" for line in text.splitlines() if line.strip()))
    return max(rts) <= 25


def print_tail(tail: dict[str, Any]) -> bool:
    calls = tail["calls"]
    rt = [c["rt"] for c in calls]
    firsts = [c["rt"] for c in calls if c["first"]]
    ok = pct(rt, 99) <= 5.0 and max(firsts) <= 25.0
    print(f"\nthe tail: {len(calls)} pods from the server's first request on, /filter + /prioritize, 500 names, "
          f"nothing discarded, {1000 * tail['gap']:g} ms between pods; ms")
    replicas = [c["rt"] for c in calls if not c["first"]]
    print(f"  /filter + /prioritize: p50 {pct(rt, 50):.2f}, p99 {pct(rt, 99):.2f}, max {max(rt):.2f} "
          f"(/filter p99 {pct([c['filter'] for c in calls], 99):.2f}, /prioritize p99 "
          f"{pct([c['prioritize'] for c in calls], 99):.2f}; the replicas alone: p50 {pct(replicas, 50):.2f}, p99 "
          f"{pct(replicas, 99):.2f}); goal p99 <= 5 ms")
    print(f"  the server process's CPU (every thread, transports too): {tail['process_cpu']:.2f} ms per pod")
    print(f"  the first pod of a model ({len(firsts)} of them): p50 {pct(firsts, 50):.2f}, max {max(firsts):.2f}; "
          f"goal <= 25 ms")
    collected = [c for c in calls if c["gcgen"] >= 0]
    print(f"  in the server: GC {sum(c['gc'] for c in calls):.1f} ms in all (CPU {sum(c['gccpu'] for c in calls):.1f}),"
          f" in {len(collected)} calls (of them {sum(c['gcgen'] == 2 for c in calls)} full collections); ledgers "
          f"built {sum(c['ledgers'] for c in calls):.0f}")
    print("  the server's CPU for the pair, by kind of call: p50, p99, max (fits computed per call, median)")
    kinds = {"the first pod of a model": lambda c: c["first"],
             "a replica, within 50 pods of its model's first": lambda c: not c["first"] and c["k"] - c["since"] < 50,
             "a replica, later": lambda c: not c["first"] and c["k"] - c["since"] >= 50,
             "all": lambda c: True}
    for kind, which in kinds.items():
        these = [c for c in calls if which(c)]
        if these:
            cpu = [c["cpu"] for c in these]
            print(f"    {kind} ({len(these)}): {pct(cpu, 50):.2f}, {pct(cpu, 99):.2f}, {max(cpu):.2f} "
                  f"({statistics.median(c['fits'] for c in these):.0f} fits)")
    print("  the slowest 8: call, first of its model?, round trip, server, its CPU, of it GC (its CPU, oldest "
          "generation), ledgers built, fits computed")
    for c in sorted(calls, key=lambda c: -c["rt"])[:8]:
        print(f"    #{c['k']:<4} {'first' if c['first'] else 'replica':7} {c['rt']:7.2f} {c['server']:7.2f} "
              f"{c['cpu']:7.2f} "
              f"{c['gc']:7.2f} ({c['gccpu']:.2f}, {c['gcgen']:.0f}) {c['ledgers']:5.0f} {c['fits']:5.0f}")
    print(f"  goals: {'met' if ok else 'MISSED'}")
    if "profile" in tail:
        print("  where the server spent the tail (cProfile of every request, by own time):")
        print("\n".join(f"    {line}" for line in tail["profile"].splitlines() if line.strip()))
    return ok


def run(args: argparse.Namespace) -> int:
    import orjson

    print(f"machine: {calibration()}")

    ctx = mp.get_context("fork")
    here, there = ctx.Pipe()
    proc = ctx.Process(target=serve_extender, args=(args.nodes, args.pods, args.gc, there, args.fleet), daemon=True)
    t0 = time.perf_counter()
    proc.start()
    port, built, pods, model_pods = here.recv()
    print(f"fleet: {args.nodes} nodes, {pods} pods ({model_pods} model pods); ClusterState + ledgers built in "
          f"{built:.1f} s (server up after {time.perf_counter() - t0:.1f} s); server GC: {args.gc}")
    client = Client(port)
    rng = random.Random(11)
    names = [node_name(i) for i in range(args.nodes)]
    rows: list[tuple[str, int, list[float], list[float], str, float | None, float | None]] = []
    pid = proc.pid
    serial = 0

    def case(label: str, n: int, goal: str, limit: float | None, make: Any,
             path: str = "/filter") -> dict[str, list[float]]:
        nonlocal serial
        rt: list[float] = []
        server: list[float] = []
        extra: dict[str, list[float]] = {"rt": rt, "server": server, "prio_rt": [], "prio_server": [], "passed": []}
        for k in range(args.requests + args.warmup):
            if k == args.warmup:
                cpu = process_cpu(pid)
            serial += 1
            body, follow = make()
            elapsed, srv, answer = client.post(path, body)
            if k >= args.warmup:
                rt.append(elapsed)
                server.append(srv)
            if follow is not None:  # kube-scheduler's prioritize: the nodes that passed, same pod
                passed = answer["NodeNames"]
                p_elapsed, p_srv, _ = client.post("/prioritize", follow(passed))
                if k >= args.warmup:
                    extra["prio_rt"].append(p_elapsed)
                    extra["prio_server"].append(p_srv)
                    extra["passed"].append(len(passed))
        calls = args.requests * (2 if follow is not None else 1)
        rows.append((label, n, rt, server, goal, limit, (process_cpu(pid) - cpu) * 1000 / calls))
        return extra

    def settle() -> None:
        # A server that has run a while has judged, between requests, every node for the models it was
        # asked about (extender.filter.Judge.warm); the figures with a goal are that steady state.
        time.sleep(args.settle)

    if args.new_model:
        ok = new_model_case(client, rng, names, args.new_model, args.profile)
        proc.kill()
        return 0 if ok else 1
    if args.profile:
        client.exchange("/bench/profile", b"start", "text/plain")
    assert proc.pid is not None
    tail = tail_case(client, rng, names, args.tail, args.tail_new, args.tail_gap / 1000, proc.pid)
    if args.profile:
        tail["profile"] = client.exchange("/bench/profile", b"stop", "text/plain")[1].decode()
    serial += args.tail
    for n in (500, args.nodes):
        settle()

        def make_filter(n: int = n) -> tuple[bytes, Any]:
            pod = pending_pod(rng, serial)
            cand = rng.sample(names, n) if n < len(names) else names
            return (orjson.dumps(extender_args(pod, cand)),
                    lambda passed: orjson.dumps(extender_args(pod, passed)))

        def make_cold(n: int = n, new_shape: bool = False) -> tuple[bytes, Any]:
            pod = pending_pod(rng, serial, new_shape=new_shape)
            cand = rng.sample(names, n) if n < len(names) else names
            return orjson.dumps(extender_args(pod, cand)), None

        limit = 5.0 if n == 500 else 25.0
        extra = case("/filter NodeNames, new pod each", n, f"p99 <= {limit:g} ms", limit, make_filter)
        rows.append(("/prioritize after its /filter", n, extra["prio_rt"], extra["prio_server"],
                     f"p99 <= {limit:g} ms (passed: {statistics.median(extra['passed']):.0f})", limit, None))
        case("/prioritize, new pod", n, f"p99 <= {limit:g} ms", limit, make_cold, "/prioritize")
        case("/filter, new demand (nothing cached)", n, "(no goal: first pod of a model)", None,
             lambda: make_cold(new_shape=True))

    def make_plain() -> tuple[bytes, Any]:
        pod = plain_pod(f"web-7c9d8f6b5d-{serial:06d}", f"plain-{serial}", None, 250)
        return orjson.dumps(extender_args(pod, names)), None

    case("/filter non-model pod", args.nodes, "cheap", None, make_plain)

    node_list = {"metadata": {"resourceVersion": "123456"},
                 "items": [node_object(i, full=True) for i in rng.sample(range(args.nodes), 500)]}
    list_bodies = []
    for _ in range(args.requests + args.warmup):
        serial += 1
        body = extender_args(pending_pod(rng, serial), nodes=node_list)
        list_bodies.append(json.dumps(body).encode())
    it = iter(list_bodies)
    extra = case("/filter NodeList (full Nodes)", 500, "<= 1.5x baseline", None, lambda: (next(it), None))
    baseline = []
    for body in list_bodies[args.warmup:]:
        started = time.perf_counter()
        json.dumps(json.loads(body))
        baseline.append((time.perf_counter() - started) * 1000)
    rows.append(("  baseline json.loads + json.dumps", 500, baseline, baseline,
                 f"body {len(list_bodies[0]) / 1e6:.2f} MB", None, None))

    ok = print_tail(tail)
    print(f"\n{args.requests} requests per case (after {args.warmup} warm-up), one keep-alive connection; ms (process "
          f"CPU: the server's, per request, /prioritize included where it follows)")
    print(f"{'case':38} {'nodes':>5} {'p50':>7} {'p99':>7} {'server p50':>10} {'server p99':>10} "
          f"{'process CPU':>11}  goal")
    print("-" * 112)
    for label, n, rt, server, goal, limit, cpu in rows:
        verdict = ""
        if limit is not None:
            verdict = "  ok" if pct(rt, 99) <= limit else "  MISSED"
            ok &= pct(rt, 99) <= limit
        print(f"{label:38} {n:>5} {pct(rt, 50):7.2f} {pct(rt, 99):7.2f} {pct(server, 50):10.2f} "
              f"{pct(server, 99):10.2f} {'' if cpu is None else f'{cpu:.2f}':>11}  {goal}{verdict}")
    ratio_rt = pct(extra["rt"], 50) / pct(baseline, 50)
    ratio_srv = pct(extra["server"], 50) / pct(baseline, 50)
    print(f"\nNodeList of 500: round trip p50 {ratio_rt:.2f}x the bare json.loads + json.dumps p50 "
          f"(server's own time {ratio_srv:.2f}x); goal <= 1.5x: {'ok' if ratio_rt <= 1.5 else 'MISSED'}")
    ok &= ratio_rt <= 1.5
    print(f"machine after: {calibration()}")
    proc.kill()
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=100_000)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--settle", type=float, default=3.0,
                        help="seconds the server idles before the cases with a goal (it warms its verdicts)")
    parser.add_argument("--gc", choices=("server", "default", "freeze", "tuned"), default="server",
                        help="server process GC: as `model-placement extender` does; as Python ships; gc.freeze() "
                             "after the state is built; freeze and gc.set_threshold(7000, 2, 1000)")
    parser.add_argument("--tail", type=int, default=1000, help="pods of the tail case, the first thing measured")
    parser.add_argument("--tail-new", type=int, default=200, metavar="N",
                        help="in the tail, one pod in N is the first of a model never asked about")
    parser.add_argument("--tail-gap", type=float, default=0.0, metavar="MS",
                        help="in the tail, the time between one pod's /prioritize and the next pod's /filter (what "
                             "kube-scheduler spends on a pod besides calling us: 4-8 ms at 1,000 nodes in "
                             "bench_scheduler); 0: back to back")
    parser.add_argument("--profile", action="store_true", help="cProfile the server's requests of the tail case "
                        "(they run slower: read its figures from a run without)")
    parser.add_argument("--quick", action="store_true", help="1,000 nodes, 20,000 pods, 100 requests")
    parser.add_argument("--fleet", choices=("synthetic", "mixed", "mixed-placed"), default="synthetic",
                        help="synthetic: the fleet described above; mixed: issue 39's (1/2/4-NUMA nodes, 24-48 cores, "
                             "one default policy of plain TP 1/2/4 types, two TP=1 model pods and 18 small pods on "
                             "each node: 20 pods a node), its model pods of unknown placement; mixed-placed: the same "
                             "with their placements recorded")
    parser.add_argument("--new-model", type=int, default=0, metavar="N",
                        help="only this: right after the load, one new TP=2 pod asks /filter + /prioritize N times "
                             "(issue 39: 100)")
    args = parser.parse_args(argv)
    if args.quick:
        args.nodes, args.pods, args.requests = 1000, 20_000, 100
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
