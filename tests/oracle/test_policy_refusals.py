"""Each BalloonsPolicy refusal /validate makes, held to the real balloons plugin (nri-plugins v0.14.0): the plugin
refuses the same policy at start-up, or accepts it and then breaks what the refusal protects (NUMA-local ranks,
the reserved cpuset). Both sides read the same object: the policy as the apiserver stores it from the real CRD."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from placement.balloons import model_balloon_types, node_balloons_policy
from placement.cluster import ClusterState
from placement.config import Settings
from placement.policycheck import (
    COMPONENT_MISSING,
    IGNORED_SETTING,
    MIN_BALLOONS_DO_NOT_FIT,
    NUMA_DEVICE_MISSING,
    PLUGIN_REFUSES,
    RESERVED_NOT_ON_NODE,
    RESERVES_HELD_CORES,
    SPAN_BELOW_TP,
    SPAN_EXCEEDS_NUMA,
    PolicyCheck,
    check_policy,
)
from placement.topology import linux_layout
from tests.oracle.peer import BALLOON_KEY, BalloonsPeer, Container, Pod, PolicyRefused, policy_object
from tests.oracle.sysfs import NodeShape
from tests.test_policy_admission import composite, numa_type
from tests.test_webhook_validate import running

# 2 NUMA nodes × 4 cores × 2 threads: NUMA node 0 is CPUs 0-3,8-11, NUMA node 1 is 4-7,12-15.
SHAPE = NodeShape(packages=2, numa_per_package=1, cores_per_numa=4, threads_per_core=2)
RESERVED = frozenset({0, 8})
Spec = dict[str, Any]


def node_object() -> dict[str, Any]:
    """The same node as Kubernetes describes it (NFD labels and capacity)."""
    cpus = str(SHAPE.numa_nodes * SHAPE.cores_per_numa * SHAPE.threads_per_core)
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": "node-1", "labels": {
                "feature.node.kubernetes.io/cpu-hardware_multithreading": "true",
                "feature.node.kubernetes.io/memory-numa.node_count": str(SHAPE.numa_nodes)}},
            "spec": {}, "status": {"capacity": {"cpu": cpus}}}


def ours(spec: Spec, *objects: dict[str, Any]) -> PolicyCheck:
    cluster = ClusterState.from_objects([node_object(), *objects], Settings())
    return check_policy(policy_object(spec), cluster)


def policy(*types: Spec, reserved: str = "cpuset:0,8") -> Spec:
    return {"reservedResources": {"cpu": reserved}, "balloonTypes": list(types)}


TP4 = composite("vllm-balloon-tp4", *(f"vllm-numa-{i}" for i in range(4)))

# (our check id, the policy, what the plugin says at start-up)
PLUGIN_REFUSED: dict[str, tuple[str, Spec, str]] = {
    "reserved-cpus-missing": (RESERVED_NOT_ON_NODE, policy(reserved="cpuset:0,8,40"),
                              "ReservedResources cpus 0,8,40 contains CPUs not in AllowedResources 0-15, namely 40"),
    "component-missing": (COMPONENT_MISSING, policy(numa_type(0), composite("vllm-balloon-tp2", "vllm-numa-0", "nope")),
                          'balloon type \\"nope\\" in composite balloon \\"vllm-balloon-tp2\\" is not defined'),
    "min-balloons-exceed-node": (MIN_BALLOONS_DO_NOT_FIT, policy({"name": "warm", "minBalloons": 3, "minCPUs": 8}),
                                 "not enough free CPUs"),
    "reserved-count-exceeds-node": (MIN_BALLOONS_DO_NOT_FIT, policy(reserved="20"), "not enough free CPUs"),
    "duplicate-name": (PLUGIN_REFUSES, policy({"name": "a"}, {"name": "a"}), "two balloon types with the same name"),
    "empty-name": (PLUGIN_REFUSES, policy({"name": ""}), "missing or empty name in a balloon type"),
    "min-cpus-above-max": (PLUGIN_REFUSES, policy({"name": "a", "minCPUs": 4, "maxCPUs": 2}),
                           "MinCpus (4) > MaxCpus (2)"),
    # The plugin's message prints minCPUs/maxCPUs there (balloons-policy.go:1735): "MinBalloons (0) > MaxBalloons (0)".
    "min-balloons-above-max": (PLUGIN_REFUSES, policy({"name": "a", "minBalloons": 3, "maxBalloons": 2}),
                               "MinBalloons (0) > MaxBalloons (0)"),
    "composite-spread": (PLUGIN_REFUSES, policy(numa_type(0), composite("c", "vllm-numa-0",
                                                                        preferSpreadOnPhysicalCores=False)),
                         "CPU allocation options not allowed in composite balloons"),
    "composite-close-to": (PLUGIN_REFUSES, policy(numa_type(0), composite(
        "c", "vllm-numa-0", preferCloseToDevices=["/sys/devices/system/node/node0"])),
        "CPU allocation options not allowed in composite balloons"),
    "composite-cpu-class": (PLUGIN_REFUSES, policy(numa_type(0), composite("c", "vllm-numa-0", cpuClass="x")),
                            "cannot have CpuClasses"),
    "creation-without-components": (PLUGIN_REFUSES, policy({"name": "a", "componentCreation": "all"}),
                                    "specified but no components defined"),
    "circular": (PLUGIN_REFUSES, policy(composite("a", "b"), composite("b", "a")), "circular composition detected"),
    "empty-component": (PLUGIN_REFUSES, policy(composite("a", "")), "missing or empty component balloonType name"),
    "quantity-vs-min-cpus": (PLUGIN_REFUSES, policy({"name": "reserved", "minCPUs": 3}, reserved="2"),
                             "mismatching reserved balloon minCpus: 3"),
    "quantity-vs-max-cpus": (PLUGIN_REFUSES, policy({"name": "reserved", "maxCPUs": 2}, reserved="3"),
                             "mismatching reserved balloon maxCpus: 2"),
    "unreadable-cpuset": (PLUGIN_REFUSES, policy(reserved="cpuset:0-x"), "failed to parse reserved CPU cpuset"),
}


@pytest.mark.parametrize("case", sorted(PLUGIN_REFUSED))
def test_what_we_refuse_the_plugin_refuses(case: str) -> None:
    check, spec, plugin_says = PLUGIN_REFUSED[case]
    assert check in {r.check for r in ours(spec).refusals}, ours(spec)
    with pytest.raises(PolicyRefused) as refused:
        BalloonsPeer(SHAPE, spec).close()
    assert plugin_says in str(refused.value)


def model_pod(name: str, balloon: str) -> Pod:
    return Pod(name, "models", annotations={f"{BALLOON_KEY}/container.vllm": balloon})


def ranks_share_numa_nodes(node: BalloonsPeer) -> None:
    """A TP=4 model gets its 4 ranks' CPUs from 2 NUMA nodes: the components preferring node2/node3 lost it."""
    got = node.create(model_pod("m4", "vllm-balloon-tp4"), Container("vllm", cpu="8", cpu_limit="8",
                                                                      memory_limit=1 << 30))
    assert got.ok, got.error
    [balloon] = [b for b in node.balloons() if b.type == "vllm-balloon-tp4"]
    assert len(balloon.cpus) == 8 and {SHAPE.numa_of(cpu) for cpu in balloon.cpus} == {0, 1}


