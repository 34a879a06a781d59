"""Why a demand does not fit one node: one value per kind of refusal, carrying the facts, with its check id and
`text()`, the one place that words its sentence, as Kubernetes' cpumanager does with its typed errors
(placement/refusals.py does the same for admission's refusals).

No sentence names the node or the pod: kube-scheduler counts identical reasons into its summary ("0/1000 nodes are
available: 640 <reason>, ..."), so nodes of one class must give the same text.

The values are named tuples, not frozen dataclasses: a fit that fails builds one, and the extender asks thousands
of fits per demand, where a frozen dataclass costs three times as much to build. So the check id is the last field,
defaulted (mypy reads no class attribute of a named tuple), and two kinds with equal fields compare equal: compare
refusals by `check` or by their text, never by value. Each words itself, rather than one `match` over all kinds:
`match` tries its cases in turn, a few hundred nanoseconds each on a named tuple.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

from placement.demand import ranks_text
from placement.quantity import format_cpu

# Check ids: one name per refusal, shared by messages, logs and metrics.
TP_EXCEEDS_NUMA = "tp-exceeds-numa"
FOOTPRINT_EXCEEDS_NODE = "footprint-exceeds-node"
BALLOON_TYPE_MISSING = "balloon-type-missing"
BALLOON_TYPE_CAPPED = "balloon-type-max-cpus"
NOT_NUMA_LOCAL = "balloon-not-numa-local"
RANKS_SHARE_NUMA = "ranks-share-numa"
NRI_NOT_RUNNING = "nri-not-running"
MAX_BALLOONS = "max-balloons-reached"
SHARES_BALLOON = "balloon-would-be-shared"
MEMORY_EXCEEDS_NUMA = "memory-exceeds-numa"
INSUFFICIENT_FREE_MEMORY = "insufficient-free-memory"
INSUFFICIENT_FREE = "insufficient-free"
NO_CPU = "no-cpu-request"
REQUEST_OVER_SHARES = "request-over-cpu-shares"
PLACEMENT_UNKNOWN = "placement-unknown"
RESERVED_LENT = "reserved-cpus-lent"
SHARED_UNSEEN = "shared-balloons-unseen"
POD_LEAVING = "pod-terminating"
KUBELET_REJECTS = "kubelet-rejects"
NOT_KUBELET_NODE = "not-kubelet-static-node"
NOT_PINNED = "kubelet-pins-nothing"
UNKNOWN_NODE = "unknown-node"
ALREADY_BOUND = "already-bound"
INIT_EXCEEDS_NODE = "init-exceeds-node"

# Model pods with no recorded placement (bound by another scheduler, or before the install) and no container zone
# in the plugin's NodeResourceTopology: held on every NUMA node they could be on.
_UNKNOWN = "model pods here with no recorded placement count on every NUMA node they could use"


class Described(Protocol):
    """What a demand costs on a node (fit.Footprint, which this module cannot import: fit imports it)."""

    def describe(self) -> str: ...


# The balloons plugin's own refusals (placement/nri.py).

class TypeCapped(NamedTuple):
    balloon_type: str
    max_cpus: int
    asked: int  # CPUs

    check: str = BALLOON_TYPE_CAPPED

    def text(self) -> str:
        return (f"balloon type {self.balloon_type} holds at most maxCPUs={self.max_cpus} CPUs and this needs "
                f"{self.asked}")


class ComponentMissing(NamedTuple):
    balloon_type: str  # a composite
    component: str  # the first of its components the policy lacks

    check: str = BALLOON_TYPE_MISSING

    def text(self) -> str:
        return (f"composite balloon type {self.balloon_type} names component type {self.component}, which the "
                "BalloonsPolicy does not define")


class PreferredNumaMissing(NamedTuple):
    balloon_type: str
    numa: int  # the NUMA node the type prefers
    numa_count: int  # the node's

    check: str = NOT_NUMA_LOCAL

    def text(self) -> str:
        return (f"balloon type {self.balloon_type} prefers NUMA node {self.numa}, which a node with "
                f"{self.numa_count} NUMA node{_s(self.numa_count)} lacks")


class NoRoomOnOneNuma(NamedTuple):
    balloon_type: str
    cores: int  # whole cores the balloon takes
    numa: int | None  # the NUMA node the type prefers, if any: a rank of the generated policy
    # NOT_NUMA_LOCAL when the NUMA nodes it may use have that many free together, else INSUFFICIENT_FREE
    check: str

    def text(self) -> str:
        # A component type is the generated policy's inner working: the user asked for a model and its ranks, and
        # the policy decides which NUMA node each rank gets.
        if self.numa is not None:
            return (f"the balloons policy puts a rank on NUMA node {self.numa} (or, lacking room there, another), "
                    f"which needs {self.cores} free core{_s(self.cores)} on one NUMA node")
        return f"balloon type {self.balloon_type} needs {self.cores} free core{_s(self.cores)} on one NUMA node"


# What no eviction changes: the demand against the node's shape and policy.

class NoCpu(NamedTuple):
    check: str = NO_CPU

    def text(self) -> str:
        return "the model container requests no CPU"


class TpExceedsNuma(NamedTuple):
    tp: int
    pp: int
    dp: int
    numa_count: int

    check: str = TP_EXCEEDS_NUMA

    def text(self) -> str:
        return (f"{ranks_text(self.tp, self.pp, self.dp)} needs {self.tp * self.pp * self.dp} NUMA nodes, one per "
                f"rank; this node has {self.numa_count}")


class NoBalloonsPolicy(NamedTuple):
    balloon_type: str

    check: str = BALLOON_TYPE_MISSING

    def text(self) -> str:
        return f"no BalloonsPolicy applies to this node, so balloon type {self.balloon_type} cannot be created here"


class NriNotRunning(NamedTuple):
    status: str | None  # as the plugin reports it
    policy: str  # namespace/name; empty for the node's own, whose name is the node's

    check: str = NRI_NOT_RUNNING

    def text(self) -> str:
        return (f"the NRI balloons plugin reports {self.status} for {_where(self.policy)} on this node, so it is not "
                "pinning CPUs here")


class BalloonTypeUndefined(NamedTuple):
    balloon_type: str
    policy: str  # as NriNotRunning's
    known: tuple[str, ...]  # the types it defines

    check: str = BALLOON_TYPE_MISSING

    def text(self) -> str:
        return (f"balloon type {self.balloon_type} is not defined in {_where(self.policy)} (types there: "
                f"{', '.join(self.known) or 'none'})")


class RequestOverShares(NamedTuple):
    cpus: int
    most: int  # CPUs the plugin can read from cpu.shares

    check: str = REQUEST_OVER_SHARES

    def text(self) -> str:
        return (f"the model container requests {self.cpus} CPUs, and the balloons plugin reads a request from its "
                f"cpu.shares, which stop at {self.most} CPUs: the balloon would be smaller than asked; split the "
                "model into more pods or request less")


class ExceedsEmptyNode(NamedTuple):
    why: NoRoomOnOneNuma | PreferredNumaMissing  # what the plugin says on an empty node
    most: int  # model cores on its largest NUMA node

    check: str = FOOTPRINT_EXCEEDS_NODE

    def text(self) -> str:
        return (f"{self.why.text()}, more than this node has even when empty (at most {self.most} model cores on a "
                "NUMA node)")


class MemoryExceedsNuma(NamedTuple):
    tp: int
    pp: int
    dp: int
    memory: int  # bytes pinned on each of its NUMA nodes
    room: int  # bytes on the NUMA node of this shape with the least, of those it would need

    check: str = MEMORY_EXCEEDS_NUMA

    def text(self) -> str:
        span = self.tp * self.pp * self.dp
        return (f"{ranks_text(self.tp, self.pp, self.dp)} pins {fmt_bytes(self.memory)} of memory to each of its "
                f"{span} NUMA node{'s' if span > 1 else ''} (pinMemory); nodes of this shape have "
                f"{fmt_bytes(self.room)}")


class TypeSpansFewer(NamedTuple):
    balloon_type: str
    numa_nodes: int  # the type's balloon spans
    tp: int
    pp: int
    dp: int

    check: str = RANKS_SHARE_NUMA

    def text(self) -> str:
        return (f"balloon type {self.balloon_type} puts the model on {self.numa_nodes} NUMA "
                f"node{_s(self.numa_nodes)} but its {ranks_text(self.tp, self.pp, self.dp)} needs "
                f"{self.tp * self.pp * self.dp}, one per rank")


class NotKubeletNode(NamedTuple):
    """A kubelet-static pod offered a node whose CPUs the NRI balloons plugin pins."""

    check: str = NOT_KUBELET_NODE

    def text(self) -> str:
        return ("kubelet-static pod, but the NRI balloons plugin pins CPUs on these nodes (set "
                "model-manager.io/cpu-policy: nri-balloons, or schedule it to a kubelet-static node group)")


class NotPinned(NamedTuple):
    """The kubelet gives the model container no exclusive CPU."""

    why: str

    check: str = NOT_PINNED

    def text(self) -> str:
        return f"the kubelet's static CPU Manager pins no CPU for the model container: {self.why}"


class KubeletRejects(NamedTuple):
    """What the node's kubelet would answer: the pod Failed with this Reason (a controller then replaces it, and
    the replacement lands here again)."""

    reason: str  # TopologyAffinityError, SMTAlignmentError, UnexpectedAdmissionError, OutOfcpu
    message: str  # the kubelet's own, after "Pod was rejected: "
    config: str  # the node's Topology Manager policy and scope
    asked: int  # CPUs the Topology Manager aligns (the container's, or the pod's under pod scope)
    total: tuple[int, ...]  # per NUMA node, the CPUs the kubelet can ever give (all but the reserved)
    free: tuple[int, ...] = ()  # per NUMA node, free now; (): it rejects it on an empty node too

    check: str = KUBELET_REJECTS

    def text(self) -> str:
        if self.reason != "TopologyAffinityError":
            detail = self.message
        elif self.asked > sum(self.total):
            detail = f"{self.asked} CPUs are more than the {sum(self.total)} nodes of this shape can ever give"
        elif not self.free:
            detail = f"{self.asked} CPUs fit no NUMA node of nodes of this shape, the largest holds {max(self.total)}"
        else:
            detail = f"{self.asked} CPUs fit no NUMA node now; free CPUs " + ", ".join(
                f"NUMA {i}: {f} of {t}" for i, (f, t) in enumerate(zip(self.free, self.total)))
        return f"the kubelet ({self.config}) would fail the pod with {self.reason}: {detail}"


# What the pods on the node decide: evicting some could make room.

class MaxBalloons(NamedTuple):
    balloon_type: str
    max_balloons: int

    check: str = MAX_BALLOONS

    def text(self) -> str:
        return (f"maxBalloons={self.max_balloons} {self.balloon_type} balloons already run here; the plugin would put "
                "this model into one of them, sharing its cores")


class SharesBalloon(NamedTuple):
    balloon_type: str  # preferNewBalloons: false, and one runs

    check: str = SHARES_BALLOON

    def text(self) -> str:
        return (f"balloon type {self.balloon_type} has preferNewBalloons: false and a {self.balloon_type} balloon "
                "already runs here: the plugin would put this model into it, sharing its cores")


class RanksCrowded(NamedTuple):
    needs: int  # NUMA nodes, one per rank
    numa_nodes: int  # the plugin would put them on

    check: str = RANKS_SHARE_NUMA

    def text(self) -> str:
        return (f"needs {self.needs} distinct NUMA nodes; with what runs here the plugin would put its ranks on "
                f"{self.numa_nodes}")


class PlacementUnknown(NamedTuple):
    check: str = PLACEMENT_UNKNOWN

    def text(self) -> str:
        return (f"the balloons plugin may pick NUMA nodes without room for it ({_UNKNOWN}: bound by another "
                "scheduler or before model-placement was installed); re-create them through this scheduler, or set "
                "showContainersInNrt: true in the BalloonsPolicy")


class KubeletOrder(NamedTuple):
    """kubelet-static: a pod bound here moments ago that the kubelet has not admitted yet would be placed otherwise,
    or rejected, if this one reached the kubelet first."""

    pod: str
    check: str = KUBELET_REJECTS

    def text(self) -> str:
        return (f"pod {self.pod}, bound here moments ago, is not yet admitted by the kubelet, and which of the two it "
                "admits first decides their CPUs (or rejects one); judged again once it runs")


class KubeletFreeing(NamedTuple):
    """kubelet-static: a pod terminating here holds CPUs the kubelet frees at a moment no object shows; whether it
    has freed them when this pod reaches it decides this pod's CPUs."""

    pod: str
    check: str = KUBELET_REJECTS

    def text(self) -> str:
        return (f"pod {self.pod} is terminating here, and whether the kubelet has freed its CPUs when this one "
                "reaches it decides this one's CPUs; judged again once it is gone")


