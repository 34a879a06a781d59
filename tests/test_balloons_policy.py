"""`model-placement balloons-policy`: what NRI enforces and what the extender assumes, from one model."""

from __future__ import annotations

from cli.policies import balloons_policies
from placement.cluster import ClusterState

# Documented fields (nri-plugins' balloons config): policy level and per balloon type.
POLICY_FIELDS = {"pinCPU", "pinMemory", "reservedResources", "availableResources", "reservedPoolNamespaces",
                 "allocatorTopologyBalancing", "preferSpreadOnPhysicalCores", "balloonTypes", "preserve",
                 "showContainersInNrt", "loadClasses", "schedulingClasses", "cpuClasses", "idleCPUClass",
                 "turboDomain", "controllableInterrupts", "control", "log", "instrumentation", "agent"}
TYPE_FIELDS = {"name", "components", "componentCreation", "namespaces", "groupBy", "matchExpressions", "maxCPUs",
               "minCPUs", "memoryTypes", "pinMemory", "allocatorPriority", "preferSpreadOnPhysicalCores",
               "hideHyperthreads", "allocatorTopologyBalancing", "cpuClass", "loads", "minBalloons", "maxBalloons",
               "preferSpreadingPods", "preferPerNamespaceBalloon", "preferNewBalloons", "shareIdleCPUsInSame",
               "preferCloseToDevices", "preferIsolCpus", "preferCoreType", "schedulingClass", "showContainersInNrt",
               "irqClaim", "irqMode"}


def test_rendered_policy_uses_documented_fields_and_numa_allowed_types(demo: ClusterState) -> None:
    [snc4, nosmt] = balloons_policies(demo, ["cpu-snc4", "cpu-nosmt"], "kube-system")
    assert snc4["apiVersion"] == "config.nri/v1alpha1" and snc4["kind"] == "BalloonsPolicy"
    assert snc4["metadata"] == {"name": "node.cpu-snc4", "namespace": "kube-system"}
    for policy in (snc4, nosmt):
        assert set(policy["spec"]) <= POLICY_FIELDS
        for btype in policy["spec"]["balloonTypes"]:
            assert set(btype) <= TYPE_FIELDS
    def names(p):
        return [t["name"] for t in p["spec"]["balloonTypes"]]
    assert names(snc4) == ["reserved", "vllm-numa-0", "vllm-numa-1", "vllm-numa-2", "vllm-numa-3", "vllm-balloon-tp1",
                           "vllm-numa-0-1", "vllm-numa-2-3", "vllm-balloon-tp2", "vllm-balloon-tp4"]  # no tp8
    assert names(nosmt) == ["reserved", "vllm-numa-0", "vllm-numa-1", "vllm-balloon-tp1", "vllm-balloon-tp2"]
    types = {t["name"]: t for t in snc4["spec"]["balloonTypes"]}
    # One component per rank, each carved from its own NUMA node.
    assert types["vllm-numa-2"]["preferCloseToDevices"] == ["/sys/devices/system/node/node2"]
    assert [c["balloonType"] for c in types["vllm-balloon-tp2"]["components"]] == ["vllm-numa-0-1", "vllm-numa-2-3"]
    assert types["vllm-balloon-tp2"]["componentCreation"] == "balance-balloons"
    assert [c["balloonType"] for c in types["vllm-numa-2-3"]["components"]] == ["vllm-numa-2", "vllm-numa-3"]
    assert "componentCreation" not in types["vllm-balloon-tp4"]
    for name, btype in types.items():
        if name != "reserved":
            assert btype["hideHyperthreads"] and btype["preferNewBalloons"]
        if "components" in btype:  # the plugin refuses these options on composites
            assert not ({"preferCloseToDevices", "preferSpreadOnPhysicalCores", "allocatorTopologyBalancing"}
                        & set(btype))
    # Whole cores reserved on every NUMA node, held from the start; every namespace lands there.
    assert snc4["spec"]["reservedResources"]["cpu"] == "cpuset:0-1,24-25,48-49,72-73,96-97,120-121,144-145,168-169"
    assert types["reserved"] == {"name": "reserved", "namespaces": ["*"], "minCPUs": 16}


def test_rendered_policy_read_back_gives_the_same_ledger(demo_objects, settings) -> None:
    state = ClusterState.from_objects(demo_objects, settings)
    rendered = balloons_policies(state, ["cpu-a1"], "kube-system")
    without = [o for o in demo_objects if o["kind"] != "BalloonsPolicy"]
    again = ClusterState.from_objects([*without, *rendered], settings)
    ledger = again.ledger("cpu-a1")
    assert ledger.nri.policy is not None and ledger.nri.policy.name == "node.cpu-a1"
    assert ledger.reserved == state.ledger("cpu-a1").reserved  # same profile, same whole cores
    assert ledger.nri.policy.balloon_type("vllm-balloon-tp2").hide_hyperthreads
