"""Reading a model pod: detection, model container, TP from real vLLM command lines, footprints."""

from __future__ import annotations

import copy
from types import MappingProxyType

import pytest

from placement.cluster import ClusterState
from placement.config import Settings
from placement.demand import is_model_pod, pod_shared_cpu_milli, read_model_pod
from placement.fit import footprint
from placement.mutation import mutate_pod
from placement.quantity import cpu_milli
from server.sources import demo_text, load_objects
from tests.support.payloads import fixture_json


def kserve_pod() -> dict:
    return copy.deepcopy(fixture_json("admissionreview-v1-pod-create.json")["request"]["object"])


def with_args(args: list[str], command: list[str] | None = None, annotations: dict | None = None) -> dict:
    pod = kserve_pod()
    pod["spec"]["containers"][0]["args"] = args
    if command is not None:
        pod["spec"]["containers"][0]["command"] = command
    pod["metadata"]["annotations"] = annotations or {}
    return pod


@pytest.mark.parametrize("args,command,tp", [
    (["--model", "/m", "--tensor-parallel-size", "2"], None, 2),
    (["--model", "/m", "--tensor-parallel-size=4"], None, 4),
    (["serve", "/m", "-tp", "8"], ["vllm"], 8),
    (["--model", "/m"], None, 1),
    # KServe's huggingfaceserver style: a shell script line
    ([], ["/bin/sh", "-c",
          "python -m vllm.entrypoints.openai.api_server --model /m --tensor-parallel-size 2 --port 8080"], 2),
    # argparse semantics: the last one wins
    (["--tensor-parallel-size", "1", "--tensor-parallel-size", "2"], None, 2),
])
def test_tp_from_real_vllm_command_lines(args: list[str], command: list[str] | None, tp: int,
                                         settings: Settings) -> None:
    demand = read_model_pod(with_args(args, command), settings)
    assert demand.tp == tp and not demand.problems


def test_tp_annotation_beats_args(settings: Settings) -> None:
    pod = with_args(["--tensor-parallel-size", "1"], annotations={"model-manager.io/tensor-parallel-size": "2"})
    assert read_model_pod(pod, settings).tp == 2


@pytest.mark.parametrize("raw,words", [("3", "1, 2, 4 or 8"), ("0", "1, 2, 4 or 8"), ("two", "whole number")])
def test_bad_tp_is_a_problem_the_user_can_read(raw: str, words: str, settings: Settings) -> None:
    demand = read_model_pod(with_args(["--tensor-parallel-size", raw]), settings)
    assert any(words in p for p in demand.problems)


def test_model_container_choice(settings: Settings) -> None:
    pod = kserve_pod()
    sidecar = {"name": "agent", "resources": {"requests": {"cpu": "1"}}}
    pod["spec"]["containers"].insert(0, sidecar)
    assert read_model_pod(pod, settings).container == "main"
    pod["spec"]["containers"][1]["name"] = "kserve-container"
    assert read_model_pod(pod, settings).container == "kserve-container"
    pod["metadata"]["annotations"] = {"model-manager.io/container": "agent"}
    assert read_model_pod(pod, settings).container == "agent"
    pod["metadata"]["annotations"] = {"model-manager.io/container": "nope"}
    assert "names no container" in read_model_pod(pod, settings).problems[0]


def test_model_pod_detection(settings: Settings) -> None:
    assert is_model_pod({"serving.kserve.io/inferenceservice": "x"}, settings)
    assert is_model_pod({"model-manager.io/model": "x"}, settings)
    assert not is_model_pod({"app": "nginx"}, settings)
    assert not is_model_pod(None, settings)


@pytest.mark.parametrize("cpu,words", [("-3", "negative"), ("abc", "not a Kubernetes quantity")])
def test_absurd_cpu_is_a_problem_not_a_crash(cpu: str, words: str, settings: Settings) -> None:
    pod = kserve_pod()
    pod["spec"]["containers"][0]["resources"] = {"requests": {"cpu": cpu}}
    demand = read_model_pod(pod, settings)
    assert demand.cpu_milli == 0 and any(words in p for p in demand.problems)


