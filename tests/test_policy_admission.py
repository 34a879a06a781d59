"""POST /validate over TLS for BalloonsPolicy CREATE and UPDATE: each refusal with its node(s) and numbers, the
warning when an update would take cores that running model balloons hold, what is admitted untouched.

The policies sent are what the apiserver would store (the real CRD's defaults filled in); tests/oracle/
test_policy_refusals.py shows that the real plugin refuses the same policies, or accepts them and breaks pinning."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from placement.balloons import node_balloons_policy
from placement.config import Settings
from placement.topology import linux_layout
from server.sources import demo_text, load_objects
from tests.support.webhook import Answer, MakeWebhook, Obj, Webhook, balloons_policy, decisions, node, review, running


def policy_review(policy: Obj, operation: str = "UPDATE", uid: str = "") -> Obj:
    """What kube-apiserver v1.35 sent our webhook for `kubectl apply` of a BalloonsPolicy (recorded through the e2e
    control plane: tests/fixtures/ar-balloonspolicy-update.json), carrying `policy` instead."""
    sent = review("ar-balloonspolicy-update.json", uid=uid or None)
    request = sent["request"]
    request.update(name=policy["metadata"]["name"], namespace=policy["metadata"]["namespace"], operation=operation,
                   object=policy, oldObject=copy.deepcopy(request["object"]) if operation == "UPDATE" else None)
    request["options"]["kind"] = f"{operation.capitalize()}Options"
    return sent


def stored(spec: dict[str, Any], name: str = "default") -> Obj:
    """A BalloonsPolicy as the apiserver stores it."""
    return {"apiVersion": "config.nri/v1alpha1", "kind": "BalloonsPolicy",
            "metadata": {"name": name, "namespace": "kube-system", "uid": f"uid-{name}", "generation": 2,
                         "resourceVersion": "4711", "creationTimestamp": "2026-11-30T08:00:00Z"},
            "spec": {"pinCPU": True, "pinMemory": True, "reservedPoolNamespaces": ["kube-system"], **spec}}


def numa_type(i: int) -> Obj:
    return {"name": f"vllm-numa-{i}", "preferCloseToDevices": [f"/sys/devices/system/node/node{i}"],
            "hideHyperthreads": True, "preferNewBalloons": True}


def composite(name: str, *components: str, **extra: Any) -> Obj:
    return {"name": name, "components": [{"balloonType": c} for c in components], "hideHyperthreads": True,
            "preferNewBalloons": True, **extra}


RESERVED = "cpuset:0-2,32-34,64-66,96-98"  # 3 cores of each NUMA node of a 2 × 32-core node
TWO_NUMA_TYPES = [numa_type(0), numa_type(1), composite("vllm-balloon-tp1", "vllm-numa-0", "vllm-numa-1",
                                                        componentCreation="balance-balloons"),
                  composite("vllm-balloon-tp2", "vllm-numa-0", "vllm-numa-1")]


def spec(*types: Obj, reserved: str = RESERVED) -> dict[str, Any]:
    return {"reservedResources": {"cpu": reserved}, "balloonTypes": list(types or TWO_NUMA_TYPES)}


def fleet() -> list[Obj]:
    """Two small nodes (2 NUMA × 16 cores × 2 threads: CPUs 0-63), one large (2 × 32 × 2: 0-127) with a policy
    of its own, one 4-NUMA node in group `wide`."""
    wide = node("wide-1", numa=4, cores=16)
    wide["metadata"]["labels"]["config.nri/group"] = "wide"
    big_policy = stored(spec(), name="node.big")
    return [node("small-a", cores=16), node("small-b", cores=16), node("big"), wide, big_policy]


def refused(answer: Answer, *phrases: str) -> str:
    assert answer.allowed is False and answer.code == 403, answer.response
    assert answer.message.startswith("model-placement refuses BalloonsPolicy kube-system/"), answer.message
    for phrase in phrases:
        assert phrase in answer.message, (phrase, answer.message)
    assert "Traceback" not in answer.message
    return answer.message


async def test_reserved_cpuset_names_the_nodes_that_lack_its_cpus(make_webhook: MakeWebhook) -> None:
    wh = await make_webhook(fleet())
    # `default` applies to the nodes without a node./group. policy: small-a and small-b, not big or wide-1.
    message = refused(await wh.validate(policy_review(stored(spec()))))
    assert message == ("model-placement refuses BalloonsPolicy kube-system/default: reservedResources.cpu names "
                          "CPUs 64-66,96-98, which nodes small-a, small-b lack.")
    refused(await wh.validate(policy_review(stored(spec(reserved="cpuset:0,64"), name="node.small-a"), "CREATE")),
            "reservedResources.cpu names CPUs 64, which node small-a lacks.")
    # The same cpuset is fine on the node it was written for.
    assert (await wh.validate(policy_review(stored(spec(), name="node.big")))).allowed
    # exclude-cpuset: names the CPUs left out; the node lacking some of them is no fault (the plugin agrees).
    assert (await wh.validate(policy_review(stored(spec(reserved="exclude-cpuset:4-127"))))).allowed


async def test_group_policy_is_judged_on_the_nodes_of_its_group(make_webhook: MakeWebhook) -> None:
    wh = await make_webhook(fleet())
    tp4 = [numa_type(i) for i in range(4)] + [composite("vllm-balloon-tp4", *(f"vllm-numa-{i}" for i in range(4)))]
    # 4 NUMA nodes × 16 cores: CPUs 0-127. On `default`'s 2-NUMA nodes the same type would be refused.
    assert (await wh.validate(policy_review(stored(spec(*tp4, reserved="cpuset:0,64"), name="group.wide"),
                                            "CREATE"))).allowed
    refused(await wh.validate(policy_review(stored(spec(*tp4, reserved="cpuset:0,32"), name="default"))),
            "model type 'vllm-balloon-tp4' spans 4 NUMA nodes but nodes small-a, small-b have 2: its ranks would "
            "share NUMA nodes",
            "type 'vllm-numa-2' (a component of model type 'vllm-balloon-tp4') prefers "
            "/sys/devices/system/node/node2 but nodes small-a, small-b have NUMA nodes 0-1 only",
            "type 'vllm-numa-3' (a component of model type 'vllm-balloon-tp4')")


async def test_numa_span_counts_components_recursively(make_webhook: MakeWebhook) -> None:
    wh = await make_webhook(fleet())
    pairs = [numa_type(0), numa_type(1), composite("pair", "vllm-numa-0", "vllm-numa-1")]
    # Two pairs: 4 ranks on a 2-NUMA node.
    refused(await wh.validate(policy_review(stored(spec(*pairs, composite("vllm-balloon-tp4", "pair", "pair"),
                                                        reserved="cpuset:0,32")))),
            "model type 'vllm-balloon-tp4' spans 4 NUMA nodes but nodes small-a, small-b have 2")
    # balance-balloons makes one balloon of one component: a pair spans 2, which fits.
    balanced = composite("vllm-balloon-tp2", "pair", "pair", componentCreation="balance-balloons")
    assert (await wh.validate(policy_review(stored(spec(*pairs, balanced, reserved="cpuset:0,32"))))).allowed
    # A type without the model prefix is not judged for its span.
    assert (await wh.validate(policy_review(stored(spec(*pairs, composite("batch", "pair", "pair"),
                                                        reserved="cpuset:0,32"))))).allowed


async def test_composite_naming_a_missing_type_is_refused(make_webhook: MakeWebhook) -> None:
    wh = await make_webhook(fleet())
    refused(await wh.validate(policy_review(stored(spec(numa_type(0), composite(
        "vllm-balloon-tp2", "vllm-numa-0", "vllm-numa-one"), reserved="cpuset:0,32")))),
        "type 'vllm-balloon-tp2' is made of 'vllm-numa-one', which no balloonType defines")
    # The plugin's own reserved and default types exist unlisted.
    assert (await wh.validate(policy_review(stored(spec(composite("batch", "default"), reserved="cpuset:0,32"))))) \
        .allowed


async def test_min_balloons_that_do_not_fit_outside_the_reserved_cpuset_are_refused(make_webhook: MakeWebhook) -> None:
    wh = await make_webhook(fleet())
    warm = {"name": "vllm-balloon-tp1", "hideHyperthreads": True, "minBalloons": 4, "minCPUs": 16}
    refused(await wh.validate(policy_review(stored(spec(warm, reserved="cpuset:0-1,32-33")))),
            "minBalloons × minCPUs ('vllm-balloon-tp1' 4 × 16) is 64 CPUs but nodes small-a, small-b have 60 "
            "outside the reserved cpuset")
    warm["minBalloons"] = 3
    assert (await wh.validate(policy_review(stored(spec(warm, reserved="cpuset:0-1,32-33"))))).allowed
    # A reserved CPU count is a balloon of that many CPUs, anywhere on the node.
    refused(await wh.validate(policy_review(stored(spec(warm, reserved="20")))),
            "minBalloons × minCPUs ('reserved' 1 × 20, 'vllm-balloon-tp1' 3 × 16) is 68 CPUs but nodes small-a, "
            "small-b have 64 in all")


@pytest.mark.parametrize(("types", "reserved", "phrase"), [
    ([{"name": "a"}, {"name": "a"}], RESERVED, "two balloon types are named 'a'"),
    ([{"name": ""}], RESERVED, "balloonTypes[0] has no name"),
    ([{"name": "a", "minCPUs": 8, "maxCPUs": 4}], RESERVED, "type 'a' has minCPUs 8 above maxCPUs 4"),
    ([{"name": "a", "minBalloons": 3, "maxBalloons": 2}], RESERVED, "type 'a' has minBalloons 3 above maxBalloons 2"),
    ([numa_type(0), composite("c", "vllm-numa-0", preferSpreadOnPhysicalCores=False)], RESERVED,
     "composite type 'c' sets preferSpreadOnPhysicalCores, CPU allocation options that only its components may set"),
    ([numa_type(0), composite("c", "vllm-numa-0", preferCloseToDevices=["/sys/devices/system/node/node0"])],
     RESERVED, "composite type 'c' sets preferCloseToDevices"),
    ([numa_type(0), composite("c", "vllm-numa-0", cpuClass="turbo")], RESERVED,
     "composite type 'c' sets cpuClass 'turbo', which only its components may"),
    ([{"name": "a", "componentCreation": "all"}], RESERVED,
     "type 'a' sets componentCreation 'all' but has no components"),
    ([composite("a", "b"), composite("b", "a")], RESERVED, "types 'a' -> 'b' -> 'a' are made of each other"),
    ([composite("a", "")], RESERVED, "component 1 of type 'a' names no balloonType"),
    ([{"name": "reserved", "minCPUs": 3}], "2", "reservedResources.cpu 2 means 2 reserved CPUs but the reserved "
                                                "type's minCPUs is 3"),
    ([{"name": "reserved", "maxCPUs": 2}], "3", "reservedResources.cpu 3 means 3 reserved CPUs but the reserved "
                                                "type's maxCPUs is 2"),
    ([], "cpuset:0-x", "reservedResources.cpu: invalid cpuset '0-x'"),
])
async def test_settings_the_plugin_itself_rejects(wh: Webhook, types: list[Obj], reserved: str, phrase: str) -> None:
    obj = stored({"reservedResources": {"cpu": reserved}, "balloonTypes": types}, name="node.cpu-a1")
    before = decisions(webhook="validate", policy="nri-balloons", decision="denied", reason="policy-plugin-refuses")
    refused(await wh.validate(policy_review(obj)), phrase)
    assert decisions(webhook="validate", policy="nri-balloons", decision="denied",
                     reason="policy-plugin-refuses") == before + 1


async def test_update_taking_cores_running_models_hold_is_admitted_with_the_pods_named(
        make_webhook: MakeWebhook) -> None:
    # One node, both NUMA nodes' 29 model cores held by the two pods of model `big`.
    wh = await make_webhook([node("solo"), balloons_policy("solo"), running("big-0", "solo", "big", 29),
                             running("big-1", "solo", "big", 29, "2026-11-30T09:01:00Z")])
    current = balloons_policy("solo")
    assert (await wh.validate(policy_review(current))).warnings == []  # the same reserved CPUs: nothing taken
    wider = copy.deepcopy(current)
    wider["spec"]["reservedResources"]["cpu"] = "cpuset:0-3,32-34,64-67,96-98"  # a fourth core on NUMA node 0
    answer = await wh.validate(policy_review(wider))
    assert answer.allowed
    assert answer.warning_text == (
        "BalloonsPolicy kube-system/default: on node solo the new reserved CPUs 0-3,64-67 of NUMA node 0 leave 28 "
        "model cores where running models hold 29 (llm/big-0): the plugin re-places them when the policy changes")
    # Cores freed instead of taken: nothing to warn about.
    narrower = copy.deepcopy(current)
    narrower["spec"]["reservedResources"]["cpu"] = "cpuset:0-1,32-33,64-65,96-97"
    assert (await wh.validate(policy_review(narrower))).warnings == []


async def test_held_cores_on_many_nodes_name_a_few_and_count_the_rest(make_webhook: MakeWebhook) -> None:
    names = [f"solo-{i}" for i in range(7)]
    wh = await make_webhook([*map(node, names), balloons_policy(*names),
                             *(running(f"big-{i}", name, "big", 29) for i, name in enumerate(names))])
    wider = balloons_policy(*names)
    wider["spec"]["reservedResources"]["cpu"] = "cpuset:0-3,32-34,64-67,96-98"
    answer = await wh.validate(policy_review(wider))
    assert answer.allowed
    assert answer.warning_text.count("the plugin re-places them") == 5
    assert answer.warning_text.endswith("BalloonsPolicy kube-system/default: likewise on 2 more nodes")


async def test_every_policy_we_generate_is_admitted_without_a_warning(wh: Webhook) -> None:
    # The demo fleet runs the policies `balloons-policy` writes: 2- and 4-NUMA nodes, SMT on and off.
    for obj in [o for o in load_objects(demo_text()) if o.get("kind") == "BalloonsPolicy"]:
        answer = await wh.validate(policy_review(obj))
        assert answer.allowed and answer.warnings == [], (obj["metadata"]["name"], answer.response)


async def test_reserved_balloon_counts_other_than_one_are_admitted_with_a_warning(wh: Webhook) -> None:
    policy = node_balloons_policy("cpu-a1", linux_layout([32, 32], 2, "nrt"), Settings(), "kube-system")
    policy["spec"]["balloonTypes"][0]["minBalloons"] = 2
    answer = await wh.validate(policy_review(policy))
    assert answer.allowed
    assert answer.warning_text == ("BalloonsPolicy kube-system/node.cpu-a1: the reserved type's minBalloons 2 has no "
                                   "effect: the plugin always runs exactly one reserved balloon")


async def test_a_plain_tp2_type_is_admitted_with_a_warning(wh: Webhook) -> None:
    # What manifests/examples/balloonspolicy.yaml used to be (the usual hand-written shape): plain TP>1 types.
    plain = {"apiVersion": "config.nri/v1alpha1", "kind": "BalloonsPolicy",
             "metadata": {"name": "default", "namespace": "kube-system"},
             "spec": {"reservedResources": {"cpu": "12"}, "balloonTypes": [
                 {"name": "reserved", "namespaces": ["kube-system"]},
                 *({"name": f"vllm-balloon-tp{tp}", "hideHyperthreads": True, "preferNewBalloons": True}
                   for tp in (1, 2, 4))]}}
    answer = await wh.validate(policy_review(plain, "CREATE"))
    assert answer.allowed
    assert "model type 'vllm-balloon-tp2' spans 1 NUMA node, so the 2 ranks of a pod given it would share; make it a " \
           "composite of 2 per-NUMA types" in answer.warning_text
    assert "'vllm-balloon-tp4' spans 1 NUMA node, so the 4 ranks" in answer.warning_text
    # The example shipped now is the generated policy: nothing to warn about but where it applies.
    example = yaml.safe_load((Path(__file__).parent.parent / "manifests/examples/balloonspolicy.yaml").read_text())
    answer = await wh.validate(policy_review(example, "CREATE"))
    assert answer.allowed and "spans" not in answer.warning_text, (answer.message, answer.warning_text)


async def test_a_policy_no_node_takes_is_admitted_with_a_warning(wh: Webhook) -> None:
    held = spec({"name": "reserved", "minCPUs": 12}, *TWO_NUMA_TYPES)
    answer = await wh.validate(policy_review(stored(held, name="node.cpu-gone"), "CREATE"))
    assert answer.allowed
    assert answer.warning_text == ("BalloonsPolicy kube-system/node.cpu-gone: it applies to no node now: no node "
                                   "named 'cpu-gone' is known")
    answer = await wh.validate(policy_review(stored(spec(), name="gpu-nodes"), "CREATE"))
    assert answer.warning_text.endswith("the plugin reads only `default`, `node.<node>` and `group.<group>` "
                                        "policies, not 'gpu-nodes'")


async def test_what_is_not_judged_and_what_cannot_be_read(wh: Webhook) -> None:
    sent = policy_review(stored(spec(reserved="cpuset:0-9999")), "DELETE")
    sent["request"]["object"] = None
    assert (await wh.validate(sent)).allowed
    broken = policy_review(stored({"balloonTypes": {"name": "a"}}))
    answer = await wh.validate(broken)
    assert (answer.allowed, answer.code) == (False, 400)
    assert answer.message == ("model-placement refuses BalloonsPolicy kube-system/default: "
                              "spec.balloonTypes is not a list.")


async def test_a_reserved_type_without_min_cpus_is_admitted_with_a_warning_it_lends_the_cpuset(wh: Webhook) -> None:
    # The plugin resolves such a type's minCPUs to 0 (tests/oracle/test_lent_reserved.py shows what follows).
    lending = stored(spec(*TWO_NUMA_TYPES), name="node.big")
    answer = await wh.validate(policy_review(lending))
    assert answer.allowed
    assert ("the reserved type sets neither minCPUs nor maxCPUs, so the plugin keeps none of reservedResources "
            f"{RESERVED} for kube-system and lends those CPUs to other balloons, which may then take them on another "
            "NUMA node than their own; the extender refuses model pods that would need them: set the reserved "
            "type's minCPUs to 12") in answer.warning_text
    held = stored(spec({"name": "reserved", "minCPUs": 12}, *TWO_NUMA_TYPES), name="node.big")
    assert "lends" not in (await wh.validate(policy_review(held))).warning_text
