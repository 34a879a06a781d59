"""The real kubelet as a test peer: where kubelet v1.35's managers put a pod's containers, and whether it admits it.

`tests/peers/kube` (the multi-call binary of the pinned Kubernetes release, `tests.peers.build.build("kube")`) runs,
as its `kubelet` subcommand, the kubelet's own CPU Manager static policy, Topology Manager, Memory Manager Static
policy, predicate admit handler (resource fit) and podresources v1 server on a synthetic machine; the protocol is
in `tests/peers/kube/kubelet.go`. One process is one node, from its start-up to its last pod.

Python API::

    with KubeletPeer() as kubelet:
        started = kubelet.start(NodeShape(packages=2, cores_per_numa=8), {"reservedSystemCPUs": "0,16",
                                "topologyManagerPolicy": "single-numa-node"})
        started.allocatable                              # frozenset of CPU ids: all but the reserved ones
        got = kubelet.add(v1_pod("m1", container("vllm", cpu=4)))
        got.admit, got.reason, got.message               # as the pod's status would say after rejectPod
        got.containers["vllm"].cpus                      # its exclusive CPUs (empty when it runs in the shared pool)
        kubelet.podresources()                           # what node-feature-discovery would read

A kubelet that would not start answers `Started(ok=False, error=...)`; the process has then exited. A crashed or
silent peer, or an answer outside the protocol, raises `PeerError`.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from placement.topology import CPUSet
from tests.oracle.peer import LinePeer, PeerError
from tests.oracle.sysfs import NodeShape
from tests.peers.build import build

GIB = 1 << 30
REJECTED = "Pod was rejected: "  # how kubelet.rejectPod begins the pod status' Message


@lru_cache(maxsize=1)
def binary() -> Path:
    return build("kube")


def machine(shape: NodeShape) -> dict[str, Any]:
    """The driver's machine for a node shape, numbered as Linux numbers it (tests/oracle/sysfs.py): each core is
    the list of its threads, each NUMA node its cores, memory and package, with the shape's NUMA distances."""
    return {
        "numa": [{"id": numa, "socket": numa // shape.numa_per_package, "memory": shape.memory_gib_per_numa * GIB,
                  "cores": [shape.threads(core) for core in range(numa * shape.cores_per_numa,
                                                                  (numa + 1) * shape.cores_per_numa)]}
                 for numa in range(shape.numa_nodes)],
        "distances": [[shape.distance(a, b) for b in range(shape.numa_nodes)] for a in range(shape.numa_nodes)],
    }


def container(name: str, cpu: str | int, memory: str = "1Gi", *, limits: bool = True,
              sidecar: bool = False) -> dict[str, Any]:
    """A container spec requesting cpu and memory; with `limits` (the default) it limits both to the same, which
    makes it Guaranteed; a `sidecar` is a native one (an init container with restartPolicy Always)."""
    amounts = {"cpu": str(cpu), "memory": memory}
    spec: dict[str, Any] = {"name": name, "image": "busybox",
                            "resources": {"requests": amounts, **({"limits": amounts} if limits else {})}}
    if sidecar:
        spec["restartPolicy"] = "Always"
    return spec


def v1_pod(name: str, *containers: Mapping[str, Any], init: Iterable[Mapping[str, Any]] = (),
           namespace: str = "default", uid: str | None = None) -> dict[str, Any]:
    """A v1 Pod object (its uid is `uid-<namespace>-<name>` unless given)."""
    spec: dict[str, Any] = {"containers": [dict(c) for c in containers]}
    if init:
        spec["initContainers"] = [dict(c) for c in init]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "uid": uid or f"uid-{namespace}-{name}"},
            "spec": spec}


def _cpus(text: str) -> frozenset[int]:
    return CPUSet.parse(text).cpus


@dataclass(frozen=True)
class Started:
    ok: bool
    error: str | None = None  # the error the kubelet exits with when it cannot start
    reserved: frozenset[int] = frozenset()
    allocatable: frozenset[int] = frozenset()


@dataclass(frozen=True)
class Placed:
    cpus: frozenset[int]  # exclusive CPUs; empty for a container in the shared pool
    memory_numa: tuple[int, ...]  # NUMA nodes of its Memory Manager blocks (none under the None policy)