class KubeletSplits(NamedTuple):
    """kubelet-static, restricted or single-numa-node: what runs here would make the kubelet split the model (under
    pod scope the other containers can take the pod past one NUMA node), where with room it keeps it local."""

    config: str  # the node's Topology Manager policy and scope
    now: tuple[tuple[int, int], ...]  # (NUMA node, cores) the model would get now
    alone: tuple[tuple[int, int], ...]  # and on this node empty
    ranks: str  # "1 rank", "2 ranks"

    check: str = INSUFFICIENT_FREE

    def text(self) -> str:
        return (f"the kubelet ({self.config}) would run the model split now (cores {numa_cores(self.now)} for its "
                f"{self.ranks}), where with room it keeps each rank on a NUMA node of its own "
                f"({numa_cores(self.alone)}); a node that aligns waits for room rather than split it")


class MemoryPlacementUnknown(NamedTuple):
    """kubelet-static, Static Memory Manager: pods of unknown placement hold memory where the node's
    NodeResourceTopology says it is not where they were replayed."""

    pods: int
    check: str = PLACEMENT_UNKNOWN

    def text(self) -> str:
        pods = f"{self.pods} pod{'s' if self.pods != 1 else ''}"
        return (f"the kubelet's Static Memory Manager holds memory of {pods} with no recorded placement, not where "
                "they were replayed (the node's NodeResourceTopology says so): which NUMA nodes it would give this "
                "pod is unknown; judged again when they leave or the NodeResourceTopology agrees. To change: "
                "re-create them through this scheduler")


