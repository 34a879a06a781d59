"""`render`: the server's dry run. Each object goes through exactly what the apiserver would make of it:
`/mutate`'s answer (its patch applied), then `/validate` of the patched object, then the extender's `/filter`
and `/prioritize` over the nodes kube-scheduler would hand it. The same functions the servers run, called
in-process, so a verdict, a patch or a reason here cannot differ from theirs."""

from __future__ import annotations

import base64
import sys
import textwrap
from collections.abc import Mapping, Sequence
from typing import Any

import orjson
import yaml

from extender.filter import Judge, filter_nodes
from extender.score import prioritize
from placement.admission import WORKLOAD_KINDS, NotAdmissible, subject_of
from placement.cluster import ClusterState
from placement.fit import placed_cpus
from placement.mutation import mutate_pod
from server.inputs import plural
from webhook.patch import apply_patch
from webhook.review import POD_SHAPE, WORKLOAD_SHAPE, ReviewError, parse_review, shape_problem
from webhook.routes import Context, Outcome, mutate_review, validate_review

# Exit codes: the command line's (docs/operations.md, "The command line").
ADMITTED, BAD_INPUT, REFUSED = 0, 2, 3
JUDGED = ("Pod", *WORKLOAD_KINDS)


def admission_review(obj: Mapping[str, Any], uid: str, operation: str = "CREATE") -> dict[str, Any]:
    """The AdmissionReview the apiserver sends for `kubectl create -f` of `obj`."""
    kind = str(obj.get("kind") or "")
    api = str(obj.get("apiVersion") or ("v1" if kind == "Pod" else "apps/v1"))
    group, _, version = api.rpartition("/")
    raw_meta = obj.get("metadata")
    meta: Mapping[str, Any] = raw_meta if isinstance(raw_meta, Mapping) else {}
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": uid, "kind": {"group": group, "version": version, "kind": kind},
        "namespace": str(meta.get("namespace") or "default"), "name": str(meta.get("name") or ""),
        "operation": operation, "object": obj}}


def patch_of(outcome: Outcome) -> list[dict[str, Any]]:
    encoded = outcome.review["response"].get("patch")
    return orjson.loads(base64.b64decode(encoded)) if encoded else []


def _verdict(outcome: Outcome | None) -> dict[str, Any]:
    """An answer as the apiserver reads it; None: the webhook was not asked."""
    if outcome is None:
        return {"allowed": True, "decision": "not-asked", "reason": "", "message": "", "warnings": []}
    response = outcome.review["response"]
    return {"allowed": response["allowed"], "decision": outcome.decision, "reason": outcome.reason,
            "message": (response.get("status") or {}).get("message", ""), "warnings": response.get("warnings", [])}


def render(objects: Sequence[Any], state: ClusterState) -> list[dict[str, Any]]:
    return [render_one(obj, state, f"render-{i}") for i, obj in enumerate(objects, 1)]


def render_one(obj: Any, state: ClusterState, uid: str) -> dict[str, Any]:
    kind = obj.get("kind") if isinstance(obj, Mapping) else None
    if kind not in JUDGED:
        return {"object": f"{kind or 'object without a kind'}", "exit": BAD_INPUT,
                "error": f"kind {kind!r} is not judged here; expected Pod, Deployment or StatefulSet"}
    label = f"{kind} {_display(obj)}"
    try:
        if kind == "Pod":
            entry = {"object": label, **_mutated_pod(obj, state, uid)}
            judged = entry["mutated"]  # the apiserver validates the patched pod
        else:
            # What each replica gets from /mutate, shown in the template; the workload itself is not patched.
            entry = {"object": label, "mutation": _verdict(None), "patch": [], "mutated": obj}
            if shape_problem(obj, WORKLOAD_SHAPE) is None:
                pod = _mutated_pod(dict(subject_of(obj).pod), state, uid)
                entry.update(pod, mutated=_with_template(obj, pod["mutated"]))
            judged = obj
        outcome = validate_review(parse_review(admission_review(judged, uid)), Context(state))
    except (NotAdmissible, ReviewError) as exc:
        return {"object": label, "exit": BAD_INPUT, "error": str(exc)}
    entry["verdict"] = _verdict(outcome)
    if outcome.reason == "unreadable":
        entry["exit"] = BAD_INPUT
    else:
        entry["exit"] = ADMITTED if entry["verdict"]["allowed"] else REFUSED
    try:
        subject = subject_of(entry["mutated"])
    except NotAdmissible:
        return entry  # nothing any node could be asked about
    pod = dict(subject.pod)
    if shape_problem(pod, POD_SHAPE) is None:  # what /mutate reads before it judges; the extender reads less
        entry.update(_nodes(pod, state))
        if entry.get("excluded") and not entry["ranking"] and not entry["filtered"]:
            entry["exit"] = REFUSED  # admitted (warn, skip), but kube-scheduler itself offers it no node
    if entry.get("demand"):
        entry["demand"]["replicas"] = subject.replicas
    return entry


