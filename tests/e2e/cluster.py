"""A real Kubernetes control plane on loopback, with model-placement installed from its Helm chart.

etcd, kube-apiserver, kube-controller-manager and kube-scheduler come from one multi-call binary built from the
pinned Kubernetes release (tests/peers/kube). There is no kubelet: Node objects carry the status a kubelet would
report, and bound pods simply stay Pending. Our webhook and extender run as local processes with the args their
containers get in the rendered manifests; only what cannot exist outside a pod is rewritten (see `local_args`).
Every component logs to its own file under the cluster's directory.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import urllib3
import yaml

from certs import make_ca, make_serving_cert, write_bundle
from placement.ledger import PLACEMENT
from tests.image.build import env as podman_env
from tests.image.build import podman
from tests.peers.build import build, module_source
from tests.support.chart import SERVICE_ACCOUNT, Rendered

ROOT = Path(__file__).resolve().parents[2]
NAMESPACE = "model-placement"
SERVICE = "model-placement-webhook"
RELEASE = "model-placement"
ADMIN_TOKEN = "e2e-admin-token"
LOOPBACK = "127.0.0.1"

# The controllers the product relies on: Deployments -> ReplicaSets -> pods, owner-reference cleanup, each
# namespace's default ServiceAccount (the ServiceAccount admission plugin refuses pods without it), PDB status.
# Not node-lifecycle: with no kubelet it would taint every Node unreachable.
CONTROLLERS = ",".join([
    "deployment-controller", "replicaset-controller", "garbage-collector-controller", "serviceaccount-controller",
    "namespace-controller", "root-ca-certificate-publisher-controller", "disruption-controller",
])


def crd_files() -> list[Path]:
    """The real BalloonsPolicy and NodeResourceTopology CRDs, as the nri-plugins release the balloons oracle
    pins (tests/peers/balloons/go.mod) ships them, from the Go module cache."""
    bases = module_source("balloons", "github.com/containers/nri-plugins") / "config" / "crd" / "bases"
    return [bases / "config.nri_balloonspolicies.yaml", bases / "topology.node.k8s.io_noderesourcetopologies.yaml"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


def wait_until(what: str, check: Callable[[], Any], timeout: float = 60, every: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except AssertionError:
            raise  # a check's own verdict that waiting cannot change (a process exited)
        except Exception as exc:
            last = exc
        else:
            if last:
                return last
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")


@dataclass
class Component:
    """One process of the cluster, its output in `log`."""

    name: str
    argv: list[str]
    log: Path
    env: dict[str, str] = field(default_factory=dict)
    cwd: Path = ROOT
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Component:
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         cwd=self.cwd, env={**os.environ, **self.env}, start_new_session=True)
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 20) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        return self.proc.returncode

    def restart(self) -> Component:
        self.stop()
        return self.start()

    def tail(self, lines: int = 40) -> str:
        if not self.log.exists():
            return ""
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


@dataclass
class ContainerComponent(Component):
    """One of our servers run from the image by `podman run` (its argv): podman passes SIGTERM on to the
    container and exits with its code; a container that outlives a killed podman is removed."""

    container: str = ""

    def stop(self, timeout: float = 20) -> int | None:
        code = super().stop(timeout)
        podman("rm", "--force", "--ignore", self.container, check=False)
        return code


def _kubeconfig(path: Path, server: str, ca: Path, token: str, user: str) -> Path:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "e2e",
        "clusters": [{"name": "e2e", "cluster": {"server": server, "certificate-authority": str(ca)}}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": user}}],
    }))
    return path


class Api:
    """Direct JSON calls to the apiserver, for setting up fleets faster than kubectl could."""

    def __init__(self, server: str, ca: Path, token: str) -> None:
        self.server = server
        self.http = urllib3.PoolManager(maxsize=16, ca_certs=str(ca), cert_reqs="CERT_REQUIRED")
        self.auth = {"Authorization": f"Bearer {token}"}

    def call(self, method: str, path: str, body: Any = None, *, ok: Iterable[int] = (200, 201),
             content_type: str = "application/json") -> Any:
        data = None if body is None else json.dumps(body).encode()
        resp = self.http.request(method, self.server + path, body=data, timeout=30,
                                 headers={**self.auth, "Content-Type": content_type, "Accept": "application/json"})
        if resp.status not in ok:
            raise AssertionError(f"{method} {path}: {resp.status} {resp.data[:500].decode(errors='replace')}")
        return json.loads(resp.data) if resp.data else None

    def get(self, path: str) -> Any:
        return self.call("GET", path)

    def watch(self, path: str, read_timeout: float) -> Iterator[dict[str, Any]]:
        """The events of a watch (`path` with its query, `watch=1` included), one object each, until the
        apiserver ends the stream; an ERROR event (a resourceVersion too old) is yielded like the others."""
        resp = self.http.request("GET", self.server + path, headers=self.auth, preload_content=False,
                                 timeout=urllib3.Timeout(connect=10, read=read_timeout))
        try:
            buffered = b""
            for chunk in resp.stream(65536):
                buffered += chunk
                *lines, buffered = buffered.split(b"\n")
                for line in lines:
                    if line:
                        yield json.loads(line)
        finally:
            resp.release_conn()

    def create_many(self, path_of: Callable[[dict[str, Any]], str], objects: list[dict[str, Any]],
                    workers: int = 8) -> None:
        with ThreadPoolExecutor(workers) as pool:
            list(pool.map(lambda o: self.call("POST", path_of(o), o), objects))


# Our servers: the Deployment, container and ServiceAccount each runs as.
OURS = {
    "webhook": ("model-placement-webhook", "webhook", "model-placement-webhook"),
    "extender": ("model-placement-scheduler", "extender", "model-placement-scheduler"),
}


class Cluster(Rendered):
    """The control plane (started by `start`) and model-placement installed on it (`install`)."""

    def __init__(self, root: Path) -> None:
        super().__init__([], root)
        self.logs = root / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.kube = str(build("kube"))
        self.components: dict[str, Component] = {}
        self.api_port = free_port()
        self.server = f"https://{LOOPBACK}:{self.api_port}"
        self.pki = root / "pki"
        self.ports = {"webhook": free_port(), "extender": free_port()}
        # Where the apiserver and kube-scheduler call us: our servers, unless a recording proxy stands in front.
        self.front = dict(self.ports)
        self.mounts: dict[str, dict[str, Path]] = {}  # component -> its container's mountPath -> local copy
        self.extender_api: Api | None = None  # calls as our extender's ServiceAccount (`create_pods`)

    # -- control plane ---------------------------------------------------------------------------------

    def _component(self, name: str, args: list[str], env: dict[str, str] | None = None,
                   argv0: list[str] | None = None) -> Component:
        comp = Component(name, [*(argv0 or [self.kube, name]), *args], self.logs / f"{name}.log", env or {})
        self.components[name] = comp
        return comp.start()

    def _pki(self) -> None:
        self.pki.mkdir(exist_ok=True)
        ca = make_ca("e2e-kubernetes-ca")
        serving = make_serving_cert(ca, "kubernetes", "default", extra_sans=("localhost", LOOPBACK))
        (self.pki / "ca.crt").write_bytes(ca.cert_pem)
        (self.pki / "apiserver.crt").write_bytes(serving.cert_pem)
        (self.pki / "apiserver.key").write_bytes(serving.key_pem)
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import rsa

        sa = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        (self.pki / "sa.key").write_bytes(sa.private_bytes(serialization.Encoding.PEM,
                                                           serialization.PrivateFormat.TraditionalOpenSSL,
                                                           serialization.NoEncryption()))
        (self.pki / "sa.pub").write_bytes(sa.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
        (self.pki / "tokens.csv").write_text(f"{ADMIN_TOKEN},admin,admin-uid,system:masters\n")
        self.admin_kubeconfig = _kubeconfig(self.root / "admin.kubeconfig", self.server, self.pki / "ca.crt",
                                            ADMIN_TOKEN, "admin")
        self.api = Api(self.server, self.pki / "ca.crt", ADMIN_TOKEN)

    def start(self) -> Cluster:
        self._pki()
        etcd_port = free_port()
        self._component("etcd", [f"--data-dir={self.root / 'etcd'}", f"--listen-client-urls=http://{LOOPBACK}:{etcd_port}",
                                 f"--listen-peer-urls=http://{LOOPBACK}:{free_port()}", "--unsafe-no-fsync",
                                 # at warn it logs "request stats" for every slow-ish request on this busy machine
                                 "--log-level=error"])
        self.apiserver_args = [
            f"--etcd-servers=http://{LOOPBACK}:{etcd_port}",
            f"--bind-address={LOOPBACK}", f"--advertise-address={LOOPBACK}", f"--secure-port={self.api_port}",
            f"--tls-cert-file={self.pki / 'apiserver.crt'}", f"--tls-private-key-file={self.pki / 'apiserver.key'}",
            f"--client-ca-file={self.pki / 'ca.crt'}", f"--token-auth-file={self.pki / 'tokens.csv'}",
            "--authorization-mode=Node,RBAC",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={self.pki / 'sa.pub'}",
            f"--service-account-signing-key-file={self.pki / 'sa.key'}",
            "--service-cluster-ip-range=10.96.0.0/16",
            # The kubernetes Service's endpoint would be 127.0.0.1, which Endpoints validation forbids.
            "--endpoint-reconciler-type=none",
            # It taints every new Node not-ready until the node-lifecycle controller sees a kubelet's Ready
            # heartbeat; with no kubelet (and no node-lifecycle controller) the taint would never go.
            "--disable-admission-plugins=TaintNodesByCondition",
            f"--cert-dir={self.root / 'apiserver-certs'}",
            "--profiling=false",
        ]
        self._component("kube-apiserver", self.apiserver_args)
        self.wait_apiserver()
        self._component("kube-controller-manager", [
            f"--kubeconfig={self.admin_kubeconfig}", f"--authentication-kubeconfig={self.admin_kubeconfig}",
            f"--authorization-kubeconfig={self.admin_kubeconfig}",
            f"--bind-address={LOOPBACK}", f"--secure-port={free_port()}", "--leader-elect=false",
            f"--controllers={CONTROLLERS}", f"--root-ca-file={self.pki / 'ca.crt'}",
            "--kube-api-qps=200", "--kube-api-burst=400", "--concurrent-replicaset-syncs=10",
        ])
        return self

    def wait_apiserver(self, timeout: float = 90) -> None:
        apiserver = self.components["kube-apiserver"]

        def ready() -> bool:
            if not apiserver.alive():
                raise AssertionError("kube-apiserver exited:\n" + apiserver.tail())
            return self.api.http.request("GET", self.server + "/readyz", timeout=5, retries=False).status == 200

        wait_until("kube-apiserver /readyz", ready, timeout)

    def restart_apiserver(self) -> None:
        self.components["kube-apiserver"].restart()
        self.wait_apiserver()

    def stop(self) -> None:
        for comp in reversed(list(self.components.values())):
            comp.stop()

    def tails(self, lines: int = 30) -> str:
        return "\n".join(f"----- {c.name} ({c.log}) -----\n{c.tail(lines)}" for c in self.components.values())

    # -- kubectl ----------------------------------------------------------------------------------------

    def kubectl(self, *args: str, input: str | None = None, check: bool = True,
                kubeconfig: Path | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([self.kube, "kubectl", f"--kubeconfig={kubeconfig or self.admin_kubeconfig}", *args],
                              input=input, capture_output=True, text=True, timeout=timeout)
        if check and done.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} exited {done.returncode}:\n{done.stderr}{done.stdout}")
        return done

    def kubectl_json(self, *args: str) -> Any:
        return json.loads(self.kubectl(*args, "-o", "json").stdout)

    def service_account_token(self, name: str, namespace: str = NAMESPACE) -> str:
        """What a pod running as this ServiceAccount would authenticate with: a TokenRequest token."""
        granted = self.api.call("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
                                {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                                 "spec": {"expirationSeconds": 86400}})
        return str(granted["status"]["token"])

    def service_account_kubeconfig(self, name: str, namespace: str = NAMESPACE) -> Path:
        return _kubeconfig(self.root / f"{name}.kubeconfig", self.server, self.pki / "ca.crt",
                           self.service_account_token(name, namespace), f"system:serviceaccount:{namespace}:{name}")

    def service_account_volume(self, name: str, namespace: str = NAMESPACE) -> Path:
        """The files the kubelet mounts at SERVICE_ACCOUNT in a pod of this ServiceAccount."""
        local = self.root / "volumes" / f"serviceaccount-{name}"
        local.mkdir(parents=True, exist_ok=True)
        for key, value in (("token", self.service_account_token(name, namespace)),
                           ("ca.crt", (self.pki / "ca.crt").read_text()), ("namespace", namespace)):
            (local / key).write_text(value)
            (local / key).chmod(0o644)
        return local

    # -- model-placement from its Helm chart -------------------------------------------------------------

    def helm(self, *args: str) -> str:
        done = subprocess.run([str(build("helm")), f"--kubeconfig={self.admin_kubeconfig}", *args],
                              capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} exited {done.returncode}:\n{done.stderr}{done.stdout}")
        return done.stdout

    def install(self) -> None:
        """CRDs, then model-placement with the real helm from charts/model-placement, as docs/install.md says
        (the chart's objects are manifests/base's: tests/test_chart.py compares them with kustomize's).
        certs.mode=existing: a Secret from `write_bundle` (as `model-placement certs` writes it), also valid for
        the loopback address the apiserver calls the webhook on. Then the webhooks' clientConfig is pointed at our
        local webhook, the one thing a pod-less install cannot have."""
        for crd in crd_files():
            self.kubectl("apply", "--server-side", "-f", str(crd))
        for crd in ("balloonspolicies.config.nri", "noderesourcetopologies.topology.node.k8s.io"):
            self.kubectl("wait", "--for=condition=Established", f"crd/{crd}", "--timeout=60s")
        self.tls = write_bundle(SERVICE, NAMESPACE, self.root / "certs", extra_sans=(LOOPBACK,))
        ca_bundle = base64.b64encode(Path(self.tls.ca_file).read_bytes()).decode()
        self.helm("install", RELEASE, str(ROOT / "charts" / "model-placement"), "-n", NAMESPACE,
                  "--create-namespace", "--set", "certs.mode=existing", "--set", f"certs.caBundle={ca_bundle}")
        self.kubectl("-n", NAMESPACE, "create", "secret", "generic", "model-placement-tls",
                     *(f"--from-file={Path(f).name}={f}" for f in (self.tls.cert_file, self.tls.key_file,
                                                                   self.tls.ca_file)))
        self.rendered = [d for d in yaml.safe_load_all(self.helm("get", "manifest", RELEASE, "-n", NAMESPACE)) if d]
        self.rendered.append(self.kubectl_json("-n", NAMESPACE, "get", "secret", "model-placement-tls"))
        for doc in self.rendered:
            if doc["kind"] in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
                patch = [{"op": "replace", "path": f"/webhooks/{i}/clientConfig",
                          "value": {"url": f"https://{LOOPBACK}:{self.front['webhook']}"
                                           f"{hook['clientConfig']['service']['path']}",
                                    "caBundle": hook["clientConfig"]["caBundle"]}}
                         for i, hook in enumerate(doc["webhooks"])]
                self.kubectl("patch", doc["kind"].lower(), doc["metadata"]["name"], "--type=json",
                             "-p", json.dumps(patch))

    def local_args(self, args: list[str], mounts: dict[str, Path], kubeconfig: Path | None, port: int) -> list[str]:
        """The container's args as they run here. Rewritten, and nothing else: `--in-cluster` becomes the
        ServiceAccount's kubeconfig (no pod, so no mounted token; kept without one); mounted paths become their
        local copies; `--host` is loopback (never any other address here); `--port` a free port."""
        out = []
        for arg in args:
            flag, eq, value = arg.partition("=")
            if arg == "--in-cluster" and kubeconfig is not None:
                arg = f"--kubeconfig={kubeconfig}"
            elif flag == "--host" and eq:
                arg = f"--host={LOOPBACK}"
            elif flag == "--port" and eq:
                arg = f"--port={port}"
            else:
                for mount, local in mounts.items():
                    if value.startswith(mount + "/"):
                        arg = f"{flag}={local}{value[len(mount):]}"
            out.append(arg)
        return out

    def start_model_placement(self, which: str, argv0: list[str] | None = None, image: str | None = None
                              ) -> Component:
        """Our webhook (`which` = webhook) or extender, with the args and env of its container; `argv0` runs the
        module some other way than `python -m cli`; `image` runs our image instead, as the kubelet would
        on the host's network: the ServiceAccount's token where a pod has it and the kubernetes Service's address
        in the environment the kubelet sets, so `--in-cluster` and the mounted paths stay as the chart says."""
        deployment, name, sa = OURS[which]
        container = self.container(deployment, name)
        mounts = self.materialize_volumes(deployment, container)
        self.mounts[which] = mounts
        if image is None:
            args = self.local_args(container["args"], mounts, self.service_account_kubeconfig(sa), self.ports[which])
            comp = self._component(which, args, self.env(deployment, container),
                                   argv0=argv0 or [sys.executable, "-m", "cli"])
        else:
            args = self.local_args(container["args"], {}, None, self.ports[which])
            named = f"model-placement-{which}-{self.api_port}"
            argv = self.podman_run(deployment, container, image, args, name=named, network="host",
                                   mounts={**mounts, SERVICE_ACCOUNT: self.service_account_volume(sa)},
                                   env={"KUBERNETES_SERVICE_HOST": LOOPBACK,
                                        "KUBERNETES_SERVICE_PORT": str(self.api_port)})
            comp = ContainerComponent(which, argv, self.logs / f"{which}.log", podman_env(), container=named)
            self.components[which] = comp.start()
        self.wait_ready(which)
        return comp

    def tls_context(self, client: bool) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.tls.ca_file))
        ctx.check_hostname = False  # the bundle is issued for the Service names (and 127.0.0.1)
        if client:
            ctx.load_cert_chain(self.tls.cert_file, self.tls.key_file)
        return ctx

    def scheme(self, which: str) -> str:
        """http or https, as the args of our server's container in the manifests say."""
        deployment, name, _ = OURS[which]
        return "http" if "--insecure-http" in self.container(deployment, name)["args"] else "https"

    def url(self, which: str, port: int | None = None) -> str:
        """Where one of our servers answers (or the front at `port` that stands in for it)."""
        return f"{self.scheme(which)}://{LOOPBACK}:{port or self.ports[which]}"

    def client_tls(self, which: str) -> ssl.SSLContext | None:
        """What a caller of our server `which` presents and trusts; None over plain HTTP."""
        return self.tls_context(client=which == "extender") if self.scheme(which) == "https" else None

    def get_ours(self, which: str, path: str, timeout: float = 5) -> tuple[int, bytes]:
        http = urllib3.PoolManager(ssl_context=self.client_tls(which), assert_hostname=False)
        resp = http.request("GET", f"{self.url(which)}{path}", timeout=timeout, retries=False)
        return resp.status, resp.data

    def wait_ready(self, which: str, timeout: float = 60) -> None:
        comp = self.components[which]

        def ready() -> bool:
            if not comp.alive():
                raise AssertionError(f"{which} exited with {comp.proc.returncode if comp.proc else '?'}:\n"
                                     f"{comp.tail()}")
            return self.get_ours(which, "/readyz")[0] == 200

        wait_until(f"{which} /readyz", ready, timeout)

    def start_scheduler(self, component: str = "kube-scheduler",
                        edit: Callable[[dict[str, Any]], None] | None = None) -> Component:
        """kube-scheduler with the manifests' KubeSchedulerConfiguration; rewritten: the extender's urlPrefix,
        its TLS file paths where it has any, and clientConnection.kubeconfig (the ServiceAccount's token, as
        in-cluster). `edit` changes the configuration further (the bench's scheduler without the extender)."""
        container = self.container("model-placement-scheduler", "kube-scheduler")
        mounts = {}  # a copy per scheduler process: each may have its own configuration
        for mount, local in self.materialize_volumes("model-placement-scheduler", container).items():
            mounts[mount] = self.root / "volumes" / component / Path(mount).name
            shutil.copytree(local, mounts[mount], dirs_exist_ok=True)
        tls_dir = Path(self.tls.cert_file).parent  # an extender stanza with TLS trusts and presents the bundle
        kubeconfig = self.service_account_kubeconfig("model-placement-scheduler")
        for local in mounts.values():
            for path in local.glob("*.yaml"):
                config = yaml.safe_load(path.read_text())
                if config.get("kind") != "KubeSchedulerConfiguration":
                    continue
                for ext in config.get("extenders", []):
                    ext["urlPrefix"] = self.url("extender", self.front["extender"])
                    tls = ext.get("tlsConfig", {})
                    for key in ("caFile", "certFile", "keyFile"):
                        if key in tls:
                            tls[key] = str(tls_dir / Path(tls[key]).name)
                config.setdefault("clientConnection", {})["kubeconfig"] = str(kubeconfig)
                if edit:
                    edit(config)
                path.write_text(yaml.safe_dump(config))
        args = self.local_args(container["command"][1:], mounts, kubeconfig, 0)
        # Its secure port would otherwise listen on every address.
        self.ports[component] = free_port()
        args += [f"--bind-address={LOOPBACK}", f"--secure-port={self.ports[component]}"]
        return self._component(component, args, argv0=[self.kube, "kube-scheduler"])

    # -- fleet ----------------------------------------------------------------------------------------------

    def create_namespace(self, name: str, enabled: bool, labels: dict[str, str] | None = None) -> None:
        """`enabled`: opted in to our webhooks. One that is not stands for pods placed before the install or by
        hand, which may carry model balloon types (the install's widening label, docs/rules.md "What
        model-placement owns on a pod"), unless `labels` says otherwise."""
        if labels is None:
            labels = {"model-placement.io/enabled": "true"} if enabled else \
                {"model-placement.io/model-balloon-types": "any-pod"}
        self.api.call("POST", "/api/v1/namespaces",
                      {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}})
        wait_until(f"the default ServiceAccount of {name}",
                   lambda: self.api.call("GET", f"/api/v1/namespaces/{name}/serviceaccounts/default", ok=(200, 404))
                   .get("kind") == "ServiceAccount")

    def create_nodes(self, nodes: list[dict[str, Any]]) -> None:
        self.api.create_many(lambda o: "/api/v1/nodes", nodes)

    def create_pods(self, pods: list[dict[str, Any]]) -> None:
        """Created as given; but a pod bound by name with a placement, as our extender leaves a pod, is created
        unbound and bound as our extender binds it: by a Binding that carries the placement, sent with our
        scheduler's ServiceAccount (the install refuses a pod created with one, and lets nobody else write it)."""
        placed = [p for p in pods
                  if p["spec"].get("nodeName") and PLACEMENT in (p["metadata"].get("annotations") or {})]
        unbound = [{**p, "metadata": {**p["metadata"], "annotations": {
            k: v for k, v in p["metadata"]["annotations"].items() if k != PLACEMENT}},
            "spec": {k: v for k, v in p["spec"].items() if k != "nodeName"}} for p in placed]
        self.api.create_many(lambda o: f"/api/v1/namespaces/{o['metadata']['namespace']}/pods",
                             [p for p in pods if not any(p is q for q in placed)] + unbound)
        if placed:
            if self.extender_api is None:
                self.extender_api = Api(self.server, self.pki / "ca.crt",
                                        self.service_account_token(OURS["extender"][2]))
            self.extender_api.create_many(
                lambda o: f"/api/v1/namespaces/{o['metadata']['namespace']}/pods/{o['metadata']['name']}/binding",
                [{"apiVersion": "v1", "kind": "Binding",
                  "metadata": {"name": p["metadata"]["name"], "namespace": p["metadata"]["namespace"],
                               "annotations": {PLACEMENT: p["metadata"]["annotations"][PLACEMENT]}},
                  "target": {"apiVersion": "v1", "kind": "Node", "name": p["spec"]["nodeName"]}} for p in placed])

    def delete_deployment(self, namespace: str, name: str, selector: str) -> None:
        """Delete it and force its pods away: with no kubelet, a graceful pod delete never completes."""
        self.kubectl("-n", namespace, "delete", "deployment", name, "--wait=false", check=False)

        def gone() -> bool:
            if not self.pods(namespace, selector):
                return True
            # again: its ReplicaSet may have created more before the garbage collector deleted it
            self.kubectl("-n", namespace, "delete", "pods", "-l", selector, "--grace-period=0", "--force",
                         check=False)
            return False

        wait_until(f"the pods of {name} gone", gone, timeout=60, every=1)

    def pods(self, namespace: str, selector: str = "") -> list[dict[str, Any]]:
        query = f"?labelSelector={selector}" if selector else ""
        return self.api.get(f"/api/v1/namespaces/{namespace}/pods{query}")["items"]


