"""The real-format payloads in tests/fixtures/, read by name, and taints for the demo fleet."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def fixture_json(name: str) -> Any:
    return json.loads((FIXTURES / name).read_text())


def fixture_text(name: str) -> str:
    return (FIXTURES / name).read_text()


# A demo fleet kube-scheduler's own filters narrow: a node tainted NoSchedule, one NoExecute, one cordoned (with the
# taint the node lifecycle controller adds), one PreferNoSchedule (which only scores); cpu-icx has no AMX.
TAINTS = {
    "cpu-a1": [{"key": "dedicated", "value": "inference", "effect": "NoSchedule"}],
    "cpu-a2": [{"key": "maintenance", "effect": "NoExecute", "timeAdded": "2026-12-01T00:00:00Z"}],
    "cpu-b1": [{"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule",
                "timeAdded": "2026-12-01T00:00:00Z"}],
    "cpu-snc4": [{"key": "spot", "value": "true", "effect": "PreferNoSchedule"}],
}
# Tolerations a pod may carry against TAINTS: right, wrong value, wrong effect, everything.
TOLERATIONS = [
    [{"key": "dedicated", "operator": "Equal", "value": "inference", "effect": "NoSchedule"}],
    [{"key": "dedicated", "operator": "Equal", "value": "batch"}],
    [{"key": "maintenance", "operator": "Exists", "effect": "NoSchedule"}],
    [{"key": "maintenance", "operator": "Exists"}, {"key": "node.kubernetes.io/unschedulable", "operator": "Exists"}],
    [{"operator": "Exists"}],
]


def tainted(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = json.loads(json.dumps(objects))
    for obj in out:
        if obj.get("kind") == "Node" and obj["metadata"]["name"] in TAINTS:
            spec = obj.setdefault("spec", {})
            spec["taints"] = TAINTS[obj["metadata"]["name"]]
            if obj["metadata"]["name"] == "cpu-b1":
                spec["unschedulable"] = True
    return out