def _display(obj: Mapping[str, Any]) -> str:
    raw_meta = obj.get("metadata")
    meta: Mapping[str, Any] = raw_meta if isinstance(raw_meta, Mapping) else {}
    generated = f"{meta['generateName']}*" if meta.get("generateName") else "*"
    return f"{meta.get('namespace') or 'default'}/{meta.get('name') or generated}"


def _mutated_pod(pod: Mapping[str, Any], state: ClusterState, uid: str) -> dict[str, Any]:
    """/mutate's answer for a pod, and the pod with its patch applied as the apiserver applies it."""
    outcome = mutate_review(parse_review(admission_review(pod, uid)), Context(state))
    ops = patch_of(outcome)
    return {"mutation": _verdict(outcome), "patch": ops, "mutated": apply_patch(pod, ops) if ops else pod}


def _with_template(workload: Mapping[str, Any], pod: Mapping[str, Any]) -> dict[str, Any]:
    out = orjson.loads(orjson.dumps(workload))
    template = out["spec"]["template"]
    meta = dict(pod["metadata"])
    meta.pop("namespace", None)
    if not (workload["spec"]["template"].get("metadata") or {}).get("name"):
        meta.pop("name", None)  # subject_of names the template after the workload, for messages only
    template["metadata"] = meta
    template["spec"] = pod["spec"]
    return out


# -- which nodes, and why not the others -------------------------------------------------------------

def _nodes(pod: Mapping[str, Any], state: ClusterState) -> dict[str, Any]:
    """Every node: not offered by kube-scheduler (its own filters: cordons, taints, affinity), or the extender's
    verdict and score; /filter applies the same eligibility rule, so one call answers both."""
    judge = Judge(state)
    ref = judge.read_pod(pod)
    if ref.demand is None:
        return {}
    out = filter_nodes(judge, ref, sorted(state.nodes))
    scores = dict(zip(out.passed, prioritize(judge, ref, out.passed)))
    ranking = []
    for name in sorted(out.passed, key=lambda n: (-scores[n], n)):
        ledger = state.ledger(name)
        fit = state.fit(ref.demand, ledger) if ledger is not None else None
        ranking.append({"node": name, "score": scores[name],
                        "numa_cores": {str(n): c for n, c in fit.per_numa} if fit is not None else {},
                        "agent": ledger.agent() if ledger is not None else "",
                        **({"cpus": {c: str(cpus) for c, cpus in placed_cpus(fit)}, "split": fit.split}
                           if fit is not None and fit.admitted is not None else {})})
    # The extender completes a reason with the most any node refused with it has free (the reason
    # kube-scheduler gets, shown as is); each node's line adds the node's own free cores.
    filtered = [{"node": n, "list": lst, "reason": why, "free": _free(state, n), "agent": _agent(state, n)}
                for lst, reasons in (("FailedNodes", out.failed), ("FailedAndUnresolvableNodes", out.unresolvable))
                for n, why in reasons.items() if n not in out.ineligible]
    excluded = [{"node": n, "reason": miss.reason} for n, miss in out.ineligible.items()]
    return {"demand": _demand(pod, state), "ranking": ranking, "filtered": filtered, "excluded": excluded}


def _agent(state: ClusterState, name: str) -> str:
    ledger = state.ledger(name)
    return ledger.agent() if ledger is not None else ""


def _free(state: ClusterState, name: str) -> dict[str, int]:
    ledger = state.ledger(name)
    return {str(k): cores for k, cores in enumerate(ledger.free())} if ledger is not None else {}


def _demand(pod: Mapping[str, Any], state: ClusterState) -> dict[str, Any]:
    mutation = mutate_pod(pod, state, str((pod.get("metadata") or {}).get("namespace") or "default"))
    d = mutation.demand
    if d is None:
        return {}
    return {"model_container": d.container, "tp": d.tp, "tp_source": d.tp_source, "cpus": d.cpus,
            "requested_policy": d.requested_policy,
            "policy": mutation.resolution.policy if mutation.resolution else None,
            "reason": mutation.resolution.reason if mutation.resolution else None,
            "balloon_type": d.balloon_type, "preflight": d.preflight, "problems": list(d.problems)}