class PodLeaving(NamedTuple):
    numa: tuple[int, ...]  # where the balloon goes while the terminating pods' balloons stand
    instead: tuple[int, ...]  # where once they are gone; (): nowhere with a NUMA node per rank

    check: str = POD_LEAVING

    def text(self) -> str:
        where = _numa_nodes(self.instead) if self.instead else "no NUMA node per rank"
        return (f"a pod here is terminating and the balloons plugin may already have removed its balloon, after "
                f"which it would put this one on {where}, not on {_numa_nodes(self.numa)}; judged again once that "
                "pod is gone")


class ReservedLent(NamedTuple):
    numa: int  # the NUMA node the balloon would take lent cores on
    lacking: int  # cores beyond what is free there unreserved

    check: str = RESERVED_LENT

    def text(self) -> str:
        return (f"the balloon would need {self.lacking} of the reserved cores on NUMA node {self.numa}, which the "
                "BalloonsPolicy lends (its reserved balloon type sets no minCPUs), and the plugin may take them from "
                "another NUMA node; set minCPUs on the reserved type to the size of reservedResources")


class SharedUnseen(NamedTuple):
    numa: int  # the NUMA node the balloon would take
    cores: int  # shared balloons' cores that may be there
    replayed: bool = False  # the ledger was built from a list of the node's pods (`NodeLedger.mark_replayed`)

    check: str = SHARED_UNSEEN

    def text(self) -> str:
        why = (": the extender read the node's pods from a list (a restart, a relist), which does not say where the "
               "pods that came and went since grew and shrank them; it is known again once they shrink back to their "
               "minimum, or let the extender read the plugin's NodeResourceTopology") if self.replayed else \
            (" (no NodeResourceTopology export was read, and no type of the BalloonsPolicy prefers a NUMA node, or "
             "the reserved balloon is a CPU count); let the extender read the plugin's NodeResourceTopology, or use "
             "the generated policy")
        return (f"NUMA node {self.numa} has room for it only if the {self.cores} core{_s(self.cores)} the shared "
                f"balloons took elsewhere {'are' if self.cores != 1 else 'is'} not there, and where they grew is not "
                f"known{why}")


