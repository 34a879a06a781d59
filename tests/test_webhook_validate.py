"""POST /validate over TLS against cluster snapshots (the demo fleet and small purpose-built ones): every
refusal with its message and numbers, warn and skip modes, rolling updates, Deployments and StatefulSets
(template × replicas), what is never judged, unreadable objects, the deadline, and no patch, ever.

Pods go through the apiserver's own sequence: /mutate first, the patch applied, the name generated,
then /validate — so the pod judged is the pod that would be stored."""

from __future__ import annotations

import copy
import json
import logging
import re
from typing import Any

import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from placement.cluster import ClusterState
from placement.config import Settings
from server.inputs import load_settings
from tests.support.payloads import fixture_json
from tests.support.webhook import (
    TP,
    Answer,
    MakeWebhook,
    Obj,
    Webhook,
    admitted,
    balloons_policy,
    decisions,
    json_paths,
    node,
    objects_without,
    refused,
    review,
    running,
)
from webhook.review import WARNING_MAX, WARNINGS_TOTAL, ReviewError, parse_review, render_warnings
from webhook.routes import TIMINGS, Context, mutate_review, validate_review

MESSAGE = "cpu-policy.model-manager.io/message"
DEMO_ELIGIBLE = "the 8 eligible nodes"  # the AMX nodes: all but cpu-icx




def kserve(uid: str = "", cpu: str | None = None, **annotations: str) -> Obj:
    sent = review("ar-pod-kserve-rs.json", uid=uid or None)
    pod = sent["request"]["object"]
    pod["metadata"]["annotations"].update(annotations)
    if cpu is not None:
        pod["spec"]["containers"][0]["resources"] = {"requests": {"cpu": cpu, "memory": "96Gi"},
                                                     "limits": {"cpu": cpu, "memory": "96Gi"}}
    return sent




def workload(name: str, replicas: int | None = None, uid: str | None = None, cpu: str | None = None,
             **annotations: str) -> Obj:
    sent = review(name, uid=uid)
    obj = sent["request"]["object"]
    if replicas is not None:
        obj["spec"]["replicas"] = replicas
    template = obj["spec"]["template"]
    template["metadata"].setdefault("annotations", {}).update(annotations)
    if cpu is not None:
        template["spec"]["containers"][0]["resources"] = {"requests": {"cpu": cpu, "memory": "64Gi"},
                                                          "limits": {"cpu": cpu, "memory": "64Gi"}}
    return sent


# ------------------------------------------------------------------------------------- small clusters








def model_pod(model: str, cpus: int, name: str | None = None) -> Obj:
    """A bare model pod (as `kubectl apply` sends it) for the purpose-built clusters."""
    sent = review("ar-pod-kubectl-run.json", uid=f"new-{model}-{cpus}")
    pod = sent["request"]["object"]
    pod["metadata"].update(name=name or f"{model}-new", labels={"model-manager.io/model": model})
    sent["request"]["name"] = pod["metadata"]["name"]
    pod["spec"]["containers"][0].update(name="main", resources={
        "requests": {"cpu": str(cpus), "memory": "64Gi"}, "limits": {"cpu": str(cpus), "memory": "64Gi"}})
    return sent


@pytest.fixture
async def full_node(make_webhook: MakeWebhook) -> Webhook:
    """One node, both NUMA nodes (29 model cores each) filled by the two pods of model `big`."""
    objects = [node("solo"), balloons_policy("solo"),
               running("big-0", "solo", "big", 29),
               running("big-1", "solo", "big", 29, "2026-11-30T09:01:00Z", numa=1)]
    return await make_webhook(objects)  # type: ignore[no-any-return]


# ------------------------------------------------------------------------------------- each refusal


async def test_tp_outside_1_2_4_8_is_refused_with_the_supported_values(wh: Webhook) -> None:
    for tp in ("0", "3"):
        message = refused(await admitted(wh, kserve(f"tp-{tp}", **{"model-manager.io/tensor-parallel-size": tp})),
                          f"tensor-parallel-size {tp} (from annotation model-manager.io/tensor-parallel-size)",
                          "use 1, 2, 4 or 8")
        assert "not supported" in message
    sent = kserve("tp-6-args")
    sent["request"]["object"]["spec"]["containers"][0]["args"][-1] = "6"
    refused(await admitted(wh, sent), "tensor-parallel-size 6 (from --tensor-parallel-size in container "
                                      "'kserve-container') is not supported")


async def test_tp_larger_than_every_eligible_numa_count_names_the_largest_and_the_fix(wh: Webhook) -> None:
    message = refused(await admitted(wh, kserve("tp-8", **{"model-manager.io/tensor-parallel-size": "8"})))
    assert message == (f"TP=8 needs a node with at least 8 NUMA nodes, one per rank; {DEMO_ELIGIBLE} have at most 4 "
                       "(cpu-a1, cpu-a2, cpu-b1, cpu-full, …). Use tensor-parallel-size 4, or add a node with "
                       "≥8 NUMA nodes.")
    # Eligible nodes are those the pod may use: without the AMX requirement, cpu-icx counts too.
    no_amx = kserve("tp-8-no-amx", **{"model-manager.io/tensor-parallel-size": "8",
                                      "model-manager.io/require-amx": "false"})
    refused(await admitted(wh, no_amx), "the 9 eligible nodes have at most 4")


async def test_footprint_larger_than_any_empty_node_says_how_much_would_fit(wh: Webhook) -> None:
    refused(await admitted(wh, kserve("too-big", cpu="31")),
            "llm/llama3-8b-predictor-6c9f7d8b4-x7k2p asks for cpu: 31, that is balloon vllm-balloon-tp1: 31 cores on 1 "
            "NUMA node (62 CPUs)",
            "more than any of the 5 eligible nodes with ≥1 NUMA nodes has even when empty",
            "(largest: cpu-b1, 30 model cores per NUMA node)",
            "Request at most cpu: 30 for TP=1, or use tensor-parallel-size 2")


