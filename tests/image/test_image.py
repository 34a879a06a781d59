"""Our image (tests/image/build.py: the Dockerfile on a base made from Debian's own packages) run as the chart runs
it: the containers of `helm template` with the chart's default values (its selfSigned TLS Secret included), with
their user, read-only root, dropped capabilities, limits, mounts and args, each in a network namespace of its own and
spoken to from inside it, as the kubelet's probes and the pod's peers do. One arg goes: `--in-cluster` (no
apiserver here: the servers read the bundled demo fleet); tests/e2e runs the image in-cluster against the real
control plane."""

from __future__ import annotations

import json
import os
import re
import subprocess
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from placement.config import Settings
from server.inputs import load_settings
from server.sources import demo_text, load_objects
from tests.image import build
from tests.peers.build import build as peer
from tests.support.chart import Rendered
from tests.support.extender import DEMO_NODES, MakeExt
from tests.support.payloads import fixture_json
from tests.support.process import ServerProcess, command
from tests.support.webhook import MakeWebhook

ROOT = Path(__file__).resolve().parents[2]
WEBHOOK = ("model-placement-webhook", "webhook")
EXTENDER = ("model-placement-scheduler", "extender")
SERVICE = "model-placement-webhook.model-placement.svc"  # the name the apiserver calls, as cluster DNS resolves it
CONFIG_DIR = "/etc/model-placement"

# An HTTP client in the image's own Python, run by `podman exec` in the pod's network namespace (the extender
# listens on the pod's loopback only): the body on stdin; prints the status, a newline, the answer's body.
CLIENT = r"""
import ssl, sys, urllib.error, urllib.request
url, ca = sys.argv[1:3]
body = sys.stdin.buffer.read()
request = urllib.request.Request(url, data=body or None, headers={"Content-Type": "application/json"})
context = ssl.create_default_context(cafile=ca) if ca else None
try:
    with urllib.request.urlopen(request, timeout=10, context=context) as r:
        status, data = r.status, r.read()
except urllib.error.HTTPError as exc:
    status, data = exc.code, exc.read()
sys.stdout.buffer.write(b"%d\n" % status + data)
"""

# Every module of ours imported, as the servers and commands import them; then, per distribution in the venv,
# whether any of its top-level modules is loaded, and the packages (two levels deep) nothing loaded, with their size.
PROBE = r"""
import importlib, importlib.metadata as md, json, os, pkgutil, sys, sysconfig
for top in ("placement", "webhook", "extender", "certs", "server", "cli"):
    for found in pkgutil.walk_packages(importlib.import_module(top).__path__, top + "."):
        importlib.import_module(found.name)
loaded = {}
for dist in md.distributions():
    tops = {f.parts[0].split(".")[0] for f in dist.files or [] if f.parts[0] not in ("..", "__pycache__")
            and not f.parts[0].endswith(".dist-info")}
    loaded[dist.metadata["Name"].lower()] = any(t in sys.modules for t in tops)
site = sysconfig.get_paths()["purelib"]
unloaded = {}
for top in os.listdir(site):
    for sub in [top, *(f"{top}/{s}" for s in (os.listdir(f"{site}/{top}") if os.path.isdir(f"{site}/{top}") else []))]:
        name = sub.replace("/", ".")
        if os.path.isfile(f"{site}/{sub}/__init__.py") and name not in sys.modules and name.rpartition(".")[0] in (
                "", *sys.modules):
            walked = os.walk(f"{site}/{sub}")
            unloaded[name] = sum(os.path.getsize(os.path.join(d, f)) for d, _, files in walked for f in files)
print(json.dumps({"loaded": loaded, "unloaded": unloaded}))
"""


@pytest.fixture(scope="module")
def image() -> str:
    return build.image()  # a build error fails these tests; it is never a skip


