"""What the real balloons plugin does, pinned on the plugin itself.

Where the plugin differs from what its documentation suggests, these assert what the plugin does.
"""

from __future__ import annotations

from typing import Any

import pytest

from placement.topology import linux_layout, reserved_from_spec
from tests.oracle.peer import BALLOON_KEY, Balloon, BalloonsPeer, Container, PeerError, Pod, PolicyRefused
from tests.oracle.sysfs import NodeShape

TWO_SOCKETS = NodeShape(packages=2, numa_per_package=1, cores_per_numa=16, threads_per_core=2)
RESERVED = frozenset({0, 32})  # core 0 of NUMA node 0, both threads
MODEL_TYPE = {"hideHyperthreads": True, "preferSpreadOnPhysicalCores": False}


def policy(*types: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {"reservedResources": {"cpu": "cpuset:0,32"}, "balloonTypes": list(types), **spec}


def model_pod(name: str, balloon: str, container: str = "vllm") -> Pod:
    return Pod(name, "models", annotations={f"{BALLOON_KEY}/container.{container}": balloon})


def model(cpu: str) -> Container:
    return Container("vllm", cpu=cpu, cpu_limit=cpu, memory_limit=8 << 30)


def numa_nodes(shape: NodeShape, cpus: frozenset[int]) -> set[int]:
    return {shape.numa_of(cpu) for cpu in cpus}


def balloon_of(node: BalloonsPeer, container: str) -> Balloon:
    [balloon] = [b for b in node.balloons() if container in b.containers]
    return balloon


def test_hide_hyperthreads_balloon_holds_the_request_in_logical_cpus() -> None:
    with BalloonsPeer(TWO_SOCKETS, policy({"name": "vllm-balloon-tp1", **MODEL_TYPE})) as node:
        got = node.create(model_pod("m1", "vllm-balloon-tp1"), model("16"))
        assert got.ok, got.error
        balloon = balloon_of(node, "models/m1/vllm")
    cores = {TWO_SOCKETS.core_of(cpu) for cpu in balloon.cpus}
    assert len(balloon.cpus) == 16 and len(cores) == 8  # 16 logical CPUs = 8 whole cores, not 16 cores
    assert len(got.cpus) == 8 and {TWO_SOCKETS.core_of(cpu) for cpu in got.cpus} == cores  # one thread per core
    assert got.cpus <= balloon.cpus


def test_plain_type_lands_on_one_numa_node_when_one_has_room() -> None:
    with BalloonsPeer(TWO_SOCKETS, policy({"name": "vllm-balloon-tp2", **MODEL_TYPE})) as node:
        got = node.create(model_pod("m2", "vllm-balloon-tp2"), model("16"))
        assert got.ok, got.error
        balloon = balloon_of(node, "models/m2/vllm")
    assert len(balloon.cpus) == 16 and len(numa_nodes(TWO_SOCKETS, balloon.cpus)) == 1  # a TP=2 pod on ONE node


def numa_component(numa: int) -> dict[str, Any]:
    return {"name": f"vllm-numa{numa}", **MODEL_TYPE,
            "preferCloseToDevices": [f"/sys/devices/system/node/node{numa}"]}


TP2_COMPOSITE = {"name": "vllm-balloon-tp2", "hideHyperthreads": True,
                 "components": [{"balloonType": "vllm-numa0"}, {"balloonType": "vllm-numa1"}]}


def test_composite_type_splits_the_request_over_its_components_numa_nodes() -> None:
    with BalloonsPeer(TWO_SOCKETS, policy(numa_component(0), numa_component(1), TP2_COMPOSITE)) as node:
        got = node.create(model_pod("m2", "vllm-balloon-tp2"), model("16"))
        assert got.ok, got.error
        balloon = balloon_of(node, "models/m2/vllm")
    assert len(balloon.cpus) == 16
    for numa in (0, 1):  # request / components = 8 logical CPUs (4 cores) on each preferred node
        assert len(balloon.cpus & frozenset(TWO_SOCKETS.numa_cpus(numa))) == 8
    assert numa_nodes(TWO_SOCKETS, got.cpus) == {0, 1} and len(got.cpus) == 8
    assert got.mems == {0, 1}  # pinMemory: the composite's memory from both its nodes


def test_composite_component_preference_is_soft_so_a_tp2_pod_can_land_on_one_numa_node() -> None:
    # A plain 28-CPU balloon fills most of one NUMA node; the component preferring that node has no room
    # there and is taken from the other node, beside its sibling component: the TP=2 pod spans ONE node.
    types = (numa_component(0), numa_component(1), TP2_COMPOSITE, {"name": "big", **MODEL_TYPE})
    with BalloonsPeer(TWO_SOCKETS, policy(*types)) as node:
        assert node.create(model_pod("big", "big"), model("28")).ok
        got = node.create(model_pod("m2", "vllm-balloon-tp2"), model("16"))
        assert got.ok, got.error
        balloon = balloon_of(node, "models/m2/vllm")
        big = balloon_of(node, "models/big/vllm")
    [full] = numa_nodes(TWO_SOCKETS, big.cpus)
    assert len(balloon.cpus) == 16 and not balloon.cpus & big.cpus
    assert numa_nodes(TWO_SOCKETS, balloon.cpus) == {1 - full}
    assert got.mems == {1 - full}


def test_non_model_containers_go_to_reserved_or_default_by_namespace() -> None:
    spec = policy({"name": "vllm-balloon-tp1", **MODEL_TYPE}, reservedPoolNamespaces=["monitoring"])
    with BalloonsPeer(TWO_SOCKETS, spec) as node:
        for namespace in ("kube-system", "monitoring", "cert-manager", "models"):
            assert node.create(Pod("p", namespace, qos="Burstable"), Container("c", cpu="100m")).ok
        # a model pod's sidecar has no balloon annotation of its own
        assert node.create(model_pod("m1", "vllm-balloon-tp1"), model("4")).ok
        assert node.create(model_pod("m1", "vllm-balloon-tp1"), Container("sidecar", cpu="100m")).ok
        where = {name: balloon_of(node, name).type for name in
                 ("kube-system/p/c", "monitoring/p/c", "cert-manager/p/c", "models/p/c", "models/m1/sidecar")}
    assert where == {"kube-system/p/c": "reserved", "monitoring/p/c": "reserved",
                     "cert-manager/p/c": "default", "models/p/c": "default", "models/m1/sidecar": "default"}


def test_default_balloon_avoids_reserved_cpus_and_holds_a_cpu_even_for_best_effort() -> None:
    with BalloonsPeer(TWO_SOCKETS, policy({"name": "vllm-balloon-tp1", **MODEL_TYPE})) as node:
        got = node.create(Pod("web", "shop", qos="BestEffort"), Container("nginx"))
        assert got.ok, got.error
        default = balloon_of(node, "shop/web/nginx")
        model_got = node.create(model_pod("m1", "vllm-balloon-tp1"), model("8"))
        assert model_got.ok, model_got.error
        model_balloon = balloon_of(node, "models/m1/vllm")
    assert default.type == "default" and len(default.cpus) == 1
    assert not default.cpus & RESERVED and got.cpus == default.cpus
    assert not model_balloon.cpus & default.cpus  # the default balloon's CPU is no model's


def test_max_balloons_reached_puts_the_next_container_into_an_existing_balloon() -> None:
    with BalloonsPeer(TWO_SOCKETS, policy({"name": "vllm-balloon-tp1", **MODEL_TYPE, "maxBalloons": 1})) as node:
        first = node.create(model_pod("m1", "vllm-balloon-tp1"), model("8"))
        second = node.create(model_pod("m2", "vllm-balloon-tp1"), model("8"))
        assert first.ok and second.ok, (first.error, second.error)
        balloons = [b for b in node.balloons() if b.type == "vllm-balloon-tp1"]
        placed = node.containers()
    [shared] = balloons
    assert set(shared.containers) == {"models/m1/vllm", "models/m2/vllm"} and len(shared.cpus) == 16
    assert placed["models/m1/vllm"].cpus == placed["models/m2/vllm"].cpus  # the two models share cores


def test_no_room_fails_the_container() -> None:
    with BalloonsPeer(TWO_SOCKETS, policy({"name": "vllm-balloon-tp1", **MODEL_TYPE})) as node:
        got = node.create(model_pod("m1", "vllm-balloon-tp1"), model("65"))
        assert not got.ok
        assert "models/m1/vllm" not in node.containers()
    assert "failed to allocate resources" in got.error


def test_reserved_cpuset_is_not_held_unless_the_reserved_type_sets_min_cpus() -> None:
    # balloons-policy.go fillBuiltinBalloonDefs: MinCpus = |cpuset| only if that is < MaxCpus, and the
    # implicit reserved type's MaxCpus is 0 (no limit), so MinCpus stays 0 and the reserved balloon is empty.
    with BalloonsPeer(TWO_SOCKETS, policy({"name": "vllm-balloon-tp1", **MODEL_TYPE})) as node:
        assert not next(b.cpus for b in node.balloons() if b.type == "reserved")
        greedy = node.create(model_pod("m1", "vllm-balloon-tp1"), model("64"))
        taken = balloon_of(node, "models/m1/vllm").cpus
        system = node.create(Pod("dns", "kube-system", qos="Burstable"), Container("coredns", cpu="100m"))
    assert greedy.ok and taken >= RESERVED  # the model took the reserved CPUs
    assert not system.ok and "reserved[0]" in system.error  # and kube-system can no longer start
    held = policy({"name": "reserved", "minCPUs": 2}, {"name": "vllm-balloon-tp1", **MODEL_TYPE})
    with BalloonsPeer(TWO_SOCKETS, held) as node:
        [reserved] = [b for b in node.balloons() if b.type == "reserved"]
        greedy = node.create(model_pod("m1", "vllm-balloon-tp1"), model("64"))
    assert reserved.cpus == RESERVED and not greedy.ok


def test_unknown_balloon_type_fails_the_container() -> None:
    with BalloonsPeer(TWO_SOCKETS, policy({"name": "vllm-balloon-tp1", **MODEL_TYPE})) as node:
        got = node.create(model_pod("m1", "vllm-balloon-tp4"), model("4"))
    assert not got.ok and "vllm-balloon-tp4" in got.error


def test_min_balloons_are_created_up_front_with_min_cpus() -> None:
    spec = policy({"name": "vllm-balloon-tp1", **MODEL_TYPE, "minBalloons": 2, "minCPUs": 4})
    with BalloonsPeer(TWO_SOCKETS, spec) as node:
        balloons = [b for b in node.balloons() if b.type == "vllm-balloon-tp1"]
    assert len(balloons) == 2 and all(len(b.cpus) == 4 and not b.containers for b in balloons)


def test_max_cpus_is_compared_with_the_request_not_a_doubled_footprint() -> None:
    with BalloonsPeer(TWO_SOCKETS, policy({"name": "vllm-balloon-tp1", **MODEL_TYPE, "maxCPUs": 8})) as node:
        fits = node.create(model_pod("m1", "vllm-balloon-tp1"), model("8"))
        too_big = node.create(model_pod("m2", "vllm-balloon-tp1"), model("10"))
    assert fits.ok, fits.error  # 8 logical CPUs for cpu: 8 on a hideHyperthreads type: within maxCPUs 8
    assert not too_big.ok and "no suitable balloon instance available" in too_big.error


def test_without_prefer_new_balloons_a_second_model_inflates_the_first_ones_balloon() -> None:
    with BalloonsPeer(TWO_SOCKETS, policy({"name": "vllm-balloon-tp1", **MODEL_TYPE})) as node:
        assert node.create(model_pod("m1", "vllm-balloon-tp1"), model("28")).ok
        second = node.create(model_pod("m2", "vllm-balloon-tp1"), model("16"))
        [balloon] = [b for b in node.balloons() if b.type == "vllm-balloon-tp1"]
        placed = node.containers()
    assert second.ok and len(balloon.cpus) == 44 and len(numa_nodes(TWO_SOCKETS, balloon.cpus)) == 2
    assert placed["models/m1/vllm"].cpus == placed["models/m2/vllm"].cpus  # both models on all 22 cores


@pytest.mark.parametrize("pin_memory", [True, False])
def test_pin_memory_assigns_the_balloons_numa_node(pin_memory: bool) -> None:
    spec = policy({"name": "vllm-balloon-tp1", **MODEL_TYPE, "preferNewBalloons": True}, pinMemory=pin_memory)
    with BalloonsPeer(TWO_SOCKETS, spec) as node:
        first = node.create(model_pod("m1", "vllm-balloon-tp1"), model("28"))
        second = node.create(model_pod("m2", "vllm-balloon-tp1"), model("16"))
    assert first.ok and second.ok, (first.error, second.error)
    [full] = numa_nodes(TWO_SOCKETS, first.cpus)
    assert numa_nodes(TWO_SOCKETS, second.cpus) == {1 - full}  # a new balloon, on the node with room
    assert (first.mems, second.mems) == (({full}, {1 - full}) if pin_memory else (set(), set()))


def test_a_policy_the_plugin_rejects_is_refused_with_its_message() -> None:
    with pytest.raises(PolicyRefused, match="MinCpus"):
        BalloonsPeer(TWO_SOCKETS, policy({"name": "vllm-balloon-tp1", "minCPUs": 8, "maxCPUs": 4}))


SNC = NodeShape(packages=2, numa_per_package=2, cores_per_numa=16, threads_per_core=2)


def test_plain_type_too_big_for_a_numa_node_stays_in_one_package_of_an_snc_node() -> None:
    # 48 logical CPUs: more than a sub-NUMA cluster (32), less than a package (64): the deepest level with room.
    with BalloonsPeer(SNC, policy({"name": "vllm-balloon-tp2", **MODEL_TYPE})) as node:
        got = node.create(model_pod("m2", "vllm-balloon-tp2"), model("48"))
        assert got.ok, got.error
        balloon = balloon_of(node, "models/m2/vllm")
    assert len(balloon.cpus) == 48 and len({SNC.package_of(cpu) for cpu in balloon.cpus}) == 1
    assert len(numa_nodes(SNC, balloon.cpus)) == 2


def test_hide_hyperthreads_on_an_smt_off_node_runs_on_every_cpu_of_the_balloon() -> None:
    shape = NodeShape(packages=2, numa_per_package=1, cores_per_numa=16, threads_per_core=1)
    spec = {"reservedResources": {"cpu": "cpuset:0"}, "balloonTypes": [{"name": "vllm-balloon-tp1", **MODEL_TYPE}]}
    with BalloonsPeer(shape, spec) as node:
        got = node.create(model_pod("m1", "vllm-balloon-tp1"), model("8"))
        balloon = balloon_of(node, "models/m1/vllm")
    assert got.ok and got.cpus == balloon.cpus and len(got.cpus) == 8 and len(numa_nodes(shape, got.cpus)) == 1


def test_exported_topology_is_one_zone_per_balloon_and_containers_as_children() -> None:
    with BalloonsPeer(TWO_SOCKETS, policy({"name": "vllm-balloon-tp1", **MODEL_TYPE})) as node:
        assert node.create(model_pod("m1", "vllm-balloon-tp1"), model("8")).ok
        zones = node.zones()
    kinds = {(z["Name"], z["Type"], z["Parent"]) for z in zones}
    assert kinds == {("reserved[0]", "balloon", ""), ("default[0]", "balloon", ""),
                     ("vllm-balloon-tp1[0]", "balloon", ""),
                     ("models/m1/vllm", "allocation for container", "vllm-balloon-tp1[0]")}  # no node-N zones
    [model_zone] = [z for z in zones if z["Name"] == "vllm-balloon-tp1[0]"]
    assert {a["Name"] for a in model_zone["Attributes"]} >= {"cpuset", "shared cpuset", "excess cpus"}


def test_a_refused_update_keeps_the_previous_configuration() -> None:
    with BalloonsPeer(TWO_SOCKETS, policy({"name": "vllm-balloon-tp1", **MODEL_TYPE})) as node:
        assert node.create(model_pod("m1", "vllm-balloon-tp1"), model("8")).ok
        before = node.balloons()
        refused = node.reconfigure(policy({"name": "vllm-balloon-tp1", **MODEL_TYPE, "minCPUs": 8, "maxCPUs": 4}))
        after = node.balloons()
        still = node.create(model_pod("m2", "vllm-balloon-tp1"), model("8"))
        applied = node.reconfigure(policy({"name": "vllm-balloon-tp1", **MODEL_TYPE},
                                          {"name": "vllm-balloon-tp2", **MODEL_TYPE}))
        new_type = node.create(model_pod("m3", "vllm-balloon-tp2"), model("8"))
    assert refused is not None and "MinCpus" in refused
    assert after == before and still.ok  # the running balloons and the old types are untouched
    assert applied is None and new_type.ok, new_type.error


def test_the_peer_answers_a_bad_request_with_one_sentence() -> None:
    with BalloonsPeer(TWO_SOCKETS, policy()) as node:
        with pytest.raises(PeerError, match=r"^remove_pod: no pod models/ghost$"):
            node.remove_pod(Pod("ghost", "models"))
        odd = node.create(Pod("p", "models", qos="Platinum"), Container("c"))
        assert node.request("resize") == {"error": 'unknown op "resize" (create, remove, remove_pod, containers, '
                                                   'balloons, reconfigure)'}
        assert node.create(Pod("p", "models", qos="BestEffort"), Container("c")).ok  # and it goes on serving
    assert odd.error == "pod models/p: qos must be Guaranteed, Burstable or BestEffort, not \"Platinum\""


@pytest.mark.parametrize("quantity", ["1", "3"])
def test_a_reserved_cpu_quantity_is_whole_cores_from_the_lowest_ids_as_the_ledger_reads_it(quantity: str) -> None:
    """`reservedResources: {cpu: N}` is allocated like any balloon on an idle node: the first cores of NUMA node 0,
    both threads of one before the next; the ledger had spread them over the NUMA nodes (issue 39's hand-written
    policy: a TP=1 balloon foreseen on NUMA node 0 went to NUMA node 1)."""
    with BalloonsPeer(TWO_SOCKETS, policy(reservedResources={"cpu": quantity})) as node:
        [reserved] = [b for b in node.balloons() if b.type == "reserved"]
    topo = linux_layout([TWO_SOCKETS.cores_per_numa] * TWO_SOCKETS.numa_nodes, TWO_SOCKETS.threads_per_core, "labels")
    assert reserved.cpus == reserved_from_spec(topo, quantity).cpus, sorted(reserved.cpus)
