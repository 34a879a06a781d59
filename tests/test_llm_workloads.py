"""KServe LLMInferenceService and llm-d pods, shaped as KServe's controller renders them (labels from its
pkg/constants, containers from config/llmisvcconfig: `bash -c` running `eval "exec vllm serve …"`), through /mutate
and /validate on the demo fleet: workload pods (decode, prefill, LeaderWorkerSet worker) are model pods with the
ranks their vLLM flags give; the router-scheduler is left alone; the LLMInferenceService itself gets the early answer
at apply time, like a Deployment."""

from __future__ import annotations

from tests.support.webhook import BALLOON, NUMA, TP, TYPE, MakeWebhook, Obj, Webhook, admitted, refused, review
from webhook.review import WARNING_MAX

ROUTER = "ar-pod-llmisvc-router-scheduler.json"


async def test_decode_and_prefill_pods_are_model_pods_with_the_tp_of_their_vllm_command(wh: Webhook) -> None:
    for fixture in ("ar-pod-llmisvc-decode.json", "ar-pod-llmisvc-prefill.json"):
        answer = await wh.mutate(review(fixture))
        ann = answer.pod["metadata"]["annotations"]
        # --tensor-parallel-size 2 inside the quoted `eval "exec vllm serve …"` of the template's bash script.
        assert (ann[TYPE], ann[TP], ann[NUMA], ann[BALLOON + "main"]) == (
            "nri-balloons", "2", "2", "vllm-balloon-tp2"), ann
        assert (await admitted(wh, review(fixture))).allowed


async def test_a_leaderworkerset_worker_pod_counts_its_own_ranks(wh: Webhook) -> None:
    """--data-parallel-size 4 spans the group's pods; --data-parallel-size-local 2 ranks run in this one, each with
    TP=2 (the flag after a trimmed template line, `\\--tensor-parallel-size 2`): 4 NUMA nodes."""
    ann = (await wh.mutate(review("ar-pod-llmisvc-lws-worker.json"))).pod["metadata"]["annotations"]
    assert (ann[TP], ann[NUMA], ann[BALLOON + "main"]) == ("2", "4", "vllm-balloon-tp4"), ann


async def test_the_router_scheduler_pod_is_left_alone(wh: Webhook) -> None:
    mutated = await wh.mutate(review(ROUTER))
    assert mutated.allowed and mutated.ops == []
    validated = await wh.validate(review(ROUTER))
    assert validated.allowed and not validated.warnings


async def test_llm_workloads_off_leaves_them_to_the_model_labels(make_webhook: MakeWebhook) -> None:
    from placement.config import Settings

    off = await make_webhook(settings=Settings(llm_workloads=False))
    assert (await off.mutate(review("ar-pod-llmisvc-decode.json"))).ops == []


def llmisvc(uid: str, operation: str = "CREATE", **spec: object) -> Obj:
    sent = review("ar-llmisvc-create.json", uid=uid)
    sent["request"]["operation"] = operation
    sent["request"]["object"]["spec"].update(spec)
    return sent


async def test_an_llminferenceservice_is_judged_at_apply_time_with_its_parallelism_and_replicas(
        wh: Webhook) -> None:
    assert (await wh.validate(llmisvc("two"))).allowed  # 2 replicas of TP=2, 16 cores each
    message = refused(await wh.validate(llmisvc("too-many", replicas=40)), "llm/qwen3-8b-kserve: only ",
                      " of 40 replicas fit at once (balloon vllm-balloon-tp2: 8 cores on each of 2 NUMA nodes")
    # The same scale as an update is admitted with the numbers: its pods wait Pending for room.
    update = await wh.validate(llmisvc("too-many-update", "UPDATE", replicas=40))
    assert update.allowed and all(clause in update.warning_text for clause in message.split("; ")), message
    assert "its pods that do not fit are admitted, wait Pending, and are bound as soon as cores are free" in \
        update.warning_text
    # What no node could ever hold is refused whatever the count.
    refused(await wh.validate(llmisvc("tp-16", parallelism={"tensor": 16})), "tensor-parallel-size 16")
    # A worker (LeaderWorkerSet): each pod runs dataLocal ranks, data ÷ dataLocal pods per replica.
    wide = await wh.validate(llmisvc("lws", replicas=40, worker={"containers": []},
                                     parallelism={"tensor": 2, "data": 4, "dataLocal": 2}))
    assert "of 80 replicas fit at once (balloon vllm-balloon-tp4" in wide.message, wide.message