def node(name: str, *, numa: int, cores_per_numa: int, smt: bool = True, amx: bool = True,
         labels: dict[str, str] | None = None, memory_gi: int = 1024) -> dict[str, Any]:
    """A Node as a kubelet with NFD would register it, Ready, with no kubelet behind it."""
    cpus = numa * cores_per_numa * (2 if smt else 1)
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    resources = {"cpu": str(cpus), "memory": f"{memory_gi}Gi", "pods": "110"}
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {
            "kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
            "feature.node.kubernetes.io/cpu-hardware_multithreading": "true" if smt else "false",
            "feature.node.kubernetes.io/memory-numa.node_count": str(numa),
            "feature.node.kubernetes.io/memory-numa": "true" if numa > 1 else "false",
            "feature.node.kubernetes.io/cpu-security.amx.enabled": "true" if amx else "false",
            **(labels or {}),
        }},
        "spec": {},
        "status": {
            "capacity": resources, "allocatable": resources,
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                            "message": "kubelet is posting ready status", "lastHeartbeatTime": now,
                            "lastTransitionTime": now}],
            "nodeInfo": {"architecture": "amd64", "operatingSystem": "linux", "kubeletVersion": "v1.35.4",
                         "containerRuntimeVersion": "containerd://2.1.0", "kernelVersion": "6.8.0",
                         "osImage": "Ubuntu 24.04", "kubeProxyVersion": "", "machineID": "", "systemUUID": "",
                         "bootID": ""},
        },
    }