async def test_init_containers_no_shared_balloon_could_hold_are_refused_with_the_fix(wh: Webhook) -> None:
    """The balloons plugin runs init containers in the shared balloon before the model's; it fails one that balloon
    cannot grow for, and the pod never starts (issue 39, tests/oracle/test_init_containers.py)."""
    pod = kserve("big-init")
    pod["request"]["object"]["spec"]["initContainers"] = [{"name": "fetch", "image": "busybox", "resources": {
        "requests": {"cpu": "240", "memory": "1Gi"}, "limits": {"cpu": "240", "memory": "1Gi"}}}]
    refused(await admitted(wh, pod),
            "its init containers (cpu: 240 at once) run in balloon reserved, which would need",
            "lower the init containers' CPU requests")


async def test_footprint_larger_than_what_is_free_now_shows_the_free_cores(wh: Webhook) -> None:
    by_hand = kserve("on-full", **{"model-manager.io/node": "cpu-full"})
    del by_hand["request"]["object"]["metadata"]["ownerReferences"]  # a person's pod: told at once
    refused(await admitted(wh, by_hand),
            "asks for cpu: 16, that is balloon vllm-balloon-tp1: 16 cores on 1 NUMA node (32 CPUs)",
            "none of the 1 eligible nodes has that free now (most free: cpu-full: NUMA 0: 3/29, NUMA 1: 1/29 free "
            "cores; the balloons policy puts a rank on NUMA node 0 (or, lacking room there, another), which needs 16 "
            "free cores on one NUMA node)")
    # The same pod anywhere fits: the refusal was about free capacity, not the request.
    assert (await admitted(wh, kserve("anywhere"))).allowed


async def test_kubelet_static_names_the_container_without_memory_or_cpu(wh: Webhook) -> None:
    sent = review("ar-pod-init-sidecar.json", uid="no-memory")
    metrics_sidecar = sent["request"]["object"]["spec"]["containers"][1]
    metrics_sidecar["resources"] = {"requests": {"cpu": "250m"}}
    refused(await admitted(wh, sent), "llm/granite-8b: kubelet-static pins cores only for Guaranteed pods",
            "container(s) metrics set no memory request or limit")
    sent = review("ar-pod-init-sidecar.json", uid="no-cpu")
    sent["request"]["object"]["spec"]["initContainers"][0]["resources"] = {"requests": {"memory": "256Mi"}}
    refused(await admitted(wh, sent), "container(s) fetch-weights set no cpu request or limit")
    # A native sidecar (restartPolicy: Always) is given native_sidecar_cpu instead: it runs for the pod's life.
    sent = review("ar-pod-init-sidecar.json", uid="sidecar-no-cpu")
    sent["request"]["object"]["spec"]["initContainers"][1]["resources"] = {"requests": {"memory": "256Mi"}}
    assert (await admitted(wh, sent)).allowed
    assert (await admitted(wh, review("ar-pod-init-sidecar.json", uid="complete"))).allowed


async def test_kubelet_static_deployment_is_judged_as_its_mutated_pods(make_webhook: MakeWebhook) -> None:
    """A Deployment's template is validated as our mutation makes its pods: a queue-proxy sidecar (KServe's
    Serverless predictor) whose limits exceed its requests is made Guaranteed, so the model still gets its cores;
    judged unmutated it was refused as "not Guaranteed" on every node (found by tests/e2e/test_kubelet_static.py)."""
    wh = await make_webhook(settings=Settings(kubernetes_cpu_policy="kubelet-static"))
    sent = workload("ar-deployment-create.json", uid="queue-proxy")
    sent["request"]["object"]["spec"]["template"]["spec"]["containers"].append({
        "name": "queue-proxy", "image": "gcr.io/knative-releases/knative.dev/serving/cmd/queue:v1.16.0",
        "resources": {"requests": {"cpu": "25m", "memory": "50Mi"}, "limits": {"cpu": "1", "memory": "200Mi"}}})
    answer = await wh.validate(sent)
    assert answer.allowed, answer.message


async def test_explicit_balloon_type_no_policy_defines_is_refused(wh: Webhook) -> None:
    refused(await admitted(wh, kserve("custom", **{"model-manager.io/nri-balloon": "vllm-balloon-custom"})),
            "asks for balloon type vllm-balloon-custom, which no BalloonsPolicy defines for the 6 eligible nodes",
            "remove the model-manager.io/nri-balloon annotation to use vllm-balloon-tp1")


async def test_a_balloon_type_derived_from_pipeline_ranks_falls_back_as_one_derived_from_tp(
        make_webhook: MakeWebhook) -> None:
    """A TP=1 PP=2 pod needs `vllm-balloon-tp2` as a TP=2 pod does, and nobody named it: where no policy defines it,
    both run best-effort and are told why. The PP pod was refused as if its author had named the type, "remove the
    nri-balloon annotation", which it does not carry (found by bench/bench_fleet.py)."""
    policy = balloons_policy("solo")
    policy["spec"]["balloonTypes"] = [t for t in policy["spec"]["balloonTypes"] if t["name"] != "vllm-balloon-tp2"]
    wh = await make_webhook([node("solo"), policy])
    for ranks in ("tensor-parallel-size", "pipeline-parallel-size"):
        sent = kserve(ranks, cpu="8", **{f"model-manager.io/{ranks}": "2"})
        annotations = (await wh.mutate(sent)).pod["metadata"]["annotations"]
        assert annotations[MESSAGE] == ("runs best-effort without exclusive cores: no eligible node has a running "
                                        "NRI balloons plugin with balloon type vllm-balloon-tp2."), annotations
        answer = await admitted(wh, sent)
        assert answer.allowed, answer.message


