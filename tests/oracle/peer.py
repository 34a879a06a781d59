"""The real NRI balloons plugin as a test peer: what it really gives a container on a node of a given shape.

`tests/peers/balloons` (built once per machine by `tests.peers.build.build("balloons")`) runs the balloons
policy of containers/nri-plugins v0.14.0 (its resmgr and agent, as the plugin's own main wires them) on a
synthetic sysfs tree (`tests/oracle/sysfs.py`) with a BalloonsPolicy read from a file, and plays the
container runtime to it through containerd/nri's runtime-side adaptation over a socket in a temporary
directory. The policy is first defaulted as the apiserver would from the real CRD of that release (read from
the Go module cache), so a field the policy leaves out means what it means in a cluster.

Line protocol (one JSON object a line each way, answers in request order):

start-up  ``balloons -host-root DIR -config-file POLICY.yaml`` (or ``-kubeconfig FILE`` with ``NODE_NAME`` set:
          the policy is the node's BalloonsPolicy in that cluster, as the plugin's agent picks it) prints
          ``{"ready": true, "error": null}``, or ``{"ready": false, "error": "<the plugin's own refusal>"}`` and
          exits when the plugin rejects the policy.
create    ``{"op": "create", "pod": {"name", "namespace", "qos": "Guaranteed|Burstable|BestEffort",
          "annotations", "labels"}, "container": {"name", "cpu_request_m", "cpu_limit_m", "memory_limit",
          "annotations"}}``: RunPodSandbox the first time the pod (namespace/name) is seen, then
          CreateContainer with the Linux resources the kubelet would pass (CPU shares from the request, CFS
          quota from the limit, memory limit) and StartContainer.
          → ``{"cpuset": "1-8", "mems": "0", "updates": {"ns/pod/ctr": {"cpuset", "mems"}}, "error": null}``;
          ``cpuset`` is what the plugin pinned the container to ("" if it set nothing), ``updates`` the other
          containers it re-pinned on the way. A container the plugin refuses fails: ``{"error": "..."}``.
remove    ``{"op": "remove", "pod": {...}, "container": {"name"}}``: StopContainer + RemoveContainer
          → ``{"updates": {...}, "error": null}``.
remove_pod ``{"op": "remove_pod", "pod": {...}}``: every container, then StopPodSandbox + RemovePodSandbox.
containers ``{"op": "containers"}`` → ``{"containers": {"ns/pod/ctr": {"cpuset", "mems"}}}``: where the
          runtime has every running container now.
balloons  ``{"op": "balloons"}`` → ``{"balloons": [{"name": "type[i]", "type", "instance", "cpuset",
          "shared_cpuset", "component_cpusets", "containers": ["ns/pod/ctr"]}], "zones": [...]}``: the
          NodeResourceTopology zones the plugin exports (containers listed with showContainersInNrt, which
          `BalloonsPeer` turns on unless the policy says otherwise).
reconfigure ``{"op": "reconfigure", "policy": "<BalloonsPolicy YAML>"}``: the policy file is replaced, as an
          updated BalloonsPolicy reaches the agent, and the plugin's verdict read from its log
          → ``{"applied": true, "error": null}`` or ``{"applied": false, "refused": "<its error>"}`` (it then
          keeps the previous configuration). Not in agent mode: there the BalloonsPolicy object is updated.
Errors of the protocol itself (unknown op, unknown pod) come back as ``{"error": "..."}`` too.

Python API::

    with BalloonsPeer(NodeShape(packages=2, cores_per_numa=16), {"reservedResources": {"cpu": "cpuset:0,32"},
                      "balloonTypes": [{"name": "vllm-balloon-tp1", "hideHyperthreads": True}]}) as node:
        got = node.create(Pod("m1", "models", annotations={BALLOON_KEY + "/container.vllm": "vllm-balloon-tp1"}),
                          Container("vllm", cpu="16"))
        got.cpus        # {1, ..., 8}: the threads the container may run on
        node.balloons() # [Balloon(name="vllm-balloon-tp1[0]", cpus={1..8, 33..40}, ...), ...]

`BalloonsPeer(...)` raises `PolicyRefused` with the plugin's message for a policy it rejects; a crashed or
silent peer raises `PeerError`. Leaving the `with` block always kills the process.
"""

from __future__ import annotations

import copy
import json
import os
import select
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import IO, Any

import yaml

from placement.quantity import cpu_milli
from placement.topology import CPUSet
from tests.oracle.sysfs import NodeShape, write_sysfs
from tests.peers.build import build, module_source

BALLOON_KEY = "balloon.balloons.resource-policy.nri.io"
NRI_PLUGINS = "github.com/containers/nri-plugins"
CRD = "config/crd/bases/config.nri_balloonspolicies.yaml"
SHM = "/dev/shm"


def _cpus(text: str) -> frozenset[int]:
    return CPUSet.parse(text).cpus


class PeerError(RuntimeError):
    """The peer crashed, hung or answered outside the protocol."""


