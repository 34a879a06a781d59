"""Every broken input an operator can hand the command line: one sentence naming it, exit 2, no traceback.
Each test runs the real console script, as the operator does (the field-by-field one calls `render` in-process)."""

from __future__ import annotations

import copy
import json
import os
import re
import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from certs import make_ca, write_bundle
from tests.support.process import ROOT, ServerProcess, command

DEMO = ROOT / "placement/demo/cluster.yaml"
TP1 = ROOT / "examples/kserve-tp1-pod.yaml"


def run(*args: str, stdin: str | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*command(), *args], cwd=ROOT, capture_output=True, text=True, timeout=60, input=stdin,
                          env={**os.environ, **(env or {})})


def refused(out: subprocess.CompletedProcess[str], sentence: str, code: int = 2) -> None:
    """Exit `code`, and stderr is `sentence` on one line (a server's: in its JSON log line), no traceback."""
    assert "Traceback" not in out.stderr, out.stderr
    assert out.returncode == code, (out.returncode, out.stderr)
    lines = [line for line in out.stderr.splitlines() if sentence in line]
    assert lines, f"{sentence!r} not in stderr:\n{out.stderr}"


def demo_items() -> list[dict[str, Any]]:
    return yaml.safe_load(DEMO.read_text())["items"]  # type: ignore[no-any-return]


def cluster_file(tmp_path: Path, items: list[dict[str, Any]], name: str = "cluster.yaml") -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": items}))
    return str(path)


def with_node(change: Any, name: str = "cpu-a1") -> list[dict[str, Any]]:
    items = demo_items()
    node = next(o for o in items if o["kind"] == "Node" and o["metadata"]["name"] == name)
    change(node)
    return items


# -- flags -------------------------------------------------------------------------------------------

def test_port_out_of_range() -> None:
    out = run("serve", "--insecure-http", "--port", "99999")
    refused(out, "model-placement: argument --port: 99999 is not a TCP port (0-65535; 0 picks a free one) "
                 "(see `model-placement serve --help`)")


def test_unknown_flag_and_two_cluster_sources(tmp_path: Path) -> None:
    refused(run("report", "--colour"), "model-placement: unrecognized arguments: --colour")
    out = run("report", "--cluster", str(DEMO), "--kubeconfig", str(tmp_path / "kc"))
    refused(out, "model-placement: give one of --cluster, --kubeconfig, --in-cluster, not --cluster and --kubeconfig")


def test_global_flags_before_or_after_the_subcommand(tmp_path: Path) -> None:
    path = cluster_file(tmp_path, [o for o in demo_items() if o["kind"] != "Node" or o["metadata"]["name"] == "cpu-a1"])
    for args in (("--cluster", path, "--log-level", "error", "report", "-o", "json"),
                 ("report", "-o", "json", "--log-level", "error", "--cluster", path),
                 ("--log-level", "error", "report", "--cluster", path, "-o", "json")):
        out = run(*args)
        assert out.returncode == 0, out.stderr
        assert [n["node"] for n in json.loads(out.stdout)] == ["cpu-a1"]


def test_every_flag_says_its_default() -> None:
    for sub in ("render", "report", "serve", "webhook", "extender", "certs", "balloons-policy"):
        out = run(sub, "--help")
        assert out.returncode == 0
        options = out.stdout.split("options:", 1)[1]
        blocks = [" ".join(b.split()) for b in re.split(r"\n(?=  -)", options) if b.strip()]
        for block in blocks:
            if (block.startswith(("-h", "--service", "--namespace NAMESPACE")) and sub == "certs") or \
                    block.startswith("-h"):
                continue
            assert "(default: " in block, (sub, block)
        assert len(blocks) > 3, sub


def test_config_error_names_the_environment_variable() -> None:
    out = run("report", env={"MM_NRI_PREFLIGHT": "bogus"})
    refused(out, "model-placement: invalid configuration: MM_NRI_PREFLIGHT='bogus' (setting preflight): "
                 "Input should be 'enforce', 'warn' or 'skip'")


def test_missing_config_file(tmp_path: Path) -> None:
    refused(run("report", "--config", str(tmp_path / "nope.yaml")),
            f"model-placement: cannot read config file {tmp_path / 'nope.yaml'}: No such file or directory")


