"""Where a command or a server gets its cluster from: the live API, a `--cluster` file, or the bundled demo fleet."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable
from importlib import resources
from typing import Any

from placement.cluster import ClusterState
from placement.config import Settings
from server.inputs import api_client, flatten, list_cluster, load_cluster_file, parse_documents

# The notices keep the component they have always been logged under: they are about the command line's flags.
log = logging.getLogger("model_placement.cli")
# What a ClusterState reports (an assumed pod bound elsewhere, a node read as one NUMA node, ...).
cluster_log = logging.getLogger("model_placement.cluster")

DEMO_NOTICE = ("using the bundled demo fleet (9 invented nodes, not your cluster): give --cluster FILE or "
               "--kubeconfig FILE to judge against a real one")


def demo_text() -> str:
    return resources.files("placement").joinpath("demo/cluster.yaml").read_text()


def load_objects(text: str, source: str = "input") -> list[dict[str, Any]]:
    """A `kubectl get … -o yaml|json` List, a JSON List, or multi-document YAML, flattened to objects."""
    return flatten(parse_documents(text.encode(), source), source)


def snapshot_objects(args: argparse.Namespace, say: Callable[[str], None]) -> list[dict[str, Any]]:
    """The objects of `--cluster FILE` (each malformed one named and skipped), else the demo fleet's."""
    if not args.cluster:
        say(DEMO_NOTICE)
        return load_objects(demo_text(), "the demo fleet")
    loaded = load_cluster_file(args.cluster, args.strict)
    for sentence in loaded.skipped:
        say(sentence)
    if loaded.skipped or loaded.ignored:
        say(loaded.summary() + ("" if not loaded.skipped else " (--strict makes a malformed object an error)"))
    return loaded.objects


def snapshot_state(args: argparse.Namespace, settings: Settings) -> ClusterState:
    """The servers' state when not connected to a cluster (notices go to the JSON log)."""
    return ClusterState.from_objects(snapshot_objects(args, log.warning), settings, cluster_log)


def load_cluster(args: argparse.Namespace, settings: Settings, say: Callable[[str], None]) -> ClusterState:
    if args.kubeconfig or args.in_cluster:
        state = ClusterState(settings, log=cluster_log)
        list_cluster(state, api_client(args.kubeconfig, args.in_cluster))
        return state
    return ClusterState.from_objects(snapshot_objects(args, say), settings, cluster_log)
