"""Why admission refuses a model: one value per kind of refusal, carrying the facts, and `render`, the one place
that turns them into the sentence an operator reads (what was asked, what is free, what to change).

The check id of each (`Refusal.check`) is what metrics, logs and the admission decision key on; the text may
change without them changing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from placement import reasons

POD_SPEC = "pod-spec"
NO_ELIGIBLE_NODE = "no-eligible-node"
MEMORY_MISSING = "memory-missing"
CPU_MISSING = "cpu-missing"
REPLICAS = "replicas-do-not-fit"
NOT_MUTATED = "not-mutated"


def names(items: Sequence[str], limit: int = 4) -> str:
    return ", ".join(items[:limit]) + (", …" if len(items) > limit else "")


def _plural(count: int) -> str:
    return "s" if count != 1 else ""


@dataclass(frozen=True, slots=True)
class PodSpecProblems:
    problems: tuple[str, ...]
    check = POD_SPEC


@dataclass(frozen=True, slots=True)
class NoEligibleNode:
    what: str  # the pod and its model container, as the summary names them
    why: str  # each reason kube-scheduler would give, with its count
    check = NO_ELIGIBLE_NODE


@dataclass(frozen=True, slots=True)
class TooFewNumaNodes:
    ranks: str
    numa_nodes: int  # the ranks need
    eligible: tuple[str, ...]
    most: int  # NUMA nodes the best eligible node has
    fewer: str  # the rank layout that would fit
    check = reasons.TP_EXCEEDS_NUMA


@dataclass(frozen=True, slots=True)
class NotGuaranteed:
    pod: str
    containers: tuple[str, ...]
    resource: str  # "memory" or "cpu"

    @property
    def check(self) -> str:
        return MEMORY_MISSING if self.resource == "memory" else CPU_MISSING


@dataclass(frozen=True, slots=True)
class UnknownBalloonType:
    pod: str
    balloon_type: str
    eligible: tuple[str, ...]
    default_type: str  # what the pod gets without the annotation
    check = reasons.BALLOON_TYPE_MISSING


@dataclass(frozen=True, slots=True)
class LargerThanAnyNode:
    asked: str  # the request as written and what it costs
    eligible: int
    numa_nodes: int
    largest: str  # the eligible node with the most room when empty
    largest_cores: int  # its model cores per NUMA node
    most_cpu: int  # the largest `cpu:` that fits it, 0 when none does
    ranks: str
    wider_tp: int | None  # a tensor-parallel size that spreads over more NUMA nodes, where nodes have them
    check = reasons.FOOTPRINT_EXCEEDS_NODE


@dataclass(frozen=True, slots=True)
class NeverFits:
    asked: str
    nodes: tuple[tuple[str, reasons.Reason], ...]  # (node, why it does not fit), the first few
    more: bool

    @property
    def check(self) -> str:
        return self.nodes[0][1].check


@dataclass(frozen=True, slots=True)
class NoRoomNow:
    asked: str
    eligible: int
    most_free: tuple[tuple[str, str], ...]  # (node, its free cores per NUMA node), the freest few
    why: tuple[str, ...]
    check = reasons.INSUFFICIENT_FREE


@dataclass(frozen=True, slots=True)
class TooManyReplicas:
    pod: str
    placed: int
    replicas: int
    footprint: str
    feasible: int
    eligible: int
    check = REPLICAS


@dataclass(frozen=True, slots=True)
class NotMutated:
    pod: str
    annotation: str  # the one our mutating webhook always writes
    check = NOT_MUTATED


Refusal = (PodSpecProblems | NoEligibleNode | TooFewNumaNodes | NotGuaranteed | UnknownBalloonType
           | LargerThanAnyNode | NeverFits | NoRoomNow | TooManyReplicas | NotMutated)


def render(refusal: Refusal) -> str:
    match refusal:
        case PodSpecProblems(problems):
            return "; ".join(problems)
        case NoEligibleNode(what, why):
            return f"{what}: {why}"
        case TooFewNumaNodes(ranks, numa_nodes, eligible, most, fewer):
            return (f"{ranks} needs a node with at least {numa_nodes} NUMA nodes, one per rank; the "
                    f"{len(eligible)} eligible node{_plural(len(eligible))} have at most {most} "
                    f"({names(eligible)}). Use {fewer}, or add a node with ≥{numa_nodes} NUMA nodes.")
        case NotGuaranteed(pod, containers, "memory"):
            return (f"{pod}: kubelet-static pins cores only for Guaranteed pods, and container(s) "
                    f"{', '.join(containers)} set no memory request or limit. Set resources.limits.memory "
                    "(and the same requests.memory) on every container and init container.")
        case NotGuaranteed(pod, containers, _):
            return (f"{pod}: kubelet-static pins cores only for Guaranteed pods, and container(s) "
                    f"{', '.join(containers)} set no cpu request or limit, so the pod would be Burstable and get "
                    "no exclusive cores. Set resources.limits.cpu (and the same requests.cpu) on every "
                    "container and init container; a fractional value such as 100m keeps a sidecar in the "
                    "shared pool.")
        case UnknownBalloonType(pod, balloon_type, eligible, default_type):
            return (f"{pod} asks for balloon type {balloon_type}, which no BalloonsPolicy defines for the "
                    f"{len(eligible)} eligible nodes ({names(eligible)}) with a running NRI balloons plugin. Add "
                    "the type to the BalloonsPolicy, or remove the model-manager.io/nri-balloon annotation to use "
                    f"{default_type}.")
        case LargerThanAnyNode(asked, eligible_count, numa_nodes, largest, cores, most_cpu, ranks, wider_tp):
            advice = f"Request at most cpu: {most_cpu} for {ranks}" if most_cpu > 0 else "Use a smaller model"
            if wider_tp is not None:
                advice += f", or use tensor-parallel-size {wider_tp} to spread over more NUMA nodes"
            return (f"{asked}, more than any of the {eligible_count} eligible node{_plural(eligible_count)} with "
                    f"≥{numa_nodes} NUMA nodes has even when empty (largest: {largest}, {cores} model cores per "
                    f"NUMA node). {advice}.")
        case NeverFits(asked, nodes, more):
            detail = "; ".join(f"{node}: {why.text()}" for node, why in nodes) + ("; …" if more else "")
            return f"{asked}, and no eligible node can ever hold it: {detail}"
        case NoRoomNow(asked, eligible_count, most_free, why):
            free_text = "; ".join(f"{node}: {free}" for node, free in most_free)
            return (f"{asked}; none of the {eligible_count} eligible nodes has that free now (most free: "
                    f"{free_text}; {'; '.join(why)}). Scale down or delete another model on these nodes, lower the "
                    "CPU request, or add capacity.")
        case TooManyReplicas(pod, placed, replicas, footprint, feasible, eligible_count):
            return (f"{pod}: only {placed} of {replicas} replicas fit at once ({footprint} each; {feasible} of "
                    f"{eligible_count} eligible nodes have room now). Use replicas: {placed} or fewer, lower the CPU "
                    "request, or free capacity.")
        case NotMutated(pod, annotation):
            return (f"{pod} was not processed by the model-placement mutating webhook (it has no {annotation} "
                    "annotation), so it would run without CPU pinning. The mutating webhook was probably "
                    "unavailable: check `kubectl -n model-placement get pods,endpoints`; a Deployment's ReplicaSet "
                    "retries on its own.")
    raise AssertionError(f"no text for {refusal!r}")  # pragma: no cover - every kind is matched above