def test_footprint_tp2_cpu16_hidden_hyperthreads_is_two_numa_nodes_of_8_cores(demo, settings: Settings) -> None:
    pod = with_args(["--tensor-parallel-size", "2"])
    pod["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "16", "memory": "8Gi"}}
    # As the user wrote it, the plugin would give the balloon 16 logical CPUs: 4 cores on each NUMA node.
    raw = read_model_pod(pod, settings)
    fp = footprint(raw, demo.ledger("cpu-a1"), settings.mm_kubelet_threads_per_core)
    assert (fp.numa_nodes, fp.cores_per_numa, fp.cores, fp.cpus) == (2, 4, 8, 16)
    # The webhook makes cpu: 16 mean 16 cores (8 per rank) for 16 threads: a request of 32.
    mutated = mutate_pod(pod, demo).demand
    assert mutated.cpu_milli == 32_000
    fp = footprint(mutated, demo.ledger("cpu-a1"), settings.mm_kubelet_threads_per_core)
    assert (fp.numa_nodes, fp.cores_per_numa, fp.cores, fp.cpus) == (2, 8, 16, 32)
    # SMT off: a CPU is a core, so the same request is 16 cores on each NUMA node.
    fp = footprint(mutated, demo.ledger("cpu-nosmt"), settings.mm_kubelet_threads_per_core)
    assert (fp.numa_nodes, fp.cores_per_numa, fp.cpus) == (2, 16, 32)


@pytest.mark.parametrize("cpu,tp,mode,want", [
    ("16", 1, "cores", 32_000), ("15", 2, "cores", 32_000), ("3", 4, "cores", 8_000),
    ("16", 1, "cpus", 16_000), ("15", 1, "cpus", 16_000), ("3", 2, "cpus", 4_000), ("500m", 1, "cpus", 2_000),
])
def test_the_balloon_request_is_whole_cores_on_every_rank(demo, cpu: str, tp: int, mode: str, want: int) -> None:
    settings = Settings(nri_cpu_request=mode)
    state = ClusterState.from_objects(load_objects(demo_text()), settings)
    pod = with_args(["--tensor-parallel-size", str(tp)])
    pod["spec"]["containers"][0]["resources"] = {"requests": {"cpu": cpu}, "limits": {"cpu": cpu}}
    mutation = mutate_pod(pod, state)
    resources = mutation.pod["spec"]["containers"][0]["resources"]
    assert mutation.demand.cpu_milli == want
    assert cpu_milli(resources["requests"]["cpu"]) == cpu_milli(resources["limits"]["cpu"]) == want
    annotations = mutation.pod["metadata"]["annotations"]
    assert annotations.get("cpu-policy.model-manager.io/requested-cpu") == (cpu if want != cpu_milli(cpu) else None)
    # Mutating the output again changes nothing: the request is never doubled twice.
    assert mutate_pod(mutation.pod, state).pod == mutation.pod


def test_kubelet_static_footprint_rounds_up_to_whole_cores(demo) -> None:
    settings = Settings(kubernetes_cpu_policy="kubelet-static")
    pod = kserve_pod()
    pod["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "15", "memory": "8Gi"}}
    demand = read_model_pod(pod, settings)
    fp = footprint(demand, demo.ledger("cpu-a1"), settings.mm_kubelet_threads_per_core)
    assert (fp.cores, fp.cpus) == (8, 16)


def test_shared_pool_request_follows_kubelet_effective_request() -> None:
    spec = {"initContainers": [{"name": "init", "resources": {"requests": {"cpu": "4"}}},
                               {"name": "sidecar", "restartPolicy": "Always",
                                "resources": {"requests": {"cpu": "500m"}}}],
            "containers": [{"name": "a", "resources": {"requests": {"cpu": "1"}}},
                           {"name": "b", "resources": {"limits": {"cpu": "2"}}}]}
    # While it initializes, the init container's 4 (it runs before the sidecar starts) beats 1 + 2 + 0.5; once the
    # pod runs, only the app containers and the sidecar hold CPUs.
    assert pod_shared_cpu_milli(spec, initializing=True) == 4000
    assert pod_shared_cpu_milli(spec) == 3500
    spec["initContainers"][0]["resources"]["requests"]["cpu"] = "1"
    assert pod_shared_cpu_milli(spec, initializing=True) == 3500


def test_shared_pool_request_reads_any_mapping_and_skips_what_is_not_a_container() -> None:
    spec = {"containers": [MappingProxyType({"name": "a", "resources": {"requests": {"cpu": "1"}}}), "junk", None,
                           {"name": "b", "resources": {"requests": {"cpu": "bad"}}}],
            "initContainers": [7, MappingProxyType({"name": "i", "resources": {"limits": {"cpu": "3"}}})]}
    assert pod_shared_cpu_milli(spec, initializing=True) == 3000  # the init's 3 beats the 1 (+ 0 for the bad one)
    assert pod_shared_cpu_milli(spec) == 1000
    spec["initContainers"] = None
    assert pod_shared_cpu_milli(spec) == 1000


@pytest.mark.parametrize("value,milli", [("2", 2000), ("500m", 500), ("1.5", 1500), ("0.1", 100), ("2e3", 2_000_000),
                                         ("1k", 1_000_000), (4, 4000), ("250m", 250)])
def test_cpu_quantities(value: object, milli: int) -> None:
    from placement.quantity import cpu_milli

    assert cpu_milli(value) == milli


@pytest.mark.parametrize("value", ["\uff11\uff12", "m", "", "1.2.3", "-1", "abc", None, True, "1Gi8"])
def test_cpu_quantities_rejected(value: object) -> None:
    from placement.quantity import QuantityError, cpu_milli

    for _ in range(2):  # a string that failed is not remembered as a value
        with pytest.raises(QuantityError):
            cpu_milli(value)
