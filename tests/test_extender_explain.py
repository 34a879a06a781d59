"""`model-placement explain POD`: what the extender's node-free answer leaves out, per node: its own free cores,
the reason of its class, and the one change that would make the pod fit there. Through the real command."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from server.sources import demo_text, load_objects
from tests.support.extender import model_pod
from tests.support.payloads import tainted

ROOT = Path(__file__).resolve().parents[1]


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


def cluster_file(tmp_path: Path, *pods: dict[str, Any], without: tuple[str, str] | None = None) -> str:
    """The demo fleet with `pods` added and the object `without` (kind, name) left out."""
    items = [o for o in load_objects(demo_text()) if (o["kind"], o["metadata"]["name"]) != without]
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": [*items, *pods]}))
    return str(path)


def test_every_node_with_its_numbers_and_the_change_that_would_fit(tmp_path: Path) -> None:
    pending = model_pod("big-model", cpus=48)  # 24 cores on one NUMA node (SMT 2)
    done = cli("--cluster", cluster_file(tmp_path, pending), "explain", "llm-inference/big-model", "-o", "json")
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    nodes = {n["node"]: n for n in answer["nodes"]}
    assert answer["pod"] == "llm-inference/big-model" and len(nodes) == 9
    assert nodes["cpu-a1"]["fits"] and nodes["cpu-a1"]["change"].startswith("fits now (NUMA 0: 24 cores")
    # Full now: the fewest pods to evict, by name, on the NUMA node it would get.
    full = nodes["cpu-full"]
    assert not full["fits"] and re.fullmatch(r"NUMA 0: \d/29, NUMA 1: \d/29 free cores", full["free"])
    assert full["change"].startswith("evict llm/qwen-14b-predictor-7f6d5-klmno (NUMA ")
    assert "cpu-full" not in full["reason"] and "needs 24 free cores" in full["reason"]
    # Too small even when empty: the largest request that would fit there.
    assert nodes["cpu-snc4"]["change"] == "ask for at most 44 CPUs (the pod asks for 48)"
    text = cli("--cluster", cluster_file(tmp_path, pending), "explain", "big-model", "-n", "llm-inference")
    assert text.returncode == 0 and "fits 4 of 9 nodes now" in text.stdout.splitlines()[0]
    assert f"cpu-full: {full['free']}" in text.stdout


def test_without_the_plugins_export_an_eviction_short_of_the_shared_balloons_doubt_names_the_export(
        tmp_path: Path) -> None:
    """cpu-full's reserved balloon grew by 2 cores; without its plugin's export, a ledger built from a list does not
    know on which NUMA node, so evicting one qwen replica is not enough, and the change is the export, not a
    smaller request."""
    path = cluster_file(tmp_path, model_pod("big-model", cpus=48), without=("NodeResourceTopology", "cpu-full"))
    done = cli("--cluster", path, "explain", "llm-inference/big-model", "-o", "json")
    assert done.returncode == 0, done.stderr
    full = next(n for n in json.loads(done.stdout)["nodes"] if n["node"] == "cpu-full")
    assert not full["fits"] and full["change"].startswith(
        "evicting llm/qwen-14b-predictor-7f6d5-klmno would make room, but NUMA node 0 has room for it only if the 2 "
        "cores the shared balloons took elsewhere are not there")
    assert full["change"].endswith("let the extender read the plugin's NodeResourceTopology")


def test_a_pod_that_is_not_there_bound_or_not_a_model_is_one_sentence(tmp_path: Path) -> None:
    demo = cluster_file(tmp_path)
    missing = cli("--cluster", demo, "explain", "llm/nope")
    assert missing.returncode == 2 and missing.stdout == ""
    assert missing.stderr.strip().endswith("no pod llm/nope in the cluster (give NAMESPACE/NAME, or -n NAMESPACE)")
    bound = cli("--cluster", demo, "explain", "llm/qwen-14b-predictor-7f6d5-klmno")
    assert bound.returncode == 0 and "is not pending: it is bound to node cpu-full" in bound.stderr


def test_nodes_kube_scheduler_would_not_offer_are_named_so_not_said_to_fit(tmp_path: Path) -> None:
    """On a live cluster explain once said a node without AMX "fits now" while kube-scheduler said it did not match
    the pod's node affinity: the pod as the webhook left it (AMX required), on the demo fleet with taints."""
    pending = model_pod("amx-model", cpus=16)
    pending["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [
            {"key": "feature.node.kubernetes.io/cpu-security.amx.enabled", "operator": "In", "values": ["true"]}]}]}}}
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List",
                                "items": [*tainted(load_objects(demo_text())), pending]}))
    done = cli("--cluster", str(path), "explain", "llm-inference/amx-model", "-o", "json")
    assert done.returncode == 0, done.stderr
    nodes = {n["node"]: n for n in json.loads(done.stdout)["nodes"]}
    assert not nodes["cpu-icx"]["fits"] and nodes["cpu-icx"]["reason"].startswith(
        "not offered by kube-scheduler: no AMX (the node has no label feature.node.kubernetes.io/cpu-security.amx")
    assert nodes["cpu-icx"]["change"].startswith('set model-manager.io/require-amx: "false"')
    assert nodes["cpu-a1"]["reason"] == "not offered by kube-scheduler: taint dedicated=inference:NoSchedule is not " \
                                        "tolerated" and not nodes["cpu-a1"]["fits"]
    # The fixture pod tolerates not-ready and unreachable for NoExecute (the apiserver's defaults), not maintenance.
    assert nodes["cpu-a2"]["reason"] == "not offered by kube-scheduler: taint maintenance:NoExecute is not tolerated"
    assert nodes["cpu-b1"]["reason"] == "not offered by kube-scheduler: cordoned (spec.unschedulable)"
    # PreferNoSchedule only scores: the node is offered, and the pod fits there.
    assert nodes["cpu-snc4"]["fits"] and nodes["cpu-snc4"]["change"].startswith("fits now")
    assert {n for n, v in nodes.items() if v["fits"]} == {"cpu-snc4", "cpu-nosmt"}