class PolicyRefused(PeerError):
    """The plugin rejected the BalloonsPolicy at start-up; the message is its own."""


@dataclass(frozen=True)
class Pod:
    name: str
    namespace: str
    qos: str = "Guaranteed"
    annotations: dict[str, str] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)

    def wire(self) -> dict[str, Any]:
        return {"name": self.name, "namespace": self.namespace, "qos": self.qos,
                "annotations": self.annotations, "labels": self.labels}


def millicpus(quantity: str | int | float | None) -> int:
    """A CPU quantity in milli-CPUs as the kubelet hands it to the runtime: Quantity.MilliValue rounds up, so a
    sub-milli fraction is read the way the ledger reads it."""
    return 0 if quantity is None else cpu_milli(quantity)


@dataclass(frozen=True)
class Container:
    name: str
    cpu: str | int | float | None = None  # requests.cpu
    cpu_limit: str | int | float | None = None
    memory_limit: int = 0  # bytes
    annotations: dict[str, str] = field(default_factory=dict)

    def wire(self) -> dict[str, Any]:
        return {"name": self.name, "cpu_request_m": millicpus(self.cpu), "cpu_limit_m": millicpus(self.cpu_limit),
                "memory_limit": self.memory_limit, "annotations": self.annotations}


@dataclass(frozen=True)
class Placement:
    cpus: frozenset[int]
    mems: frozenset[int]

    @classmethod
    def wire(cls, raw: dict[str, str]) -> Placement:
        return cls(frozenset(_cpus(raw.get("cpuset", ""))), frozenset(_cpus(raw.get("mems", ""))))


@dataclass(frozen=True)
class Created:
    """The answer to a create: where the container runs, or why the runtime failed it."""
    error: str | None
    cpus: frozenset[int] = frozenset()
    mems: frozenset[int] = frozenset()
    updates: dict[str, Placement] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass(frozen=True)
class Balloon:
    name: str
    type: str
    instance: int
    cpus: frozenset[int]
    shared_cpus: frozenset[int]
    containers: tuple[str, ...]


@lru_cache(maxsize=1)
def binary() -> Path:
    """The built peer; looked up once a session (the lookup hashes the module and asks go its version)."""
    return build("balloons")


@lru_cache(maxsize=1)
def nri_plugins_dir() -> Path:
    """The pinned nri-plugins module's source (its CRDs and Helm charts)."""
    return module_source("balloons", NRI_PLUGINS)


@lru_cache(maxsize=1)
def crd_schema() -> dict[str, Any]:
    """The openAPIV3Schema of the BalloonsPolicy CRD shipped in the pinned nri-plugins module."""
    crd = yaml.safe_load((nri_plugins_dir() / CRD).read_text())
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def with_defaults(value: Any, schema: dict[str, Any]) -> Any:
    """value with the schema's defaults filled in where a field is absent, as the apiserver stores it."""
    if isinstance(value, dict):
        out = dict(value)
        for name, sub in schema.get("properties", {}).items():
            if name not in out and "default" in sub:
                out[name] = copy.deepcopy(sub["default"])
            if name in out:
                out[name] = with_defaults(out[name], sub)
        return out
    if isinstance(value, list) and "items" in schema:
        return [with_defaults(item, schema["items"]) for item in value]
    return value


def policy_object(policy: dict[str, Any]) -> dict[str, Any]:
    """A BalloonsPolicy object (or just its spec) as the plugin would read it from the apiserver."""
    obj = copy.deepcopy(policy) if "spec" in policy else {"spec": copy.deepcopy(policy)}
    obj.setdefault("apiVersion", "config.nri/v1alpha1")
    obj.setdefault("kind", "BalloonsPolicy")
    obj.setdefault("metadata", {"name": "default", "namespace": "kube-system"})
    obj["spec"].setdefault("showContainersInNrt", True)
    return with_defaults(obj, crd_schema())


