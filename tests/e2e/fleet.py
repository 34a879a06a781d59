"""The e2e fleet: 1,000 Nodes of four shapes and the model pods already running on them.

Three roomy nodes (pool `open`) take the model pods the tests create. The rest (pool `full`) pass kube-scheduler's
own filters for a 16-core, 96Gi model pod but give it nowhere to run now, each for a reason only our extender
knows: 597 already run two models placed before the tests (bound by name) and have 9 free cores per NUMA node;
300 have NUMA nodes too small for 16 cores even when empty; 100 have no AMX.
"""

from __future__ import annotations

from typing import Any

from tests.e2e.cluster import node

MODEL_NS = "llm"  # opted in: our webhooks see its model pods
PLACED_NS = "placed"  # model pods that were running before the tests; no webhook sees this namespace
POOL = "e2e.model-placement.io/pool"
OPEN_NODES = [f"open-{i}" for i in range(3)]
SHAPES = {  # pool `full`: name prefix -> (count, node shape, the model pods each already runs)
    # 29 model cores per NUMA node; two 20-core models leave 9 free on each, and 48 of 128 CPUs node-wide. They
    # run as our webhook left them: 40 CPUs each, 20 cores with their hidden hyperthreads.
    "xeon2": (597, {"numa": 2, "cores_per_numa": 32}, [{"tp": 1, "cpu": "40"}] * 2),
    # SNC-4 with 16 cores per NUMA node: after the reserved CPUs, fewer than 16 model cores on any of them.
    # They run the generated policy of their own shape (group.snc4): a policy matches one NUMA layout.
    "xeon4": (300, {"numa": 4, "cores_per_numa": 16, "labels": {"config.nri/group": "snc4"}}, []),
    "noamx": (100, {"numa": 2, "cores_per_numa": 28, "amx": False}, []),
}

# What KServe's raw deployment mode creates for a TP=1 InferenceService: its pods come from the ReplicaSet controller.
KSERVE_DEPLOYMENT = """
apiVersion: apps/v1
kind: Deployment
metadata:
  name: llama3-8b-predictor
  namespace: llm
  labels:
    serving.kserve.io/inferenceservice: llama3-8b
    component: predictor
spec:
  replicas: 3
  selector:
    matchLabels:
      app: isvc.llama3-8b-predictor
  template:
    metadata:
      labels:
        app: isvc.llama3-8b-predictor
        serving.kserve.io/inferenceservice: llama3-8b
        component: predictor
      annotations:
        serving.kserve.io/deploymentMode: RawDeployment
    spec:
      containers:
      - name: kserve-container
        image: vllm/vllm-openai-cpu:v0.10.0
        args: ["--model", "/mnt/models", "--dtype", "bfloat16", "--tensor-parallel-size", "1"]
        ports:
        - containerPort: 8080
          protocol: TCP
        resources:
          requests: {cpu: "16", memory: 96Gi}
          limits: {cpu: "16", memory: 96Gi}
"""


def model_pod(name: str, namespace: str, *, tp: int, cpu: str, memory: str = "64Gi", model: str | None = None,
              node_name: str | None = None, annotations: dict[str, str] | None = None,
              node_selector: dict[str, str] | None = None) -> dict[str, Any]:
    """A vLLM model pod as a user writes it: nothing about CPU placement."""
    spec: dict[str, Any] = {"containers": [{
        "name": "main", "image": "vllm/vllm-openai-cpu:v0.10.0",
        "args": ["--model", f"/models/{model or name}", "--tensor-parallel-size", str(tp)],
        "resources": {"requests": {"cpu": cpu, "memory": memory}, "limits": {"cpu": cpu, "memory": memory}},
    }]}
    if node_name:
        spec["nodeName"] = node_name
    if node_selector:
        spec["nodeSelector"] = node_selector
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": {"model-manager.io/model": model or name},
                         "annotations": annotations or {}},
            "spec": spec}


def fleet(scale: float = 1.0) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Nodes and the pods already running on them; `scale` shrinks the `full` pool (the recorder's small fleet)."""
    nodes = [node(n, numa=2, cores_per_numa=32, labels={POOL: "open"}) for n in OPEN_NODES]
    placed = []
    for prefix, (count, shape, runs) in SHAPES.items():
        for i in range(max(1, round(count * scale))):
            name = f"{prefix}-{i:04d}"
            shape = {**shape, "labels": {POOL: "full", **shape.get("labels", {})}}  # type: ignore[dict-item]
            nodes.append(node(name, **shape))
            for k, running in enumerate(runs):
                placed.append(model_pod(f"running-{name}-{k}", PLACED_NS, model=f"running-{prefix}-{k}",
                                        node_name=name, **running))
    return nodes, placed


def model_deployment(name: str, namespace: str, replicas: int, *, cpu: str = "16", memory: str = "96Gi",
                     tp: int = 1) -> dict[str, Any]:
    pod = model_pod(name, namespace, tp=tp, cpu=cpu, memory=memory)
    labels = {**pod["metadata"]["labels"], "app": name}
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": labels}, "spec": pod["spec"]}}}
