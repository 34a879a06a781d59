"""The placement-quality simulation (bench/simulate.py) on a small fleet: the extender run never binds a pod
where its balloon cannot be carved, an audit written here (not the simulation's own) finds no overcommitted
NUMA node and no AMX violation, the stock run does fail on the node (so the comparison means something), the
index-driven fast path gives the same figures as asking `preflight` and `fit` of every node, the same seed
gives the same figures, and the real balloons plugin, replaying sampled nodes, agrees."""

from __future__ import annotations

import importlib.util
import random
import sys
from pathlib import Path
from typing import Any

import pytest

from placement.config import Settings

ROOT = Path(__file__).resolve().parent.parent
NODES, EVENTS, SEED = 60, 1500, 11


def _load_simulate() -> Any:
    spec = importlib.util.spec_from_file_location("bench_simulate", ROOT / "bench" / "simulate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


sim = _load_simulate()


@pytest.fixture(scope="module")
def world() -> tuple[list[Any], list[tuple[str, Any]], list[dict[str, Any]]]:
    fleet = sim.make_fleet(NODES, random.Random(f"fleet-{SEED}"))
    stream = sim.make_stream(fleet, EVENTS, random.Random(f"stream-{SEED}"), 1.0, Settings())
    return fleet, stream, sim.fleet_objects(fleet, Settings())


@pytest.fixture(scope="module")
def runs(world: Any) -> dict[str, Any]:
    _fleet, stream, objects = world
    out = {}
    for run in (sim.StockRun(objects, Settings()), sim.ExtenderRun(objects, Settings())):
        run.play(stream, 50)
        out[run.kind] = run
    return out


def test_fleet_and_stream_are_mixed(world: Any) -> None:
    fleet, stream, objects = world
    assert {n.numa for n in fleet} == {2, 4, 8}
    assert {n.smt for n in fleet} == {True, False}
    assert {n.amx for n in fleet} == {True, False}
    nodes = [o for o in objects if o["kind"] == "Node"]
    assert any(sim.AMX_LABEL not in n["metadata"]["labels"] for n in nodes)
    deploys = [d for verb, d in stream if verb == "deploy"]
    assert {d.tp for d in deploys} == {1, 2, 4, 8}
    assert sum(1 for verb, _ in stream if verb == "undeploy") > EVENTS // 4
    assert len({d.cpus for d in deploys}) >= 6


def test_extender_run_has_no_node_side_failure(runs: dict[str, Any]) -> None:
    ext = runs["extender"].counters
    assert ext.bound > 0 and ext.node_failures == 0 and ext.started == ext.bound
    assert ext.refused > 0  # the fleet is loaded enough that the pre-flight has to say no
    assert not ext.failure_checks


def test_stock_run_fails_on_the_node(runs: dict[str, Any]) -> None:
    stock = runs["stock"].counters
    assert stock.node_failures > stock.bound // 10
    # Each of the three ways face-value CPU requests go wrong on a NUMA machine shows up.
    assert {"tp-exceeds-numa", "footprint-exceeds-node", "insufficient-free"} <= set(stock.failure_checks)
    # ... and the extender run serves more models with the same stream.
    assert runs["extender"].counters.started > stock.started + stock.recovered


def _audit(run: Any, objects: list[dict[str, Any]]) -> list[str]:
    """Recount from the final cluster state alone: per NUMA node, the cores every holding takes against the
    cores that no reserved CPU touches; every held pod is a live model pod bound there, with its balloon
    spanning TP distinct NUMA nodes; no AMX-requiring pod on a node without the AMX label."""
    labels = {o["metadata"]["name"]: o["metadata"]["labels"] for o in objects if o["kind"] == "Node"}
    problems = []
    held_uids = set()
    for ledger in run.cluster.ledgers():
        reserved = set(ledger.reserved.cpus)
        capacity = [sum(1 for core in numa.cores if not reserved & set(core.threads))
                    for numa in ledger.topology.numa_nodes]
        used = [0] * len(capacity)
        for uid, holding in ledger.holdings.items():
            held_uids.add(uid)
            rec = run.cluster.pods.get(uid)
            if rec is None or rec.node != ledger.name or rec.model is None:
                problems.append(f"{ledger.name}: holding {uid} is not a model pod bound there")
                continue
            if holding.shortfall or holding.assumed:
                problems.append(f"{ledger.name}: {uid} shortfall={holding.shortfall} assumed={holding.assumed}")
            if len({n for n, _ in holding.per_numa}) != rec.model.tp:
                problems.append(f"{ledger.name}: {uid} spans {holding.per_numa}, TP={rec.model.tp}")
            if rec.model.require_amx and labels[ledger.name].get(sim.AMX_LABEL) != "true":
                problems.append(f"{ledger.name}: {uid} requires AMX, node has none")
            for numa, cores in holding.per_numa:
                used[numa] += cores
        for numa, (u, c) in enumerate(zip(used, capacity)):
            if u > c:
                problems.append(f"{ledger.name} NUMA {numa}: {u} cores held of {c}")
    running = {uid for uid, state in run.state.items() if state == "running"}
    if running != held_uids:
        problems.append(f"{len(running ^ held_uids)} pods running without a holding or held without running")
    return problems


@pytest.mark.parametrize("kind", ["extender", "stock"])
def test_final_ledgers_pass_an_independent_audit(runs: dict[str, Any], world: Any, kind: str) -> None:
    fleet, _, objects = world
    run = runs[kind]
    assert _audit(run, objects) == []
    assert all(v == 0 for v in run.audit(fleet).values()), run.audit(fleet)
    running = sum(1 for s in run.state.values() if s == "running")
    assert running > 0 and run.counters.samples[-1]["held"] > 0


def test_fast_path_gives_the_same_figures_as_asking_every_node() -> None:
    """The index only proposes candidates; balance-balloons may make `fit` refuse one (it picks the NUMA node or
    block by balloon count, not by room), and the figures must not move. The per-node create/remove history
    is part of the figures, so the plugin replay would see the same nodes."""
    fast = sim.run_simulation(40, 900, seed=3, replay_nodes=0)
    exact = sim.run_simulation(40, 900, seed=3, exact=True, replay_nodes=0)
    assert fast["runs"]["extender"]["index_misses"] > 0  # the case that makes the index inexact did occur
    assert exact["runs"]["extender"]["index_misses"] == 0
    assert sim.comparable(fast) == sim.comparable(exact)


def test_same_seed_same_figures() -> None:
    first = sim.run_simulation(NODES, 1000, seed=5, replay_nodes=0)
    again = sim.run_simulation(NODES, 1000, seed=5, replay_nodes=0)
    other = sim.run_simulation(NODES, 1000, seed=6, replay_nodes=0)
    assert sim.comparable(first) == sim.comparable(again)
    assert sim.comparable(first) != sim.comparable(other)
    ext = first["runs"]["extender"]
    assert ext["node_failures"] == 0 and not any(ext["audit"].values())


def test_the_real_plugin_runs_what_the_extender_binds_and_fails_what_stock_binds() -> None:
    """Three nodes of each run replayed through the real balloons plugin: on the extender's, every model
    container starts NUMA-local on cores of its own, where the ledger said; on stock kube-scheduler's, the
    plugin fails some containers or spreads them over more NUMA nodes than their ranks."""
    result = sim.run_simulation(NODES, EVENTS, seed=SEED, replay_nodes=3)
    ext, stock = result["runs"]["extender"]["replay"], result["runs"]["stock"]["replay"]
    assert ext["nodes"] == stock["nodes"] and len(ext["nodes"]) == 3
    assert ext["created"] > 10 and ext["agreement"]["ledger fits, plugin runs"] == ext["created"]
    assert [ext[k] for k in ("failed", "spans", "shares", "unpinned", "daemon_failed", "mispredicted_at_end")] \
        == [0] * 6
    assert stock["created"] > 10 and stock["failed"] + stock["spans"] > 0
    text = sim.format_report(result)
    for words in ("stock kube-scheduler", "webhook + extender", "predicted to fail on the node",
                  "REAL PLUGIN on 3 sampled nodes", "FAILED BY THE PLUGIN", "PINNED TO MORE NUMA NODES",
                  "SHARING A CORE", "refused up front", "left pending", "stranded", "wall time"):
        assert words in text


def test_the_audit_catches_what_it_looks_for(world: Any) -> None:
    """Bind pods behind the scheduler's back: an AMX-requiring pod on a node without AMX, and one NUMA node's
    worth of cores per NUMA node plus one more (the ledger keeps the excess as a shortfall)."""
    fleet, _, objects = world
    run = sim.ExtenderRun(objects, Settings())
    no_amx = next(n for n in fleet if not n.amx)
    whole_numa = min(run.cluster.ledger(no_amx.name).capacity) * no_amx.tpc  # logical CPUs
    deploys = [sim.Deploy(900001, "bad-amx", "bad-amx", "team-a", "llama-3.1-8b", 1, 4, True, 0)]
    deploys += [sim.Deploy(900002 + k, f"bad-size-{k}", f"bad-size-{k}", "team-a", "llama-3.1-8b", 1, whole_numa,
                           False, 0) for k in range(no_amx.numa + 1)]
    for d in deploys:
        run.cluster.apply("Pod", "MODIFIED", sim.bound(sim.pod_object(d), no_amx.name))
        run.state[d.uid] = "running"
    problems = _audit(run, objects)
    assert any("requires AMX" in p for p in problems), problems
    assert any(f"bad-size-{no_amx.numa} shortfall=" in p for p in problems), problems
