"""Shared fixtures: the demo fleet and real-format payloads from tests/fixtures/."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from placement.cluster import ClusterState
from placement.config import Settings
from server.cli import demo_text, load_objects

FIXTURES = Path(__file__).parent / "fixtures"


def fixture_json(name: str) -> Any:
    return json.loads((FIXTURES / name).read_text())


def fixture_text(name: str) -> str:
    return (FIXTURES / name).read_text()


@pytest.fixture
def settings() -> Settings:
    return Settings()


@pytest.fixture
def demo_objects() -> list[dict[str, Any]]:
    return load_objects(demo_text())


@pytest.fixture
def demo(demo_objects: list[dict[str, Any]], settings: Settings) -> ClusterState:
    return ClusterState.from_objects(demo_objects, settings)
