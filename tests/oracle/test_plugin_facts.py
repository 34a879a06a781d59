"""What the real balloons plugin does, pinned on the plugin itself (issue 12's list of facts)."""

from __future__ import annotations

from tests.oracle.peer import BALLOON_KEY, BalloonsPeer, Container, Pod
from tests.oracle.sysfs import NodeShape

TWO_SOCKETS = NodeShape(packages=2, numa_per_package=1, cores_per_numa=16, threads_per_core=2)


def model_pod(name: str, balloon: str, container: str = "vllm") -> Pod:
    return Pod(name, "models", annotations={f"{BALLOON_KEY}/container.{container}": balloon})


def test_hide_hyperthreads_balloon_holds_the_request_in_logical_cpus() -> None:
    policy = {"reservedResources": {"cpu": "cpuset:0,32"},
              "balloonTypes": [{"name": "vllm-balloon-tp1", "hideHyperthreads": True}]}
    with BalloonsPeer(TWO_SOCKETS, policy) as node:
        got = node.create(model_pod("m1", "vllm-balloon-tp1"), Container("vllm", cpu="16", cpu_limit="16"))
        assert got.ok, got.error
        [balloon] = [b for b in node.balloons() if b.type == "vllm-balloon-tp1"]
    cores = {TWO_SOCKETS.core_of(cpu) for cpu in balloon.cpus}
    assert len(balloon.cpus) == 16 and len(cores) == 8  # 16 logical CPUs = 8 whole cores, not 16 cores
    assert len(got.cpus) == 8 and {TWO_SOCKETS.core_of(cpu) for cpu in got.cpus} == cores  # one thread per core
    assert got.cpus <= balloon.cpus