@dataclass(frozen=True)
class Verdict:
    admit: bool
    reason: str | None  # the pod status' Reason after a rejection
    message: str | None  # its Message: "Pod was rejected: ..."
    containers: Mapping[str, Placed]
    free: tuple[frozenset[int], ...]  # per NUMA node (machine order): CPUs exclusive allocations can still take


@dataclass(frozen=True)
class Memory:
    type: str
    size: int
    numa: tuple[int, ...]


@dataclass(frozen=True)
class ContainerResources:
    name: str
    cpu_ids: tuple[int, ...]
    memory: tuple[Memory, ...]


@dataclass(frozen=True)
class PodResources:
    namespace: str
    name: str
    containers: tuple[ContainerResources, ...]


@dataclass(frozen=True)
class Listing:
    """The podresources v1 API: GetAllocatableResources and List."""
    allocatable_cpus: tuple[int, ...]
    allocatable_memory: tuple[Memory, ...]
    pods: tuple[PodResources, ...]


def _memory(raw: Iterable[Mapping[str, Any]]) -> tuple[Memory, ...]:
    return tuple(Memory(m["type"], int(m["size"]), tuple(m["numa"])) for m in raw)


class KubeletPeer(LinePeer):
    name = "kubelet"

    def __init__(self, *, verbosity: int | None = None, timeout: float = 60) -> None:
        """`verbosity` keeps the managers' own log (klog -v) in the log_tail of errors."""
        argv = [str(binary()), "kubelet", *([f"-v={verbosity}"] if verbosity is not None else [])]
        super().__init__(argv, tempfile.TemporaryFile(), timeout=timeout)  # noqa: SIM115 - the peer closes it

    def __enter__(self) -> KubeletPeer:
        return self

    def _checked(self, message: dict[str, Any]) -> dict[str, Any]:
        answer = self.send(message)
        if "error" in answer and "started" not in answer:
            raise PeerError(f"{message.get('op', 'start')}: {answer['error']}")
        return answer

    @staticmethod
    def _free(answer: Mapping[str, Any]) -> tuple[frozenset[int], ...]:
        return tuple(_cpus(numa) for numa in answer["free"])

    def start(self, shape: NodeShape | Mapping[str, Any], kubelet: Mapping[str, Any]) -> Started:
        """Start the node: `shape` a NodeShape or the driver's machine object, `kubelet` the settings."""
        answer = self._checked({"machine": machine(shape) if isinstance(shape, NodeShape) else dict(shape),
                                "kubelet": dict(kubelet)})
        if not answer["started"]:
            return Started(False, answer["error"])
        return Started(True, None, _cpus(answer["reserved"]), _cpus(answer["allocatable"]))

    def add(self, pod: Mapping[str, Any]) -> Verdict:
        answer = self._checked({"op": "add", "pod": dict(pod)})
        placed = {name: Placed(_cpus(c["cpus"]), tuple(c["memory_numa"]))
                  for name, c in (answer.get("containers") or {}).items()}
        return Verdict(answer["admit"], answer.get("reason"), answer.get("message"), placed, self._free(answer))

    def remove(self, uid: str) -> tuple[bool, tuple[frozenset[int], ...]]:
        """Delete the pod: whether it was running here, and the free CPUs per NUMA node after."""
        answer = self._checked({"op": "remove", "uid": uid})
        return answer["removed"], self._free(answer)

    def podresources_answer(self) -> dict[str, Any]:
        """The podresources op's answer as sent: what tests/e2e/nrt.py's PodResources serves."""
        return self._checked({"op": "podresources"})

    def podresources(self) -> Listing:
        answer = self.podresources_answer()
        pods = tuple(PodResources(p["namespace"], p["name"], tuple(
            ContainerResources(c["name"], tuple(c["cpu_ids"]), _memory(c["memory"])) for c in p["containers"]))
            for p in answer["pods"])
        allocatable = answer["allocatable"]
        return Listing(tuple(allocatable["cpu_ids"]), _memory(allocatable["memory"]), pods)
