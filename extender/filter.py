"""/filter: the candidate nodes where a model pod's footprint fits now, and why not the others.

The answer for each node is the core's `cluster.fit`. Asked naively that is one fit per node per call,
which at 5,000 nodes costs far more than a scheduling cycle can spend, so the `Judge` remembers, per
demand (replicas of one model ask the same):

- per node, the verdict it gave, until the node's ledger changes (the common case: most nodes did not
  change since the last replica was filtered; the cluster's stamp sequence says which did, so a
  call looks each candidate up once, and judges again only the nodes that changed);
- per *class* of nodes, the verdict: nodes whose ledgers look the same to `fit` (capacity and free
  cores per NUMA node, SMT width, reserved size, NRI policy and its status, and the balloon counts or
  shared-pool load when the demand depends on them) get the same one. The key holds everything `fit`
  reads, so a verdict never goes stale: a changed node is a new key. A refusal no eviction can change
  (TP above the NUMA count, no such balloon type, ...) does not depend on what the node holds, so it
  is kept for the node's whole shape.

A refusal names neither the node nor the pod: kube-scheduler counts identical reasons into its summary
("0/1000 nodes are available: 640 <reason>, 350 <reason>"), and the event it writes is cut at 1,024
characters. So each reason is the class's sentence, completed once per call with the class's own number
(the most free cores any node of that class has), the fix, and the `model-placement explain NS/POD` that
shows the per-node numbers (also in the log line and GET /debug/nodes/NAME).
"""

from __future__ import annotations

import asyncio
import math
import re
import time
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, NamedTuple

import orjson

from placement import fit as fitmod
from placement.cluster import ClusterState
from placement.demand import ModelDemand, is_model_pod, pod_display_name, read_model_pod
from placement.eligibility import REQUIRED, Eligibility, Miss
from placement.ledger import NodeLedger
from server.app import BadRequest

MAX_PODS = 4096  # pods kept by uid: /bind needs the demand seen at /filter
MAX_DEMANDS = 64  # distinct demands whose verdicts are kept (each: up to one per node)
MAX_WHERES = 64  # distinct node constraints (selector, affinity, tolerations) whose node answers are kept
MAX_MEMO_CLASSES = 50_000  # a demand asked for hours in a changing cluster starts over past this
MAX_SHAPES = 100_000  # distinct node shapes before the shape table starts over
MAX_REFUSALS = 10_000  # distinct refusal sentences shared before that table starts over
MIN_SCORE, MAX_SCORE = 0, 10  # extender/v1 MinExtenderPriority, MaxExtenderPriority


@dataclass(frozen=True, slots=True)
class PodRef:
    """A pod as the extender saw it at /filter or /prioritize."""

    uid: str
    namespace: str
    name: str
    display: str  # namespace/name for messages
    resource_version: str
    demand: ModelDemand | None  # None: not a model pod
    key: ModelDemand | None = None  # the demand as `fit` sees it, without the pod's own names
    eligibility: Eligibility | None = None  # which nodes kube-scheduler offers it (model pods)
    where: bytes = b""  # the spec fields `eligibility` reads, as a key replicas share
    created: float | None = None  # metadata.creationTimestamp, seconds since the epoch; None when unreadable

    @property
    def unreadable(self) -> str | None:
        """Why the pod cannot be placed whatever the node, when its spec is wrong."""
        if self.demand is None or not self.demand.problems:
            return None
        return f"the pod cannot be placed until its spec is fixed: {'; '.join(self.demand.problems)}"


class Verdict(NamedTuple):
    # The cyclic collector untracks only exact tuples, so every Verdict stays in its sight: a warmed Judge refers to
    # tens of thousands, and made one per refusal they made young collections of 30,000-47,000 objects pause the
    # loop 7-31 ms. So there are few: the fits are `_FITS`, and each refusal is made once (`Judge._refusal`).
    ok: bool
    resolvable: bool  # could evicting pods make it fit? (FailedNodes vs FailedAndUnresolvableNodes)
    score: int  # 0..10 when it fits, else 0
    message: str  # the class of refusal, naming neither node nor pod; empty when it fits
    split: bool = False  # it fits with a rank off a NUMA node of its own, or short of its share there (kubelet-static)


