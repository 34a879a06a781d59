"""What an operator sees: /metrics counters move on a refusal, a fallback and a filter; every refusal
and every filtered-out node is explainable from one JSON log line carrying pod, reason and numbers."""

from __future__ import annotations

import copy
import io
import json
import logging
import re
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from placement.cluster import ClusterState
from server.app import Runtime
from server.logs import JSONFormatter
from tests.support.payloads import fixture_json
from tests.support.servers import serving


def samples(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name:
                out[tuple(sorted(s.labels.items()))] = s.value
    return out


def total(text: str, name: str, **labels: str) -> float:
    return sum(v for k, v in samples(text, name).items() if all((key, val) in k for key, val in labels.items()))


def review(pod: dict[str, Any], uid: str) -> dict[str, Any]:
    body = fixture_json("admissionreview-v1-pod-create.json")
    body["request"]["uid"] = uid
    body["request"]["object"] = pod
    return body


def kserve_pod(cpu: str = "8", tp: str = "1", annotations: dict[str, str] | None = None) -> dict[str, Any]:
    pod = copy.deepcopy(fixture_json("admissionreview-v1-pod-create.json")["request"]["object"])
    pod["spec"]["containers"][0]["args"][-1] = tp
    pod["spec"]["containers"][0]["resources"] = {"requests": {"cpu": cpu, "memory": "8Gi"},
                                                 "limits": {"cpu": cpu, "memory": "8Gi"}}
    pod["metadata"]["annotations"] = annotations or {}
    return pod


@pytest.fixture
def log_lines() -> Any:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JSONFormatter())
    root = logging.getLogger()
    root.addHandler(handler)
    old = root.level
    root.setLevel(logging.INFO)
    yield lambda: [json.loads(line) for line in stream.getvalue().splitlines() if line.strip()]
    root.removeHandler(handler)
    root.setLevel(old)


async def test_metrics_move_after_a_refusal_a_fallback_and_a_filter(demo: ClusterState, tmp_path: Path,
                                                                    log_lines: Any) -> None:
    runtime = Runtime(demo.settings, demo)
    async with serving(runtime, "serve", tmp_path) as srv, aiohttp.ClientSession() as session:
        kw = srv.request_kwargs()

        async def scrape() -> str:
            async with session.get(f"{srv.url}/metrics", **kw) as resp:
                assert resp.status == 200
                return await resp.text()

        before = await scrape()
        # A refusal: TP=8 where the largest node has 4 NUMA nodes.
        async with session.post(f"{srv.url}/validate", json=review(kserve_pod(tp="8"), "u-refuse"), **kw) as resp:
            refused = (await resp.json())["response"]
        assert refused["allowed"] is False
        # A fallback: a balloon type no BalloonsPolicy defines.
        fallback_pod = kserve_pod(annotations={"model-manager.io/nri-balloon": "vllm-balloon-custom"})
        async with session.post(f"{srv.url}/mutate", json=review(fallback_pod, "u-fallback"), **kw) as resp:
            assert (await resp.json())["response"]["allowed"] is True
        # A filter over the whole demo fleet with a pod only some nodes can hold.
        args = fixture_json("extender-args-nodecache.json")
        args["Pod"]["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "20", "memory": "8Gi"}}
        args["NodeNames"] = sorted(demo.nodes)
        async with session.post(f"{srv.url}/filter", json=args, **kw) as resp:
            result = await resp.json()
        assert result["NodeNames"] and (result["FailedNodes"] or result["FailedAndUnresolvableNodes"])
        after = await scrape()

    name = "model_placement_admission_decisions_total"
    assert total(after, name, webhook="validate", reason="tp-exceeds-numa") == \
        total(before, name, webhook="validate", reason="tp-exceeds-numa") + 1
    assert total(after, name, webhook="mutate", reason="nri-resolution-failed") == \
        total(before, name, webhook="mutate", reason="nri-resolution-failed") + 1
    nodes = "model_placement_extender_filter_nodes_total"
    assert total(after, nodes, outcome="passed") - total(before, nodes, outcome="passed") == len(result["NodeNames"])
    failed = len(result["FailedNodes"]) + len(result["FailedAndUnresolvableNodes"])
    assert (total(after, nodes, outcome="failed") + total(after, nodes, outcome="unresolvable")
            - total(before, nodes, outcome="failed") - total(before, nodes, outcome="unresolvable")) == failed
    requests = "model_placement_http_requests_total"
    assert total(after, requests, route="/filter", outcome="200") >= 1
    assert samples(after, "model_placement_free_model_cores")  # ledger totals by NUMA-count class
    # The demo fleet's model pods carry the placement /bind recorded: none is of unknown placement.
    unknown = samples(after, "model_placement_pods_of_unknown_placement")
    assert unknown and set(unknown.values()) == {0}

    # Every refusal is explainable from one log line with pod, reason and numbers.
    lines = log_lines()
    refusals = [e for e in lines if e.get("verb") == "validate" and e.get("decision") == "denied"]
    assert refusals, lines
    for entry in refusals:
        assert entry.get("pod") and (entry.get("check") or entry.get("reason"))
        text = json.dumps(entry)
        assert re.search(r"TP=8", text) and re.search(r"\b4\b", text)
    filters = [e for e in lines if e.get("verb") == "filter"]
    assert filters and filters[-1]["nodes_in"] == len(demo.nodes)
    assert filters[-1]["nodes_out"] == len(result["NodeNames"])
    assert any(re.search(r"\d+/\d+ free cores|has \d+|needs \d+", r) for r in filters[-1]["first_reasons"])


def test_log_formatter_writes_one_json_object_per_line() -> None:
    record = logging.LogRecord("model_placement.extender", logging.INFO, __file__, 1, "filtered", None, None)
    record.verb, record.pod, record.duration_ms = "filter", "llm/x", 0.42
    line = JSONFormatter().format(record)
    entry = json.loads(line)
    assert "\n" not in line
    assert entry["component"] == "extender" and entry["verb"] == "filter" and entry["pod"] == "llm/x"
    assert entry["level"] == "info" and entry["time"].endswith("Z") and entry["duration_ms"] == 0.42

