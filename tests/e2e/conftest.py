"""One real control plane for the whole e2e session, with model-placement installed by the real helm from
charts/model-placement and the 1,000-node fleet of tests/e2e/fleet.py; our webhook and extender run from our image
(tests/image/build.py), as users deploy them. Component logs are printed (tails) under any failing test."""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.cluster import ROOT, Cluster, wait_until
from tests.e2e.fleet import MODEL_NS, PLACED_NS, fleet
from tests.image.build import image
from tests.peers.build import build

SESSION: dict[str, Any] = {}


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    started = time.monotonic()
    build("kube")  # a build error fails every e2e test; it is never a skip
    ours = image()
    SESSION["build_seconds"] = time.monotonic() - started
    started = time.monotonic()
    # Not pytest's tmp_path: its retention of three runs loses the logs when others run tests on this machine.
    c = Cluster(Path(tempfile.mkdtemp(prefix="model-placement-e2e-")))
    SESSION["cluster"] = c
    try:
        c.start()
        c.install()
        c.kubectl("apply", "-f", str(ROOT / "manifests" / "examples" / "balloonspolicy.yaml"))
        apply_snc4_policy(c)
        c.create_namespace(MODEL_NS, enabled=True)
        c.create_namespace(PLACED_NS, enabled=False)
        nodes, placed = fleet()
        c.create_nodes(nodes)
        c.create_pods(placed)
        c.start_model_placement("webhook", image=ours)
        c.start_model_placement("extender", image=ours)
        c.start_scheduler()
        wait_until("kube-scheduler to hold its leader Lease", lambda: c.api.call(
            "GET", "/apis/coordination.k8s.io/v1/namespaces/model-placement/leases/model-placement-scheduler",
            ok=(200, 404)).get("spec", {}).get("holderIdentity"), timeout=60)
        SESSION["setup_seconds"] = time.monotonic() - started
        yield c
    finally:
        c.stop()
        SESSION["session_seconds"] = time.monotonic() - started
        if not SESSION.get("failed"):
            shutil.rmtree(c.root, ignore_errors=True)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    c = SESSION.get("cluster")
    if report.failed and c is not None:
        SESSION["failed"] = True
        report.sections.append(("component logs (tails)", c.tails()))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if "setup_seconds" in SESSION:
        terminalreporter.write_line(f"e2e: control plane, install and 1,000-node fleet ready in "
                                    f"{SESSION['setup_seconds']:.1f}s; whole e2e session "
                                    f"{SESSION.get('session_seconds', 0):.1f}s; peer and image builds (or cache hits) "
                                    f"{SESSION['build_seconds']:.1f}s")
    if SESSION.get("failed"):
        terminalreporter.write_line(f"e2e: every component's whole log is kept in {SESSION['cluster'].logs}")


def apply_snc4_policy(c: Cluster) -> None:
    """The 4-NUMA nodes' own policy, as `balloons-policy` generates it for their shape (the example is for 2)."""
    import yaml

    from placement.balloons import node_balloons_policy
    from placement.config import Settings
    from placement.topology import linux_layout

    policy = node_balloons_policy("xeon4", linux_layout([16] * 4, 2, "labels"), Settings(), "kube-system")
    policy["metadata"]["name"] = "group.snc4"
    path = c.root / "group.snc4.yaml"
    path.write_text(yaml.safe_dump(policy))
    c.kubectl("apply", "-f", str(path))
