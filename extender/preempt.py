"""NUMA-aware preemption, on two paths.

`/preempt` (kube-scheduler's preemptVerb): the scheduler found candidate nodes by dry-running its in-tree
filters, which count CPUs node-wide, and sends each one's victims. We narrow each to the fewest that free
the right NUMA nodes (`victims.choose`), honouring PodDisruptionBudgets. Where the scheduler's victims free
cores on the wrong NUMA nodes (its reprieve keeps the longest-running pods, whatever NUMA node they hold),
we choose among every lower-priority pod of the node instead: the scheduler maps the uids we answer to the
pods of that node and evicts them as they are, checking nothing else (extender.go convertToVictims), so the
answer may name pods it did not send. Nodes where no set works are dropped. A node left out is simply no
candidate; one kept must have at least one victim, or kube-scheduler fails the whole preemption ("expected
at least one victim pod on node", preemption.go callExtenders).

Our own path: a node only our filter refused (its CPUs are free node-wide, on the wrong NUMA nodes) passes
the in-tree dry run with every pod reprieved, so the scheduler offers no candidate there and never calls
/preempt for it (DryRunPreemption: "expected at least one victim"). When /filter finds that a model pod
fits nowhere and the scheduler's own preemption did not act for it, we choose the victims as /preempt
would among the lower-priority pods of the nodes we refused, evict them through the Eviction API (which
honours PDBs and grace periods), and let the next scheduling cycle place the pod once they are gone.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from extender.bind import OutOfTime, api_call
from extender.filter import Judge, PodRef
from placement.cluster import pod_priority
from placement.ledger import NodeLedger
from placement.victims import Candidate, Choice, Outcome, best_node, choose
from server import metrics
from server.app import Runtime

log = logging.getLogger("model_placement.extender")

WAIT_FOR_SCHEDULER = 1.0  # its /preempt follows its /filter within the same cycle, in milliseconds
COOLDOWN = 45.0  # after evicting for a pod: the victims' grace period, before it may evict again
RETRY = 10.0  # after finding nothing to evict for a pod
BLOCKED_SAYS = 60.0  # how long /filter's reasons for a pod say that PodDisruptionBudgets blocked its preemption
SHORTLIST = 16  # nodes judged from the ledger alone, closest to fitting first
READ = 4  # of those, the nodes whose pods are read from the API (priority, labels) and judged for real
EVENT_REASON = "PreemptionBlocked"
EVENT_SOURCE = "model-placement-extender"
API_SECONDS = 5.0  # each API call of our own path (it runs in the background, not inside a scheduler call)


@dataclass(frozen=True, slots=True)
class Pdb:
    key: str  # namespace/name
    namespace: str
    match_labels: Mapping[str, str]
    expressions: tuple[Mapping[str, Any], ...]
    allowed: int  # status.disruptionsAllowed
    disrupted: frozenset[str]  # status.disruptedPods: evictions the apiserver already counted

    def covers(self, namespace: str, name: str, labels: Mapping[str, str]) -> bool:
        # As kube-scheduler counts (filterPodsWithPDBViolation): a nil or empty selector matches nothing.
        if namespace != self.namespace or name in self.disrupted or not (self.match_labels or self.expressions):
            return False
        if any(labels.get(k) != v for k, v in self.match_labels.items()):
            return False
        return all(_expression(e, labels) for e in self.expressions)


def _expression(expr: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    key: Any = expr.get("key")  # a str, or None (in no labels)
    op, values = expr.get("operator"), expr.get("values") or ()
    if op == "In":
        return key in labels and labels[key] in values
    if op == "NotIn":
        return key not in labels or labels[key] not in values
    if op == "Exists":
        return key in labels
    if op == "DoesNotExist":
        return key not in labels
    return False  # an invalid selector matches nothing, as LabelSelectorAsSelector's error does there


def read_pdb(obj: Mapping[str, Any]) -> Pdb:
    meta = obj.get("metadata") or {}
    selector = (obj.get("spec") or {}).get("selector") or {}
    status = obj.get("status") or {}
    namespace = str(meta.get("namespace") or "")
    return Pdb(f"{namespace}/{meta.get('name')}", namespace, dict(selector.get("matchLabels") or {}),
               tuple(selector.get("matchExpressions") or ()), int(status.get("disruptionsAllowed") or 0),
               frozenset(status.get("disruptedPods") or ()))


def candidate(pod: Mapping[str, Any], pdbs: Iterable[Pdb]) -> Candidate:
    meta = pod.get("metadata") or {}
    namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
    labels = meta.get("labels") or {}
    return Candidate(str(meta.get("uid") or ""), f"{namespace}/{name}", pod_priority(pod.get("spec") or {}),
                     tuple(p.key for p in pdbs if p.covers(namespace, name, labels)))


class Preemption:
    """Both paths; lives on the event loop with the cluster state."""

    def __init__(self, runtime: Runtime, judge: Judge) -> None:
        self.runtime = runtime
        self.cluster = runtime.cluster
        self.judge = judge
        self._scheduler_acted: dict[str, float] = {}  # preemptor uid -> when /preempt kept a node for it
        self._not_before: dict[str, float] = {}  # preemptor uid -> when our own path may act for it again
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._blocked: dict[str, tuple[float, str]] = {}  # preemptor uid -> (until when, which PDBs blocked it)
        self._told: dict[str, float] = {}  # preemptor uid -> until when its PreemptionBlocked event stands
        self._events: set[asyncio.Task[None]] = set()

    # -- reading the API ----------------------------------------------------------------------------

    async def _get(self, path: str, deadline: float) -> Any:
        from server.kubeapi import get_json

        return await api_call(get_json, deadline, self.runtime.api_client, path)

    async def _pdbs(self, deadline: float) -> list[Pdb]:
        if self.runtime.api_client is None:
            return []
        listed = await self._get("/apis/policy/v1/poddisruptionbudgets", deadline)
        return [read_pdb(o) for o in listed.get("items") or ()]

    async def _victim_pod(self, uid: str, sent: Mapping[str, Mapping[str, Any]], deadline: float
                          ) -> Mapping[str, Any] | None:
        """The victim's v1.Pod: as kube-scheduler sent it, else from the API; with the cluster state's name. None
        when the API says it is gone (deleted, or re-created under its name) and the watch has not caught up."""
        if uid in sent:
            return sent[uid]
        rec = self.cluster.pods.get(uid)
        if rec is None or self.runtime.api_client is None:
            ns, name = (rec.namespace, rec.name) if rec is not None else ("", uid)
            return {"metadata": {"uid": uid, "namespace": ns, "name": name}}
        from server.kubeapi import KubeApiError, pod_path

        try:
            pod = await self._get(pod_path(rec.namespace, rec.name), deadline)
        except KubeApiError as exc:
            if exc.status == 404:
                return None
            raise
        return pod if (pod.get("metadata") or {}).get("uid") == uid else None

    # -- /preempt -------------------------------------------------------------------------------------

    async def narrow(self, ref: PodRef, priority: int, victims: Mapping[str, list[str]],
                     sent: Mapping[str, Mapping[str, Any]],
                     deadline: float) -> tuple[dict[str, list[str]], dict[str, str]]:
        """Per node, the uids to evict (nodes where none work are left out), and why each dropped node was."""
        if ref.demand is None:  # not ours to judge: keep the scheduler's choice
            return {node: list(uids) for node, uids in victims.items() if uids}, {}
        pdbs = await self._pdbs(deadline)
        allowed = {p.key: p.allowed for p in pdbs}
        namespaces = {p.namespace for p in pdbs}
        kept: dict[str, list[str]] = {}
        dropped: dict[str, str] = {}
        wrong: list[NodeLedger] = []  # nodes where the scheduler's own victims free the wrong NUMA nodes
        for node, uids in victims.items():
            ledger = self.cluster.ledger(node)
            if ledger is None:
                dropped[node] = "not known to the extender"
                continue
            pods = []
            for uid in uids:
                rec = self.cluster.pods.get(uid)
                # Labels matter only where a PDB could cover the pod; the rest need no API call.
                obj = await self._victim_pod(uid, sent, deadline) \
                    if uid in sent or (rec is not None and rec.namespace in namespaces) else None
                if obj is not None:
                    pods.append(candidate(obj, pdbs))
                else:
                    pods.append(Candidate(uid, f"{rec.namespace}/{rec.name}" if rec else uid))
            outcome = choose(self.cluster, ref.demand, ledger, pods, allowed)
            if outcome.choice is not None:
                kept[node] = outcome.choice.uids
            elif self.runtime.api_client is None:  # the other pods' priorities are unknown: spare them
                dropped[node] = outcome.why_not
                self._block(ref, outcome)
            else:
                wrong.append(ledger)
        for ledger, outcome in await self._among_all(ref, priority, wrong, pdbs, lambda: deadline):
            if outcome.choice is None:
                dropped[ledger.name] = outcome.why_not
                self._block(ref, outcome)
            else:
                kept[ledger.name] = outcome.choice.uids
        if kept:
            self._scheduler_acted[ref.uid] = time.monotonic()
            self._blocked.pop(ref.uid, None)
        else:
            self._tell_blocked(ref)
        return kept, dropped

    async def _among_all(self, ref: PodRef, priority: int, ledgers: list[NodeLedger], pdbs: list[Pdb],
                         deadline: Callable[[], float]) -> list[tuple[NodeLedger, Outcome]]:
        """Each node's choice among all its pods of lower priority than `priority`: judged from the ledger alone
        (every model pod a candidate) on up to SHORTLIST nodes, then, on the READ cheapest of those, for real
        with the pods read from the API (priority, labels for the PDBs, whether one is leaving already).
        `deadline()` bounds each API call. Nodes no set could work on even from the ledger come back too."""
        assert ref.demand is not None
        rough: list[tuple[NodeLedger, Outcome]] = []
        for ledger in ledgers[:SHORTLIST]:
            everyone = [Candidate(uid, h.pod) for uid, h in ledger.holdings.items() if not h.assumed]
            rough.append((ledger, choose(self.cluster, ref.demand, ledger, everyone, {})))
            await asyncio.sleep(0)  # let requests in between nodes
        possible = sorted((r for r in rough if r[1].choice is not None),
                          key=lambda r: len(r[1].choice.victims) if r[1].choice is not None else 0)
        out = [r for r in rough if r[1].choice is None]
        allowed = {p.key: p.allowed for p in pdbs}
        for ledger, _ in possible[:READ]:
            pods = []
            for uid in [u for u, h in ledger.holdings.items() if not h.assumed]:
                obj = await self._victim_pod(uid, {}, deadline())
                if obj is None or (obj.get("metadata") or {}).get("deletionTimestamp"):
                    break  # a pod is leaving (or gone) already: the next cycle may fit without evicting
                found = candidate(obj, pdbs)
                if found.priority < priority:
                    pods.append(found)
            else:
                out.append((ledger, choose(self.cluster, ref.demand, ledger, pods, allowed)))
                continue
            out.append((ledger, Outcome(None, leaving=True)))
        return out

    def _block(self, ref: PodRef, outcome: Outcome) -> None:
        if outcome.blocked_by:
            self._blocked[ref.uid] = (time.monotonic() + BLOCKED_SAYS, outcome.why_not)

    def _tell_blocked(self, ref: PodRef) -> None:
        """A Warning event on the pod when PodDisruptionBudgets blocked its preemption, once per BLOCKED_SAYS.
        Where every node fails kube-scheduler's own filters (CPUs node-wide) /filter is never called, so its
        reasons cannot say it, and the scheduler's FailedScheduling event reads only "preemption: no candidate
        node for preemption"; `kubectl describe pod` shows this event beside it."""
        now = time.monotonic()
        until, why = self._blocked.get(ref.uid, (0.0, ""))
        if until <= now or self._told.get(ref.uid, 0.0) > now or self.runtime.api_client is None:
            return
        self._told = {uid: t for uid, t in self._told.items() if t > now}
        self._told[ref.uid] = now + BLOCKED_SAYS
        task = asyncio.get_running_loop().create_task(self._post_event(ref, f"cannot preempt for this pod: {why}"))
        self._events.add(task)
        task.add_done_callback(self._events.discard)

    async def _post_event(self, ref: PodRef, message: str) -> None:
        from server.kubeapi import request

        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        event = {"apiVersion": "v1", "kind": "Event",
                 "metadata": {"generateName": f"{ref.name}.", "namespace": ref.namespace},
                 "involvedObject": {"apiVersion": "v1", "kind": "Pod", "namespace": ref.namespace, "name": ref.name,
                                    "uid": ref.uid},
                 "type": "Warning", "reason": EVENT_REASON, "message": message, "count": 1,
                 "firstTimestamp": now, "lastTimestamp": now, "source": {"component": EVENT_SOURCE}}

        def post(*, timeout: tuple[float, float]) -> int:
            resp = request(self.runtime.api_client, "POST", f"/api/v1/namespaces/{quote(ref.namespace, safe='')}"
                           "/events", body=event, timeout=timeout)
            resp.drain_conn()
            resp.release_conn()
            return resp.status

        try:
            status = await api_call(post, time.monotonic() + API_SECONDS)
        except (OutOfTime, OSError) as exc:
            status, message = 0, f"{message} ({exc or 'no answer in time'})"
        if not 200 <= status < 300:
            log.warning("event not written", extra={"verb": "preempt", "pod": ref.display, "decision": "blocked",
                                                    "reason": message, "count": status})

    def say_blocked(self, ref: PodRef, failed: dict[str, str]) -> dict[str, str]:
        """/filter's FailedNodes for the pod, saying so when PodDisruptionBudgets blocked its preemption lately:
        the reason then reaches the pod's FailedScheduling event, where its owner looks."""
        until, why = self._blocked.get(ref.uid, (0.0, ""))
        if until <= time.monotonic():
            self._blocked.pop(ref.uid, None)
            return failed
        return {node: f"{text}; {why}" for node, text in failed.items()}

    # -- our own path ---------------------------------------------------------------------------------

    def consider(self, ref: PodRef, pod: Mapping[str, Any], refused: list[str]) -> None:
        """/filter found that the model pod fits nowhere, `refused` being the nodes eviction could help on."""
        if not refused or self.runtime.api_client is None or ref.demand is None:
            return
        if (pod.get("spec") or {}).get("preemptionPolicy") == "Never" or ref.uid in self._tasks:
            return
        if self._not_before.get(ref.uid, 0.0) > time.monotonic():
            return
        if (pod.get("status") or {}).get("nominatedNodeName"):
            # kube-scheduler preempted for it and waits for its victims; our /filter may not have seen them go yet
            return
        task = asyncio.get_running_loop().create_task(self._own(ref, pod_priority(pod.get("spec") or {}), refused))
        self._tasks[ref.uid] = task
        task.add_done_callback(lambda _: self._tasks.pop(ref.uid, None))

    async def _own(self, ref: PodRef, priority: int, refused: list[str]) -> None:
        started = time.monotonic()
        try:
            await asyncio.sleep(WAIT_FOR_SCHEDULER)
            if self._scheduler_acted.get(ref.uid, 0.0) >= started or self._settled(ref, refused):
                return  # kube-scheduler preempts for it itself, or it needs no eviction any more
            outcome = await self._plan(ref, priority, refused)
            if outcome.choice is None:
                self._not_before[ref.uid] = time.monotonic() + RETRY
                self._block(ref, outcome)
                self._tell_blocked(ref)
                metrics.PREEMPTIONS.labels("own", "none").inc()
                log.info("no preemption", extra={"verb": "preempt", "pod": ref.display, "decision": "none",
                                                 "reason": outcome.why_not})
                return
            if self._settled(ref, refused):  # reading the victims took API calls: look again
                return
            self._not_before[ref.uid] = time.monotonic() + COOLDOWN
            await self._evict(ref, outcome.choice)
        except Exception:  # a bug here must not take the serving down; the pod is retried later
            log.exception("own preemption failed", extra={"verb": "preempt", "pod": ref.display})

    def _settled(self, ref: PodRef, refused: list[str]) -> bool:
        """The pod needs no eviction any more: it is bound or held (the watch, a /bind or a hold got there
        first), or a node /filter refused has room for it now (a pod it waited for is gone). In the real
        scheduler a /filter that saw the cluster a few milliseconds late was followed by a bind, and the own
        path then evicted for a pod already running (tests/e2e/test_preemption.py)."""
        assert ref.demand is not None
        rec = self.cluster.pods.get(ref.uid)
        if rec is not None and rec.node is not None:
            return True
        return any(self.cluster.fit(ref.demand, ledger).ok
                   for ledger in map(self.cluster.ledger, refused) if ledger is not None)

    async def _plan(self, ref: PodRef, priority: int, refused: list[str]) -> Outcome:
        ledgers = [ledger for ledger in map(self.cluster.ledger, refused) if ledger is not None]
        ledgers.sort(key=lambda ledger: -sum(ledger.free()))
        pdbs = await self._pdbs(time.monotonic() + API_SECONDS)
        outcomes = [o for _, o in await self._among_all(ref, priority, ledgers, pdbs,
                                                        lambda: time.monotonic() + API_SECONDS)]
        if any(o.leaving for o in outcomes):
            return Outcome(None)  # the next cycle may fit once that pod is gone
        best = best_node(outcomes)
        blocked = sorted({p for o in outcomes for p in o.blocked_by})
        return Outcome(best, () if best else tuple(blocked))

    async def _evict(self, ref: PodRef, choice: Choice) -> None:
        from server.kubeapi import EvictionError, evict_pod

        for victim in choice.victims:
            namespace, name = victim.pod.split("/", 1)
            try:
                await api_call(evict_pod, time.monotonic() + API_SECONDS, self.runtime.api_client, namespace, name,
                               victim.uid)
            except (EvictionError, OutOfTime, OSError) as exc:
                metrics.PREEMPTIONS.labels("own", "refused").inc()
                log.warning("eviction refused", extra={
                    "verb": "preempt", "pod": ref.display, "node": choice.node, "decision": "refused",
                    "reason": f"{victim.pod}: {exc or 'no answer in time'}"})
                return
        metrics.PREEMPTIONS.labels("own", "evicted").inc()
        log.info("preempted", extra={"verb": "preempt", "pod": ref.display, "node": choice.node,
                                     "decision": "evicted", "reason": choice.describe(), "count": len(choice.victims)})
