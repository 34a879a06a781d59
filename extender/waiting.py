"""Pods /filter turned away for want of room now, and the retry kube-scheduler would not make by itself.

kube-scheduler and this extender each watch the apiserver. When a model pod leaves, the scheduler's own informer
may see it first: the event moves the waiting pod out of its unschedulable queue (an extender has no queueing
hints, so any event does), it retries at once, and /filter, whose watch has not yet delivered the deletion, refuses
it again. Back in the unschedulable queue, the pod then waits for another cluster event, or for the scheduler's
five-minute flush (podMaxInUnschedulablePodsDuration), although the cores are free.

So every pod /filter refuses for what nodes hold now is kept here, and once the ledgers change (after the watch
applied an event), or its wait for a NUMA-local node is over (`filter.split_deadline`: no event marks that moment),
it is judged again as /filter would; a pod that would pass now gets a condition written into its
status, as kube-scheduler writes PodScheduled. That update is an event for the pod itself, which moves it from the
unschedulable queue to the active one (kube-scheduler v1.35, PriorityQueue.Update: the Extender's default hint
queues on any pod update), and its next /filter reads the state that let it pass.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import OrderedDict
from collections.abc import Callable
from datetime import UTC, datetime
from typing import NamedTuple

from extender.filter import UNKNOWN_NODE, Filtered, Judge, PodRef, filter_nodes, split_deadline
from placement.fit import fmt_free
from server import metrics
from server.app import Runtime

log = logging.getLogger("model_placement.extender")

CONDITION = "cpu-policy.model-manager.io/CoresFree"  # a qualified name, as the apiserver requires of other types
MAX_WAITING = 4096  # pods kept (the oldest go first); kube-scheduler's own flush retries any pod dropped
WAIT_SECONDS = 300.0  # kube-scheduler retries an unschedulable pod by itself after this (its default)
POLL_SECONDS = 0.05  # how often the ledgers are looked at for a change
API_SECONDS = 5.0


class _Waiter(NamedTuple):
    ref: PodRef
    names: list[str]  # the candidates kube-scheduler sent: the nodes its own filters offer the pod
    since: float


class Waiting:
    """Lives on the event loop, like the ledgers it reads."""

    def __init__(self, judge: Judge, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time) -> None:
        self.judge = judge
        self.cluster = judge.cluster
        self.clock = clock
        self.wall = wall  # the clock creation timestamps are read against
        self._waiting: OrderedDict[str, _Waiter] = OrderedDict()  # uid -> waiter, oldest first
        self._seen = (-1, -1)  # the ledgers' stamp and the node generation last judged at
        self._wait_over = math.inf  # the next moment (wall clock) a waiter's wait for a NUMA-local node ends

    def __len__(self) -> int:
        return len(self._waiting)

    def after_filter(self, ref: PodRef, names: list[str], out: Filtered) -> None:
        """Keep a model pod refused for what is held now (or for a node not in the cache yet); drop it once it
        passes."""
        if ref.demand is None or not ref.uid:
            return
        if out.passed or not (out.failed or UNKNOWN_NODE in out.unresolvable.values()):
            self._waiting.pop(ref.uid, None)
            return
        self._waiting[ref.uid] = _Waiter(ref, names, self.clock())
        self._waiting.move_to_end(ref.uid)
        deadline = split_deadline(self.judge, ref)
        if deadline is not None:
            self._wait_over = min(self._wait_over, deadline)
        while len(self._waiting) > MAX_WAITING:
            self._waiting.popitem(last=False)

    def due(self) -> list[tuple[PodRef, str]]:
        """The pods that would pass /filter now, each with a node it would pass on, taken out of the wait; [] while
        no ledger and no node changed since the last call. Replicas of one model (the same demand and node
        constraints) are judged once, and as many are due as nodes passed: the first to bind changes the
        ledgers, and the rest are judged again."""
        seen, wall = (self.cluster.stamps.taken, self.cluster.node_generation), self.wall()
        if (seen == self._seen and wall < self._wait_over) or not self._waiting:
            return []
        self._seen = seen
        now, pods = self.clock(), self.cluster.pods
        groups: dict[tuple[object, bytes], list[_Waiter]] = {}
        for uid, waiter in list(self._waiting.items()):
            rec = pods.get(uid)
            if (rec is not None and rec.node is not None) or now - waiter.since > WAIT_SECONDS:
                del self._waiting[uid]  # bound (or held for its bind), or kube-scheduler retries it by itself
                continue
            groups.setdefault((waiter.ref.key, waiter.ref.where), []).append(waiter)
        due = []
        for waiters in groups.values():
            passed = filter_nodes(self.judge, waiters[0].ref, waiters[0].names, wall).passed
            for waiter, node in zip(waiters, passed):  # the oldest first, one per node that passed
                del self._waiting[waiter.ref.uid]
                due.append((waiter.ref, node))
        ends = (split_deadline(self.judge, w.ref) for w in self._waiting.values())
        self._wait_over = min((end for end in ends if end is not None and end > wall), default=math.inf)
        return due

    def note(self, node: str) -> str:
        """The condition's message: what is free where, and when it was seen."""
        ledger = self.cluster.ledger(node)
        free = f" ({fmt_free(ledger, ledger.free())})" if ledger is not None else ""
        seen = datetime.now(UTC).strftime("%H:%M:%S.%f")[:-3]
        return (f"the cores it needs are free on {node}{free}: model-placement's extender saw them at {seen}Z and "
                f"asked kube-scheduler to retry it")


async def ask_retry(runtime: Runtime, waiting: Waiting, ref: PodRef, node: str) -> None:
    """Write the condition into the pod's status (its update is what requeues it); log what happened."""
    from server.kubeapi import patch_pod_status

    assert runtime.api is not None
    started = time.perf_counter()
    message = waiting.note(node)
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    condition = {"type": CONDITION, "status": "True", "reason": "CoresFreed", "message": message,
                 "lastProbeTime": None, "lastTransitionTime": now}
    decision, error = "asked", None
    try:
        await patch_pod_status(runtime.api, ref.namespace, ref.name, ref.uid, {"conditions": [condition]},
                               timeout=API_SECONDS, connect_timeout=min(2.0, API_SECONDS))
    except Exception as exc:
        decision, error = "not-asked", str(exc)
    metrics.RETRIES.labels(decision).inc()
    log.log(logging.INFO if error is None else logging.WARNING, "retry", extra={
        "verb": "retry", "pod": ref.display, "node": node, "decision": decision, "reason": message,
        "error": error, "duration_ms": round((time.perf_counter() - started) * 1000, 3)})


async def retry_waiting(runtime: Runtime, waiting: Waiting, every: float = POLL_SECONDS) -> None:
    """Until cancelled: after every change to the ledgers, ask kube-scheduler to retry the pods that fit now."""
    tasks: set[asyncio.Task[None]] = set()
    try:
        while True:
            await asyncio.sleep(every)
            try:
                due = waiting.due()
            except Exception:  # a bug here must not stop the retries for good, nor the serving
                log.exception("judging the waiting pods failed", extra={"verb": "retry"})
                continue
            for ref, node in due:
                task = asyncio.create_task(ask_retry(runtime, waiting, ref, node))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
    finally:
        for task in tasks:
            task.cancel()
