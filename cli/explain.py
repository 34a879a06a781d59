"""`model-placement explain POD`: for one pending model pod, every node with its own numbers (what it has free
per NUMA node, the extender's verdict) and the one change that would make the pod fit there.

The extender's answer to kube-scheduler names no node (so that the scheduler's summary can count its reasons);
this is where an operator sees each node: the same `fit` the extender asks, on the same ledgers.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from extender.filter import describe_demand
from extender.filter import explain as class_reason
from placement import fit as fitmod
from placement import reasons
from placement.cluster import ClusterState, PodRecord
from placement.config import Settings
from placement.demand import ModelDemand
from placement.eligibility import Eligibility
from placement.ledger import NodeLedger
from placement.victims import Candidate, choose
from server.inputs import InputError
from server.sources import load_cluster

# A request lowered to this can still not fit: the change is then not "ask for fewer CPUs".
MIN_CPUS = 1


@dataclass(frozen=True, slots=True)
class NodeVerdict:
    node: str
    fits: bool
    free: str  # per NUMA node: free/capacity cores
    reason: str  # the class's sentence, as the extender answers it; empty when it fits
    change: str  # the one change that would make it fit (or, when it fits, where it would go)

    def to_json(self) -> dict[str, Any]:
        return {"node": self.node, "fits": self.fits, "free": self.free, "reason": self.reason, "change": self.change}


def _with_cpus(demand: ModelDemand, cpus: int) -> ModelDemand:
    return replace(demand, cpu_milli=cpus * 1000)


def _most_cpus(state: ClusterState, demand: ModelDemand, ledger: NodeLedger) -> int | None:
    """The largest whole-CPU request below the pod's own that fits `ledger` as it is (None: none does)."""
    lo, hi, best = MIN_CPUS, demand.cpus - 1, None
    while lo <= hi:
        mid = (lo + hi) // 2
        if state.fit(_with_cpus(demand, mid), ledger).ok:
            best, lo = mid, mid + 1
        else:
            hi = mid - 1
    return best


def _change(state: ClusterState, demand: ModelDemand, ledger: NodeLedger, result: fitmod.Fit) -> str:
    if result.ok:
        where = ", ".join(f"NUMA {n}: {c} cores" for n, c in result.per_numa) or "the shared pool"
        return f"fits now ({where}; score {result.score}/10)"
    if result.resolvable:
        everyone = [Candidate(uid, h.pod) for uid, h in ledger.holdings.items() if not h.assumed]
        outcome = choose(state, demand, ledger, everyone, {})
        if outcome.choice is not None:
            victims = outcome.choice.victims
            return (f"evict {', '.join(v.pod for v in victims)} (NUMA {', '.join(map(str, outcome.choice.numa))}): "
                    f"the fewest model pods whose cores make room; preemption does this only for pods of lower "
                    "priority")
        if result.check != reasons.SHARED_UNSEEN:  # a refusal that says so already needs no eviction named
            # Where an eviction would make room but for the shared balloons nothing says the place of, the change
            # is what would say it, not a smaller request.
            for victim in everyone:
                unseen = state.fit(demand, ledger.scratch(evicted=(victim.uid,)))
                if unseen.check == reasons.SHARED_UNSEEN:
                    return f"evicting {victim.pod} would make room, but {unseen.reason}"
    if result.check == reasons.TP_EXCEEDS_NUMA:
        return f"ask for at most {len(ledger.capacity)} ranks (tensor-parallel-size × pipeline × data parallel)"
    if result.check in (reasons.BALLOON_TYPE_MISSING, reasons.NRI_NOT_RUNNING):
        return ("give the node a BalloonsPolicy that defines balloon type "
                f"{demand.balloon_type} and an NRI balloons plugin that reports Success"
                if result.check == reasons.BALLOON_TYPE_MISSING else "fix the NRI balloons plugin on this node")
    most = _most_cpus(state, demand, ledger)
    if most is not None:
        return f"ask for at most {most} CPUs (the pod asks for {demand.cpus})"
    return "none that the pod can make: the node would need more free model cores"


def explain_pod(state: ClusterState, demand: ModelDemand, eligibility: Eligibility | None) -> list[NodeVerdict]:
    out = []
    for ledger in state.ledgers():
        miss = eligibility.miss(state.nodes[ledger.name]) if eligibility is not None else None
        if miss is not None:  # kube-scheduler's own filters: the extender is never asked about this node
            out.append(NodeVerdict(ledger.name, False, fitmod.fmt_free(ledger, ledger.free()),
                                   f"not offered by kube-scheduler: {miss.reason}", miss.change))
            continue
        result = state.fit(demand, ledger)
        reason = "" if result.ok else class_reason(demand, result)
        out.append(NodeVerdict(ledger.name, result.ok, fitmod.fmt_free(ledger, ledger.free()), reason,
                               _change(state, demand, ledger, result)))
    return out


def find_pod(state: ClusterState, ref: str, namespace: str) -> tuple[str, PodRecord]:
    """POD as NAMESPACE/NAME or NAME (in `namespace`): its display name and record; LookupError if absent."""
    ns, _, name = ref.rpartition("/")
    ns = ns or namespace
    for rec in state.pods.values():
        if (rec.namespace, rec.name) == (ns, name):
            return f"{ns}/{name}", rec
    raise LookupError(f"no pod {ns}/{name} in the cluster (give NAMESPACE/NAME, or -n NAMESPACE)")


def run_explain(args: argparse.Namespace, settings: Settings, say: Callable[[str], None]) -> int:
    state = load_cluster(args, settings, say)
    try:
        pod, rec = find_pod(state, args.pod, args.namespace)
    except LookupError as exc:
        raise InputError(str(exc)) from None
    demand, node = rec.model, rec.node
    if demand is None:
        say(f"{pod} is not a model pod: the extender passes every node for it")
        return 0
    if node is not None:
        say(f"{pod} is not pending: it is bound to node {node}")
        return 0
    verdicts = explain_pod(state, demand, rec.eligibility)
    if args.output == "json":
        print(json.dumps({"pod": pod, "nodes": [v.to_json() for v in verdicts]}, indent=2, ensure_ascii=False))
        return 0
    fitting = sum(v.fits for v in verdicts)
    print(f"{pod}: needs {describe_demand(demand)}; fits {fitting} of {len(verdicts)} nodes now")
    for v in verdicts:
        print(f"{v.node}: {v.free}")
        if v.reason:
            print(f"  why not: {v.reason}")
        print(f"  {'' if v.fits else 'change: '}{v.change}")
    return 0
