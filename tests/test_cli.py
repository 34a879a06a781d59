"""The command line an operator runs: report and render on the demo fleet and on a cluster file."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)


def test_report_table_shows_every_node_and_numa_node() -> None:
    out = run("report")
    assert out.returncode == 0, out.stderr
    text = out.stdout
    ledgers = json.loads(run("report", "-o", "json").stdout)
    assert len(ledgers) == 9
    for ledger in ledgers:  # the table says what the ledger holds
        assert f"{ledger['node']}: {ledger['topology']['numa_nodes']} NUMA nodes" in text
        assert ledger["reserved"]["cpuset"] in text
    assert "mistral-7b-predictor-58d4c-fghij (vllm-balloon-tp2, " in text


def test_report_draws_each_numa_nodes_model_cores_held_lent_and_free() -> None:
    """One bar under each NUMA node, in the order of the JSON: a cell per model core, held (the pods' cores
    there), lent to the shared pool (what neither they nor FREE account for) and free, as the ledger counts them."""
    text = run("report").stdout
    bars = re.findall(r"^ {7}([█▒·]*)  (\d+) held, (\d+) shared, (\d+) free$", text, re.MULTILINE)
    expected = []
    for ledger in json.loads(run("report", "-o", "json").stdout):
        for numa in ledger["numa"]:
            held = sum(h["cores"] for h in numa["held"])
            expected.append((held, numa["capacity"] - held - numa["free"], numa["free"]))
    assert [(int(h), int(lent), int(f)) for _, h, lent, f in bars] == expected
    for (cells, *_), (held, lent, free) in zip(bars, expected):
        assert cells == "█" * held + "▒" * lent + "·" * free
    assert (26, 2, 1) in expected  # cpu-full's NUMA node 1: the shared pool has grown into 2 of its model cores
    assert max(map(len, text.splitlines())) <= 120


def test_a_bar_past_64_cells_draws_a_cell_for_every_few_cores_and_keeps_each_part_seen() -> None:
    from cli.report import bar

    assert bar(100, 3, 25) == "█" * 50 + "▒" * 2 + "·" * 12 + "  100 held, 3 shared, 25 free; a cell is 2 cores"
    assert bar(1, 0, 191) == "█" + "·" * 63 + "  1 held, 0 shared, 191 free; a cell is 3 cores"
    assert bar(2, 0, 0) == "██  2 held, 0 shared, 0 free"


def test_report_json_carries_the_ledger() -> None:
    out = run("report", "-o", "json")
    nodes = {n["node"]: n for n in json.loads(out.stdout)}
    snc4 = nodes["cpu-snc4"]
    assert [n["free"] for n in snc4["numa"]] == [6, 6, 22, 22]
    assert snc4["topology"] == {"source": "nrt", "numa_nodes": 4, "threads_per_core": 2, "cpus": 192}
    assert nodes["cpu-b1"]["reserved"]["source"].startswith("BalloonsPolicy kube-system/node.cpu-b1")


def test_render_admits_and_ranks_the_tp1_kserve_pod() -> None:
    out = run("render", "examples/kserve-tp1-pod.yaml", "-o", "json")
    assert out.returncode == 0, out.stderr
    [entry] = json.loads(out.stdout)
    assert entry["verdict"]["allowed"] is True
    ann = entry["mutated"]["metadata"]["annotations"]
    assert ann["balloon.balloons.resource-policy.nri.io/container.kserve-container"] == "vllm-balloon-tp1"
    assert entry["ranking"] and entry["ranking"] == sorted(entry["ranking"], key=lambda r: -r["score"])
    # Every node is accounted for: ranked, filtered by the extender, or not offered (cpu-icx has no AMX; cpu-nosmt
    # has SMT off, and the request is sized for the SMT-2 nodes, which the pod's node affinity now says).
    named = [r["node"] for r in entry["ranking"]] + [f["node"] for f in entry["filtered"]]
    excluded = {e["node"]: e["reason"] for e in entry["excluded"]}
    assert sorted(excluded) == ["cpu-icx", "cpu-nosmt"]
    assert excluded["cpu-icx"].startswith("no AMX (the node has no label ")
    assert "cpu-hardware_multithreading NotIn false" in excluded["cpu-nosmt"]
    assert sorted(named + list(excluded)) == ["cpu-a1", "cpu-a2", "cpu-b1", "cpu-full", "cpu-icx", "cpu-ks1",
                                              "cpu-ks2", "cpu-nosmt", "cpu-snc4"]


def test_render_refuses_the_tp4_pod_with_numbers_and_exit_code() -> None:
    out = run("render", "examples/tp4-too-big.yaml")
    assert out.returncode == 3
    assert "verdict: REFUSED [footprint-exceeds-node]" in out.stdout
    assert re.search(r"Request at most cpu: \d+ for TP=4", " ".join(out.stdout.split()))  # wrapped at 120


def test_render_deployment_and_kubelet_static(tmp_path: Path) -> None:
    out = run("render", "examples/deployment-tp2.yaml", "-o", "json")
    [entry] = json.loads(out.stdout)
    assert entry["demand"]["tp"] == 2 and entry["demand"]["replicas"] == 2
    tmpl = entry["mutated"]["spec"]["template"]
    annotations = tmpl["metadata"]["annotations"]
    assert annotations["balloon.balloons.resource-policy.nri.io/container.main"] == "vllm-balloon-tp2"
    out = run("render", "examples/kubelet-static-pod.yaml", "-o", "json")
    [entry] = json.loads(out.stdout)
    containers = {c["name"]: c["resources"] for c in entry["mutated"]["spec"]["containers"]}
    assert containers["main"]["limits"] == {"cpu": "16", "memory": "64Gi"} == containers["main"]["requests"]
    assert containers["metrics-sidecar"]["limits"] == {"cpu": "250m", "memory": "128Mi"}


def test_render_against_a_cluster_file(tmp_path: Path) -> None:
    demo = yaml.safe_load((ROOT / "placement/demo/cluster.yaml").read_text())
    keep = [o for o in demo["items"] if o["kind"] != "Node" or o["metadata"]["name"] == "cpu-nosmt"]
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": keep}))
    out = run("render", "examples/kserve-tp1-pod.yaml", "--cluster", str(cluster), "-o", "json")
    assert out.returncode in (0, 3) and out.stderr == "", out.stderr  # a real file: no demo notice
    [entry] = json.loads(out.stdout)
    assert [n["node"] for n in entry["ranking"] + entry["filtered"] + entry["excluded"]] == ["cpu-nosmt"]


def test_bad_config_is_a_clear_startup_error(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("kubernetes_cpu_policy: fast\n")
    out = run("report", "--config", str(cfg))
    assert out.returncode == 2 and "kubernetes_cpu_policy='fast'" in out.stderr


def test_render_text_fits_120_columns() -> None:
    out = run("render", "examples/kserve-tp1-pod.yaml")
    assert out.returncode == 0, out.stderr
    head = out.stdout.split("mutated object:")[0].splitlines()
    assert max(map(len, head)) <= 120 and any(line.startswith("   x  cpu-icx ") for line in head)
    assert "1 replica," in out.stdout and "1 replicas" not in out.stdout


def test_report_counts_a_pod_of_unknown_placement_on_every_numa_node_it_could_use(tmp_path: Path) -> None:
    """The demo fleet as a cluster where model-placement was installed after the pods were bound: no pod carries
    the placement /bind records, and no NodeResourceTopology exports balloons, so none can be known."""
    from placement.ledger import PLACEMENT
    from server.sources import demo_text

    fleet = yaml.safe_load(demo_text())
    for obj in fleet["items"]:
        if obj["kind"] == "Pod":
            obj["metadata"].get("annotations", {}).pop(PLACEMENT, None)
    path = tmp_path / "installed-late.yaml"
    path.write_text(yaml.safe_dump(fleet))
    nodes = {n["node"]: n for n in json.loads(run("report", "--cluster", str(path), "-o", "json").stdout)}
    # mistral-7b (TP=2, 16 cores a rank) could be on any two of cpu-snc4's four NUMA nodes: 16 counted on each.
    assert [n["free"] for n in nodes["cpu-snc4"]["numa"]] == [6, 6, 6, 6]
    held = [h for n in nodes["cpu-snc4"]["numa"] for h in n["held"]]
    assert held and all(h.get("placement") == "unknown" for h in held)
    table = run("report", "--cluster", str(path)).stdout
    flat = " ".join(table.split())  # the pods column wraps after commas
    assert flat.count("mistral-7b-predictor-58d4c-fghij (vllm-balloon-tp2, 16, placement unknown)") == 4, table


def test_a_server_on_a_cluster_file_builds_every_ledger_before_it_listens() -> None:
    """As the live source does once its first list is in: left lazy, a new model's first /filter calls of 500 names
    on issue 39's 5,000-node fleet built a few hundred ledgers each (208, 184, 167 ms of CPU), and the ledgers
    built after the server froze its state stayed in the collector's sight."""
    from cli.main import parser
    from cli.runner import make_runtime
    from placement.config import Settings

    runtime = make_runtime(parser().parse_args(["extender", "--insecure-http"]), Settings())
    cluster = runtime.cluster
    assert cluster.nodes and set(cluster._ledgers) == set(cluster.nodes)