class PackagesUnseen(NamedTuple):
    """Where the shared balloons grew and shrank depends on which NUMA nodes share a package, which nothing says."""

    numa: tuple[int, ...]  # where the plugin puts it if each NUMA node is a package of its own, or all one
    paired: tuple[int, ...]  # where it puts it if they sit on two packages; () when it could not be NUMA-local

    check: str = SHARED_UNSEEN

    def text(self) -> str:
        return _two_layouts(self.numa, "if this node's NUMA nodes sit on one package, or one package each",
                            self.paired, "if they sit on two", "the shared balloons grew and shrank where the "
                            "packages decide, and nothing says which NUMA nodes share one")


class ThreadsUnseen(NamedTuple):
    """The shared balloons' growth counted in whole cores per pod and in CPUs container by container disagree."""

    numa: tuple[int, ...]  # where the plugin puts it if the shared balloons hold whole cores
    threads: tuple[int, ...]  # where it puts it as they grew CPU by CPU; () when it could not be NUMA-local

    check: str = SHARED_UNSEEN

    def text(self) -> str:
        return _two_layouts(self.numa, "if the shared balloons held whole cores", self.threads,
                            "as they grew CPU by CPU, container by container", "an odd CPU leaves half a core, and "
                            "the next growth may go to another NUMA node")