@pytest.mark.parametrize(("cpu", "phrase"), [("-3", "cpu '-3' is negative"),
                                             ("abc", "cpu 'abc' is not a Kubernetes quantity"),
                                             ("0", "requests no CPU")])
async def test_absurd_resources_are_refused_with_the_core_message(wh: Webhook, cpu: str, phrase: str) -> None:
    sent = kserve(f"cpu-{cpu}", cpu=cpu)
    mutated = await wh.mutate(sent)
    assert mutated.ops == [] and phrase in mutated.warning_text  # left as sent for /validate to refuse
    refused(await admitted(wh, kserve(f"cpu-{cpu}-v", cpu=cpu)), phrase)


async def test_absurd_memory_is_refused_not_a_crash(wh: Webhook) -> None:
    """A memory quantity past int64 (the fuzzer sent 1e400) once crashed the refusal's own text."""
    for phrase, memory in (("memory '1e400' is larger than any node", "1e400"), ("memory '-1Gi' is negative", "-1Gi")):
        sent = kserve(f"mem-{memory}", cpu="16")
        sent["request"]["object"]["spec"]["containers"][0]["resources"]["limits"]["memory"] = memory
        sent["request"]["object"]["spec"]["containers"][0]["resources"]["requests"]["memory"] = memory
        refused(await admitted(wh, sent), phrase)


# ------------------------------------------------------------------------------------- modes


async def test_warn_mode_admits_with_the_refusal_as_warnings(make_webhook: MakeWebhook) -> None:
    tp8 = {"model-manager.io/tensor-parallel-size": "8"}
    by_env = await make_webhook(settings=load_settings(env={"MM_NRI_PREFLIGHT": "warn"}))
    by_annotation = await make_webhook()
    for server, sent in ((by_env, kserve("warn-env", **tp8)),
                         (by_annotation, kserve("warn-ann", **tp8, **{"model-manager.io/preflight": "warn"}))):
        answer = await admitted(server, sent)
        assert answer.allowed and "status" not in answer.response
        assert answer.warning_text == (f"TP=8 needs a node with at least 8 NUMA nodes, one per rank; {DEMO_ELIGIBLE} "
                                       "have at most 4 (cpu-a1, cpu-a2, cpu-b1, cpu-full, …). "
                                       "Use tensor-parallel-size 4, or add a node with ≥8 NUMA nodes.")
        assert answer.warnings == [answer.warning_text]  # one warning, whole: kubectl prints one line
    # Enforce stays the default for everyone else.
    assert not (await admitted(by_annotation, kserve("enforce", **tp8))).allowed


async def test_skip_mode_admits_silently(make_webhook: MakeWebhook) -> None:
    too_big = {"model-manager.io/tensor-parallel-size": "8"}
    by_env = await make_webhook(settings=load_settings(env={"MM_NRI_SKIP_PREFLIGHT": "1"}))
    answer = await admitted(by_env, kserve("skip-env", **too_big))
    assert answer.allowed and not answer.warnings
    wh = await make_webhook()
    answer = await admitted(wh, kserve("skip-ann", **too_big, **{"model-manager.io/preflight": "skip"}))
    assert answer.allowed and not answer.warnings


async def test_nri_disabled_skips_the_nri_checks(make_webhook: MakeWebhook) -> None:
    wh = await make_webhook(settings=load_settings(env={"MM_NRI_ENABLED": "false"}))
    answer = await admitted(wh, kserve("nri-off", **{"model-manager.io/nri-balloon": "vllm-balloon-custom"}))
    assert answer.allowed
    # What NRI has nothing to do with is still checked.
    assert not (await admitted(wh, kserve("nri-off-tp8", **{"model-manager.io/tensor-parallel-size": "8"}))).allowed


async def test_best_effort_fallback_is_admitted_with_the_note_as_warnings(
        make_webhook: MakeWebhook, demo_objects: list[Obj]) -> None:
    wh = await make_webhook(objects_without(demo_objects, "BalloonsPolicy"))
    answer = await admitted(wh, kserve("fallback"))
    assert answer.allowed
    assert answer.warning_text == ("llm/llama3-8b-predictor-6c9f7d8b4-x7k2p runs best-effort without exclusive cores: "
                                   "no eligible node has a running NRI balloons plugin with balloon type "
                                   "vllm-balloon-tp1.")
    assert len(answer.warnings) == 1


# ------------------------------------------------------------------------------------- a model's own pods


async def test_scale_ups_of_a_model_that_fills_its_node_get_one_answer_and_only_a_replacement_counts_old_cores(
        full_node: Webhook) -> None:
    """2→3 (a third pod of `big`, which holds the node) is answered as 1→2 of another model: a new replica needs
    new cores. Only a pod replacing one of `big` that is being deleted (maxSurge 0, a re-created pod) may count
    the cores that pod frees."""
    for model in ("big", "other"):
        refused(await admitted(full_node, model_pod(model, 29)),
                "none of the 1 eligible nodes has that free now (most free: solo: NUMA 0: 0/29, NUMA 1: 0/29 free "
                "cores;")
    leaving = running("big-1", "solo", "big", 29, "2026-11-30T09:01:00Z", numa=1)
    leaving["metadata"]["deletionTimestamp"] = "2026-12-03T20:00:00Z"
    full_node.served.runtime.cluster.apply("Pod", "MODIFIED", leaving)
    assert (await admitted(full_node, model_pod("big", 29))).allowed
    refused(await admitted(full_node, model_pod("other", 29)), "none of the 1 eligible nodes has that free now")
    # The Deployment of `big` updated in place: its template × replicas, its own pods replaced by them.
    update = workload("ar-deployment-update.json", replicas=2, cpu="29",
                      **{"model-manager.io/tensor-parallel-size": "1"})
    update["request"]["object"]["spec"]["template"]["metadata"]["labels"]["model-manager.io/model"] = "big"
    assert (await full_node.validate(update)).allowed


