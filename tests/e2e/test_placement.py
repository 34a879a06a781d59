"""What a user sees through kubectl, with the real apiserver, controllers and kube-scheduler in front of us."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any

import yaml

from placement.ledger import PLACEMENT
from tests.e2e.cluster import ROOT, Cluster, wait_until
from tests.e2e.fleet import KSERVE_DEPLOYMENT, MODEL_NS, OPEN_NODES, POOL, model_pod

BALLOON = "balloon.balloons.resource-policy.nri.io/container."


def debug_node(cluster: Cluster, name: str) -> dict[str, Any]:
    status, body = cluster.get_ours("extender", f"/debug/nodes/{name}")
    assert status == 200, body
    return json.loads(body)


def held_numa(ledger: dict[str, Any]) -> dict[str, list[tuple[int, int]]]:
    """pod -> [(NUMA node, cores)] as the extender's ledger holds it."""
    out: dict[str, list[tuple[int, int]]] = {}
    for numa in ledger["numa"]:
        for h in numa["held"]:
            out.setdefault(h["pod"], []).append((numa["numa"], h["cores"]))
    return out


def model_placement(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cli", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=120)


def test_kserve_deployment_is_mutated_bound_by_our_extender_and_pinned(cluster: Cluster) -> None:
    cluster.kubectl("apply", "-f", "-", input=KSERVE_DEPLOYMENT)

    def bound() -> list[dict[str, Any]]:
        pods = cluster.kubectl_json("-n", MODEL_NS, "get", "pods", "-l", "app=isvc.llama3-8b-predictor")["items"]
        return pods if len(pods) == 3 and all(p["spec"].get("nodeName") for p in pods) else []

    pods = wait_until("3 bound llama3-8b pods", bound, timeout=90)
    wide = cluster.kubectl("-n", MODEL_NS, "get", "pods", "-l", "app=isvc.llama3-8b-predictor", "-o", "wide").stdout
    print(wide)
    placed: dict[str, str] = {}
    for pod in pods:
        meta, spec = pod["metadata"], pod["spec"]
        assert meta["ownerReferences"][0]["kind"] == "ReplicaSet"  # created by the controller, not by us
        assert meta["annotations"]["cpu-policy.model-manager.io/type"] == "nri-balloons"
        assert meta["annotations"][BALLOON + "kserve-container"] == "vllm-balloon-tp1"
        assert spec["schedulerName"] == "model-placement-scheduler"
        # cpu: 16 means 16 physical cores for a hide-hyperthreads balloon: 32 logical CPUs on 2-way SMT.
        assert spec["containers"][0]["resources"]["requests"]["cpu"] == "32"
        assert meta["annotations"]["cpu-policy.model-manager.io/requested-cpu"] == "16"
        assert spec["nodeName"] in OPEN_NODES, spec["nodeName"]  # the `full` pool has no NUMA node with room
        placed[meta["name"]] = spec["nodeName"]
        assert meta["name"] in wide and spec["nodeName"] in wide.split(meta["name"], 1)[1].splitlines()[0]
    # The ledger holds each pod once, on one NUMA node, with 16 cores, where the apiserver says it runs.
    holders: dict[str, str] = {}
    for node_name in set(placed.values()):
        ledger = debug_node(cluster, node_name)
        for pod_ref, numa in held_numa(ledger).items():
            name = pod_ref.split("/")[-1]
            if name in placed:
                assert name not in holders, f"{name} is held on {holders[name]} and {node_name}"
                holders[name] = node_name
                assert len(numa) == 1 and numa[0][1] == 16, (name, numa)
        for numa in ledger["numa"]:
            assert sum(h["cores"] for h in numa["held"]) <= numa["capacity"], numa
    assert holders == placed
    # Bound through pods/binding by our extender (bindVerb), with the ServiceAccount of manifests/.
    _status, metrics = cluster.get_ours("extender", "/metrics")
    bound_total = sum(float(line.rsplit(" ", 1)[1]) for line in metrics.decode().splitlines()
                      if line.startswith("model_placement_extender_bind_total") and 'result="bound"' in line)
    assert bound_total >= 3, metrics.decode()[-2000:]


def test_bare_pod_that_can_never_fit_is_refused_by_kubectl_apply(cluster: Cluster) -> None:
    done = cluster.kubectl("apply", "-f", str(ROOT / "examples" / "tp4-too-big.yaml"), check=False)
    print(done.stderr)
    assert done.returncode != 0
    assert 'admission webhook "pods.validate.model-placement.io" denied the request' in done.stderr
    assert "llama3-70b" in done.stderr and "NUMA" in done.stderr
    gone = cluster.kubectl("-n", MODEL_NS, "get", "pod", "llama3-70b", check=False)
    assert gone.returncode != 0 and "NotFound" in gone.stderr


def test_report_and_render_read_the_real_apiserver(cluster: Cluster) -> None:
    wait_until("the llama3-8b pods bound", lambda: len([
        p for p in cluster.pods(MODEL_NS, "app=isvc.llama3-8b-predictor") if p["spec"].get("nodeName")]) == 3,
        timeout=90)
    kubeconfig = str(cluster.admin_kubeconfig)
    report = model_placement("report", "--kubeconfig", kubeconfig, "-o", "json")
    assert report.returncode == 0, report.stderr
    ledgers = {n["node"]: n for n in json.loads(report.stdout)}
    assert len(ledgers) == 1000
    # It reads the same bindings the apiserver holds: each llama3-8b pod on its node, 16 cores on one NUMA node, and
    # (a ledger rebuilt from a list) on the NUMA node the extender chose, which the real apiserver kept on the pod
    # from the Binding's annotations.
    for pod in cluster.pods(MODEL_NS, "app=isvc.llama3-8b-predictor"):
        placement = json.loads(pod["metadata"]["annotations"][PLACEMENT])
        assert placement["node"] == pod["spec"]["nodeName"] and list(placement["numa"].values()) == [16], placement
        held = held_numa(ledgers[pod["spec"]["nodeName"]])
        assert held[f"{MODEL_NS}/{pod['metadata']['name']}"] == [(int(n), c) for n, c in placement["numa"].items()], \
            (held, placement)
    table = model_placement("report", "--kubeconfig", kubeconfig)
    assert table.returncode == 0, table.stderr
    for pod in cluster.pods(MODEL_NS, "app=isvc.llama3-8b-predictor"):
        assert pod["metadata"]["name"] in table.stdout
    render = model_placement("render", str(ROOT / "examples" / "kserve-tp1-pod.yaml"), "--kubeconfig", kubeconfig)
    print(render.stdout[:3000])
    assert render.returncode == 0, render.stderr
    first = next(line for line in render.stdout.splitlines() if line.strip().startswith("1. "))
    assert any(n in first for n in OPEN_NODES), first
    too_big = model_placement("render", str(ROOT / "examples" / "tp4-too-big.yaml"), "--kubeconfig", kubeconfig)
    assert too_big.returncode == 3, too_big.stdout + too_big.stderr


def test_model_pod_that_fits_nowhere_now_stays_pending_with_a_readable_reason(cluster: Cluster) -> None:
    pod = model_pod("qwen-14b", MODEL_NS, tp=1, cpu="16", memory="96Gi", node_selector={POOL: "full"},
                    annotations={"model-manager.io/preflight": "warn"})
    applied = cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(pod))
    print("kubectl apply:", applied.stdout, applied.stderr)
    # What kubectl prints of warn mode's warnings, through the real apiserver's warning recorder: the refusal
    # enforce would give, each warning ≤ 256 runes (never cut by the apiserver) and split only between clauses,
    # so the pieces joined at "; " are the message whole, ending with its fix.
    warned = [line.removeprefix("Warning: ") for line in applied.stderr.splitlines() if line.startswith("Warning: ")]
    first = "llm/qwen-14b asks for cpu: 16, that is balloon vllm-balloon-tp1: 16 cores"
    assert warned and warned[0].startswith(first), applied.stderr
    assert all(len(w) <= 256 for w in warned), warned
    whole = "; ".join(warned)
    assert "eligible nodes has that free now (most free: " in whole and whole.endswith("or add capacity."), whole

    def scheduled_condition() -> dict[str, Any] | None:
        got = cluster.kubectl_json("-n", MODEL_NS, "get", "pod", "qwen-14b")
        for cond in got["status"].get("conditions", []):
            if cond["type"] == "PodScheduled" and cond["status"] == "False":
                return cond
        return None

    cond = wait_until("PodScheduled=False on qwen-14b", scheduled_condition, timeout=90)
    events = wait_until("a FailedScheduling event", lambda: [
        e for e in cluster.kubectl_json("-n", MODEL_NS, "get", "events",
                                        "--field-selector", "involvedObject.name=qwen-14b")["items"]
        if e["reason"] == "FailedScheduling"], timeout=60)
    describe = cluster.kubectl("-n", MODEL_NS, "describe", "pod", "qwen-14b").stdout
    print(f"PodScheduled condition message ({len(cond['message'])} chars):\n{cond['message']}")
    print(f"FailedScheduling event message ({len(events[0]['message'])} chars):\n{events[0]['message']}")
    assert cluster.kubectl_json("-n", MODEL_NS, "get", "pod", "qwen-14b")["status"]["phase"] == "Pending"
    assert cond["reason"] == "Unschedulable"
    assert cond["message"].startswith("0/1000 nodes are available")
    assert "FailedScheduling" in describe
    # In the user's terms: the fix and where to look further, no balloon type of the policy's own making.
    message = events[0]["message"]
    assert "wait for free cores or lower cpu; `model-placement explain llm/qwen-14b` lists every node" in message
    assert "vllm-numa-" not in message and "vllm-numa-" not in cond["message"], message
    # One event per scheduling attempt: as many FailedScheduling events (a series counts each) as kube-scheduler
    # logged attempts that found no fit (the nodes still being added as the test starts can cause a second one).
    def attempts() -> int:
        log = (cluster.logs / "kube-scheduler.log").read_text()
        return sum(1 for line in log.splitlines() if "Unable to schedule pod" in line and 'pod="llm/qwen-14b"' in line)

    time.sleep(2)  # the last attempt's event written
    before = attempts()
    events = [e for e in cluster.kubectl_json("-n", MODEL_NS, "get", "events",
                                              "--field-selector", "involvedObject.name=qwen-14b")["items"]
              if e["reason"] == "FailedScheduling"]
    reported = sum((e.get("series") or {}).get("count") or e.get("count") or 1 for e in events)
    assert 1 <= before <= reported <= attempts(), (before, reported, events)
