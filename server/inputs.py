"""What an operator hands the command line: manifest and `--cluster` files, a kubeconfig.

Everything here turns bad input into an `InputError`, one sentence naming the file, the object and the field,
never a traceback. A `--cluster` file is checked object by object before it reaches `ClusterState`: the core
reads fields as the apiserver guarantees them (a Node's labels are a map of strings), which a hand-edited or
truncated dump does not; a malformed object is named and skipped (an error with `strict`).

Speed: a `kubectl get … -o json` dump of a large fleet is hundreds of megabytes, so JSON goes through orjson
and YAML through libyaml's C loader; the checks below look only at the fields the core reads.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import yaml

from placement.config import ConfigError, Settings, resolve_settings
from placement.quantity import QuantityError, cpu_milli
from placement.topology import CPUSet, CPUSetError

SAFE_LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
CLUSTER_KINDS = ("Node", "Pod", "BalloonsPolicy", "NodeResourceTopology")
DUMP_COMMAND = "kubectl get nodes,pods,balloonspolicies,noderesourcetopologies -A -o yaml"


class InputError(Exception):
    """Bad input: the message is one sentence naming the file, flag or field."""


def load_settings(path: str | Path | None = None, env: Mapping[str, str] | None = None) -> Settings:
    """The settings of the config file at `path` (none: the defaults) and of the environment (`env`: in place of
    the process's). A file that cannot be read or is not a YAML mapping is a ConfigError naming it."""
    loaded: Any = None
    if path:
        try:
            loaded = yaml.safe_load(Path(path).read_text()) or {}
        except OSError as exc:
            raise ConfigError(f"cannot read config file {path}: {exc.strerror or exc}") from None
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {path} is not valid YAML: {' '.join(str(exc).split())}") from None
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {path} must be a mapping of settings, got {type(loaded).__name__}")
    return resolve_settings(os.environ if env is None else env, loaded, str(path or ""))


def read_bytes(path: str, what: str = "file") -> tuple[bytes, str]:
    """The content of `path` (`-`: standard input) and the name to show for it."""
    if path == "-":
        return sys.stdin.buffer.read(), "standard input"
    try:
        return Path(path).read_bytes(), path
    except IsADirectoryError:
        raise InputError(f"{what} {path} is a directory, not a file") from None
    except OSError as exc:
        raise InputError(f"cannot read {what} {path}: {exc.strerror or exc}") from None


def parse_documents(data: bytes, source: str) -> list[Any]:
    """JSON (orjson) or YAML, possibly several documents (libyaml)."""
    text_start = data.lstrip()[:1]
    json_error: orjson.JSONDecodeError | None = None
    if text_start in (b"{", b"["):
        try:
            return [orjson.loads(data)]
        except orjson.JSONDecodeError as exc:
            json_error = exc  # flow-style YAML starts the same way: try it before blaming the JSON
    try:
        return [doc for doc in yaml.load_all(data, Loader=SAFE_LOADER) if doc is not None]
    except yaml.MarkedYAMLError as exc:
        if json_error is not None:
            raise InputError(f"{source} is not valid JSON: {json_error}") from None
        mark = exc.problem_mark or exc.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise InputError(f"{source} is not valid YAML{where}: {exc.problem or exc.context}") from None
    except yaml.YAMLError as exc:
        raise InputError(f"{source} is not valid YAML: {exc}") from None


def flatten(docs: Iterable[Any], source: str) -> list[dict[str, Any]]:
    """Documents -> objects: a `List` (or kubectl's typed `PodList`, …) contributes its items."""
    out: list[dict[str, Any]] = []
    for i, doc in enumerate(docs, 1):
        if not isinstance(doc, dict) or not isinstance(doc.get("kind"), str) or not doc["kind"]:
            what = "has no kind" if isinstance(doc, dict) else f"is a {_type(doc)}"
            raise InputError(f"{source}: document {i} is not a Kubernetes object (it {what})")
        kind = doc["kind"]
        if kind.endswith("List") and "items" in doc:
            items = doc["items"]
            if items is None:
                continue
            if not isinstance(items, list):
                raise InputError(f"{source}: {kind} items is a {_type(items)}, expected a list")
            default_kind = kind.removesuffix("List")
            for item in items:
                # kubectl's typed lists (PodList…) leave kind off the items.
                if isinstance(item, dict) and "kind" not in item and default_kind:
                    item["kind"] = default_kind
                out.append(item)
        else:
            out.append(doc)
    return out


def load_manifests(path: str) -> list[dict[str, Any]]:
    """The objects of a manifest file (`-`: standard input); an empty file is an error."""
    data, source = read_bytes(path)
    objects = flatten(parse_documents(data, source), source)
    if not objects:
        raise InputError(f"{source} is empty: expected a Pod, Deployment or StatefulSet manifest")
    return objects


# -- --cluster files --------------------------------------------------------------------------------

@dataclass
class ClusterFile:
    source: str
    objects: list[dict[str, Any]]  # the objects the core reads, every one checked
    skipped: list[str] = field(default_factory=list)  # one sentence per malformed object
    ignored: dict[str, int] = field(default_factory=dict)  # other kinds, by kind

    def summary(self) -> str:
        counts = {k: 0 for k in CLUSTER_KINDS}
        for obj in self.objects:
            counts[obj["kind"]] += 1
        parts = [plural(counts[k], k) for k in CLUSTER_KINDS if counts[k]]
        text = f"{self.source}: {', '.join(parts)}"
        if self.skipped:
            text += f"; {plural(len(self.skipped), 'malformed object')} skipped"
        if self.ignored:
            text += "; ignored " + ", ".join(plural(n, k) for k, n in sorted(self.ignored.items()))
        return text


def load_cluster_file(path: str, strict: bool = False) -> ClusterFile:
    data, source = read_bytes(path, "--cluster file")
    objects = flatten(parse_documents(data, source), source)
    if not objects:
        raise InputError(f"{source} is empty: expected what `{DUMP_COMMAND}` prints")
    result = ClusterFile(source, [])
    for obj in objects:
        kind = obj.get("kind") if isinstance(obj, dict) else None
        check = CHECKS.get(kind) if isinstance(kind, str) else None
        if check is None:
            label = kind if isinstance(kind, str) and kind else "object without a kind"
            result.ignored[label] = result.ignored.get(label, 0) + 1
            continue
        problem = _check_meta(obj) or check(obj)
        if problem is None:
            result.objects.append(obj)
            continue
        sentence = f"{source}: {kind} {_name(obj)}: {problem}"
        if strict:
            raise InputError(sentence)
        result.skipped.append(sentence + "; skipped")
    if not any(o["kind"] == "Node" for o in result.objects):
        found = ", ".join(plural(n, k) for k, n in sorted(result.ignored.items())) or "no usable Node"
        raise InputError(f"{source} holds no usable Node object ({found}): expected what `{DUMP_COMMAND}` prints")
    return result


def _name(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata")
    if not isinstance(meta, dict) or not isinstance(meta.get("name"), str) or not meta["name"]:
        return "(no name)"
    ns = meta.get("namespace")
    return f"{ns}/{meta['name']}" if isinstance(ns, str) and ns else meta["name"]


def _type(value: Any) -> str:
    return {dict: "mapping", list: "list", str: "string", bool: "boolean", int: "number", float: "number",
            type(None): "null"}.get(type(value), type(value).__name__)


def _expect_map(obj: Mapping[str, Any], key: str, where: str) -> str | None:
    value = obj.get(key)
    if value is None or isinstance(value, dict):
        return None
    return f"{where}{key} is a {_type(value)}, expected a mapping"


def _string_map(value: Any, where: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        return f"{where} is a {_type(value)}, expected a mapping of strings"
    for k, v in value.items():
        if type(v) is not str:
            return f"{where}[{k!r}] is a {_type(v)}, expected a string"
    return None


def _check_meta(obj: dict[str, Any]) -> str | None:
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        return f"metadata is a {_type(meta)}, expected a mapping"
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        return "metadata.name is missing" if name is None else f"metadata.name is a {_type(name)}, expected a string"
    return (_string_map(meta.get("labels"), "metadata.labels")
            or _string_map(meta.get("annotations"), "metadata.annotations")
            or _expect_map(obj, "spec", "") or _expect_map(obj, "status", ""))


def _check_node(obj: dict[str, Any]) -> str | None:
    status = obj.get("status") or {}
    for key in ("capacity", "allocatable"):
        problem = _expect_map(status, key, "status.")
        if problem:
            return problem
        cpu = (status.get(key) or {}).get("cpu")
        if cpu is not None:
            try:
                cpu_milli(cpu)
            except QuantityError as exc:
                return f"status.{key}.cpu: {exc}"
    return None


def _check_containers(spec: dict[str, Any], key: str) -> str | None:
    containers = spec.get(key)
    if containers is None:
        return None
    if not isinstance(containers, list):
        return f"spec.{key} is a {_type(containers)}, expected a list"
    for i, c in enumerate(containers):
        if not isinstance(c, dict):
            return f"spec.{key}[{i}] is a {_type(c)}, expected a mapping"
        resources = c.get("resources")
        if resources is None:
            continue
        if not isinstance(resources, dict):
            return f"spec.{key}[{i}].resources is a {_type(resources)}, expected a mapping"
        for part in ("requests", "limits"):
            values = resources.get(part)
            if values is None:
                continue
            if not isinstance(values, dict):
                return f"spec.{key}[{i}].resources.{part} is a {_type(values)}, expected a mapping"
            cpu = values.get("cpu")
            if cpu is not None:
                try:
                    cpu_milli(cpu)
                except QuantityError as exc:
                    return f"spec.{key}[{i}].resources.{part}.cpu: {exc}"
    return None


def _check_pod(obj: dict[str, Any]) -> str | None:
    uid = obj["metadata"].get("uid")
    if not isinstance(uid, str) or not uid:
        return "metadata.uid is missing (kubectl prints it; a pod without one cannot be tracked)"
    spec = obj.get("spec") or {}
    node = spec.get("nodeName")
    if node is not None and not isinstance(node, str):
        return f"spec.nodeName is a {_type(node)}, expected a string"
    phase = (obj.get("status") or {}).get("phase")
    if phase is not None and not isinstance(phase, str):
        return f"status.phase is a {_type(phase)}, expected a string"
    return _check_containers(spec, "containers") or _check_containers(spec, "initContainers")


def _check_policy(obj: dict[str, Any]) -> str | None:
    spec = obj.get("spec") or {}
    types = spec.get("balloonTypes")
    if types is not None and not isinstance(types, list):
        return f"spec.balloonTypes is a {_type(types)}, expected a list"
    problem = _expect_map(spec, "reservedResources", "spec.")
    if problem:
        return problem
    for i, item in enumerate(types or ()):
        if not isinstance(item, dict):
            return f"spec.balloonTypes[{i}] is a {_type(item)}, expected a mapping"
        for key in ("minCPUs", "maxCPUs", "maxBalloons"):
            value = item.get(key)
            if value is not None and type(value) is not int:
                return f"spec.balloonTypes[{i}].{key} is {value!r}, expected a whole number"
    reserved = (spec.get("reservedResources") or {}).get("cpu")
    if reserved is not None:
        prefix, sep, cpuset = str(reserved).partition(":")
        try:
            if sep and prefix in ("cpuset", "exclude-cpuset"):
                CPUSet.parse(cpuset)
            else:
                cpu_milli(reserved)
        except (CPUSetError, QuantityError) as exc:
            return f"spec.reservedResources.cpu {reserved!r}: {exc}"
    return _expect_map(obj.get("status") or {}, "nodes", "status.")


def _check_nrt(obj: dict[str, Any]) -> str | None:
    zones = obj.get("zones")
    if zones is not None and not isinstance(zones, list):
        return f"zones is a {_type(zones)}, expected a list"
    for i, zone in enumerate(zones or ()):
        if not isinstance(zone, dict):
            return f"zones[{i}] is a {_type(zone)}, expected a mapping"
    return None


CHECKS: dict[str, Callable[[dict[str, Any]], str | None]] = {
    "Node": _check_node, "Pod": _check_pod, "BalloonsPolicy": _check_policy, "NodeResourceTopology": _check_nrt,
}


def plural(n: int, noun: str) -> str:
    if n == 1:
        return f"1 {noun}"
    if noun.endswith("y") and not noun.endswith(("ay", "ey", "oy")):
        noun = noun[:-1] + "ie"
    elif noun.endswith(("s", "x", "ch", "sh")):
        noun += "e"
    return f"{n:,} {noun}s"


# -- a live cluster ----------------------------------------------------------------------------------

def api_client(kubeconfig: str | None, in_cluster: bool) -> Any:
    """A Kubernetes API client; a missing or malformed kubeconfig is an `InputError` naming it."""
    from kubernetes.config.config_exception import ConfigException

    from server.kubeapi import make_api_client

    where = "the pod's service account (--in-cluster)" if in_cluster else f"kubeconfig {kubeconfig or '~/.kube/config'}"
    if kubeconfig:
        data, source = read_bytes(kubeconfig, "--kubeconfig file")
        docs = parse_documents(data, f"kubeconfig {source}")
        if len(docs) != 1 or not isinstance(docs[0], dict) or docs[0].get("kind", "Config") != "Config":
            raise InputError(f"kubeconfig {source} is not a kubeconfig (expected one mapping of kind Config, "
                             "with clusters, users and contexts)")
    try:
        return make_api_client(kubeconfig, in_cluster)
    except (ConfigException, yaml.YAMLError, LookupError, TypeError, ValueError, AttributeError, OSError) as exc:
        raise InputError(f"{where} cannot be used: {_one_line(exc)}") from None


def list_cluster(state: Any, client: Any) -> dict[str, int]:
    """Every kind listed once into `state`; an apiserver that cannot be reached or refuses is an
    `InputError` naming its address."""
    import urllib3

    from server.kubeapi import KubeApiError
    from server.kubesource import list_once

    host = client.configuration.host
    try:
        return list_once(state, client)
    except urllib3.exceptions.MaxRetryError as exc:
        raise InputError(f"cannot reach the apiserver at {host}: {_one_line(exc.reason or exc)}") from None
    except (urllib3.exceptions.HTTPError, KubeApiError, OSError) as exc:
        raise InputError(f"cannot list the cluster from the apiserver at {host}: {_one_line(exc)}") from None


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    # urllib3 prefixes the connection object's repr: "<…HTTPSConnection object at 0x…>: Failed to …"
    return text.split(">: ", 1)[-1]