def recorded(name: str, uid: str) -> Obj:
    """An AdmissionReview exactly as the real kube-apiserver sent it (tests/e2e/record.py), with its own uid."""
    body = copy.deepcopy(fixture_json(f"recorded/{name}.json")["request"])
    body["request"]["uid"] = uid
    return body  # type: ignore[no-any-return]


async def test_a_controllers_pod_that_finds_no_room_now_is_admitted_to_wait_and_says_why(full_node: Webhook) -> None:
    """A ReplicaSet refused a pod retries at doubling intervals that outlive the shortage; admitted, its pod waits
    Pending in the scheduler's queue. The reason is on the pod (the warning reaches only the controller-manager)."""
    mutated = await full_node.mutate(recorded("admissionreview-mutate-pod-replicaset", "rs-full"))
    note = mutated.pod["metadata"]["annotations"][MESSAGE]
    assert note.startswith("llm/llama3-8b-predictor-b9d45b889-* asks for cpu: 16, that is balloon vllm-balloon-tp1: 16 "
                           "cores on 1 NUMA node (32 CPUs); none of the 1 eligible nodes has that free now (most free: "
                           "solo: NUMA 0: 0/29, NUMA 1: 0/29 free cores;"), note
    assert note.endswith("Admitted because ReplicaSet llama3-8b-predictor-b9d45b889 creates it (a refusal would put "
                         "it into growing backoff): it waits Pending and is bound as soon as room appears."), note
    sent = recorded("admissionreview-validate-pod-replicaset", "rs-full-validate")
    sent["request"]["object"]["metadata"]["annotations"][MESSAGE] = note
    answer = await full_node.validate(sent)
    # The same sentence, now naming the pod: the apiserver has generated its name since /mutate.
    # In as few warnings as its clauses allow, each at most WARNING_MAX long (the apiserver never cuts those).
    words = " ".join(answer.warnings).replace(";", "").split()
    assert answer.allowed and words == note.replace("b9d45b889-*", "b9d45b889-hhbq8").replace(";", "").split()
    assert all(len(w) <= WARNING_MAX for w in answer.warnings)
    # Mutating the mutated pod again (reinvocation) changes nothing.
    again = recorded("admissionreview-mutate-pod-replicaset", "rs-full-again")
    again["request"]["object"] = mutated.pod
    assert (await full_node.mutate(again)).ops == []
    # A person's pod is told at once, with the numbers.
    refused(await full_node.validate(recorded("admissionreview-validate-pod-bare", "bare-full")),
            "llm/qwen-7b asks for cpu: 16, that is balloon vllm-balloon-tp1: 16 cores on 1 NUMA node (32 CPUs); none "
            "of the 1 eligible nodes has that free now")
    assert MESSAGE not in (await full_node.mutate(recorded("admissionreview-mutate-pod-bare", "bare-m"))).pod[
        "metadata"]["annotations"]
    # What can never fit is refused whoever creates it.
    never = recorded("admissionreview-validate-pod-replicaset", "rs-never")
    never["request"]["object"]["spec"]["containers"][0]["resources"] = {
        "requests": {"cpu": "62", "memory": "96Gi"}, "limits": {"cpu": "62", "memory": "96Gi"}}
    never["request"]["object"]["metadata"]["annotations"]["cpu-policy.model-manager.io/requested-cpu"] = "31"
    refused(await full_node.validate(never), "31 cores on 1 NUMA node (62 CPUs), more than any of the 1 eligible "
                                             "node with ≥1 NUMA nodes has even when empty", "Request at most cpu: 29")


async def test_a_replica_admitted_while_there_was_room_is_not_reused_once_the_room_is_gone(
        make_webhook: MakeWebhook) -> None:
    wh = await make_webhook([node("solo"), balloons_policy("solo")])
    first = await wh.mutate(recorded("admissionreview-mutate-pod-replicaset", "rs-room"))
    assert MESSAGE not in first.pod["metadata"]["annotations"]
    cluster = wh.served.runtime.cluster
    for pod in (running("big-0", "solo", "big", 29),
                running("big-1", "solo", "big", 29, "2026-11-30T09:01:00Z", numa=1)):
        cluster.apply("Pod", "ADDED", pod)
    second = await wh.mutate(recorded("admissionreview-mutate-pod-replicaset", "rs-no-room"))
    assert "it waits Pending and is bound as soon as room appears" in second.pod["metadata"]["annotations"][MESSAGE]
    for pod in (running("big-0", "solo", "big", 29),
                running("big-1", "solo", "big", 29, "2026-11-30T09:01:00Z", numa=1)):
        cluster.apply("Pod", "DELETED", pod)
    third = await wh.mutate(recorded("admissionreview-mutate-pod-replicaset", "rs-room-again"))
    assert third.ops == first.ops