@dataclass(slots=True)
class _Memo:
    """What one demand has been told: verdicts by class of node, and by node name as of stamp `synced`
    (a node that took a stamp since has its verdict dropped at the next call: `Judge._sync`)."""

    synced: int
    classes: dict[tuple[Any, ...], Verdict] = field(default_factory=dict)
    # by class short of free memory (`fit.plan_key`): where the cores go, which `fit.finish` completes per class; or,
    # where the cores cannot go, the verdict, which no free memory changes
    plans: dict[tuple[Any, ...], fitmod.Fit | Verdict] = field(default_factory=dict)
    verdicts: dict[str, Verdict] = field(default_factory=dict)
    untold: list[str] | None = None  # nodes `Judge.warm` has still to judge; None: not begun


_FITS = tuple(Verdict(True, True, score, "") for score in range(MIN_SCORE, MAX_SCORE + 1))
_SPLITS = tuple(Verdict(True, True, score, "", True) for score in range(MIN_SCORE, MAX_SCORE + 1))


def describe_demand(demand: ModelDemand) -> str:
    text = f"{demand.policy}, TP={demand.tp}, {demand.cpus} CPUs"
    return f"{text}, balloon {demand.balloon_type}" if demand.policy == "nri-balloons" else text


def explain(demand: ModelDemand, fit: fitmod.Fit) -> str:
    """The refusal as users read it: the core's reason, completed with what the demand costs when the
    reason does not already say it. Names neither the node nor the pod."""
    described = fit.footprint.describe() if fit.footprint is not None else describe_demand(demand)
    reason = fit.reason
    return reason if described in reason else f"{reason} (needs {described})"


UNKNOWN_NODE = "not known to the extender (not in its cache yet, or deleted)"
_THERE = re.compile(r"NUMA node (\d+)")  # a reason about one NUMA node of every node ("a rank on NUMA node 0")


