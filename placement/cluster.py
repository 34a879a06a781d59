"""Cluster state: Nodes, Pods, BalloonsPolicies and NodeResourceTopologies -> one ledger per node.

Fed either from a file (`from_objects`) or by the list/watch source (`replace` / `apply`). Only what
the ledgers need is kept per object. A node's ledger is rebuilt lazily, on first use after anything
that shapes it changed; pod events update it in place.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from placement import fit as fitmod
from placement.accounting import Log, account, build_kubelet_ledger, build_ledger
from placement.balloonspolicy import BalloonsPolicy, parse_balloons_policy, policy_for_node
from placement.config import Settings
from placement.demand import (
    ModelDemand,
    Routed,
    initializing,
    is_model_pod,
    pod_init_cpu_milli,
    pod_shared_cpu_milli,
    pod_shared_memory,
    pod_shared_steps,
    read_model_pod,
    routed_containers,
)
from placement.eligibility import Eligibility, Miss, Taint, node_taints
from placement.kubelet import KPod, NodeError, kubelet_pod
from placement.kubeletnode import kubelet_node
from placement.kubeletnode import selected as kubelet_selected
from placement.ledger import PLACEMENT, NodeLedger, Placed, Stamps
from placement.quantity import QuantityError, memory_bytes
from placement.topology import (
    CPUSet,
    CPUSetError,
    Topology,
    node_topology,
    profile_reserved,
    reserved_from_spec,
    zone_resources,
)


class _Unheard:
    """A state nobody listens to (a test's, a benchmark's)."""

    def info(self, msg: str, *, extra: Mapping[str, object] | None = None) -> None:
        pass

    def warning(self, msg: str, *, extra: Mapping[str, object] | None = None) -> None:
        pass

KINDS = ("Node", "Pod", "BalloonsPolicy", "NodeResourceTopology")
TERMINATED = ("Succeeded", "Failed")


@dataclass(frozen=True, slots=True)
class NodeInfo:
    name: str
    labels: Mapping[str, str]
    capacity_cpu: str | None
    unschedulable: bool
    capacity_memory: str | None = None
    taints: tuple[Taint, ...] = ()  # the NoSchedule and NoExecute ones
    allocatable_cpu: str | None = None  # capacity less what the kubelet reserves
    total_memory: str | None = None  # status.capacity.memory: the machine's, reserved memory included


def pod_priority(spec: Mapping[str, Any]) -> int:
    value = spec.get("priority")
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


class PodRecord(NamedTuple):
    """One pod, as much of it as the ledgers need. Immutable like the other records, but a NamedTuple: one is
    built for every pod listed or watched, and a frozen dataclass's __init__ (an object.__setattr__ per field)
    costs three times as much."""

    uid: str
    namespace: str
    name: str
    node: str | None
    phase: str
    created: str
    model: ModelDemand | None  # None: not a model pod
    # CPU of the containers that hold no exclusive cores once it runs (a model pod's sidecars; all of any other
    # pod); None when there are none. Regular init containers are `init_milli`.
    shared_milli: int | None
    assumed_at: float | None = None
    shared_memory: int = 0  # bytes the containers without exclusive cores request
    priority: int = 0  # spec.priority, which the apiserver's Priority plugin sets before any webhook sees the pod
    eligibility: Eligibility | None = None  # a model pod not bound yet: the nodes it may get (`explain` asks)
    placed: Placed | None = None  # where our /bind put it (the pod's PLACEMENT annotation, or our own decision)
    # deletionTimestamp set: it holds its cores until it is gone, and its replacement may have them
    leaving: bool = False
    kpod: KPod | None = None  # the pod as the kubelet reads it: what it takes on a kubelet-static node
    # Not a model pod, but it carries the plugin's balloon annotation: its containers and where it routes them
    routed: tuple[Routed, ...] = ()
    # Its regular init containers: the most CPU they take at once in the shared pool (0: none), and whether they
    # may still run
    init_milli: int = 0
    initializing: bool = False
    # status.startTime set: its node's kubelet admitted it (its containers may still be pulling images, in Pending)
    started: bool = False
    # Its containers that run for its life, in the kubelet's order, with their CPU (`pod_shared_steps`; () for one)
    shared_steps: tuple[tuple[str, int], ...] = ()

    @property
    def active(self) -> bool:
        return self.node is not None and self.phase not in TERMINATED


def _slim_node(obj: Mapping[str, Any]) -> NodeInfo:
    meta = obj.get("metadata") or {}
    status = obj.get("status") or {}
    capacity = (status.get("capacity") or {}).get("cpu") or (status.get("allocatable") or {}).get("cpu")
    memory = (status.get("allocatable") or {}).get("memory") or (status.get("capacity") or {}).get("memory")
    return NodeInfo(
        name=str(meta.get("name", "")),
        labels={str(k): str(v) for k, v in (meta.get("labels") or {}).items()},
        capacity_cpu=None if capacity is None else str(capacity),
        unschedulable=bool((obj.get("spec") or {}).get("unschedulable")),
        capacity_memory=None if memory is None else str(memory),
        taints=node_taints(obj.get("spec") or {}),
        allocatable_cpu=None if (alloc := (status.get("allocatable") or {}).get("cpu")) is None else str(alloc),
        total_memory=None if (total := (status.get("capacity") or {}).get("memory")) is None else str(total),
    )


def _only_container(spec: Mapping[str, Any], name: str) -> bool:
    """Is container `name` all the pod runs once its regular init containers completed? Then none of it is in a
    shared balloon (the plugin's oracle: an empty `default` balloon holds no CPU)."""
    containers: Sequence[Any] = spec.get("containers") or ()
    if len(containers) != 1 or not isinstance(containers[0], Mapping) or containers[0].get("name") != name:
        return False
    return not any(isinstance(c, Mapping) and c.get("restartPolicy") == "Always"
                   for c in spec.get("initContainers") or ())


def numa_memory(node: NodeInfo, nrt: Mapping[str, Any] | None, numa_count: int) -> tuple[int, ...]:
    """Bytes of memory per NUMA node: NodeResourceTopology `Node` zones' memory where they give it, else the node's
    allocatable memory split evenly; () when neither is known."""
    zones = {}
    for numa, res in zone_resources(nrt, "memory").items():
        with contextlib.suppress(QuantityError):
            zones[numa] = memory_bytes(res.get("allocatable") or res.get("capacity"))
    if len(zones) == numa_count and all(zones.values()):
        return tuple(zones[i] for i in range(numa_count))
    try:
        total = memory_bytes(node.capacity_memory) if node.capacity_memory is not None else 0
    except QuantityError:
        total = 0
    return tuple([total // numa_count] * numa_count) if total and numa_count else ()


BALLOON_ZONE = "balloon"
CONTAINER_ZONE = "allocation for container"


def _slim_nrt(obj: Mapping[str, Any]) -> dict[str, Any]:
    """What the ledger reads of a NodeResourceTopology: NFD's `Node` zones (the NUMA layout) and the zones the
    balloons plugin exports, one per balloon with its cpuset and, with showContainersInNrt, one per container
    whose parent is its balloon."""
    zones, balloons, containers = [], {}, {}
    for zone in obj.get("zones") or ():
        if not isinstance(zone, Mapping):
            continue
        kind, name = zone.get("type"), str(zone.get("name", ""))
        if kind == "Node":
            zones.append(zone)
        elif kind == BALLOON_ZONE:
            cpuset = next((a.get("value") for a in zone.get("attributes") or ()
                           if isinstance(a, Mapping) and a.get("name") == "cpuset"), None)
            if isinstance(cpuset, str):
                balloons[name] = cpuset
        elif kind == CONTAINER_ZONE and zone.get("parent"):
            containers[name] = str(zone["parent"])
    attributes = {str(a.get("name")): str(a.get("value")) for a in obj.get("attributes") or ()
                  if isinstance(a, Mapping) and a.get("name")}
    return {"zones": zones, "balloons": balloons, "containers": containers, "attributes": attributes,
            "topologyPolicies": [str(p) for p in obj.get("topologyPolicies") or ()]}


def _pinned_containers(rec: PodRecord) -> tuple[str, ...]:
    """The containers of a pod that may be in a balloon of their own: a model pod's model container, another
    pod's annotated ones."""
    if rec.model is not None:
        return (rec.model.container,)
    return tuple(r.container for r in rec.routed if r.balloon_type is not None)


def _carried(old: PodRecord, new: PodRecord) -> PodRecord:
    """`new`, a list's or watch's view of pod `old`, keeping what only we know: that we are binding it (the watch
    has not shown the binding yet), and where we put it when its own annotation does not say."""
    if old.assumed_at is not None and new.node is None:
        new = new._replace(node=old.node, assumed_at=old.assumed_at)
    if new.placed is None and old.placed is not None and old.node == new.node:
        new = new._replace(placed=old.placed)
    return new


class ClusterState:
    """Not thread-safe: one thread (the event loop) reads and writes it."""

    def __init__(self, settings: Settings, clock: Callable[[], float] = time.monotonic, log: Log | None = None) -> None:
        self.settings = settings
        self.clock = clock
        self.log = log or _Unheard()
        self.nodes: dict[str, NodeInfo] = {}
        self.pods: dict[str, PodRecord] = {}
        self.policies: dict[tuple[str, str], BalloonsPolicy] = {}
        self.nrts: dict[str, dict[str, Any]] = {}
        self.notes: list[str] = []
        self._ledgers: dict[str, NodeLedger] = {}
        self._dirty: set[str] = set()
        self._pods_on: dict[str, set[str]] = {}
        self._homogeneous: bool | None = None
        self.generation = 0  # bumps on every change; caches key on it
        self.node_generation = 0  # bumps when a Node is added, changed or deleted; eligibility caches key on it
        self.stamps = Stamps()  # every change to this cluster's ledgers, for what was derived from them

    # -- feeding -----------------------------------------------------------------------------------

    @classmethod
    def from_objects(cls, objects: Iterable[Mapping[str, Any]], settings: Settings, log: Log | None = None
                     ) -> ClusterState:
        state = cls(settings, log=log)
        by_kind: dict[str, list[Mapping[str, Any]]] = {k: [] for k in KINDS}
        for obj in objects:
            kind = obj.get("kind")
            if kind in by_kind:
                by_kind[kind].append(obj)
        for kind in KINDS:
            state.replace(kind, by_kind[kind])
        return state

    def replace(self, kind: str, objects: Iterable[Mapping[str, Any]]) -> None:
        """A full (re)list of one kind: whatever is not in `objects` is gone."""
        self.generation += 1
        if kind == "Node":
            self.node_generation += 1
            self.nodes = {n.name: n for n in map(_slim_node, objects) if n.name}
            self._ledgers = {k: v for k, v in self._ledgers.items() if k in self.nodes}
            self._mark_all_dirty()
        elif kind == "Pod":
            previous = self.pods
            self.pods = {}
            self._pods_on = {}
            # Before indexing: the ledgers still hold the previous list's pods, so none may be updated in place
            # (holding a pod twice raises); each is rebuilt from the new list when next asked for.
            self._mark_all_dirty()
            records = [r for r in (self._slim_pod(o) for o in objects) if r is not None]
            for rec in records:
                old = previous.get(rec.uid)
                if old is not None:
                    rec = _carried(old, rec)
                self._index(rec)
        elif kind == "BalloonsPolicy":
            self.policies = {}
            for obj in objects:
                policy = parse_balloons_policy(obj)
                self.policies[(policy.namespace, policy.name)] = policy
            self._mark_all_dirty()
        elif kind == "NodeResourceTopology":
            self.nrts = {str((o.get("metadata") or {}).get("name")): _slim_nrt(o) for o in objects}
            self._mark_all_dirty()
        else:
            raise ValueError(f"unknown kind {kind!r}; expected one of {', '.join(KINDS)}")

    def apply(self, kind: str, event: str, obj: Mapping[str, Any]) -> None:
        """One watch event: ADDED, MODIFIED or DELETED."""
        self.generation += 1
        deleted = event == "DELETED"
        meta = obj.get("metadata") or {}
        if kind == "Pod":
            uid = str(meta.get("uid", ""))
            old = self.pods.get(uid)
            rec = None if deleted else self._slim_pod(obj)
            if rec is not None and old is not None:
                if old.assumed_at is not None and rec.node is not None and rec.node != old.node:
                    self.log.warning("assumed pod bound elsewhere", extra={
                        "pod": f"{rec.namespace}/{rec.name}", "node": rec.node, "assumed_node": old.node})
                rec = _carried(old, rec)
            if old is not None:
                self._unindex(old)
                ledger = self._ledgers.get(old.node) if deleted and old.node is not None else None
                if ledger is not None:
                    ledger.forget_init(uid)
            if rec is not None:
                self._index(rec)
                if old is not None and old.phase == "Pending" and rec.phase != "Pending" and rec.model is not None \
                        and rec.node is not None and (self.nrts.get(rec.node) or {}).get("balloons"):
                    # Its balloon, if the export shows one, is where it runs now (two pods bound moments apart
                    # may have reached the plugin in the other order): the ledger reads the export again.
                    self._stale(rec.node)
        elif kind == "Node":
            name = str(meta.get("name", ""))
            if deleted:
                self.node_generation += 1
                self.nodes.pop(name, None)
                self._ledgers.pop(name, None)
                self._dirty.discard(name)
                self.stamps.take(name)
            else:
                info = _slim_node(obj)
                if self.nodes.get(name) != info:  # not on a status heartbeat
                    self.node_generation += 1
                    self.nodes[name] = info
                    self._stale(name)
            self._check_homogeneity()
        elif kind == "BalloonsPolicy":
            key = (str(meta.get("namespace", "")), str(meta.get("name", "")))
            if deleted:
                self.policies.pop(key, None)
            else:
                self.policies[key] = parse_balloons_policy(obj)
            self._mark_all_dirty()
        elif kind == "NodeResourceTopology":
            name = str(meta.get("name", ""))
            if deleted:
                self.nrts.pop(name, None)
            else:
                slim = _slim_nrt(obj)
                if self.nrts.get(name) == slim:
                    return
                self.nrts[name] = slim
            self._stale(name)
            self._check_homogeneity()
        else:
            raise ValueError(f"unknown kind {kind!r}; expected one of {', '.join(KINDS)}")

    def _slim_pod(self, obj: Mapping[str, Any]) -> PodRecord | None:
        meta = obj.get("metadata") or {}
        uid = meta.get("uid")
        if not uid:
            return None
        spec = obj.get("spec") or {}
        model = read_model_pod(obj, self.settings) if is_model_pod(meta.get("labels"), self.settings) else None
        placed = None
        if model is not None:
            text = (meta.get("annotations") or {}).get(PLACEMENT)
            placed = None if text is None else Placed.parse(text)
        # Positional: this runs for every pod listed or watched, and keywords cost a third more.
        return PodRecord(
            str(uid), str(meta.get("namespace", "")), str(meta.get("name", "")), spec.get("nodeName") or None,
            str((obj.get("status") or {}).get("phase") or "Pending"), str(meta.get("creationTimestamp") or ""),
            model, None if model is not None and _only_container(spec, model.container)
            else pod_shared_cpu_milli(spec, model.container if model is not None else None),
            None, pod_shared_memory(spec, skip=model.container if model is not None else None),
            pod_priority(spec), self.eligibility(spec) if model is not None and not spec.get("nodeName") else None,
            placed, bool(meta.get("deletionTimestamp")), kubelet_pod(str(uid), spec),
            routed_containers(meta.get("annotations"), spec) if model is None else (),
            pod_init_cpu_milli(spec), initializing(obj), bool((obj.get("status") or {}).get("startTime")),
            pod_shared_steps(spec),
        )

    # -- the pod index and incremental accounting ---------------------------------------------------

    def _index(self, rec: PodRecord) -> None:
        self.pods[rec.uid] = rec
        node = rec.node
        if rec.active and node is not None:  # active: on a node
            on = self._pods_on.get(node)
            if on is None:  # not setdefault(node, set()): that builds a set for every pod
                on = self._pods_on[node] = set()
            on.add(rec.uid)
            ledger = self._ledgers.get(node)
            if ledger is not None and node not in self._dirty:
                nrt = self.nrts.get(node)
                if nrt is not None and any(f"{rec.namespace}/{rec.name}/{name}" in nrt["containers"]
                                           for name in _pinned_containers(rec)):
                    # The plugin's export already shows where the pod runs (its NRT came before the pod's own
                    # event): rebuilt, the ledger holds it there, not where we predicted.
                    self._stale(node)
                else:
                    account(ledger, rec, self.fit, self.log)

    def _unindex(self, rec: PodRecord) -> None:
        self.pods.pop(rec.uid, None)
        if rec.node is not None:
            on = self._pods_on.get(rec.node)
            if on is not None:
                on.discard(rec.uid)
            ledger = self._ledgers.get(rec.node)
            if ledger is not None and rec.node not in self._dirty:
                ledger.release(rec.uid)
                ledger.drop_shared(rec.uid)

    # -- ledgers -----------------------------------------------------------------------------------

    def _stale(self, name: str) -> None:
        """The node's ledger must be rebuilt before it is read again; what was derived from it no longer holds."""
        self._dirty.add(name)
        self.stamps.take(name)

    def _mark_all_dirty(self) -> None:
        self._dirty = set(self.nodes)
        self._homogeneous = None
        self.stamps.forget()

    def _check_homogeneity(self) -> None:
        if self.settings.nri_reserved_cpu_list and self._homogeneous is not None:
            was = self._homogeneous
            self._homogeneous = None
            if self.homogeneous != was:
                self._mark_all_dirty()

    @property
    def homogeneous(self) -> bool:
        """Every node has the same shape (cores per NUMA node, SMT width): one cpuset list fits all."""
        if self._homogeneous is None:
            shapes = {self._topology(n)[0].shape() for n in self.nodes.values()}
            self._homogeneous = len(shapes) <= 1
        return self._homogeneous

    def _topology(self, node: NodeInfo) -> tuple[Topology, str]:
        return node_topology(node.name, node.labels, node.capacity_cpu, self.nrts.get(node.name),
                             self.settings.numa_count_label, self.settings.mm_kubelet_threads_per_core)

    def _reserved(self, node: NodeInfo, topo: Topology, policy: BalloonsPolicy | None) -> tuple[CPUSet, str]:
        if policy is not None and policy.reserved_cpu:
            try:
                return reserved_from_spec(topo, policy.reserved_cpu), \
                    f"BalloonsPolicy {policy.namespace}/{policy.name} reservedResources.cpu={policy.reserved_cpu}"
            except (CPUSetError, QuantityError) as exc:
                self._note(f"node {node.name}: ignoring reservedResources.cpu of BalloonsPolicy "
                           f"{policy.namespace}/{policy.name}: {exc}")
        explicit = self.settings.nri_reserved_cpu_list
        if explicit and self.homogeneous:
            return CPUSet.parse(explicit) & topo.cpus, f"nri_reserved_cpu_list={explicit}"
        profile = self.settings.nri_deployment_profile
        return profile_reserved(topo, profile), f"profile {profile}"

    def node_policies(self) -> list[BalloonsPolicy]:
        """The BalloonsPolicies the plugin reads: those in its own namespace."""
        namespace = self.settings.nri_config_namespace
        return [p for (ns, _), p in self.policies.items() if ns == namespace]

    def _note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)
            self.log.info(text)

    def _build(self, name: str) -> NodeLedger:
        node = self.nodes[name]
        topo, note = self._topology(node)
        if topo.source == "single-numa":
            self._note(note)
        policy = None if kubelet_selected(self.settings, node.labels) else \
            policy_for_node(self.node_policies(), name, node.labels)
        nrt = self.nrts.get(name)
        memory = numa_memory(node, nrt, topo.numa_count)
        records = [self.pods[u] for u in self._pods_on.get(name, ()) if u in self.pods]
        if policy is None:
            try:
                kubelet = kubelet_node(self.settings, node.labels, topo, nrt, node.total_memory, node.capacity_cpu,
                                       node.allocatable_cpu)
            except NodeError as exc:
                self._note(f"node {name}: its kubelet would not start with these settings ({exc}); "
                           "no pod is placed there")
            else:
                return build_kubelet_ledger(name, node.labels, topo, kubelet, nrt, memory, records, self.stamps,
                                            self.log)
            policy = None
        reserved, source = self._reserved(node, topo, policy)
        return build_ledger(name, node.labels, topo, (reserved, source), policy, nrt, memory, records, self.stamps,
                            self.fit, self.log)

    def ledger(self, name: str) -> NodeLedger | None:
        ledger = self._ledgers.get(name)
        if ledger is not None and name not in self._dirty:
            return ledger
        if name not in self.nodes:
            return None
        return self._node_ledger(name)

    def _node_ledger(self, name: str) -> NodeLedger:
        """The ledger of a node in `nodes`, built again when it is stale."""
        ledger = self._ledgers.get(name)
        if ledger is None or name in self._dirty:
            ledger = self._ledgers[name] = self._build(name)
            self._dirty.discard(name)
        return ledger

    def rebuild_dirty(self, limit: int) -> int:
        """Rebuild up to `limit` stale ledgers; the server calls this between requests so that a
        policy change does not make one scheduling cycle pay for every node."""
        done = 0
        while self._dirty and done < limit:
            name = self._dirty.pop()
            if name in self.nodes:
                self._ledgers[name] = self._build(name)
                done += 1
        return done

    def ledgers(self) -> list[NodeLedger]:
        return [self._node_ledger(n) for n in sorted(self.nodes)]

    # -- questions ---------------------------------------------------------------------------------

    def eligibility(self, spec: Mapping[str, Any]) -> Eligibility:
        return Eligibility(spec, self.settings.amx_node_label)

    def iter_eligible(self, spec: Mapping[str, Any]) -> Iterator[NodeLedger]:
        """The nodes kube-scheduler would offer the pod (cordons, taints, nodeSelector, required node affinity),
        by name, lazily: a question answered by the first match need not build every ledger."""
        allows = self.eligibility(spec).allows
        for name in sorted(self.nodes):
            if allows(self.nodes[name]):
                yield self._node_ledger(name)

    def eligible(self, spec: Mapping[str, Any]) -> list[NodeLedger]:
        return list(self.iter_eligible(spec))

    def misses(self, spec: Mapping[str, Any]) -> dict[str, Miss]:
        """Each node kube-scheduler would not offer the pod, by name, and why."""
        miss = self.eligibility(spec).miss
        return {name: why for name in sorted(self.nodes) if (why := miss(self.nodes[name])) is not None}

    def fit(self, demand: ModelDemand, ledger: NodeLedger) -> fitmod.Fit:
        """The scheduler's question: does it fit what is free now?"""
        return fitmod.fit(demand, ledger, self.settings.mm_kubelet_threads_per_core, self.settings.scoring_strategy)

    def fit_admission(self, demand: ModelDemand, ledger: NodeLedger) -> fitmod.Fit:
        """Admission's question: as `fit`, with the cores of this model's pods being deleted on the node counted as
        free. A pod that replaces one of them (a rolling update with maxSurge 0, a re-created StatefulSet pod) may
        have them: the scheduler binds it once they are gone. A new replica needs new cores, at admission as at
        /filter, however many pods of its model run."""
        leaving = [uid for uid in ledger.held_by(demand.identity) if (rec := self.pods.get(uid)) and rec.leaving] \
            if demand.identity is not None else ()
        return self.fit(demand, ledger.scratch(evicted=leaving) if leaving else ledger)

    # -- the records the assume cache writes ---------------------------------------------------------

    def put(self, rec: PodRecord) -> None:
        """Index a pod record in place of the one of its uid (its cores held or released on its node)."""
        self.generation += 1
        old = self.pods.get(rec.uid)
        if old is not None:
            self._unindex(old)
        self._index(rec)

    def drop(self, uid: str) -> None:
        rec = self.pods.get(uid)
        if rec is not None:
            self.generation += 1
            self._unindex(rec)