# -- output ------------------------------------------------------------------------------------------

class _Dumper(yaml.SafeDumper):
    """Never `&id001` / `*id001`: an object shown twice (a template's spec and the pod's) is written out
    twice, as kubectl would, so a reader or `kubectl apply -f` of a piece of it needs no anchor."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def dump_yaml(value: Any, many: bool = False) -> str:
    """YAML as a person reads it: unicode as unicode, keys in their order, no aliases."""
    return yaml.dump_all(value if many else [value], Dumper=_Dumper, sort_keys=False, width=120,
                         allow_unicode=True)


WIDTH = 120


def _say(out: Any, text: str, indent: int = 0, hang: int = 4) -> None:
    """One item of the text output, wrapped to WIDTH; continuation lines indented under it."""
    print(textwrap.fill(text, WIDTH, initial_indent=" " * indent, subsequent_indent=" " * (indent + hang),
                        break_on_hyphens=False, break_long_words=False), file=out)


def print_text(results: list[dict[str, Any]], out: Any = sys.stdout) -> None:
    for entry in results:
        print(f"=== {entry['object']}", file=out)
        if "error" in entry:
            _say(out, f"error: {entry['error']}", 2)
            print(file=out)
            continue
        d = entry.get("demand")
        if d:
            if d["problems"]:  # nothing is resolved for a spec that must be fixed first (the verdict says why)
                placed = f"policy {d['requested_policy']} requested, no balloon until the spec is fixed"
            else:
                reason = f" (requested {d['requested_policy']}: {d['reason']})" if d["reason"] else ""
                balloon = f", balloon {d['balloon_type']}" if d["policy"] == "nri-balloons" else ""
                placed = f"policy {d['policy']}{reason}{balloon}"
            _say(out, f"demand:  model container {d['model_container']!r}, {d['cpus']} CPUs, TP={d['tp']} "
                      f"({d['tp_source']}), {placed}, {plural(d['replicas'], 'replica')}, preflight {d['preflight']}",
                 hang=9)
        v = entry["verdict"]
        print(f"verdict: {'ADMITTED' if v['allowed'] else 'REFUSED'} [{v['reason']}]", file=out)
        if v["message"]:
            _say(out, v["message"], 2, 2)
        for w in v["warnings"]:
            _say(out, f"warning: {w}", 2)
        for w in entry["mutation"]["warnings"]:
            _say(out, f"/mutate warning: {w}", 2)
        if "ranking" in entry:
            print("nodes (what the extender answers kube-scheduler, best first):", file=out)
            for i, r in enumerate(entry["ranking"], 1):
                numa = ", ".join(f"NUMA {n}: {plural(c, 'core')}" for n, c in r["numa_cores"].items())
                cpus = "; ".join(f"{c} on CPUs {v}" for c, v in r.get("cpus", {}).items())
                placed = (numa or "shared pool") + (f" ({cpus})" if cpus else "") + \
                    (", split: a rank's share not whole on one NUMA node" if r.get("split") else "")
                _say(out, f"{i:>2}. {r['node']:<16} score {r['score']:>2}/10  {placed}  [{r['agent']}]", 2, 21)
            for f in entry["filtered"]:
                own = ", ".join(f"NUMA {n}: {c}" for n, c in f["free"].items())
                _say(out, f" -  {f['node']:<16} {f['list']}: {f['reason']}" + (f" [this node has free: {own} cores; "
                                                                             f"{f['agent']}]" if own else ""), 2, 21)
            for x in entry["excluded"]:
                _say(out, f" x  {x['node']:<16} not offered by kube-scheduler: {x['reason']}", 2, 21)
            if entry["excluded"] and not entry["ranking"] and not entry["filtered"]:
                _say(out, "kube-scheduler offers it none of these nodes: it would stay Pending.", 2)
        print(f"patch (/mutate): {plural(len(entry['patch']), 'operation')}", file=out)
        print("mutated object:", file=out)
        print("  " + dump_yaml(entry["mutated"]).replace("\n", "\n  ").rstrip(), file=out)
        print(file=out)


def exit_code(results: list[dict[str, Any]]) -> int:
    codes = {entry["exit"] for entry in results}
    return BAD_INPUT if BAD_INPUT in codes else REFUSED if REFUSED in codes else ADMITTED

