"""The `model-placement` command: render, report, serve | webhook | extender, certs, balloons-policy."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from collections.abc import Sequence
from dataclasses import replace
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from placement.admission import NotAdmissible, subject_of, validate
from placement.cluster import ClusterState
from placement.config import ConfigError, Settings, load_settings
from placement.demand import pod_display_name
from placement.preflight import rank
from server import logs

log = logging.getLogger("model_placement.cli")

DEFAULT_PORTS = {"webhook": 8443, "extender": 8444, "serve": 8443}


# -- loading -----------------------------------------------------------------------------------------

def load_objects(text: str) -> list[dict[str, Any]]:
    """A `kubectl get … -o yaml` List, a JSON List, or multi-document YAML, flattened to objects."""
    out: list[dict[str, Any]] = []
    for doc in yaml.safe_load_all(text):
        if not isinstance(doc, dict):
            continue
        if doc.get("kind", "").endswith("List") and isinstance(doc.get("items"), list):
            for item in doc["items"]:
                if isinstance(item, dict):
                    # kubectl's typed lists (PodList…) leave kind off the items.
                    item.setdefault("kind", doc["kind"].removesuffix("List") or item.get("kind"))
                    out.append(item)
        else:
            out.append(doc)
    return out


def demo_text() -> str:
    return resources.files("placement").joinpath("demo/cluster.yaml").read_text()


def load_cluster(args: argparse.Namespace, settings: Settings) -> ClusterState:
    if getattr(args, "kubeconfig", None) or getattr(args, "in_cluster", False):
        from server.kubeapi import make_api_client
        from server.kubesource import list_once

        state = ClusterState(settings)
        list_once(state, make_api_client(args.kubeconfig, args.in_cluster))
        return state
    text = Path(args.cluster).read_text() if getattr(args, "cluster", None) else demo_text()
    return ClusterState.from_objects(load_objects(text), settings)


def load_config(args: argparse.Namespace) -> Settings:
    return load_settings(getattr(args, "config", None))


# -- report ------------------------------------------------------------------------------------------

def report(state: ClusterState) -> list[dict[str, Any]]:
    return [ledger.to_json() for ledger in state.ledgers()]


def print_report_table(state: ClusterState, out: Any = sys.stdout) -> None:
    header = f"{'NODE':<12} {'NUMA':>4} {'CPUS':<22} {'RESERVED':<16} {'CORES':>5} {'FREE':>5}  MODEL PODS (balloon, cores)"
    print(header, file=out)
    print("-" * len(header), file=out)
    for ledger in state.ledgers():
        free = ledger.free()
        nri = ledger.nri
        policy = f"{nri.policy.namespace}/{nri.policy.name}" if nri.policy else "no BalloonsPolicy"
        status = "" if nri.running else f", NRI {nri.status or 'absent'}"
        print(f"{ledger.name:<12} {ledger.topology.numa_count} NUMA × {len(ledger.topology.numa_nodes[0].cores) if ledger.topology.numa_nodes else 0} cores"
              f" × {ledger.threads_per_core} threads (from {ledger.topology.source}); reserved {ledger.reserved} from {ledger.reserved_source};"
              f" {policy}{status}; shared pool {ledger.shared_milli / 1000:g}/{ledger.shared_pool_cpus} CPUs requested"
              f"{f', {ledger.elastic_cores} model cores lent to it' if ledger.elastic_cores else ''}", file=out)
        for numa in ledger.topology.numa_nodes:
            pods = [
                f"{h.pod.split('/', 1)[-1]} ({h.balloon_type or 'kubelet-static'}, {c}{' assumed' if h.assumed else ''})"
                for h in ledger.holdings.values() for n, c in h.per_numa if n == numa.id
            ]
            print(f"{'':<12} {numa.id:>4} {str(numa.cpus):<22} {str(ledger.reserved & numa.cpus) or '-':<16} "
                  f"{ledger.capacity[numa.id]:>5} {free[numa.id]:>5}  {'; '.join(pods) or '-'}", file=out)
    total_free = sum(sum(ledger.free()) for ledger in state.ledgers())
    total = sum(sum(ledger.capacity) for ledger in state.ledgers())
    print(f"\n{len(state.nodes)} nodes, {total_free} of {total} model cores free "
          "(CORES: physical cores no reserved CPU touches; FREE: not held by model pods or the shared pool)", file=out)
    for note in state.notes:
        print(f"note: {note}", file=out)


# -- render ------------------------------------------------------------------------------------------

def render(objects: Sequence[dict[str, Any]], state: ClusterState) -> list[dict[str, Any]]:
    results = []
    for obj in objects:
        try:
            subject = subject_of(obj)
        except NotAdmissible as exc:
            results.append({"object": f"{obj.get('kind')}/{(obj.get('metadata') or {}).get('name')}", "error": str(exc)})
            continue
        decision = validate(subject, state)
        mutation = decision.mutation
        demand = mutation.demand
        entry: dict[str, Any] = {"object": f"{subject.kind} {pod_display_name(obj, subject.namespace)}"}
        if demand is None:
            entry["skipped"] = mutation.skipped
            results.append(entry)
            continue
        entry["demand"] = {
            "model_container": demand.container, "tp": demand.tp, "tp_source": demand.tp_source,
            "cpus": demand.cpus, "requested_policy": demand.requested_policy,
            "policy": mutation.resolution.policy if mutation.resolution else None,
            "reason": mutation.resolution.reason if mutation.resolution else None,
            "balloon_type": demand.balloon_type, "replicas": subject.replicas, "preflight": demand.preflight,
        }
        entry["verdict"] = {
            "allowed": decision.allowed, "check": decision.check, "message": decision.message,
            "warnings": list(decision.warnings),
        }
        # The extender counts what is held now (admission counts the model's own pods as free).
        resolved = replace(demand, resolved_policy=entry["demand"]["policy"])
        fits = rank([state.fit(resolved, ledger) for ledger in state.eligible(mutation.pod["spec"])])
        entry["ranking"] = [
            {"node": f.node, "score": f.score, "numa_cores": {str(n): c for n, c in f.per_numa}} for f in fits if f.ok
        ]
        entry["filtered"] = [
            {"node": f.node, "list": "FailedNodes" if f.resolvable else "FailedAndUnresolvableNodes",
             "check": f.check, "reason": f.reason} for f in fits if not f.ok
        ]
        entry["mutated"] = _as_object(obj, subject.kind, mutation.pod)
        results.append(entry)
    return results


def _as_object(original: dict[str, Any], kind: str, pod: dict[str, Any]) -> dict[str, Any]:
    if kind == "Pod":
        return pod
    out = json.loads(json.dumps(original))
    template = out["spec"]["template"]
    meta = dict(pod["metadata"])
    meta.pop("namespace", None)
    if not (original["spec"]["template"].get("metadata") or {}).get("name"):
        meta.pop("name", None)
    template["metadata"] = meta
    template["spec"] = pod["spec"]
    return out


def print_render_text(results: list[dict[str, Any]], out: Any = sys.stdout) -> None:
    for entry in results:
        print(f"=== {entry['object']}", file=out)
        if "error" in entry or "skipped" in entry:
            print(f"  {entry.get('error') or 'left alone: ' + str(entry['skipped'])}\n", file=out)
            continue
        d = entry["demand"]
        reason = f" (requested {d['requested_policy']}: {d['reason']})" if d["reason"] else ""
        print(f"demand:  model container {d['model_container']!r}, {d['cpus']} CPUs, TP={d['tp']} "
              f"({d['tp_source']}), policy {d['policy']}{reason}, balloon {d['balloon_type']}, "
              f"replicas {d['replicas']}, preflight {d['preflight']}", file=out)
        v = entry["verdict"]
        state = "ADMITTED" if v["allowed"] else "REFUSED"
        print(f"verdict: {state}" + (f" [{v['check']}]" if v["message"] else ""), file=out)
        if v["message"]:
            print(f"  {v['message']}", file=out)
        for w in v["warnings"]:
            print(f"  warning: {w}", file=out)
        print("ranking (what the extender answers):", file=out)
        for i, r in enumerate(entry["ranking"], 1):
            numa = ", ".join(f"NUMA {n}: {c} cores" for n, c in r["numa_cores"].items()) or "shared pool"
            print(f"  {i}. {r['node']:<12} score {r['score']:>2}/10  {numa}", file=out)
        for f in entry["filtered"]:
            print(f"  -  {f['node']:<12} {f['list']}: {f['reason']}", file=out)
        print("mutated object:", file=out)
        print("  " + yaml.safe_dump(entry["mutated"], sort_keys=False, width=120).replace("\n", "\n  ").rstrip(), file=out)
        print(file=out)


# -- servers -----------------------------------------------------------------------------------------

def run_server(args: argparse.Namespace, settings: Settings) -> int:
    from server.runner import run

    return asyncio.run(run(args, settings))


# -- main --------------------------------------------------------------------------------------------

def _cluster_flags(p: argparse.ArgumentParser, live: bool = True) -> None:
    group = p.add_mutually_exclusive_group()
    group.add_argument("--cluster", metavar="FILE", help="kubectl get nodes,pods,balloonspolicies,"
                       "noderesourcetopologies -A -o yaml output (default: the bundled demo fleet)")
    group.add_argument("--kubeconfig", metavar="FILE", help="read the live cluster through this kubeconfig")
    if live:
        group.add_argument("--in-cluster", action="store_true", help="use the pod's service account")
    p.add_argument("--config", metavar="FILE", help="settings YAML (environment MM_* overrides it)")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="model-placement", description=__doc__)
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    sub = p.add_subparsers(dest="command", required=True)

    r = sub.add_parser("render", help="dry run: mutated object, verdict, node ranking with reasons")
    r.add_argument("file", help="a Pod, Deployment or StatefulSet manifest (multi-document YAML is fine)")
    _cluster_flags(r)
    r.add_argument("-o", "--output", choices=["text", "yaml", "json"], default="text")

    rep = sub.add_parser("report", help="per node and NUMA node: model pods, balloons, CPUs, free")
    _cluster_flags(rep)
    rep.add_argument("-o", "--output", choices=["table", "json"], default="table")

    for name in ("serve", "webhook", "extender"):
        s = sub.add_parser(name, help={"serve": "webhook and extender in one process",
                                       "webhook": "the admission webhook (/mutate, /validate)",
                                       "extender": "the scheduler extender (/filter, /prioritize, /bind)"}[name])
        _cluster_flags(s)
        s.add_argument("--host", default="0.0.0.0")
        s.add_argument("--port", type=int, default=DEFAULT_PORTS[name])
        s.add_argument("--tls-cert", metavar="FILE")
        s.add_argument("--tls-key", metavar="FILE")
        s.add_argument("--client-ca", metavar="FILE", help="require client certificates signed by this CA")
        s.add_argument("--insecure-http", action="store_true", help="plain HTTP (tests, or an http:// extender URL)")
        s.add_argument("--cert-check-seconds", type=float, default=10.0)
        s.add_argument("--shutdown-grace-seconds", type=float, default=20.0)
        s.add_argument("--drain-seconds", type=float, default=2.0)
        s.add_argument("--extender-body-limit", type=int, default=None, metavar="BYTES")

    c = sub.add_parser("certs", help="CA + serving certificate + caBundle")
    c.add_argument("--service", required=True)
    c.add_argument("--namespace", required=True)
    c.add_argument("--out", default=".")
    c.add_argument("--days", type=int, default=365)

    b = sub.add_parser("balloons-policy", help="render the per-node BalloonsPolicy from the topology model")
    b.add_argument("nodes", nargs="*", metavar="NODE")
    _cluster_flags(b)
    b.add_argument("--namespace", default="kube-system")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logs.configure(args.log_level)
    try:
        if args.command == "certs":
            from certs import run_certs_command

            return run_certs_command(args.service, args.namespace, args.out, args.days)
        settings = load_config(args)
        if args.command in ("serve", "webhook", "extender"):
            return run_server(args, settings)
        state = load_cluster(args, settings)
        if args.command == "report":
            if args.output == "json":
                print(json.dumps(report(state), indent=2))
            else:
                print_report_table(state)
            return 0
        if args.command == "render":
            results = render(load_objects(Path(args.file).read_text()), state)
            if args.output == "json":
                print(json.dumps(results, indent=2))
            elif args.output == "yaml":
                print(yaml.safe_dump_all(results, sort_keys=False, width=120))
            else:
                print_render_text(results)
            return 0 if all(r.get("verdict", {}).get("allowed", True) for r in results) else 3
        if args.command == "balloons-policy":
            from server.policies import balloons_policies

            print(yaml.safe_dump_all(balloons_policies(state, args.nodes, args.namespace), sort_keys=False))
            return 0
    except (LookupError, ConfigError, OSError, yaml.YAMLError) as exc:
        print(f"model-placement: {exc}", file=sys.stderr)
        return 2
    return 1


if __name__ == "__main__":
    sys.exit(main())