async def test_a_higher_priority_pod_on_a_full_node_is_admitted_to_preempt(full_node: Webhook) -> None:
    """kube-scheduler preempts lower-priority pods for a pod that fits nowhere now: admission must let it reach
    the scheduler (the Priority plugin has set spec.priority before any webhook sees the pod), and say why."""
    urgent = model_pod("urgent", 29)
    urgent["request"]["object"]["spec"]["priority"] = 1000
    answer = await admitted(full_node, urgent)
    assert answer.allowed
    said = answer.warning_text
    assert "at priority 1000 it can have the cores of lower-priority model pods by preemption (on solo" in said
    # The same pod at the running pods' priority has nobody to preempt: refused as before.
    same = model_pod("urgent", 29)
    same["request"]["object"]["spec"]["priority"] = 0
    refused(await admitted(full_node, same), "none of the 1 eligible nodes has that free now")


async def test_on_5000_nodes_a_pod_fits_and_the_one_node_with_room_is_found(make_webhook: MakeWebhook) -> None:
    """The pre-flight of one pod stops at the first node where it fits, by name (every node's fit took most of a
    second at 5,000 nodes; how long it takes now is bench/bench_webhook.py's to measure, not a timed test's): a fleet
    where only the last node has room still admits the pod, and refuses a larger one naming every eligible node."""
    names = [f"n{i:04d}" for i in range(5000)]
    empty = await make_webhook([*(node(n) for n in names), balloons_policy(*names)])
    for i in range(5):
        assert (await admitted(empty, model_pod(f"m{i}", 16))).allowed

    # All but the last node full (29 model cores per NUMA node, both held by `big`); the last has 29 + 29 free.
    small = names[:2000]
    objects = [*(node(n) for n in small), balloons_policy(*small)]
    for n in small[:-1]:
        objects += [running(f"big-{n}-0", n, "big", 29),
                    running(f"big-{n}-1", n, "big", 29, "2026-11-30T09:01:00Z", numa=1)]
    last_free = await make_webhook(objects)
    assert (await admitted(last_free, model_pod("other", 29))).allowed
    refused(await admitted(last_free, model_pod("other", 30)),
            "more than any of the 2000 eligible nodes with ≥1 NUMA nodes has even when empty")
    last = small[-1]
    full = await make_webhook([*objects, running(f"big-{last}-0", last, "big", 29),
                               running(f"big-{last}-1", last, "big", 29, "2026-11-30T09:01:00Z", numa=1)])
    refused(await admitted(full, model_pod("other", 29)), "none of the 2000 eligible nodes has that free now")


async def test_deployment_whose_replicas_fit_only_twice_is_refused_with_the_count(make_webhook: MakeWebhook) -> None:
    wh = await make_webhook([node("solo"), balloons_policy("solo")])
    sent = workload("ar-deployment-create.json", replicas=3, cpu="20", **{"model-manager.io/tensor-parallel-size": "1"})
    refused(await wh.validate(sent), "llm/mixtral-8x7b: only 2 of 3",
            "only 2 of 3 replicas fit at once (balloon vllm-balloon-tp1: 20 cores on 1 NUMA node (40 CPUs) each; "
            "1 of 1 eligible nodes have room now)", "Use replicas: 2 or fewer")
    assert (await wh.validate(workload("ar-deployment-create.json", replicas=2, uid="two", cpu="20",
                                       **{"model-manager.io/tensor-parallel-size": "1"}))).allowed


async def test_deployment_create_update_and_statefulset_on_the_demo_fleet(wh: Webhook) -> None:
    assert (await wh.validate(review("ar-deployment-create.json"))).allowed  # TP=2 × 32 CPUs, 2 replicas
    assert (await wh.validate(review("ar-deployment-update.json"))).allowed  # scaled 2 -> 3
    # cpu: 32 at TP=2 is 16 cores on each of 2 NUMA nodes, a request of 64 CPUs: cpu-a1, cpu-b1 and cpu-snc4 (its
    # free block of NUMA nodes 2-3) can hold one now; cpu-nosmt, SMT off, is not eligible for a request doubled for
    # SMT-2 nodes.
    five = workload("ar-deployment-create.json", replicas=5, uid="five")
    refused(await wh.validate(five),
            "llm/mixtral-8x7b: only 3 of 5 replicas fit at once",
            "balloon vllm-balloon-tp2: 16 cores on each of 2 NUMA nodes (64 CPUs) each; 3 of 5 eligible nodes have "
            "room now", "Use replicas: 3 or fewer")
    assert (await wh.validate(review("ar-statefulset-create.json"))).allowed
    refused(await wh.validate(workload("ar-statefulset-create.json", uid="sts-tp8",
                                       **{"model-manager.io/tensor-parallel-size": "8"})),
            "TP=8 needs a node with at least 8 NUMA nodes")
    # Scaled to zero: nothing to place.
    assert (await wh.validate(workload("ar-deployment-update.json", replicas=0, uid="zero",
                                       **{"model-manager.io/tensor-parallel-size": "8"}))).allowed


async def test_a_scale_up_beyond_todays_capacity_is_admitted_with_a_warning(wh: Webhook) -> None:
    """GitOps scales a Deployment ahead of the nodes that will hold it: the UPDATE is admitted, and the
    warning says what does not fit today; the same object created is refused."""
    sent = review("ar-deployment-update.json", uid="twenty")
    assert sent["request"]["operation"] == "UPDATE" and sent["request"]["oldObject"]["spec"]["replicas"] == 2
    sent["request"]["object"]["spec"]["replicas"] = 20
    answer = await wh.validate(sent)
    assert answer.allowed
    assert re.search(r"llm/mixtral-8x7b: only \d+ of 20 replicas fit at once", answer.warning_text)
    assert "Admitted as an update: the workload may scale ahead of its capacity" in answer.warning_text
    created = review("ar-deployment-create.json", uid="twenty-new")
    created["request"]["object"]["spec"]["replicas"] = 20
    assert re.search(r"only \d+ of 20 replicas fit at once", refused(await wh.validate(created)))
    # What no node could ever hold is refused on UPDATE too: no new node of today's kinds would help.
    tp8 = workload("ar-deployment-update.json", uid="tp8", **{"model-manager.io/tensor-parallel-size": "8"})
    refused(await wh.validate(tp8), "TP=8 needs a node with at least 8 NUMA nodes")