class Judge:
    """Verdicts of `cluster.fit` for pods over candidate nodes, and the pods seen lately. Lives on the
    event loop, like the cluster state it reads."""

    def __init__(self, cluster: ClusterState) -> None:
        self.cluster = cluster
        self.settings = cluster.settings
        self._pods: OrderedDict[str, PodRef] = OrderedDict()
        self._memos: OrderedDict[ModelDemand, _Memo] = OrderedDict()
        # node name -> (its ledger, shape id)
        self._nodes: dict[str, tuple[NodeLedger, int]] = {}
        # shape -> (id, the policy: holding it keeps its id() from being reused while the shape is known)
        self._shapes: dict[tuple[Any, ...], tuple[int, Any]] = {}
        self.fits_asked = 0  # fits computed (verdict cache misses), for the log line
        self.untold = asyncio.Event()  # set when a demand is first asked about: `warm` has nodes to judge
        self._refusals: dict[tuple[bool, str], Verdict] = {}
        # where -> (the cluster's node generation, node name -> why it is not offered, None when it is)
        self._wheres: OrderedDict[bytes, tuple[int, dict[str, Miss | None]]] = OrderedDict()

    # -- pods ------------------------------------------------------------------------------------------

    def read_pod(self, pod: Mapping[str, Any]) -> PodRef:
        """The pod of ExtenderArgs. A non-model pod costs its labels; a model pod is read once per
        resourceVersion."""
        meta = pod.get("metadata")
        if meta is None:
            meta = {}
        if not isinstance(meta, dict):
            raise BadRequest("ExtenderArgs.Pod.metadata must be an object")
        labels = meta.get("labels")
        if labels is not None and not isinstance(labels, dict):
            raise BadRequest("ExtenderArgs.Pod.metadata.labels must be an object")
        uid = str(meta.get("uid") or "")
        rv = str(meta.get("resourceVersion") or "")
        cached = self._pods.get(uid) if uid else None
        if cached is not None and cached.resource_version == rv:
            self._pods.move_to_end(uid)
            return cached
        demand = None
        if is_model_pod(labels, self.settings):
            try:
                demand = read_model_pod(pod, self.settings)
            except (AttributeError, TypeError, ValueError) as exc:
                raise BadRequest(f"ExtenderArgs.Pod is not a readable v1.Pod: {exc}") from None
        namespace = str(meta.get("namespace") or "default")
        ref = self.ref(uid, namespace, str(meta.get("name") or ""), pod_display_name(pod), rv, demand)
        if demand is not None:
            spec = pod.get("spec")
            spec = spec if isinstance(spec, dict) else {}
            try:
                where = orjson.dumps([spec.get("nodeSelector"), spec.get("nodeName"), spec.get("tolerations"),
                                      ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(REQUIRED)],
                                     option=orjson.OPT_SORT_KEYS)
            except (AttributeError, orjson.JSONEncodeError) as exc:
                raise BadRequest(f"ExtenderArgs.Pod.spec is not a readable v1.PodSpec: {exc}") from None
            ref = replace(ref, eligibility=self.cluster.eligibility(spec), where=where,
                          created=_epoch(meta.get("creationTimestamp")))
        if uid:
            self.remember(ref)
        return ref

    @staticmethod
    def ref(uid: str, namespace: str, name: str, display: str, rv: str, demand: ModelDemand | None) -> PodRef:
        # Without the pod's name and the model's identity (only admission reads it, for the cores of a
        # replaced pod), replicas of a model ask the same question and share their verdicts.
        key = replace(demand, pod="", identity=None) if demand is not None else None
        return PodRef(uid, namespace, name, display, rv, demand, key)

    def remember(self, ref: PodRef) -> None:
        self._pods[ref.uid] = ref
        self._pods.move_to_end(ref.uid)
        while len(self._pods) > MAX_PODS:
            self._pods.popitem(last=False)

    def seen(self, uid: str) -> PodRef | None:
        return self._pods.get(uid)

    # -- verdicts --------------------------------------------------------------------------------------

    def misses(self, ref: PodRef, names: list[str]) -> dict[str, Miss]:
        """The candidates kube-scheduler would not have offered the pod, and why: one lookup per candidate while
        no Node changed (replicas share the answers)."""
        eligibility = ref.eligibility
        if eligibility is None:  # a pod not read from ExtenderArgs (`/bind` of a pod filtered before a restart)
            return {}
        generation = self.cluster.node_generation
        entry = self._wheres.get(ref.where)
        if entry is None or entry[0] != generation:
            entry = self._wheres[ref.where] = (generation, {})
            while len(self._wheres) > MAX_WHERES:
                self._wheres.popitem(last=False)
        else:
            self._wheres.move_to_end(ref.where)
        told, nodes = entry[1], self.cluster.nodes
        out = {}
        for name in names:
            if name in told:
                miss = told[name]
            else:
                node = nodes.get(name)
                miss = told[name] = eligibility.miss(node) if node is not None else None
            if miss is not None:
                out[name] = miss
        return out

    def _memo(self, key: ModelDemand) -> _Memo:
        memo = self._memos.get(key)
        if memo is not None and len(memo.classes) < MAX_MEMO_CLASSES:
            self._memos.move_to_end(key)
            return memo
        memo = self._memos[key] = _Memo(self.cluster.stamps.taken)
        self.untold.set()
        while len(self._memos) > MAX_DEMANDS:
            self._memos.popitem(last=False)
        return memo

    def _see(self, ledger: NodeLedger) -> tuple[NodeLedger, int]:
        """A node met for the first time, or rebuilt: what `fit` reads of it that only a rebuild changes
        (`fit.shape_key`), as a small id."""
        shape = fitmod.shape_key(ledger)
        known = self._shapes.get(shape)
        if known is None:
            if len(self._shapes) >= MAX_SHAPES:
                self._shapes.clear()
                self._nodes.clear()
                self._memos.clear()
            # The policy is kept with its id, so that the id stays its own while the shape is known.
            known = self._shapes[shape] = (len(self._shapes), ledger.nri.policy)
        entry = self._nodes[ledger.name] = (ledger, known[0])
        return entry

    def _judge(self, key: ModelDemand, ledger: NodeLedger, shape: int, memo: _Memo,
               plan_class: tuple[Any, ...] | None) -> Verdict:
        planned = memo.plans.get(plan_class) if plan_class is not None else None
        if type(planned) is Verdict:
            return planned
        self.fits_asked += 1
        settings = self.settings
        strategy = settings.scoring_strategy
        if planned is None:
            planned = fitmod.plan(key, ledger, settings.mm_kubelet_threads_per_core, strategy)
            if plan_class is not None:
                memo.plans[plan_class] = planned
        assert isinstance(planned, fitmod.Fit)
        fit = fitmod.finish(planned, ledger, strategy)
        if fit.ok:
            return (_SPLITS if fit.split else _FITS)[max(MIN_SCORE, min(MAX_SCORE, fit.score))]
        verdict = self._refusal(fit.resolvable, explain(key, fit))
        if not fit.resolvable:
            # What the node holds does not enter this refusal (see `fitmod.fit`): every node of this shape
            # shares it, whatever each holds.
            memo.classes[(shape,)] = verdict
        elif plan_class is not None and not planned.ok:
            # `finish` read no free memory: the nodes of this class that differ only in it are refused alike, without
            # its sentence worded again (a new model's first /filter of 500 nodes on bench_extender's synthetic
            # fleet: 91 of 442 nodes judged).
            memo.plans[plan_class] = verdict
        return verdict

    def _refusal(self, resolvable: bool, message: str) -> Verdict:
        verdict = self._refusals.get((resolvable, message))
        if verdict is None:
            if len(self._refusals) >= MAX_REFUSALS:
                self._refusals.clear()  # the verdicts already told stay as they are; only their sharing starts over
            verdict = self._refusals[(resolvable, message)] = Verdict(False, resolvable, MIN_SCORE, message)
        return verdict

    def _classify(self, key: ModelDemand, ledger: NodeLedger, memo: _Memo) -> Verdict:
        """The verdict for a node this demand has not been told of in the ledger's present state: from
        the nodes that look the same to `fit`, from those that differ only in free memory, or from `fit` itself."""
        seen = self._nodes.get(ledger.name)
        if seen is None or seen[0] is not ledger:
            seen = self._see(ledger)
        classes = memo.classes
        verdict = classes.get((seen[1],))
        if verdict is not None:
            return verdict
        plan_class = (seen[1], *fitmod.plan_key(key, ledger))
        memory = fitmod.memory_key(key, ledger)
        cls = plan_class + memory if memory else plan_class
        verdict = classes.get(cls)
        if verdict is None:
            verdict = classes[cls] = self._judge(key, ledger, seen[1], memo, plan_class if memory else None)
        return verdict

    def _sync(self, memo: _Memo) -> None:
        """Drop the verdicts of the nodes whose ledgers changed since the memo was last brought up to date."""
        stamps = self.cluster.stamps
        changed = stamps.changed_since(memo.synced)
        if changed is None:
            memo.verdicts.clear()
        else:
            pop = memo.verdicts.pop
            for name in changed:
                pop(name, None)
        memo.synced = stamps.taken  # stamps taken while judging (ledgers built lazily) are looked at next time

    def verdicts(self, ref: PodRef, names: list[str]) -> list[Verdict | None]:
        """One verdict per name (None: a node the ledger does not know), for a model pod. The hot loop of
        the extender: one lookup per candidate while its ledger has not changed since it was judged."""
        key = ref.key
        assert key is not None
        memo = self._memo(key)
        self._sync(memo)
        told = memo.verdicts
        out = list(map(told.get, names))
        ledger_of = self.cluster.ledger
        for i in _holes(out):
            ledger = ledger_of(names[i])
            if ledger is not None:
                out[i] = told[names[i]] = self._classify(key, ledger, memo)
        return out

    def warm(self, budget: float) -> bool:
        """Judge, for the demands asked lately (most recent first), the nodes they have not been asked
        about yet, for up to `budget` seconds. The server calls this between requests, so that a model's
        next replica finds every verdict ready, whichever candidates kube-scheduler samples. True while
        nodes remain."""
        deadline = time.perf_counter() + budget
        for key, memo in list(reversed(self._memos.items())):  # judging may start the memos over
            self._sync(memo)
            told = memo.verdicts
            if memo.untold is None:
                memo.untold = [name for name in self.cluster.nodes if name not in told]
            untold = memo.untold
            while untold:
                name = untold.pop()
                ledger = self.cluster.ledger(name)
                if ledger is not None and name not in told:
                    told[name] = self._classify(key, ledger, memo)
                if time.perf_counter() >= deadline:
                    return True
        return False


