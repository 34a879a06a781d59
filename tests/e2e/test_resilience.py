"""Our servers and the apiserver going away and coming back, as a user and an operator see it."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from tests.e2e.cluster import Cluster, wait_until
from tests.e2e.fleet import MODEL_NS, OPEN_NODES, model_deployment

BALLOON = "balloon.balloons.resource-policy.nri.io/container.main"


def bound(cluster: Cluster, selector: str, count: int) -> list[dict[str, Any]]:
    pods = cluster.pods(MODEL_NS, selector)
    return pods if len(pods) == count and all(p["spec"].get("nodeName") for p in pods) else []


def assert_no_core_held_twice(cluster: Cluster) -> None:
    """Every bound model pod of the tests is held once, on its own node, and no NUMA node holds more than it has."""
    on_node = {p["metadata"]["name"]: p["spec"]["nodeName"] for p in cluster.pods(MODEL_NS) if p["spec"].get("nodeName")
               and not p["metadata"].get("deletionTimestamp")}
    held: dict[str, str] = {}
    for name in OPEN_NODES:
        status, body = cluster.get_ours("extender", f"/debug/nodes/{name}")
        assert status == 200, body
        for numa in json.loads(body)["numa"]:
            assert sum(h["cores"] for h in numa["held"]) <= numa["capacity"], (name, numa)
            for h in numa["held"]:
                pod = h["pod"].split("/")[-1]
                assert held.get(pod, name) == name, f"{pod} held on {held[pod]} and {name}"
                held[pod] = name
    assert {p: n for p, n in on_node.items() if n in OPEN_NODES} == {p: n for p, n in held.items() if p in on_node}


@pytest.fixture
def deployments(cluster: Cluster) -> Iterator[list[str]]:
    """Names of model Deployments a test creates; deleted after it, passed or not, so the next finds room, and
    whatever it stopped running again."""
    names: list[str] = []
    yield names
    for which in ("webhook", "extender", "kube-scheduler"):
        if not cluster.components[which].alive():
            cluster.components[which].start()
            if which != "kube-scheduler":
                cluster.wait_ready(which)
    for name in names:
        cluster.delete_deployment(MODEL_NS, name, f"app={name}")


def test_extender_and_apiserver_restarts_never_give_two_pods_the_same_cores(cluster: Cluster,
                                                                           deployments: list[str]) -> None:
    extender = cluster.components["extender"]
    extender.stop()
    deployments.append("mistral-7b")
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(model_deployment("mistral-7b", MODEL_NS, 2)))
    # The scheduler cannot reach the extender (ignorable: false): the pods wait, unbound.
    wait_until("2 mistral-7b pods created", lambda: len(cluster.pods(MODEL_NS, "app=mistral-7b")) == 2, timeout=60)
    time.sleep(3)
    assert not any(p["spec"].get("nodeName") for p in cluster.pods(MODEL_NS, "app=mistral-7b"))
    extender.start()
    cluster.wait_ready("extender")
    wait_until("mistral-7b bound after the extender came back", lambda: bound(cluster, "app=mistral-7b", 2),
               timeout=120)
    assert_no_core_held_twice(cluster)

    # The apiserver goes away under every watch (webhook, extender, scheduler, controllers) and comes back.
    scheduler = cluster.components["kube-scheduler"]
    cluster.restart_apiserver()
    # An outage longer than renewDeadline (10 s) makes kube-scheduler exit ("Leaderelection lost"); the kubelet
    # would restart the container, so do what it would.
    time.sleep(2)
    if not scheduler.alive():
        print("kube-scheduler exited during the apiserver restart:", scheduler.tail(1))
        assert "Leaderelection lost" in scheduler.tail(5)
        scheduler.start()
    cluster.kubectl("-n", MODEL_NS, "scale", "deployment", "mistral-7b", "--replicas=3")
    wait_until("the third mistral-7b pod bound after the apiserver restart",
               lambda: bound(cluster, "app=mistral-7b", 3), timeout=120)
    print(cluster.kubectl("-n", MODEL_NS, "get", "pods", "-o", "wide").stdout)
    assert_no_core_held_twice(cluster)


def test_mutating_webhook_down_then_back(cluster: Cluster, deployments: list[str]) -> None:
    webhook = cluster.components["webhook"]
    webhook.stop()
    down_at = time.monotonic()
    deployments.append("phi-3")
    applied = cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(model_deployment("phi-3", MODEL_NS, 1)))
    print("kubectl apply while the webhook is down:", applied.stdout.strip(), applied.stderr.strip())

    def failed_create() -> list[dict[str, Any]]:
        return [e for e in cluster.kubectl_json("-n", MODEL_NS, "get", "events")["items"]
                if e["reason"] == "FailedCreate" and e["involvedObject"]["name"].startswith("phi-3-")]

    events = wait_until("FailedCreate on the phi-3 ReplicaSet", failed_create, timeout=60)
    print("FailedCreate:", events[0]["message"])
    assert "pods.validate.model-placement.io" in events[0]["message"]  # the gate failed closed
    time.sleep(max(0.0, 30 - (time.monotonic() - down_at)))  # down for 30 s, as an outage would be
    describe = cluster.kubectl("-n", MODEL_NS, "describe", "replicaset", "-l", "app=phi-3").stdout
    # What the operator reads on the ReplicaSet; and no pod slipped past the closed gate.
    assert "FailedCreate" in describe and "pods.validate.model-placement.io" in describe, describe
    assert not cluster.pods(MODEL_NS, "app=phi-3")
    webhook.start()
    cluster.wait_ready("webhook")
    back_at = time.monotonic()
    pods = wait_until("the phi-3 pod created after the webhook came back",
                      lambda: cluster.pods(MODEL_NS, "app=phi-3"), timeout=1100, every=0.5)
    appeared = time.monotonic() - back_at
    print(f"webhook down {back_at - down_at:.1f}s; the ReplicaSet's pod appeared {appeared:.1f}s after it was ready")
    assert pods[0]["metadata"]["annotations"].get(BALLOON) == "vllm-balloon-tp1"  # mutated, not let through bare
    wait_until("phi-3 bound", lambda: bound(cluster, "app=phi-3", 1), timeout=60)
