"""/bind within kube-scheduler's budget: one deadline for the whole call, below the httpTimeout of the very
KubeSchedulerConfiguration the manifests ship (which the extender reads with --scheduler-config)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from extender.schedconfig import SchedulerConfigError, budget_from_file, go_duration, http_timeout
from placement.assume import AssumeCache
from tests.support.extender import Ext, MakeExt, model_pod
from tests.support.fakeapi import FakeApiServer
from tests.support.process import ServerProcess

ROOT = Path(__file__).resolve().parents[1]
SCHEDULER_CONFIG = ROOT / "manifests/base/config/kube-scheduler.yaml"


def test_the_budget_is_below_the_shipped_http_timeout() -> None:
    config = yaml.safe_load(SCHEDULER_CONFIG.read_text())
    timeout = http_timeout(config)
    assert timeout == go_duration(config["extenders"][0]["httpTimeout"])
    assert 0 < budget_from_file(SCHEDULER_CONFIG) < timeout


def test_go_durations_and_bad_configs() -> None:
    assert [go_duration(t) for t in ("5s", "1m30s", "1500ms", "1.5s", "0")] == [5, 90, 1.5, 1.5, 0]
    assert http_timeout({"kind": "KubeSchedulerConfiguration", "extenders": [{"bindVerb": "bind"}]}) == 5.0
    with pytest.raises(SchedulerConfigError, match="'5 seconds' is not a Go duration"):
        go_duration("5 seconds")
    with pytest.raises(SchedulerConfigError, match="no extender with a bindVerb"):
        http_timeout({"kind": "KubeSchedulerConfiguration", "extenders": [{"filterVerb": "filter"}]})


@pytest.fixture
async def slow(make_ext: MakeExt, demo_objects: list[dict[str, Any]], api: client.ApiClient,
               fake: FakeApiServer) -> Ext:
    original = fake._bind

    async def late(request: Any, namespace: str, name: str) -> Any:
        await asyncio.sleep(2.5)  # an apiserver under load: past the budget, within the scheduler's 5 s
        return await original(request, namespace, name)

    fake._bind = late  # type: ignore[method-assign]
    return await make_ext(demo_objects, api_client=api, call_budget=1.0)  # type: ignore[no-any-return]


async def test_a_slow_binding_is_answered_before_the_budget_runs_out(slow: Ext, fake: FakeApiServer) -> None:
    pod = fake.add("Pod", model_pod("slow-0", tp=2, cpus=16))
    started = time.monotonic()
    error = await slow.bind(pod, "cpu-a1")  # not seen at /filter: the pod is read first, within the same deadline
    took = time.monotonic() - started
    assert 1.0 <= took < 2.0, took  # the apiserver answers after 2.5 s; kube-scheduler gives up after 5
    assert "the binding for pod llm-inference/slow-0 on node cpu-a1 did not answer within the 1 s" in error
    # The apiserver may still bind it: its cores stay assumed until the watch shows it, or they expire.
    ledger = slow.cluster.ledger("cpu-a1")
    assert ledger is not None and ledger.holdings["uid-slow-0"].assumed
    assert [r.uid for r in AssumeCache(slow.cluster).expire(ttl=0)] == ["uid-slow-0"]
    assert "uid-slow-0" not in ledger.holdings


def test_the_extender_reads_its_budget_from_the_scheduler_config(tmp_path: Path) -> None:
    config = yaml.safe_load(SCHEDULER_CONFIG.read_text())
    config["extenders"][0]["httpTimeout"] = "2s"
    path = tmp_path / "kube-scheduler.yaml"
    path.write_text(yaml.safe_dump(config))
    proc = ServerProcess(["extender", "--insecure-http", "--host", "127.0.0.1", "--port", "0", "--drain-seconds", "0",
                          "--scheduler-config", str(path)])
    try:
        (line,) = proc.logged("extender calls answer within kube-scheduler's httpTimeout")
        assert line["duration_ms"] == 1500 and line["path"] == str(path)
    finally:
        proc.stop()
    broken = ServerProcess(["extender", "--insecure-http", "--port", "0", "--scheduler-config",
                            str(tmp_path / "missing.yaml")], wait=False)
    assert broken.wait() == 2
    # A start-up error is the CLI's one sentence, not a log line.
    assert [e["msg"].strip() for e in broken.lines if e.get("level") in ("error", "raw")] == [
        f"model-placement: cannot read the KubeSchedulerConfiguration {tmp_path / 'missing.yaml'}: "
        "No such file or directory"]