class SidecarsNoRoom(NamedTuple):
    shared_milli: int  # the other containers' CPU
    grows: int  # cores the shared balloon grows by
    free: int  # cores free beside the model's ranks

    check: str = INSUFFICIENT_FREE

    def text(self) -> str:
        return (f"its other containers (cpu: {format_cpu(self.shared_milli)} together) grow the shared balloon they "
                f"land in by {self.grows} core{_s(self.grows)}, and beside its ranks {self.free} would be free")


class InitNoRoom(NamedTuple):
    """The balloons plugin runs regular init containers in the shared balloon their namespace routes them to,
    before the pod's other containers; it fails one that balloon cannot grow for, and the pod never starts."""

    init_milli: int  # the most they request at once
    balloon_type: str  # the shared balloon they run in
    grows: int  # cores it grows by for them
    free: int  # cores free now

    check: str = INSUFFICIENT_FREE

    def text(self) -> str:
        return (f"its init containers (cpu: {format_cpu(self.init_milli)} at once) grow balloon "
                f"{self.balloon_type}, where they run before the pod's other containers start, by {self.grows} "
                f"core{_s(self.grows)}, and {self.free} {'is' if self.free == 1 else 'are'} free")


class InitExceedsNode(NamedTuple):
    init_milli: int  # the most its init containers request at once
    balloon_type: str  # the shared balloon they run in
    cores: int  # cores that balloon would hold for them
    most: int  # model cores of the node, the most that balloon could ever grow into

    check: str = INIT_EXCEEDS_NODE

    def text(self) -> str:
        return (f"its init containers (cpu: {format_cpu(self.init_milli)} at once) run in balloon "
                f"{self.balloon_type}, which would need {self.cores} cores for them, and it can never grow into "
                f"more than the {self.most} cores this node has outside its reserved CPUs; lower the init "
                "containers' CPU requests")


