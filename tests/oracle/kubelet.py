"""A pod as the kubelet hands it to the container runtime, and the order it runs its containers in: the one
pod-to-plugin conversion, shared by the oracle (`tests/oracle`), the virtual nodes of `tests/e2e` and the
benchmarks.

- Requests and limits as the apiserver stores them: a resource with a limit and no request requests its limit.
- QoS class as the kubelet computes it (every container, init containers included): Guaranteed when each one
  limits both cpu and memory and requests exactly that; BestEffort when none requests or limits either; else
  Burstable. The plugin reads the class from the pod's cgroup parent.
- Memory limits are passed (the CreateContainer Linux resources carry them); memory requests are not part of
  what a runtime sees.
- Init containers run one at a time to completion (created, then removed before the next one starts); native
  sidecars (an init container with `restartPolicy: Always`) are started in their place in that order and kept;
  then the app containers start.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from placement.quantity import cpu_milli, memory_bytes
from tests.oracle.peer import BalloonsPeer, Container, Created, Pod


@dataclass(frozen=True)
class PodRun:
    """What a node runs for one pod, in the kubelet's order: `init` (each to completion, with `sidecar` telling
    which of them stay), then `containers`."""

    pod: Pod
    init: tuple[Container, ...]
    sidecar: tuple[bool, ...]  # per init container: restartPolicy Always, kept for the pod's life
    containers: tuple[Container, ...]

    @property
    def sidecars(self) -> tuple[Container, ...]:
        return tuple(c for c, keep in zip(self.init, self.sidecar) if keep)

    @property
    def running(self) -> tuple[Container, ...]:
        """The containers that run once the pod has started: native sidecars and app containers."""
        return self.sidecars + self.containers


def _resources(container: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    res = container.get("resources") or {}
    limits = dict(res.get("limits") or {})
    requests = {**{k: v for k, v in limits.items() if k in ("cpu", "memory")}, **(res.get("requests") or {})}
    return requests, limits


def qos_class(containers: Iterable[Mapping[str, Any]]) -> str:
    """The pod's QoS class from all of its containers (kubelet's GetPodQOS, cpu and memory only)."""
    guaranteed, any_set = True, False
    for c in containers:
        requests, limits = _resources(c)
        for name in ("cpu", "memory"):
            req, lim = requests.get(name), limits.get(name)
            any_set |= bool(req and _nonzero(name, req)) or bool(lim and _nonzero(name, lim))
            if lim is None or req is None or _amount(name, req) != _amount(name, lim):
                guaranteed = False
    if not any_set:
        return "BestEffort"
    return "Guaranteed" if guaranteed else "Burstable"


def _amount(name: str, value: object) -> int:
    return cpu_milli(value) if name == "cpu" else memory_bytes(value)


def _nonzero(name: str, value: object) -> bool:
    return _amount(name, value) > 0


def _container(c: Mapping[str, Any]) -> Container:
    requests, limits = _resources(c)
    return Container(c["name"], cpu=requests.get("cpu"), cpu_limit=limits.get("cpu"),
                     memory_limit=memory_bytes(limits["memory"]) if "memory" in limits else 0,
                     annotations={})


def peer_pod(pod: Mapping[str, Any]) -> PodRun:
    """The pod object (as stored: mutated, bound) as the runtime sees it."""
    meta, spec = pod["metadata"], pod["spec"]
    init = list(spec.get("initContainers") or ())
    app = list(spec["containers"])
    return PodRun(
        Pod(meta["name"], meta.get("namespace", "default"), qos=qos_class(init + app),
            annotations=dict(meta.get("annotations") or {}), labels=dict(meta.get("labels") or {})),
        tuple(_container(c) for c in init), tuple(c.get("restartPolicy") == "Always" for c in init),
        tuple(_container(c) for c in app))


def run_pod(node: BalloonsPeer, run: PodRun) -> dict[str, Created]:
    """Start the pod on the node as the kubelet does; every container's outcome by name. A failed init
    container stops the pod there (the kubelet retries it; nothing after it starts)."""
    results: dict[str, Created] = {}
    for container, keep in zip(run.init, run.sidecar):
        got = results[container.name] = node.create(run.pod, container)
        if not got.ok:
            return results
        if not keep:  # ran to completion: the runtime stops and removes it
            node.remove(run.pod, container.name)
    for container in run.containers:
        results[container.name] = node.create(run.pod, container)
    return results
