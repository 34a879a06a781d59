"""A tainted node, judged by the real kube-scheduler and by us: a model pod that does not tolerate the taint is
kept off it by kube-scheduler's TaintToleration filter, and our webhook, `render` and `explain` say so for the
same taint; the pod that tolerates it is bound there through our extender."""

from __future__ import annotations

import json
import re
from typing import Any

import yaml

from tests.e2e.cluster import Cluster, node, wait_until
from tests.e2e.fleet import MODEL_NS, POOL, model_pod
from tests.e2e.test_placement import model_placement

TAINT = {"key": "e2e.model-placement.io/dedicated", "value": "batch", "effect": "NoSchedule"}
NODE = "tainted-0"
SAID = "taint e2e.model-placement.io/dedicated=batch:NoSchedule is not tolerated"


def pending_condition(cluster: Cluster, name: str) -> dict[str, Any] | None:
    got = cluster.kubectl_json("-n", MODEL_NS, "get", "pod", name)
    return next((c for c in got["status"].get("conditions", [])
                 if c["type"] == "PodScheduled" and c["status"] == "False" and c.get("message")), None)


def test_kube_scheduler_and_we_refuse_the_same_tainted_node(cluster: Cluster) -> None:
    tainted = node(NODE, numa=2, cores_per_numa=32, labels={POOL: "tainted"})
    tainted["spec"]["taints"] = [TAINT]
    cluster.create_nodes([tainted])
    pods = ["untolerating", "tolerating"]
    try:
        # Not tolerated: admitted only because of preflight warn, with our refusal as the warning.
        pod = model_pod(pods[0], MODEL_NS, tp=1, cpu="16", memory="32Gi", node_selector={POOL: "tainted"},
                        annotations={"model-manager.io/preflight": "warn"})
        applied = cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(pod))
        # One warning per 120 characters, each continuation marked "… ".
        warned = " ".join(line.removeprefix("Warning: ").removeprefix("… ") for line in applied.stderr.splitlines())
        print("kubectl apply:", applied.stderr)
        assert "kube-scheduler would offer it none of the" in warned and SAID in warned, warned
        cond = wait_until("PodScheduled=False on the untolerating pod", lambda: pending_condition(cluster, pods[0]),
                          timeout=90)
        print("kube-scheduler:", cond["message"])
        # kube-scheduler's own verdict on the node: its TaintToleration filter, not our extender.
        assert re.search(r"\b1 node\(s\) had untolerated taint", cond["message"]), cond["message"]
        kubeconfig = str(cluster.admin_kubeconfig)
        explained = model_placement("--kubeconfig", kubeconfig, "explain", f"{MODEL_NS}/{pods[0]}", "-o", "json")
        assert explained.returncode == 0, explained.stderr
        verdict = {n["node"]: n for n in json.loads(explained.stdout)["nodes"]}[NODE]
        assert not verdict["fits"] and verdict["reason"] == f"not offered by kube-scheduler: {SAID}", verdict
        manifest = cluster.root / "untolerating.yaml"
        manifest.write_text(yaml.safe_dump({**pod, "metadata": {**pod["metadata"], "annotations": {}}}))
        rendered = model_placement("render", str(manifest), "--kubeconfig", kubeconfig, "-o", "json")
        assert rendered.returncode == 3, rendered.stdout[-2000:] + rendered.stderr
        [entry] = json.loads(rendered.stdout)
        assert not entry["verdict"]["allowed"] and entry["verdict"]["reason"] == "no-eligible-node"
        assert {"node": NODE, "reason": SAID} in entry["excluded"] and not entry["ranking"]

        # Tolerated: admitted without a word and bound there by our extender.
        pod = model_pod(pods[1], MODEL_NS, tp=1, cpu="16", memory="32Gi", node_selector={POOL: "tainted"})
        pod["spec"]["tolerations"] = [{**TAINT, "operator": "Equal"}]
        applied = cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(pod))
        assert "Warning" not in applied.stderr, applied.stderr
        bound = wait_until("the tolerating pod bound", lambda: cluster.kubectl_json(
            "-n", MODEL_NS, "get", "pod", pods[1])["spec"].get("nodeName"), timeout=90)
        assert bound == NODE
    finally:
        cluster.kubectl("-n", MODEL_NS, "delete", "pod", *pods, "--grace-period=0", "--force", "--ignore-not-found",
                        check=False)
        cluster.kubectl("delete", "node", NODE, "--ignore-not-found", check=False)