@pytest.fixture(scope="module")
def chart(tmp_path_factory: pytest.TempPathFactory) -> Rendered:
    out = subprocess.run([str(peer("helm")), "template", "model-placement", str(ROOT / "charts" / "model-placement")],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    return Rendered([d for d in yaml.safe_load_all(out) if d], tmp_path_factory.mktemp("pod"))


class Pod:
    """One of the chart's containers, run from the image with its args or `args`."""

    def __init__(self, chart: Rendered, image: str, deployment: str, name: str, args: list[str] | None = None,
                 extra: tuple[str, ...] = ()) -> None:
        self.spec = chart.container(deployment, name)
        self.name = f"model-placement-test-{name}-{os.getpid()}"
        self.argv = chart.podman_run(deployment, self.spec, image, [a for a in self.spec["args"] if a != "--in-cluster"]
                                     if args is None else args, name=self.name, network="none",
                                     mounts=chart.materialize_volumes(deployment, self.spec), extra=extra)

    def run(self) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.argv, env=build.env(), capture_output=True, text=True, timeout=120)

    def serve(self) -> ServerProcess:
        server = ServerProcess([], argv0=self.argv, env=build.env())
        assert server.port, f"the {self.spec['name']} never listened: {server.lines[-5:]}"
        return server

    def exec(self, *argv: str, body: bytes = b"") -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(["podman", "exec", "-i", self.name, *argv], input=body, env=build.env(),
                              capture_output=True, timeout=60)

    def call(self, url: str, body: bytes = b"", ca: str = "") -> tuple[int, bytes]:
        done = self.exec("python", "-c", CLIENT, url, ca, body=body)
        assert done.returncode == 0, done.stderr.decode(errors="replace")
        status, _, data = done.stdout.partition(b"\n")
        return int(status), data

    def remove(self) -> None:
        build.podman("rm", "--force", "--ignore", self.name, check=False)


def in_image(image: str, code: str) -> Any:
    done = build.podman("run", "--rm", "--network=none", "--read-only", "--entrypoint=python", image, "-c", code)
    return json.loads(done.stdout)


def test_the_image_has_the_python_minor_and_debian_release_of_the_official_base(image: str) -> None:
    minor, codename = build.official_base()
    assert in_image(image, "import json, platform, sys; print(json.dumps(["
                           "'%d.%d' % sys.version_info[:2], platform.freedesktop_os_release()['VERSION_CODENAME']]))"
                    ) == [minor, codename]
    config = json.loads(build.podman("image", "inspect", image).stdout)[0]["Config"]
    assert config["User"] == "65532:65532" and config["Entrypoint"] == ["model-placement"]


def test_the_venv_holds_only_what_the_servers_import(image: str) -> None:
    found = in_image(image, PROBE)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    test_only = {re.match(r"[A-Za-z0-9_.-]+", r).group().lower()  # type: ignore[union-attr]
                 for r in project["project"]["optional-dependencies"]["test"]}
    assert not (test_only | {"pip", "setuptools", "wheel"}) & set(found["loaded"]), found["loaded"]
    # tzdata is python-dateutil's zone database: imported when a zone name is resolved, never at start.
    assert {name for name, loaded in found["loaded"].items() if not loaded} == {"tzdata"}, found["loaded"]
    # What is left unloaded inside the distributions the servers use is small (kubernetes.aio was 64 MB).
    assert {name: size for name, size in found["unloaded"].items() if size >= 2 << 20} == {}


def test_help_certs_and_report_run_in_the_webhook_container(image: str, chart: Rendered) -> None:
    done = Pod(chart, image, *WEBHOOK, args=["--help"]).run()
    assert done.returncode == 0 and done.stdout.startswith("usage: model-placement"), done.stderr
    done = Pod(chart, image, *WEBHOOK, args=["certs", "--service", "model-placement-webhook", "--namespace",
                                             "model-placement", "--out", "/tmp/certs"]).run()  # its emptyDir
    assert done.returncode == 0, done.stderr
    config = chart.materialize_volumes(WEBHOOK[0], chart.container(*WEBHOOK))[CONFIG_DIR]
    local = subprocess.run([*command(), f"--config={config}/config.yaml", "report"], capture_output=True,
                           text=True, timeout=120)
    done = Pod(chart, image, *WEBHOOK, args=[f"--config={CONFIG_DIR}/config.yaml", "report"]).run()
    assert done.returncode == 0 and done.stdout == local.stdout and "cpu-a1" in done.stdout, done.stderr