def _epoch(stamp: object) -> float | None:
    """A metav1.Time (RFC 3339, as the apiserver writes it) in seconds since the epoch; None when it is not one."""
    if not isinstance(stamp, str):
        return None
    try:
        return datetime.fromisoformat(stamp).timestamp()
    except ValueError:
        return None


def split_deadline(judge: Judge, ref: PodRef) -> float | None:
    """Until when (seconds since the epoch) the pod waits for a node that keeps each rank on its own NUMA node rather
    than run split: `split_wait_seconds` after its creation. None: it does not wait (a pod whose creation is unknown
    is not held for a time nobody can tell)."""
    wait = judge.settings.split_wait_seconds
    return ref.created + wait if ref.created is not None and wait > 0 else None


def _local_elsewhere(judge: Judge, ref: PodRef, names: list[str]) -> bool:
    """Whether a node kube-scheduler did not send, but would offer the pod, keeps each rank on its own NUMA node
    now or could once pods leave. Its own filters drop a node short of CPUs in all (NodeResourcesFit), so the full
    nodes whose Topology Manager aligns are seldom among the candidates of a pod that only a split would place."""
    sent = set(names)
    others = [name for name in judge.cluster.nodes if name not in sent]
    ineligible = judge.misses(ref, others)
    others = [name for name in others if name not in ineligible]
    return any(v is not None and (not v.split if v.ok else v.resolvable) for v in judge.verdicts(ref, others))


