"""kube-scheduler binds asynchronously: the next pod's /filter can arrive before the previous pod's /bind. The node
a pod was scored highest on (or the only node it passed) is held for it until its /bind or a short deadline, so the
next pod is not promised the same cores. Over HTTP, with the JSON kube-scheduler sends."""

from __future__ import annotations

import asyncio

from extender.routes import HOLDS
from tests.support.extender import Ext, model_pod

NAMES = ["cpu-a1", "cpu-a2"]  # 29 + 29 and 13 + 29 free cores per NUMA node


def free(ext: Ext, node: str) -> tuple[int, ...]:
    ledger = ext.cluster.ledger(node)
    assert ledger is not None
    return ledger.free()


async def scored(ext: Ext, name: str) -> dict[str, int]:
    pod = model_pod(name, cpus=40)
    assert (await ext.filter(pod, NAMES))["NodeNames"] == NAMES
    return await ext.prioritize(pod, NAMES)


async def test_the_node_scored_highest_is_held_until_its_bind(ext: Ext) -> None:
    scores = await scored(ext, "first")
    assert scores["cpu-a2"] > scores["cpu-a1"]  # MostAllocated: kube-scheduler will pick cpu-a2
    assert free(ext, "cpu-a2") == (13, 9)  # held before the cycle of the next pod starts
    # The next pod, before the first one's /bind: cpu-a2 no longer has 20 free cores on a NUMA node.
    answer = await ext.filter(model_pod("second", cpus=40), NAMES)
    assert answer["NodeNames"] == ["cpu-a1"] and list(answer["FailedNodes"]) == ["cpu-a2"]
    assert await ext.bind(model_pod("first", cpus=40), "cpu-a2") == ""  # the hold becomes the binding's
    ledger = ext.cluster.ledger("cpu-a2")
    assert ledger is not None and [h.pod for h in ledger.holdings.values()].count("llm-inference/first") == 1
    assert await ext.bind(model_pod("second", cpus=40), "cpu-a1") == ""
    assert free(ext, "cpu-a1") == (9, 29) and free(ext, "cpu-a2") == (13, 9)


async def test_a_bind_to_another_node_moves_the_hold(ext: Ext) -> None:
    await scored(ext, "first")
    assert free(ext, "cpu-a2") == (13, 9)
    assert await ext.bind(model_pod("first", cpus=40), "cpu-a1") == ""  # kube-scheduler weighed other plugins too
    assert free(ext, "cpu-a2") == (13, 29) and free(ext, "cpu-a1") == (9, 29)


async def test_a_hold_lapses_after_its_deadline_and_a_new_cycle_of_the_pod_starts_over(ext: Ext) -> None:
    ext.served.app[HOLDS].seconds = 0.2
    await scored(ext, "first")
    assert free(ext, "cpu-a2") == (13, 9)
    await asyncio.sleep(0.3)  # its cycle failed after us: no /bind comes
    assert (await ext.filter(model_pod("second", cpus=40), NAMES))["NodeNames"] == NAMES
    assert free(ext, "cpu-a2") == (13, 29)
    # The same pod filtered again is a new attempt: its earlier hold does not count against it.
    await scored(ext, "third")
    assert (await ext.filter(model_pod("third", cpus=40), NAMES))["NodeNames"] == NAMES


async def test_a_non_model_pod_holds_nothing(ext: Ext) -> None:
    from tests.test_extender import plain_pod

    before = free(ext, "cpu-a2")
    await ext.filter(plain_pod(), ["cpu-a2"])
    await ext.prioritize(plain_pod(), NAMES)
    assert free(ext, "cpu-a2") == before