class NoFreeMemory(NamedTuple):
    memory: int  # bytes on each of its NUMA nodes
    numa: tuple[int, ...]  # where the plugin would put it

    check: str = INSUFFICIENT_FREE_MEMORY

    def text(self) -> str:
        return (f"needs {fmt_bytes(self.memory)} free memory on each of its NUMA nodes (pinMemory); the plugin would "
                f"put it on {_numa_nodes(self.numa)}")


class PoolTaken(NamedTuple):
    footprint: Described  # best-effort, from the shared pool

    check: str = INSUFFICIENT_FREE

    def text(self) -> str:
        return f"needs {self.footprint.describe()}, more than is unclaimed"


class Unsettled(NamedTuple):
    """A refusal on a node holding pods of unknown placement, which may be the cause."""

    why: Reason

    @property
    def check(self) -> str:
        return self.why.check

    def text(self) -> str:
        return f"{self.why.text()} ({_UNKNOWN})"


# Binding (placement/assume.py): these name the node and pod, as the bind error does.

class UnknownNode(NamedTuple):
    node: str

    check: str = UNKNOWN_NODE

    def text(self) -> str:
        return f"node {self.node} is not known to the extender"


class AlreadyBound(NamedTuple):
    pod: str  # namespace/name
    node: str  # where it is bound

    check: str = ALREADY_BOUND

    def text(self) -> str:
        return f"pod {self.pod} is already bound to node {self.node}"


Reason = (TypeCapped | ComponentMissing | PreferredNumaMissing | NoRoomOnOneNuma | TpExceedsNuma | NoCpu
          | NoBalloonsPolicy | NriNotRunning | BalloonTypeUndefined | RequestOverShares | ExceedsEmptyNode
          | MemoryExceedsNuma | TypeSpansFewer | MaxBalloons | SharesBalloon | RanksCrowded
          | PlacementUnknown | MemoryPlacementUnknown | KubeletOrder | KubeletFreeing | KubeletSplits | PodLeaving
          | ReservedLent | SharedUnseen
          | PackagesUnseen | ThreadsUnseen | SidecarsNoRoom | InitNoRoom | InitExceedsNode | NoFreeMemory
          | PoolTaken | Unsettled | UnknownNode | AlreadyBound | NotKubeletNode | NotPinned | KubeletRejects)


def fmt_bytes(value: int) -> str:
    gib = value / 2**30
    return f"{gib:.0f}Gi" if gib >= 10 or gib == int(gib) else f"{gib:.1f}Gi"


def _s(count: int) -> str:
    return "s" if count != 1 else ""


def _two_layouts(numa: tuple[int, ...], first: str, other: tuple[int, ...], second: str, why: str) -> str:
    """Where the plugin puts it under each of two layouts of the shared balloons that nothing tells apart."""
    where = _numa_nodes(other) if other else "no NUMA node per rank"
    return (f"the balloons plugin would put it on {_numa_nodes(numa)} {first}, and on {where} {second}: {why}; let "
            "the extender read the plugin's NodeResourceTopology")


def numa_cores(spread: tuple[tuple[int, int], ...]) -> str:
    """(NUMA node, cores) pairs as messages write them: "NUMA 0: 12, NUMA 3: 4"."""
    return ", ".join(f"NUMA {i}: {c}" for i, c in spread)


def _numa_nodes(numa: tuple[int, ...]) -> str:
    return f"NUMA node{_s(len(numa))} {', '.join(map(str, numa))}"


def _where(policy: str) -> str:
    # A node's own policy is named after it: said without the name, so the reason stays one per class.
    return f"BalloonsPolicy {policy}" if policy else "the node's own BalloonsPolicy"