def _holes(values: list[Any]) -> Iterator[int]:
    """Where `values` holds None. Found by `list.index`, at C speed: after a bind only the node it changed has lost
    its verdict, and a loop over 1,000 verdicts in Python cost more than judging that one node."""
    i = -1
    while True:
        try:
            i = values.index(None, i + 1)
        except ValueError:
            return
        yield i


@dataclass(slots=True)
class Filtered:
    passed: list[str]
    failed: dict[str, str]  # FailedNodes: evicting pods could help
    unresolvable: dict[str, str]  # FailedAndUnresolvableNodes: nothing the scheduler can do helps
    decision: str
    ineligible: dict[str, Miss] = field(default_factory=dict)  # of `unresolvable`: not offered by kube-scheduler


def most_free(message: str, policy: str, frees: list[tuple[int, ...]]) -> str:
    """The class's own number: the most free cores any of its nodes has, where the reason looks (one NUMA
    node it names, any one NUMA node, or the node in all for kubelet-static)."""
    def say(most: int, where: str) -> str:
        if where == "cores in all":
            return f"the most any such node has free is {most} cores in all"
        return f"the most any such node has free {where} is {most}"

    there = _THERE.search(message)
    if there is not None:
        k = int(there.group(1))
        return say(max((f[k] for f in frees if k < len(f)), default=0), "there")
    if policy == "kubelet-static":
        return say(max(sum(f) for f in frees), "cores in all")
    return say(max(max(f, default=0) for f in frees), "on one NUMA node")