# ------------------------------------------------------------------------------------- never judged


async def test_what_is_not_judged_is_admitted_without_a_word(wh: Webhook) -> None:
    cases: list[tuple[str, Obj]] = []
    plain = review("ar-pod-kserve-rs.json", uid="plain")
    plain["request"]["object"]["metadata"]["labels"] = {"app": "web"}
    cases.append(("non-model pod", plain))
    tp8 = {"model-manager.io/tensor-parallel-size": "8"}
    upd = kserve("pod-update", **tp8)
    upd["request"].update(operation="UPDATE", oldObject=copy.deepcopy(upd["request"]["object"]))
    cases.append(("pod UPDATE", upd))
    delete = kserve("pod-delete", **tp8)
    delete["request"].update(operation="DELETE", oldObject=delete["request"].pop("object"))
    cases.append(("pod DELETE", delete))
    mirror = kserve("mirror", **tp8, **{"kubernetes.io/config.mirror": "abc"})
    cases.append(("mirror pod", mirror))
    system = workload("ar-deployment-create.json", uid="kube-system", **tp8)
    system["request"]["namespace"] = system["request"]["object"]["metadata"]["namespace"] = "kube-system"
    cases.append(("kube-system Deployment", system))
    ours = workload("ar-deployment-create.json", uid="ours", **tp8)
    ours["request"]["namespace"] = ours["request"]["object"]["metadata"]["namespace"] = "model-placement"
    cases.append(("our namespace", ours))
    deleting = workload("ar-deployment-update.json", uid="deleting", **tp8)
    deleting["request"]["object"]["metadata"]["deletionTimestamp"] = "2026-12-01T10:00:00Z"
    cases.append(("Deployment being deleted", deleting))
    scale = workload("ar-deployment-update.json", uid="scale", **tp8)
    scale["request"]["subResource"] = "scale"
    cases.append(("scale subresource", scale))
    nonmodel = workload("ar-deployment-create.json", uid="nonmodel")
    nonmodel["request"]["object"]["spec"]["template"]["metadata"]["labels"] = {"app": "web"}
    cases.append(("non-model Deployment", nonmodel))
    other = workload("ar-deployment-create.json", uid="daemonset", **tp8)
    other["request"]["kind"] = other["request"]["requestKind"] = {"group": "apps", "version": "v1", "kind": "DaemonSet"}
    other["request"]["object"]["kind"] = "DaemonSet"
    cases.append(("DaemonSet", other))
    for label, sent in cases:
        answer = await wh.validate(sent)
        assert answer.allowed and not answer.warnings and "status" not in answer.response, label


async def test_dry_run_gets_the_same_verdict(wh: Webhook) -> None:
    live = await admitted(wh, kserve("live", **{"model-manager.io/tensor-parallel-size": "8"}))
    sent = kserve("dry", **{"model-manager.io/tensor-parallel-size": "8"})
    sent["request"]["dryRun"] = True
    dry = await admitted(wh, sent)
    assert (dry.allowed, dry.message) == (live.allowed, live.message) == (False, live.message)


async def test_unreadable_objects_that_claim_to_be_models_are_refused_others_admitted(wh: Webhook) -> None:
    no_template = workload("ar-deployment-create.json", uid="no-template-spec")
    del no_template["request"]["object"]["spec"]["template"]["spec"]
    answer = await wh.validate(no_template)
    assert not answer.allowed and answer.code == 400
    assert answer.message == ("Deployment llm/mixtral-8x7b is labelled as a model but model-placement cannot read it: "
                              "Deployment has no spec.template.spec")
    bad_pod = kserve("containers-string")
    bad_pod["request"]["object"]["spec"]["containers"] = "main"
    answer = await wh.validate(bad_pod)
    assert not answer.allowed and answer.code == 400
    assert "cannot read it: spec.containers is a JSON string, expected an array" in answer.message
    replicas = workload("ar-deployment-create.json", uid="replicas-string")
    replicas["request"]["object"]["spec"]["replicas"] = "three"
    answer = await wh.validate(replicas)
    assert not answer.allowed and "spec.replicas is a JSON string, expected a whole number" in answer.message
    no_object = kserve("no-object")
    del no_object["request"]["object"]
    answer = await wh.validate(no_object)
    assert not answer.allowed and answer.code == 400 and "without request.object" in answer.message
    deep = kserve("deep")
    here = deep["request"]["object"]["spec"]
    for _ in range(80):
        here["x"] = {}
        here = here["x"]
    answer = await wh.validate(deep)
    assert not answer.allowed and "nested deeper than 64 levels" in answer.message
    # Not claiming to be a model: not ours to refuse, however odd.
    plain = review("ar-pod-kserve-rs.json", uid="plain-odd")
    plain["request"]["object"]["metadata"]["labels"] = {"app": "web"}
    plain["request"]["object"]["spec"]["containers"] = "main"
    assert (await wh.validate(plain)).allowed
    await wh.still_serving()


# ------------------------------------------------------------------------------------- deadline