class LinePeer:
    """A Go peer of ours that answers one JSON object a line for each it reads, in order. It runs in its own
    session (a test's teardown kills the group; if this process dies first, its stdin closes and the peer exits by
    itself), its stderr kept in `log` for the error messages; closing it always kills and reaps it."""

    name = "Go"

    def __init__(self, argv: list[str], log: IO[bytes], *, env: dict[str, str] | None = None,
                 timeout: float = 120) -> None:
        self.timeout = timeout
        self._stderr = log
        self._pending = bytearray()  # what the peer wrote past its last answer read
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, env=env,
                                     start_new_session=True)

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                stream.close()
        self._stderr.close()

    def log_tail(self, lines: int = 20) -> str:
        self._stderr.flush()
        self._stderr.seek(0)
        return b"\n".join(self._stderr.read().splitlines()[-lines:]).decode(errors="replace")

    def _read(self) -> dict[str, Any]:
        # select on the pipe rather than a reader thread per answer: the kubelet oracle asks thousands of questions,
        # and a thread each cost it more than the peer's answers.
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + self.timeout
        while b"\n" not in self._pending:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                self.proc.kill()
                raise PeerError(f"the {self.name} peer did not answer within {self.timeout} s; its log ends:\n"
                                f"{self.log_tail()}")
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                self.proc.wait(10)
                raise PeerError(f"the {self.name} peer exited ({self.proc.returncode}); its log ends:\n"
                                f"{self.log_tail()}")
            self._pending += chunk
        line, _, rest = self._pending.partition(b"\n")
        self._pending = bytearray(rest)
        return json.loads(line)

    def send(self, message: dict[str, Any]) -> dict[str, Any]:
        """One round trip: message out, its answer back."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(message).encode() + b"\n")
        self.proc.stdin.flush()
        return self._read()


class BalloonsPeer(LinePeer):
    """One node's plugin. Its policy is `policy` (a file the agent watches, as the oracle plays it), or, given
    `node` and `kubeconfig`, whichever BalloonsPolicy the plugin's own agent picks for that Node in the cluster
    (the virtual nodes of tests/e2e); `log` keeps the plugin's log there instead of a temporary file."""

    name = "balloons"

    def __init__(self, shape: NodeShape, policy: dict[str, Any] | None = None, *, node: str | None = None,
                 kubeconfig: Path | None = None, log: Path | None = None, timeout: float = 120) -> None:
        if (policy is None) == (kubeconfig is None and node is None) or (kubeconfig is None) != (node is None):
            raise ValueError("a peer's policy is a BalloonsPolicy, or a node and the kubeconfig its agent reads one "
                             "with")
        self.shape = shape
        executable = binary()  # first: the build brings the module the CRD defaults are read from
        # A node's sysfs is thousands of small files: in memory when the machine has a tmpfs for it.
        self._dir = tempfile.TemporaryDirectory(prefix="balloons-node-", dir=SHM if os.access(SHM, os.W_OK) else None)
        root = write_sysfs(Path(self._dir.name) / "host", shape)
        env = {**os.environ, "TMPDIR": self._dir.name}  # its socket dir goes with ours
        if policy is not None:
            config = Path(self._dir.name) / "policy" / "policy.yaml"  # alone in its directory: the agent watches it
            config.parent.mkdir()
            config.write_text(yaml.safe_dump(policy_object(policy)))
            source = ["-config-file", str(config)]
        else:
            source, env["NODE_NAME"] = ["-kubeconfig", str(kubeconfig)], str(node)
        super().__init__([str(executable), "-host-root", str(root), *source],
                         open(log or Path(self._dir.name) / "stderr", "w+b"),  # noqa: SIM115 - the peer closes it
                         env=env, timeout=timeout)
        try:
            hello = self._read()
        except PeerError:
            self.close()
            raise
        if not hello.get("ready"):
            self.close()
            raise PolicyRefused(hello.get("error") or "the plugin refused the policy")

    def __enter__(self) -> BalloonsPeer:
        return self

    def close(self) -> None:
        super().close()
        self._dir.cleanup()

    def request(self, op: str, **fields: Any) -> dict[str, Any]:
        """One protocol round trip; raises PeerError for an error that is not the plugin's verdict."""
        return self.send({"op": op, **fields})

    def _checked(self, op: str, **fields: Any) -> dict[str, Any]:
        answer = self.request(op, **fields)
        if answer.get("error") is not None:
            raise PeerError(f"{op}: {answer['error']}")
        return answer

    @staticmethod
    def _placements(raw: dict[str, dict[str, str]] | None) -> dict[str, Placement]:
        return {name: Placement.wire(p) for name, p in (raw or {}).items()}

    def create(self, pod: Pod, container: Container) -> Created:
        answer = self.request("create", pod=pod.wire(), container=container.wire())
        if answer.get("error") is not None:
            return Created(error=answer["error"])
        placed = Placement.wire(answer)
        return Created(None, placed.cpus, placed.mems, self._placements(answer.get("updates")))

    def remove(self, pod: Pod, container: str) -> dict[str, Placement]:
        return self._placements(self._checked("remove", pod=pod.wire(), container={"name": container}).get("updates"))

    def remove_pod(self, pod: Pod) -> dict[str, Placement]:
        return self._placements(self._checked("remove_pod", pod=pod.wire()).get("updates"))

    def containers(self) -> dict[str, Placement]:
        return self._placements(self._checked("containers").get("containers"))

    def balloons(self) -> list[Balloon]:
        return [Balloon(b["name"], b["type"], int(b["instance"]), frozenset(_cpus(b["cpuset"])),
                        frozenset(_cpus(b["shared_cpuset"])), tuple(b["containers"]))
                for b in self._checked("balloons").get("balloons") or []]

    def reconfigure(self, policy: dict[str, Any]) -> str | None:
        """Update the policy in place: None when the plugin applied it, else its refusal."""
        answer = self._checked("reconfigure", policy=yaml.safe_dump(policy_object(policy)))
        return None if answer.get("applied") else answer.get("refused", "")

    def zones(self) -> list[dict[str, Any]]:
        """The NodeResourceTopology zones the plugin would export, as its Go structs serialise."""
        return self._checked("balloons").get("zones") or []