def filter_nodes(judge: Judge, ref: PodRef, names: list[str], now: float | None = None) -> Filtered:
    """`now`: seconds since the epoch (the clock creation timestamps are read against), time.time() if None."""
    if ref.demand is None:
        return Filtered(list(names), {}, {}, "not-a-model-pod")
    why = ref.unreadable
    if why is not None:
        # Unschedulable with this message on every node (the user sees it in the pod's events, and
        # no preemption is tried), rather than an Error that fails every attempt with backoff.
        return Filtered([], {}, dict.fromkeys(names, why), "unreadable-pod")
    # kube-scheduler's own filters sent only nodes it offers; the same rule here keeps every path to one answer.
    ineligible = judge.misses(ref, names)
    if ineligible:
        names = [name for name in names if name not in ineligible]
    verdicts = judge.verdicts(ref, names)
    passed = [name for name, verdict in zip(names, verdicts) if verdict is not None and verdict.ok]
    failed: dict[str, str] = {}
    unresolvable: dict[str, str] = {name: miss.reason for name, miss in ineligible.items()}
    resolvable: dict[str, list[str]] = {}  # message -> the nodes refused with it that eviction could help
    if len(passed) < len(names):
        for name, verdict in zip(names, verdicts):
            if verdict is None:
                unresolvable[name] = UNKNOWN_NODE
            elif verdict.ok:
                continue
            elif verdict.resolvable:
                resolvable.setdefault(verdict.message, []).append(name)
            else:
                unresolvable[name] = verdict.message
    ledger_of = judge.cluster.ledger
    # The same for every node of this call, so kube-scheduler still counts one reason per class; it names the
    # pod so that its FailedScheduling event says where the per-node numbers are.
    fix = f"; wait for free cores or lower cpu; `model-placement explain {ref.display}` lists every node"
    for message, nodes in resolvable.items():
        frees = [ledger.free() for ledger in map(ledger_of, nodes) if ledger is not None]
        text = f"{message}; {most_free(message, ref.demand.policy, frees)}{fix}"
        for name in nodes:
            failed[name] = text
    if passed and all(v is None or not v.ok or v.split for v in verdicts):
        # Only nodes that would split it have room, and a node refused for what it holds could keep each rank on
        # its own NUMA node once pods leave: the pod waits for that (`Waiting` asks kube-scheduler to retry it
        # when the ledgers change, or when the wait is over), as long as `split_wait_seconds` allows.
        deadline, clock = split_deadline(judge, ref), time.time() if now is None else now
        if deadline is not None and deadline > clock and (failed or _local_elsewhere(judge, ref, names)):
            until = datetime.fromtimestamp(deadline, UTC).strftime("%H:%M:%S")
            each = " each" if ref.demand.numa_nodes > 1 else ""
            text = (f"would run the model split: its {ref.demand.rank_count} would not{each} get a NUMA node of its "
                    "own with a whole share here (the kubelet does not align it so); nodes that keep each rank on "
                    f"its own NUMA node are full now, so it waits for one until {until}Z, "
                    f"{math.ceil(deadline - clock)} s more (`split_wait_seconds`), then runs split{fix}")
            unresolvable.update(dict.fromkeys(passed, text))
            return Filtered([], failed, unresolvable, "waits-for-local", ineligible)
    return Filtered(passed, failed, unresolvable, "fits" if passed else "fits-nowhere", ineligible)