def far_preference_is_dropped(node: BalloonsPeer) -> None:
    got = node.create(model_pod("m1", "vllm-balloon-tp1"), Container("vllm", cpu="4", cpu_limit="4",
                                                                      memory_limit=1 << 30))
    assert got.ok, got.error  # NUMA node 5 does not exist: the balloon is put wherever the allocator likes


def reserved_cpus_go_to_model_balloons(node: BalloonsPeer) -> None:
    held = frozenset().union(*(b.cpus for b in node.balloons() if b.type == "warm"))
    assert held & RESERVED == RESERVED  # the pre-created balloons hold the reserved cpuset


def tp2_on_one_numa_node(node: BalloonsPeer) -> None:
    got = node.create(model_pod("m2", "vllm-balloon-tp2"), Container("vllm", cpu="4", cpu_limit="4",
                                                                      memory_limit=1 << 30))
    assert got.ok, got.error
    assert len({SHAPE.numa_of(cpu) for cpu in got.cpus}) == 1


def one_reserved_balloon(node: BalloonsPeer) -> None:
    assert [b.name for b in node.balloons() if b.type == "reserved"] == ["reserved[0]"]


# (our check id, refusal or warning, the policy, what the plugin does with it once accepted)
PLUGIN_ACCEPTS: dict[str, tuple[str, bool, Spec, Callable[[BalloonsPeer], None]]] = {
    "span-exceeds-numa": (SPAN_EXCEEDS_NUMA, True, policy(*(numa_type(i) for i in range(4)), TP4),
                          ranks_share_numa_nodes),
    "numa-device-missing": (NUMA_DEVICE_MISSING, True, policy({**numa_type(5), "name": "vllm-balloon-tp1"}),
                            far_preference_is_dropped),
    "min-balloons-take-reserved": (MIN_BALLOONS_DO_NOT_FIT, True, policy({"name": "warm", "minBalloons": 2,
                                                                         "minCPUs": 8}),
                                   reserved_cpus_go_to_model_balloons),
    "plain-tp2": (SPAN_BELOW_TP, False, policy({"name": "vllm-balloon-tp2", "hideHyperthreads": True}),
                  tp2_on_one_numa_node),
    "reserved-min-balloons": (IGNORED_SETTING, False, policy({"name": "reserved", "minBalloons": 2}),
                              one_reserved_balloon),
}