def test_broken_pipe_is_a_quiet_exit() -> None:
    # pipefail: the exit status is the CLI's, not head's.
    proc = subprocess.run(["/bin/bash", "-o", "pipefail", "-c", f"{' '.join(command())} render {TP1} | head -1"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("=== Pod llm/llama3-8b-predictor-6c9f7d8b4-*")
    assert "Broken pipe" not in proc.stderr and "Traceback" not in proc.stderr


def test_unknown_environment_setting_stops_the_process() -> None:
    refused(run("report", env={"MM_NOSUCH_KEY": "1"}),
            "model-placement: invalid configuration: MM_NOSUCH_KEY is not a setting; known variables: ")
    out = run("serve", "--insecure-http", "--port", "0", env={"MM_NRI_PREFLIGTH": "warn"})
    refused(out, "model-placement: invalid configuration: MM_NRI_PREFLIGTH is not a setting")


def test_refused_render_into_head_keeps_exit_3() -> None:
    proc = subprocess.run(["/bin/bash", "-o", "pipefail", "-c",
                           f"{' '.join(command())} render {ROOT / 'examples/tp4-too-big.yaml'} | head -3"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3, proc.stderr
    assert "Broken pipe" not in proc.stderr and "Traceback" not in proc.stderr


def test_render_yaml_has_no_anchors() -> None:
    out = run("render", str(ROOT / "examples/deployment-tp2.yaml"), "-o", "yaml")
    assert out.returncode == 0, out.stderr
    assert not re.search(r"[&*]id\d+", out.stdout), out.stdout[:2000]
    [entry] = list(yaml.safe_load_all(out.stdout))
    assert entry["mutated"]["spec"]["template"]["spec"]["containers"][0]["name"] == "main"


def test_certs_with_ip_sans(tmp_path: Path) -> None:
    import ipaddress

    from cryptography import x509

    out = run("certs", "--service", "svc", "--namespace", "ns", "--out", str(tmp_path), "--ip", "10.0.0.7",
              "--ip", "::1")
    assert out.returncode == 0, out.stderr
    assert "valid for: svc, svc.ns, svc.ns.svc, svc.ns.svc.cluster.local, 10.0.0.7, ::1" in out.stdout
    cert = x509.load_pem_x509_certificate((tmp_path / "tls.crt").read_bytes())
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("10.0.0.7"), ipaddress.ip_address("::1")]
    refused(run("certs", "--service", "svc", "--namespace", "ns", "--out", str(tmp_path), "--ip", "10.0.0.300"),
            "model-placement: argument --ip: '10.0.0.300' is not an IPv4 or IPv6 address")


# -- certificates at start-up --------------------------------------------------------------------------

def serve(*args: str) -> subprocess.CompletedProcess[str]:
    return run("serve", "--host", "127.0.0.1", "--port", "0", *args)


def test_missing_certificate_file(tmp_path: Path) -> None:
    bundle = write_bundle("model-placement-webhook", "model-placement", tmp_path)
    out = serve("--tls-cert", "/nonexistent.crt", "--tls-key", str(bundle.key_file))
    refused(out, "cannot read the TLS certificate (--tls-cert) /nonexistent.crt: No such file or directory")
    # The same sentence every command prints, not a JSON record: what `kubectl logs` of a crash loop shows.
    assert out.stderr.splitlines()[-1] == ("model-placement: cannot read the TLS certificate (--tls-cert) "
                                           "/nonexistent.crt: No such file or directory")


def test_ca_certificate_given_as_the_key(tmp_path: Path) -> None:
    bundle = write_bundle("model-placement-webhook", "model-placement", tmp_path)
    out = serve("--tls-cert", str(bundle.cert_file), "--tls-key", str(bundle.ca_file))
    refused(out, f"TLS key (--tls-key) {bundle.ca_file} holds no unencrypted PEM private key (found: CERTIFICATE)")


def test_mismatched_pair(tmp_path: Path) -> None:
    one = write_bundle("model-placement-webhook", "model-placement", tmp_path / "one")
    two = write_bundle("model-placement-webhook", "model-placement", tmp_path / "two")
    out = serve("--tls-cert", str(one.cert_file), "--tls-key", str(two.key_file))
    refused(out, f"TLS key (--tls-key) {two.key_file} is not the key of the certificate in {one.cert_file}")


def test_tls_required(tmp_path: Path) -> None:
    out = serve()
    refused(out, "TLS is required: give --tls-cert and --tls-key (or --insecure-http for plain HTTP)")
    assert out.stderr.startswith("model-placement: TLS is required"), out.stderr  # the CLI's sentence, no JSON


def test_port_in_use() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = run("serve", "--insecure-http", "--host", "127.0.0.1", "--port", str(port))
    refused(out, f"cannot listen on 127.0.0.1:{port}: ")


def test_host_that_does_not_resolve() -> None:
    out = run("webhook", "--insecure-http", "--host", "nosuchhost.invalid")
    refused(out, "model-placement: cannot listen on nosuchhost.invalid:8443: ")
    assert out.stderr.splitlines()[-1].startswith("model-placement: cannot listen")


def test_certs_with_a_broken_ca(tmp_path: Path) -> None:
    ca = make_ca()
    (tmp_path / "ca.crt").write_bytes(ca.cert_pem)
    (tmp_path / "other.key").write_bytes(make_ca().key_pem)
    base = ("certs", "--service", "svc", "--namespace", "ns", "--out", str(tmp_path / "out"))
    refused(run(*base, "--ca-cert", str(tmp_path / "ca.crt")),
            "model-placement: --ca-cert and --ca-key go together: give both to issue from an existing CA")
    refused(run(*base, "--ca-cert", str(tmp_path / "ca.crt"), "--ca-key", str(tmp_path / "missing.key")),
            f"model-placement: cannot read the CA key (--ca-key) {tmp_path / 'missing.key'}: No such file or directory")
    refused(run(*base, "--ca-cert", str(tmp_path / "ca.crt"), "--ca-key", str(tmp_path / "other.key")),
            f"model-placement: --ca-key {tmp_path / 'other.key'} is not the key of the CA certificate "
            f"{tmp_path / 'ca.crt'}")
    refused(run(*base, "--days", "0"), "model-placement: argument --days: 0 must be greater than 0")
    assert not (tmp_path / "out").exists()


# -- kubeconfig and the apiserver ------------------------------------------------------------------------

def kubeconfig(tmp_path: Path, server: str) -> Path:
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": server}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        "users": [{"name": "u", "user": {"token": "t"}}]}))
    return path


def test_missing_kubeconfig() -> None:
    refused(run("report", "--kubeconfig", "/nonexistent"),
            "model-placement: cannot read --kubeconfig file /nonexistent: No such file or directory")
    out = run("serve", "--insecure-http", "--port", "0", "--kubeconfig", "/nonexistent")
    refused(out, "cannot read --kubeconfig file /nonexistent: No such file or directory")


def test_malformed_kubeconfig(tmp_path: Path) -> None:
    bad = tmp_path / "kc"
    bad.write_text("clusters: [\n")
    refused(run("report", "--kubeconfig", str(bad)),
            f"model-placement: kubeconfig {bad} is not valid YAML at line 2, column 1")
    bad.write_text("hello\n")
    refused(run("report", "--kubeconfig", str(bad)), f"model-placement: kubeconfig {bad} is not a kubeconfig")
    bad.write_text("apiVersion: v1\nkind: Config\nclusters: []\n")
    refused(run("report", "--kubeconfig", str(bad)),
            f"model-placement: kubeconfig {bad} cannot be used: Invalid kube-config file.")


def test_unreachable_apiserver(tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = run("report", "--kubeconfig", str(kubeconfig(tmp_path, f"https://127.0.0.1:{port}")))
    refused(out, f"model-placement: cannot reach the apiserver at https://127.0.0.1:{port}: ")
    assert "Connection refused" in out.stderr
    assert len(out.stderr.splitlines()) == 1, out.stderr  # not urllib3's retries first


# -- --cluster files ---------------------------------------------------------------------------------

MALFORMED = {
    "labels a list": (lambda n: n["metadata"].__setitem__("labels", ["a", "b"]),
                      "Node cpu-a1: metadata.labels is a list, expected a mapping of strings; skipped"),
    "status broken": (lambda n: n.__setitem__("status", "broken"),
                      "Node cpu-a1: status is a string, expected a mapping; skipped"),
    "metadata a string": (lambda n: n.__setitem__("metadata", "x"),
                          "Node (no name): metadata is a string, expected a mapping; skipped"),
    "capacity.cpu lots": (lambda n: n["status"]["capacity"].__setitem__("cpu", "lots"),
                          "Node cpu-a1: status.capacity.cpu: cpu 'lots' is not a Kubernetes quantity "
                          "(e.g. 8, 500m, 64Gi); skipped"),
    "no name": (lambda n: n["metadata"].pop("name"), "Node (no name): metadata.name is missing; skipped"),
    "label value a number": (lambda n: n["metadata"]["labels"].__setitem__(
                                 "feature.node.kubernetes.io/memory-numa.node_count", 2),
                             "Node cpu-a1: metadata.labels['feature.node.kubernetes.io/memory-numa.node_count'] "
                             "is a number, expected a string; skipped"),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_node_is_named_and_skipped(tmp_path: Path, case: str) -> None:
    change, sentence = MALFORMED[case]
    path = cluster_file(tmp_path, with_node(change))
    out = run("report", "-o", "json", "--cluster", path)
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    assert f"model-placement: {path}: {sentence}" in out.stderr.splitlines()
    assert "1 malformed object skipped (--strict makes a malformed object an error)" in out.stderr
    assert "cpu-a1" not in [n["node"] for n in json.loads(out.stdout)]
    refused(run("report", "--strict", "--cluster", path),
            f"model-placement: {path}: {sentence.removesuffix('; skipped')}")


def test_malformed_pod_and_policy(tmp_path: Path) -> None:
    items = demo_items()
    pod = next(o for o in items if o["kind"] == "Pod" and "llama3-8b" in o["metadata"]["name"])
    pod["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "abc"
    policy = next(o for o in items if o["kind"] == "BalloonsPolicy" and o["metadata"]["name"] == "node.cpu-b1")
    policy["spec"]["reservedResources"]["cpu"] = "cpuset:0-x"
    path = cluster_file(tmp_path, items)
    out = run("report", "--cluster", path)
    assert out.returncode == 0, out.stderr
    name = pod["metadata"]["name"]
    assert (f"model-placement: {path}: Pod llm/{name}: spec.containers[0].resources.requests.cpu: cpu 'abc' is not a "
            "Kubernetes quantity (e.g. 8, 500m, 64Gi); skipped") in out.stderr
    assert f"model-placement: {path}: BalloonsPolicy kube-system/node.cpu-b1: spec.reservedResources.cpu 'cpuset:0-x'" \
        in out.stderr
    assert "2 malformed objects skipped" in out.stderr


@pytest.mark.parametrize("content, sentence", [
    ("", "{path} is empty: expected what "
         "`kubectl get nodes,pods,balloonspolicies,noderesourcetopologies -A -o yaml` prints"),
    ("# nothing\n", "{path} is empty"),
    ("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n",
     "{path} holds no usable Node object (1 ConfigMap): expected what `kubectl get"),
    ("- a\n- b\n", "{path}: document 1 is not a Kubernetes object (it is a list)"),
    ("items: [\n", "{path} is not valid YAML at line 2, column 1: "),  # the problem is worded by the loader
    ('{"kind": "List", "items": [', "{path} is not valid JSON: "),
])
def test_unusable_cluster_file(tmp_path: Path, content: str, sentence: str) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text(content)
    refused(run("report", "--cluster", str(path)), "model-placement: " + sentence.format(path=path))


def test_missing_cluster_file(tmp_path: Path) -> None:
    refused(run("report", "--cluster", str(tmp_path / "x.json")),
            f"model-placement: cannot read --cluster file {tmp_path / 'x.json'}: No such file or directory")
    refused(run("report", "--cluster", str(tmp_path)),
            f"model-placement: --cluster file {tmp_path} is a directory, not a file")


def test_cluster_file_as_json(tmp_path: Path) -> None:
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": demo_items()}))
    out = run("report", "-o", "json", "--cluster", str(path))
    assert out.returncode == 0, out.stderr
    assert len(json.loads(out.stdout)) == 9 and out.stderr == ""  # a real file: no demo notice


# -- render's input --------------------------------------------------------------------------------------

def model_pod(**annotations: str) -> dict[str, Any]:
    pod = yaml.safe_load(TP1.read_text())
    pod["metadata"]["annotations"] = annotations
    return pod


def test_render_reads_stdin_and_names_the_demo_fleet() -> None:
    out = run("render", "-", "-o", "json", stdin=TP1.read_text())
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)[0]["verdict"]["allowed"] is True
    assert "model-placement: using the bundled demo fleet (9 invented nodes, not your cluster)" in out.stderr


def test_render_invalid_tp_is_refused_like_the_server() -> None:
    pod = model_pod(**{"model-manager.io/tensor-parallel-size": "3"})
    out = run("render", "-", "-o", "json", stdin=yaml.safe_dump(pod))
    assert out.returncode == 3, out.stderr
    [entry] = json.loads(out.stdout)
    assert entry["verdict"]["reason"] == "pod-spec" and entry["verdict"]["allowed"] is False
    assert entry["patch"] == [] and entry["mutated"] == pod  # /mutate leaves a faulty pod as it was
    assert entry["ranking"] == []  # and /filter refuses every node
    assert {f["list"] for f in entry["filtered"]} == {"FailedAndUnresolvableNodes"}


def test_render_invalid_tp_demand_names_no_policy_it_did_not_resolve() -> None:
    pod = model_pod(**{"model-manager.io/tensor-parallel-size": "3"})
    out = run("render", "-", stdin=yaml.safe_dump(pod))
    assert out.returncode == 3, out.stderr
    demand = " ".join(out.stdout.split("verdict:")[0].split())
    assert "policy nri-balloons requested, no balloon until the spec is fixed" in demand, demand
    assert "best-effort" not in demand and "vllm-balloon-tp3" not in demand and "nri-resolution-failed" not in demand


def test_render_cites_each_refused_nodes_own_free_cores() -> None:
    out = run("render", str(ROOT / "examples/deployment-tp2.yaml"))
    assert out.returncode == 0, out.stderr
    lines = " ".join(out.stdout.split()).split(" - ")
    [full] = [line for line in lines if line.startswith("cpu-full ")]
    [a2] = [line for line in lines if line.startswith("cpu-a2 ")]
    # report: cpu-full has 3 cores free on NUMA node 0 and 1 on NUMA node 1, cpu-a2 13 and 29; the reason itself is
    # what kube-scheduler is told for the class (the most any such node has), the node's own figures follow it.
    assert full.split(" x ")[0].endswith(
        "[this node has free: NUMA 0: 3, NUMA 1: 1 cores; NRI balloons: kube-system/node.cpu-full]"), full
    assert a2.endswith("[this node has free: NUMA 0: 13, NUMA 1: 29 cores; NRI balloons: kube-system/node.cpu-a2]"), a2


def test_render_unparsable_cpu_gets_no_balloon() -> None:
    pod = model_pod()
    pod["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "abc"}}
    out = run("render", "-", "-o", "json", stdin=yaml.safe_dump(pod))
    assert out.returncode == 3, out.stderr
    [entry] = json.loads(out.stdout)
    annotations = entry["mutated"]["metadata"]["annotations"]
    assert entry["patch"] == [] and not any(k.startswith("balloon.") for k in annotations)


@pytest.mark.parametrize("content, sentence", [
    ("", "model-placement: {path} is empty: expected a Pod, Deployment or StatefulSet manifest"),
    ("kind: Pod\nmetadata: {name: [\n", "model-placement: {path} is not valid YAML at line 3, column 1"),
])
def test_render_unusable_file(tmp_path: Path, content: str, sentence: str) -> None:
    path = tmp_path / "pod.yaml"
    path.write_text(content)
    refused(run("render", str(path)), sentence.format(path=path))
    refused(run("render", str(tmp_path / "nope.yaml")),
            f"model-placement: cannot read file {tmp_path / 'nope.yaml'}: No such file or directory")


def test_render_objects_it_does_not_judge_are_bad_input(tmp_path: Path) -> None:
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}}
    out = run("render", "-", stdin=yaml.safe_dump(cm))
    assert out.returncode == 2
    assert "kind 'ConfigMap' is not judged here; expected Pod, Deployment or StatefulSet" in out.stdout
    deployment = yaml.safe_load((ROOT / "examples/deployment-tp2.yaml").read_text())
    deployment["spec"]["replicas"] = "lots"
    out = run("render", "-", "-o", "json", stdin=yaml.safe_dump(deployment))
    assert out.returncode == 2, out.stderr
    [entry] = json.loads(out.stdout)
    verdict = entry["verdict"]  # the server's answer: a model workload it cannot read is refused
    assert verdict["allowed"] is False and verdict["reason"] == "unreadable"
    assert "cannot read it: spec.replicas is a JSON string, expected a whole number" in verdict["message"]


def test_serve_says_when_it_judges_against_the_demo_fleet() -> None:
    server = ServerProcess(["serve", "--insecure-http", "--host", "127.0.0.1", "--port", "0"])
    assert server.stop() == 0
    [line] = [e for e in server.lines if str(e.get("msg", "")).startswith("using the bundled demo fleet")]
    assert line["level"] == "warning"


def test_report_reads_as_a_table() -> None:
    out = run("report")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert max(map(len, lines)) <= 120
    assert lines[0].split()[:5] == ["NUMA", "CPUS", "RESERVED", "CORES", "FREE"]
    assert any(line.startswith("CORES: physical cores") for line in lines)  # the legend
    text = " ".join(out.stdout.split())
    assert "cpu-nosmt: 2 NUMA nodes × 32 cores × 1 thread " in text  # plurals
    assert " 1 threads" not in text and " 1 model cores" not in text and " 1 cores" not in text


def test_yaml_output_keeps_unicode() -> None:
    pod = model_pod(description="Modèle × 2 — démo")
    out = run("render", "-", "-o", "yaml", stdin=yaml.safe_dump(pod, allow_unicode=True))
    assert out.returncode == 0, out.stderr
    assert "description: Modèle × 2 — démo" in out.stdout and "\\x" not in out.stdout and "\\u" not in out.stdout


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    children = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    return [p for key, child in children for p in ((*prefix, key), *_paths(child, (*prefix, key)))]


def test_render_answers_every_malformed_field_without_a_crash() -> None:
    """Each field of a model pod and of a model Deployment replaced by a value of the wrong type: render gives
    an answer (exit 0, 2 or 3) for every one, as the server does, and prints it."""
    import io

    from cli.render import dump_yaml, print_text, render
    from placement.cluster import ClusterState
    from placement.config import Settings
    from server.sources import demo_text, load_objects

    state = ClusterState.from_objects(load_objects(demo_text()), Settings())
    junk = ["x", 5, None, [1], {"a": None}, True]
    tried = 0
    for path in (TP1, ROOT / "examples/deployment-tp2.yaml"):
        base = yaml.safe_load(path.read_text())
        for where in _paths(base):
            for value in junk:
                obj = copy.deepcopy(base)
                parent = obj
                for key in where[:-1]:
                    parent = parent[key]
                parent[where[-1]] = value
                [entry] = render([obj], state)
                assert entry["exit"] in (0, 2, 3), (where, value)
                print_text([entry], io.StringIO())
                dump_yaml([entry], many=True)
                tried += 1
    assert tried > 300


def test_balloons_policy_for_an_unknown_node() -> None:
    refused(run("balloons-policy", "cpu-a1", "nope"), "model-placement: unknown node(s): nope; known: cpu-a1, ")


def test_write_ca_key_is_for_a_new_ca(tmp_path: Path) -> None:
    refused(run("certs", "--service", "s", "--namespace", "n", "--out", str(tmp_path), "--ca-cert", "a",
                "--ca-key", "b", "--write-ca-key"),
            "model-placement: --write-ca-key is for a new CA: the existing CA's key is already in --ca-key")


def test_key_given_as_certificate_and_as_client_ca(tmp_path: Path) -> None:
    bundle = write_bundle("model-placement-webhook", "model-placement", tmp_path)
    out = serve("--tls-cert", str(bundle.key_file), "--tls-key", str(bundle.key_file))
    refused(out, f"TLS certificate (--tls-cert) {bundle.key_file} holds no PEM certificate (found: PRIVATE KEY)")
    out = serve("--tls-cert", str(bundle.cert_file), "--tls-key", str(bundle.key_file), "--client-ca",
                str(bundle.key_file))
    refused(out, f"client CA (--client-ca) {bundle.key_file} holds no PEM certificate (found: PRIVATE KEY)")