async def test_no_time_left_refuses_a_pod_and_admits_a_workload_with_a_warning(wh: Webhook) -> None:
    answer = await wh.validate(kserve("late-pod"), timeout="0s")
    assert not answer.allowed and answer.code == 503
    assert "within the apiserver's 0s timeout" in answer.message and "Retry" in answer.message
    answer = await wh.validate(review("ar-deployment-create.json"), timeout="0s")
    assert answer.allowed and "no time left within the apiserver's 0s timeout" in answer.warning_text
    # A non-model pod is not judged, so there is nothing to run out of time for.
    plain = review("ar-pod-kserve-rs.json", uid="plain-late")
    plain["request"]["object"]["metadata"]["labels"] = {"app": "web"}
    assert (await wh.validate(plain, timeout="0s")).allowed
    # Pre-flights typically costing 4 s lately do not fit a 3 s budget; they fit 10 s.
    for _ in range(3):
        wh.served.app[TIMINGS].record("validate", 4.0)
    assert (await wh.validate(kserve("tight"), timeout="3s")).code == 503
    assert (await admitted(wh, kserve("roomy"), timeout="10s")).allowed


async def test_a_model_pod_the_mutating_webhook_never_saw_is_refused(wh: Webhook) -> None:
    # mutate has failurePolicy Ignore: when it was down, the pod arrives here unmutated and would run unpinned.
    answer = await wh.validate(kserve("unmutated"))
    refused(answer, "was not processed by the model-placement mutating webhook",
            "cpu-policy.model-manager.io/type", "retries")
    assert (await admitted(wh, kserve("mutated"))).allowed


# ------------------------------------------------------------------------------------- logs and metrics


async def test_a_refusal_is_one_log_line_with_pod_check_and_numbers_and_one_count(
        wh: Webhook, caplog: pytest.LogCaptureFixture) -> None:
    # No balloon type exists for TP=8, so the resolved policy is best-effort; the check is what refused.
    labels = {"webhook": "validate", "policy": "best-effort", "decision": "denied", "reason": "tp-exceeds-numa"}
    before = decisions(**labels)
    caplog.set_level(logging.INFO, logger="model_placement.webhook")
    sent = kserve("log-me", **{"model-manager.io/tensor-parallel-size": "8"})
    sent["request"]["object"]["metadata"]["name"] = "llama3-8b-predictor-6c9f7d8b4-x7k2p"
    answer = await wh.validate(sent)
    assert not answer.allowed
    assert decisions(**labels) == before + 1
    (line,) = [r for r in caplog.records if r.name == "model_placement.webhook"]
    assert line.levelno == logging.WARNING and line.getMessage() == answer.message
    assert (line.verb, line.decision, line.check, line.reason) == (  # type: ignore[attr-defined]
        "validate", "denied", "tp-exceeds-numa", "tp-exceeds-numa")
    assert line.pod == "llm/llama3-8b-predictor-6c9f7d8b4-x7k2p" and line.kind == "Pod"  # type: ignore[attr-defined]
    assert "TP=8" in line.getMessage() and "at most 4" in line.getMessage()


async def test_warnings_stay_within_what_the_apiserver_keeps(make_webhook: MakeWebhook) -> None:
    """Many eligible nodes make a long message: one warning, whole, within the 256 runes the apiserver never cuts."""
    nodes = [node(f"cpu-numa2-{i:03d}") for i in range(40)]
    wh = await make_webhook([*nodes, balloons_policy(*(n["metadata"]["name"] for n in nodes))],
                            Settings(preflight="warn"))
    answer = await admitted(wh, kserve("long", **{"model-manager.io/tensor-parallel-size": "4"}))
    [warning] = answer.warnings
    assert len(warning) <= WARNING_MAX
    assert warning.startswith("TP=4 needs a node with at least 4 NUMA nodes, one per rank; the 40 eligible nodes "
                              "have at most 2 (cpu-numa2-000, cpu-numa2-001")
    assert warning.endswith("Use tensor-parallel-size 2, or add a node with ≥4 NUMA nodes.")


def test_a_long_message_is_split_between_its_clauses_and_the_total_is_kept() -> None:
    """The apiserver (pkg/endpoints/filters/warning.go) cuts every warning to 256 runes once the total passes
    4096: ours are each ≤ 256, split only where a clause ends, and never more than 4096 in all."""
    clauses = [f"node cpu-{i:02d} has {i} of 32 cores free on NUMA node 0 and none on NUMA node 1" for i in range(9)]
    long = "; ".join(clauses)
    assert len(long) > WARNING_MAX
    pieces = render_warnings([long])
    assert len(pieces) > 1 and all(len(p) <= WARNING_MAX for p in pieces)
    assert "; ".join(pieces) == long  # cut nowhere but between clauses
    many = render_warnings([f"warning {i}: " + "x" * 240 for i in range(30)])
    assert sum(map(len, many)) <= WARNINGS_TOTAL and len(many) == WARNINGS_TOTAL // 251
    assert all(w.endswith("x" * 240) for w in many)  # dropped whole, never cut
    assert render_warnings(["a\x07bell", "a\x07bell", ""]) == ["abell"]  # a control character drops a header



# ------------------------------------------------------------------------------------- fuzzing


FIXTURES = ["ar-pod-kserve-rs.json", "ar-pod-kubectl-run.json", "ar-pod-two-terms.json", "ar-pod-init-sidecar.json",
            "ar-pod-pre124-no-namespace.json", "ar-deployment-create.json", "ar-deployment-update.json",
            "ar-statefulset-create.json"]
ODD_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 100) | st.floats(allow_nan=False, allow_infinity=False)
    | st.sampled_from(["", "-3", "abc", "8", "1e400", "main", "kube-system", "Always", "CREATE", "Pod"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.sampled_from(["cpu", "memory", "name", "requests", "kind", TP, "model-manager.io/tensor-parallel-size"]),
        inner, max_size=3),
    max_leaves=6)