@pytest.mark.parametrize("case", sorted(PLUGIN_ACCEPTS))
def test_what_the_plugin_accepts_and_we_refuse_or_warn_about_breaks_pinning(case: str) -> None:
    check, refusal, spec, hazard = PLUGIN_ACCEPTS[case]
    verdict = ours(spec)
    assert check in {f.check for f in (verdict.refusals if refusal else verdict.warnings)}, verdict
    with BalloonsPeer(SHAPE, spec) as node:
        hazard(node)


def test_the_policy_we_generate_passes_both() -> None:
    generated = node_balloons_policy("node-1", linux_layout([SHAPE.cores_per_numa] * SHAPE.numa_nodes, 2, "labels"),
                                     Settings(), "kube-system")
    generated["metadata"]["name"] = "default"
    verdict = ours(generated)
    assert (verdict.refusals, verdict.warnings, verdict.nodes) == ((), (), ("node-1",))
    with BalloonsPeer(SHAPE, generated) as node:
        assert node.create(model_pod("m2", "vllm-balloon-tp2"), Container("vllm", cpu="4", cpu_limit="4")).ok


def test_an_update_reserving_cores_a_running_model_holds_moves_it() -> None:
    types = [{"name": "reserved", "namespaces": ["*"], "minCPUs": 2},
             *model_balloon_types(linux_layout([SHAPE.cores_per_numa] * SHAPE.numa_nodes, 2, "labels"),
                                  "vllm-balloon-tp")]
    before = {**policy(*types), "preferSpreadOnPhysicalCores": False}
    after = {**before, "reservedResources": {"cpu": "cpuset:0-1,8-9"},
             "balloonTypes": [{**types[0], "minCPUs": 4}, *types[1:]]}
    # The model holds 3 cores of NUMA node 0; the update leaves NUMA node 0 two model cores.
    model = running("m1", "node-1", "m1", 3)
    model["metadata"]["namespace"] = "models"
    warned = [w.message for w in ours(after, policy_object(before), model).warnings if w.check == RESERVES_HELD_CORES]
    assert warned == ["on node node-1 the new reserved CPUs 0-1,8-9 of NUMA node 0 leave 2 model cores where running "
                      "models hold 3 (models/m1): the plugin re-places them when the policy changes"]
    with BalloonsPeer(SHAPE, before) as node:
        first = node.create(model_pod("m1", "vllm-balloon-tp1"), Container("vllm", cpu="6", cpu_limit="6",
                                                                            memory_limit=1 << 30))
        assert first.ok and {SHAPE.numa_of(cpu) for cpu in first.cpus} == {0}, first
        assert node.reconfigure(after) is None
        moved = node.containers()["models/m1/vllm"]
    # The running model is re-pinned off its cores, here to the other NUMA node, its memory node with it.
    assert not moved.cpus & first.cpus and {SHAPE.numa_of(cpu) for cpu in moved.cpus} == {1}
    assert (first.mems, moved.mems) == ({0}, {1})