def settings_of(chart: Rendered, deployment: str, name: str) -> Settings:
    """The settings the chart gives the container (its mounted config file), for the checkout's own server."""
    return load_settings(chart.materialize_volumes(deployment, chart.container(deployment, name))[CONFIG_DIR]
                         / "config.yaml")


def drained(server: ServerProcess, grace: float) -> None:
    """SIGTERM, as the kubelet sends it: exit 0 within the pod's terminationGracePeriodSeconds, having drained."""
    assert server.stop(grace) == 0, server.lines[-8:]
    said = [e["msg"] for e in server.lines]
    assert said.index("stopped") > said.index("draining: readiness is false, finishing in-flight requests")
    assert server.problems() == []


async def test_webhook_serves_the_mounted_secret_and_a_recorded_review_then_drains(
        image: str, chart: Rendered, make_webhook: MakeWebhook) -> None:
    pod = Pod(chart, image, *WEBHOOK, extra=(f"--add-host={SERVICE}:127.0.0.1",))
    server = pod.serve()
    try:
        port = pod.spec["ports"][0]["containerPort"]
        ca = "/etc/model-placement-tls/ca.crt"  # the Secret's CA, the one the webhook configurations carry
        for probe in ("readinessProbe", "livenessProbe"):
            assert pod.call(f"https://{SERVICE}:{port}{pod.spec[probe]['httpGet']['path']}", ca=ca)[0] == 200
        recorded = fixture_json("recorded/admissionreview-mutate-pod-bare.json")  # what kube-apiserver sent
        body = json.dumps(recorded["request"]).encode()
        status, answer = pod.call(f"https://{SERVICE}:{port}{recorded['path']}", body, ca)
        checkout = await make_webhook(load_objects(demo_text()), settings_of(chart, *WEBHOOK))
        path, _, query = recorded["path"].partition("?")
        assert (status, json.loads(answer)) == (200, json.loads((await checkout.raw(path, body, query=f"?{query}"))[2]))
        assert json.loads(answer)["response"]["allowed"] and json.loads(answer)["response"]["patch"]
        drained(server, chart.pod_spec(WEBHOOK[0])["terminationGracePeriodSeconds"])
    finally:
        server.kill()
        pod.remove()


async def test_extender_answers_its_probes_and_a_recorded_filter_then_drains(image: str, chart: Rendered,
                                                                            make_ext: MakeExt) -> None:
    pod = Pod(chart, image, *EXTENDER)
    server = pod.serve()
    try:
        for probe in ("readinessProbe", "livenessProbe"):  # the chart's exec probes, as the kubelet runs them
            done = pod.exec(*pod.spec[probe]["exec"]["command"])
            assert done.returncode == 0, done.stderr
        args = fixture_json("extender-args-nodecache.json")  # what kube-scheduler sends, for the demo fleet's nodes
        args["NodeNames"] += DEMO_NODES
        port = next(a for a in pod.spec["args"] if a.startswith("--port=")).partition("=")[2]
        status, body = pod.call(f"http://127.0.0.1:{port}/filter", json.dumps(args).encode())
        checkout = await make_ext(load_objects(demo_text()), settings_of(chart, *EXTENDER))
        answer = json.loads(body)
        assert status == 200 and answer == await checkout.ok("/filter", json.dumps(args).encode())
        assert answer["NodeNames"] and set(answer["FailedAndUnresolvableNodes"]) >= {"worker-1", "worker-2"}
        drained(server, chart.pod_spec(EXTENDER[0])["terminationGracePeriodSeconds"])
    finally:
        server.kill()
        pod.remove()


@pytest.fixture(autouse=True)
def _nothing_left() -> Iterator[None]:
    yield
    left = build.podman("ps", "--all", "--filter", f"name=model-placement-test-.*-{os.getpid()}",
                        "--format", "{{.Names}}").stdout.split()
    assert left == [], f"containers left behind: {left}"