@hsettings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzzed_real_payloads_always_get_a_well_formed_answer(data: st.DataObject, demo: ClusterState,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    """Real payloads with random fields replaced or deleted: both webhooks answer in the wire format (or
    the envelope is refused as a 400), a patch always applies, and the core never crashes."""
    body = review(data.draw(st.sampled_from(FIXTURES)))
    places = list(json_paths(body))
    for _ in range(data.draw(st.integers(1, 4))):
        *parents, last = data.draw(st.sampled_from(places))
        here: Any = body
        try:
            for key in parents:
                here = here[key]
            if data.draw(st.booleans()):
                here[last] = data.draw(ODD_JSON)
            elif isinstance(here, dict):
                here.pop(last, None)
        except (KeyError, IndexError, TypeError):
            pass  # an earlier change removed or replaced a parent
    # What the server reads is JSON text: keys are strings (a list index drawn as a dict key becomes "0").
    body = json.loads(json.dumps(body))
    try:
        parsed = parse_review(body)
    except ReviewError as exc:
        assert str(exc)  # a 400 with this message, or an answer for exc.uid
        return
    caplog.clear()
    for judge, mutating in ((mutate_review, True), (validate_review, False)):
        outcome = judge(parsed, Context(demo))
        text = json.dumps(outcome.review)
        answer = Answer(body, 200, "application/json", text, mutating)
        if answer.ops:
            answer.pod  # noqa: B018 - applies to exactly what was sent
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


@pytest.mark.parametrize("node_pin,cpu", [(None, "31"), ("cpu-nosmt", "40"), ("cpu-nosmt", "27")])
async def test_the_suggested_cpu_request_is_admitted_when_resubmitted(wh: Webhook, node_pin: str | None,
                                                                      cpu: str) -> None:
    """The refusal speaks in the user's cpu: N, and the cpu: N it suggests is then admitted; on the SMT-off node a
    cpu: N is N cores too (the request is sized for that node's width, not doubled for SMT-2 nodes)."""
    pin = {"model-manager.io/node": node_pin} if node_pin else {}
    message = refused(await admitted(wh, kserve(f"big-{cpu}", cpu=cpu, **pin)), f"asks for cpu: {cpu}, that is ")
    suggested = re.search(r"Request at most cpu: (\d+) ", message)
    assert suggested, message
    answer = await admitted(wh, kserve(f"again-{cpu}", cpu=suggested.group(1), **pin))
    assert answer.allowed, answer.message


async def test_on_the_smt_off_node_cpu_16_is_16_cores_and_on_smt2_nodes_32_cpus(wh: Webhook) -> None:
    nosmt = (await wh.mutate(kserve("nosmt", cpu="16", **{"model-manager.io/node": "cpu-nosmt"}))).pod
    assert nosmt["spec"]["containers"][0]["resources"]["requests"]["cpu"] == "16"
    assert nosmt["metadata"]["annotations"]["cpu-policy.model-manager.io/cpus"] == "16"
    # Any node of the mixed demo fleet: sized for SMT-2, and kept off the SMT-off node by its node affinity.
    anywhere = (await wh.mutate(kserve("anywhere", cpu="16"))).pod
    assert anywhere["spec"]["containers"][0]["resources"]["requests"]["cpu"] == "32"
    [term] = anywhere["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"]
    assert {"key": "feature.node.kubernetes.io/cpu-hardware_multithreading", "operator": "NotIn",
            "values": ["false"]} in term["matchExpressions"]


async def test_kubelet_static_ranks_sharing_a_numa_node_are_warned_that_vllm_stops(make_webhook: MakeWebhook) -> None:
    """The kubelet keeps a 16-CPU TP=2 pod on one NUMA node of either kubelet-static node of the demo fleet; vLLM's
    default binding needs a NUMA node per rank and stops at start there (its `No enough allowed NUMA nodes`
    assertion). Admitted, with the warning; a TP=1 pod of the same size is told nothing."""
    wh = await make_webhook(settings=Settings(kubernetes_cpu_policy="kubelet-static"))
    answer = await admitted(wh, kserve("tp2", cpu="16", **{TP: "2"}))
    assert answer.allowed, answer.message
    said = " ".join(answer.warnings)
    assert "its 2 ranks share 1 NUMA node" in said, said
    assert 'stops at start with "No enough allowed NUMA nodes to bind threads"' in said, said
    assert "To change: use model-manager.io/cpu-policy: nri-balloons (a balloon per rank)" in said, said
    answer = await admitted(wh, kserve("tp1", cpu="16"))
    assert answer.allowed and not answer.warnings, answer.warnings


async def test_kubelet_static_ranks_spread_unevenly_are_warned_with_the_cores(make_webhook: MakeWebhook) -> None:
    """cpu-ks2's restricted kubelet spreads a 40-CPU TP=2 pod over two NUMA nodes of 24 CPUs (2 reserved on NUMA 0),
    not 20 + 20: vLLM gives each rank all of its NUMA node's CPUs, so one rank is short. Admitted, with the cores;
    this warning once left its advice unset and denied the pod ("pre-flight failed (UnboundLocalError)")."""
    wh = await make_webhook(settings=Settings(kubernetes_cpu_policy="kubelet-static"))
    sent = kserve("uneven", cpu="40", **{TP: "2"})
    sent["request"]["object"]["spec"]["nodeSelector"] = {"kubernetes.io/hostname": "cpu-ks2"}
    answer = await admitted(wh, sent)
    assert answer.allowed, answer.message
    said = " ".join(answer.warnings)
    assert "its CPUs span 2 NUMA nodes for 2 ranks unevenly (cores NUMA " in said, said
    assert "gives a rank less than its share" in said and "To change: request a multiple of the ranks" in said, said