async def test_an_llminferenceservice_without_a_template_is_left_to_its_pods(wh: Webhook) -> None:
    sent = llmisvc("no-template")
    del sent["request"]["object"]["spec"]["template"]
    answer = await wh.validate(sent)
    assert answer.allowed and not answer.warnings


def with_env(uid: str, caps: list[str] | None = None, **env: str) -> Obj:
    sent = review("ar-pod-llmisvc-decode.json", uid=uid)
    main = sent["request"]["object"]["spec"]["containers"][0]
    main["env"] += [{"name": k, "value": v} for k, v in env.items()]
    if caps is not None:
        main["securityContext"]["capabilities"]["add"] = caps
    return sent


async def test_vllm_settings_that_disagree_with_the_balloon_are_told_as_short_warnings(wh: Webhook) -> None:
    """TP=2, cpu: 16 (16 cores, hideHyperthreads): 8 CPUs per rank, memory request 64Gi."""
    pod = "llm/qwen3-8b-kserve-6d9c7b8f4-x7k2p: vLLM"
    answer = await admitted(wh, with_env("vllm-bad", VLLM_CPU_OMP_THREADS_BIND="0-15",
                                         VLLM_CPU_NUM_OF_RESERVED_CPU="8", VLLM_CPU_KVCACHE_SPACE="40"))
    assert answer.allowed
    said = answer.warning_text
    assert f"{pod} VLLM_CPU_OMP_THREADS_BIND has 1 CPU list(s) for 2 rank(s); set it to auto." in said
    assert f"{pod} VLLM_CPU_NUM_OF_RESERVED_CPU=8 leaves no CPU for the OpenMP threads of a rank with 8 CPUs" in said
    assert f"{pod} VLLM_CPU_KVCACHE_SPACE=40 GiB × 2 rank(s) = 80 GiB of KV cache, more than the memory request " \
           "(64 GiB); raise it." in said
    # KServe's template drops every capability: vLLM's migrate_pages is refused.
    assert f"{pod} cannot bind its memory to its NUMA nodes without capability SYS_NICE" in said
    assert all(len(w) <= WARNING_MAX for w in answer.warnings)
    fixed = await admitted(wh, with_env("vllm-fixed", VLLM_CPU_OMP_THREADS_BIND="0-7|32-39"))
    assert "names fixed CPU ids, but the balloon's CPUs are chosen on the node" in fixed.warning_text
    good = await admitted(wh, with_env("vllm-good", caps=["SYS_NICE"], VLLM_CPU_OMP_THREADS_BIND="auto",
                                       VLLM_CPU_NUM_OF_RESERVED_CPU="1", VLLM_CPU_KVCACHE_SPACE="16"))
    assert good.allowed and not good.warnings, good.warnings
    # A pod that sets no VLLM_CPU_* runs vLLM's defaults, which follow the balloon: nothing to tell.
    assert not (await admitted(wh, review("ar-pod-llmisvc-decode.json"))).warnings


async def test_the_decode_pods_native_sidecar_is_made_guaranteed_under_kubelet_static(
        make_webhook: MakeWebhook) -> None:
    """KServe's llm-d-routing-sidecar is a native sidecar with `resources: {}`: left so, the pod is Burstable and the
    kubelet's static CPU manager pins none of the model's cores. It gets the configured default as requests =
    limits; the model container keeps whole CPUs; an ordinary init container without resources is not invented."""
    from placement.config import Settings

    static = await make_webhook(settings=Settings(kubernetes_cpu_policy="kubelet-static", native_sidecar_cpu="250m"))
    sent = review("ar-pod-llmisvc-decode.json")
    mutated = (await static.mutate(sent)).pod
    sidecar = mutated["spec"]["initContainers"][0]
    assert sidecar["name"] == "llm-d-routing-sidecar"
    assert sidecar["resources"] == {"requests": {"cpu": "250m", "memory": "128Mi"},
                                    "limits": {"cpu": "250m", "memory": "128Mi"}}
    main = mutated["spec"]["containers"][0]["resources"]
    assert main["requests"] == main["limits"] and main["requests"]["cpu"] == "16", main
    validate = review("ar-pod-llmisvc-decode.json", uid="decode-validate")
    validate["request"]["object"] = mutated
    assert (await admitted(static, validate)).allowed
    # Without the sidecar's restartPolicy it is an ordinary init container: what it lacks is for /validate to name.
    plain = review("ar-pod-llmisvc-decode.json", uid="plain-init")
    del plain["request"]["object"]["spec"]["initContainers"][0]["restartPolicy"]
    assert (await static.mutate(plain)).pod["spec"]["initContainers"][0]["resources"] == {}
