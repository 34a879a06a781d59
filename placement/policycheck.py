"""A BalloonsPolicy judged before the apiserver stores it: what the NRI balloons plugin would refuse, and what
it would accept although it breaks NUMA-local pinning or the cores of running models.

The plugin judges a policy only once it is stored, on each node, and a refusal there is a log line on that node
while the node keeps its previous policy (or runs none). Its own checks (validateConfig and fillBuiltinBalloonDefs of
nri-plugins v0.14.0's balloons policy) are repeated here so that `kubectl apply` says so at once; on top of them,
the hazards it accepts in silence, each shown on the real plugin by tests/oracle/test_policy_refusals.py:
- a `reservedResources` cpuset the node lacks CPUs of (the plugin refuses it, but only on that node);
- a model type whose ranks outnumber the node's NUMA nodes, or a component preferring a NUMA node the node lacks:
  the preference is dropped and ranks share a NUMA node;
- pre-created balloons (`minBalloons` × `minCPUs`) that do not fit outside the reserved cpuset: the plugin gives
  them the reserved CPUs (its reserved balloon holds none of its cpuset unless told to);
- reserved `minBalloons`/`maxBalloons` other than 1: forced to 1 (fillBuiltinBalloonDefs runs before the check
  that would refuse them), so the setting does nothing;
- a reserved cpuset that takes cores running model balloons hold now: the plugin re-places every container when
  its policy changes.

Every finding is one sentence with the node(s) and the numbers; nodes alike are named together.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from placement.balloonspolicy import (
    DEFAULT_TYPE,
    GROUP_LABEL,
    RESERVED_TYPE,
    BalloonsPolicy,
    parse_balloons_policy,
    policy_for_node,
)
from placement.cluster import ClusterState
from placement.kubeletnode import selected as kubelet_selected
from placement.ledger import NodeLedger
from placement.quantity import QuantityError, cpu_milli
from placement.topology import CPUSet, CPUSetError, Topology, reserved_from_spec

# Check ids: bounded metric labels.
UNREADABLE = "policy-unreadable"
PLUGIN_REFUSES = "policy-plugin-refuses"
RESERVED_NOT_ON_NODE = "policy-reserved-cpus-missing"
SPAN_EXCEEDS_NUMA = "policy-span-exceeds-numa"
NUMA_DEVICE_MISSING = "policy-numa-device-missing"
COMPONENT_MISSING = "policy-component-missing"
MIN_BALLOONS_DO_NOT_FIT = "policy-min-balloons-do-not-fit"
RESERVES_HELD_CORES = "policy-reserves-held-cores"
IGNORED_SETTING = "policy-setting-ignored"
APPLIES_TO_NO_NODE = "policy-applies-to-no-node"
SPAN_BELOW_TP = "policy-span-below-tp"
NUMA_UNKNOWN = "policy-numa-unknown"
LENDS_RESERVED = "policy-lends-reserved-cpus"

# Forbidden on a composite type (validateConfig), whose CPUs come from its components: the pointer options when set
# at all, even to false; the others when set to something.
COMPOSITE_FORBIDDEN_SET = ("preferSpreadOnPhysicalCores", "allocatorTopologyBalancing")
COMPOSITE_FORBIDDEN_TRUE = ("preferCloseToDevices", "preferIsolCpus", "preferCoreType")
NAMED_NODES = 5  # nodes named in one finding; the rest are counted


@dataclass(frozen=True, slots=True)
class Finding:
    check: str
    message: str  # one sentence, no final period


@dataclass(frozen=True, slots=True)
class PolicyCheck:
    refusals: tuple[Finding, ...]
    warnings: tuple[Finding, ...]
    nodes: tuple[str, ...]  # the nodes the policy applies to


def check_policy(obj: Mapping[str, Any], cluster: ClusterState) -> PolicyCheck:
    """Judge a BalloonsPolicy about to be stored (CREATE or UPDATE) against the nodes it would apply to."""
    problem = _shape_problem(obj)
    if problem:
        return PolicyCheck((Finding(UNREADABLE, problem),), (), ())
    spec: Mapping[str, Any] = obj.get("spec") or {}
    raw_types: list[Mapping[str, Any]] = list(spec.get("balloonTypes") or ())
    refusals = list(_plugin_refusals(spec, raw_types))
    warnings = list(_ignored_settings(raw_types))
    policy = parse_balloons_policy(obj)
    warnings.extend(_lent_reserved(policy))
    model_types = [t.name for t in policy.balloon_types if t.name.startswith(cluster.settings.nri_balloon_prefix)]
    warnings.extend(_narrow_types(policy, model_types, cluster.settings.nri_balloon_prefix))
    names = _applies_to(policy, cluster)
    if not names:
        why = _why_no_node(policy.name) if policy.namespace == cluster.settings.nri_config_namespace else (
            f"the NRI balloons plugin reads BalloonsPolicies from namespace {cluster.settings.nri_config_namespace} "
            f"(setting nri_config_namespace), not {policy.namespace}")
        warnings.append(Finding(APPLIES_TO_NO_NODE, f"it applies to no node now: {why}"))
        return PolicyCheck(tuple(refusals), tuple(warnings), ())
    ledgers = [ledger for ledger in map(cluster.ledger, names) if ledger is not None and len(ledger.topology.cpus)]
    node_refusals, node_warnings = _node_findings(policy, ledgers, model_types)
    return PolicyCheck(tuple(refusals + node_refusals), tuple(warnings + node_warnings), tuple(names))


# -- reading -------------------------------------------------------------------------------------------------

def _shape_problem(obj: Mapping[str, Any]) -> str | None:
    """The fields the checks read, as the plugin's decoder needs them; the CRD's schema types the rest."""
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        return "spec is missing or not an object"
    types = spec.get("balloonTypes")
    if types is not None and not isinstance(types, list):
        return "spec.balloonTypes is not a list"
    for i, item in enumerate(types or ()):
        if not isinstance(item, Mapping):
            return f"spec.balloonTypes[{i}] is not an object"
        components = item.get("components")
        if components is not None and not (isinstance(components, list)
                                           and all(isinstance(c, Mapping) for c in components)):
            return f"spec.balloonTypes[{i}].components is not a list of objects"
        for key in ("minCPUs", "maxCPUs", "minBalloons", "maxBalloons"):
            if key in item and not (isinstance(item[key], int) and not isinstance(item[key], bool)):
                return f"spec.balloonTypes[{i}].{key} is {item[key]!r}, not an integer"
    reserved = spec.get("reservedResources")
    if reserved is not None and not isinstance(reserved, Mapping):
        return "spec.reservedResources is not an object"
    return None


def _name(item: Mapping[str, Any]) -> str:
    return str(item.get("name") or "")


def _components(item: Mapping[str, Any]) -> list[str]:
    return [str(c.get("balloonType") or "") for c in item.get("components") or ()]


# -- what the plugin itself refuses on every node ------------------------------------------------------------

def _plugin_refusals(spec: Mapping[str, Any], raw_types: Sequence[Mapping[str, Any]]) -> Iterator[Finding]:
    seen: set[str] = set()
    for i, item in enumerate(raw_types):
        name = _name(item)
        if not name:
            yield Finding(PLUGIN_REFUSES, f"balloonTypes[{i}] has no name")
            continue
        if name in seen:
            yield Finding(PLUGIN_REFUSES, f"two balloon types are named {name!r}")
        seen.add(name)
        yield from _limits(name, item)
        if item.get("components"):
            yield from _composite_options(name, item)
        elif item.get("componentCreation"):
            yield Finding(PLUGIN_REFUSES, f"type {name!r} sets componentCreation "
                                          f"{item['componentCreation']!r} but has no components")
    # The plugin's own `reserved` and `default` exist whether listed or not, and may be components.
    defined = seen | {RESERVED_TYPE, DEFAULT_TYPE}
    for item in raw_types:
        for index, component in enumerate(_components(item), start=1):
            if not component:
                yield Finding(PLUGIN_REFUSES, f"component {index} of type {_name(item)!r} names no balloonType")
            elif component not in defined:
                yield Finding(COMPONENT_MISSING, f"type {_name(item)!r} is made of {component!r}, "
                                                 f"which no balloonType defines")
    cycle = _cycle(raw_types)
    if cycle:
        yield Finding(PLUGIN_REFUSES, f"types {' -> '.join(repr(n) for n in cycle)} are made of each other")
    yield from _reserved_quantity(spec, raw_types)


def _limits(name: str, item: Mapping[str, Any]) -> Iterator[Finding]:
    for low, high, what in (("minCPUs", "maxCPUs", "CPUs"), ("minBalloons", "maxBalloons", "balloons")):
        lo, hi = int(item.get(low) or 0), int(item.get(high) or 0)
        if name == RESERVED_TYPE and what == "balloons":
            continue  # forced to 1 and 1 before the plugin compares them: _ignored_settings says so
        if hi and lo > hi:
            yield Finding(PLUGIN_REFUSES, f"type {name!r} has {low} {lo} above {high} {hi}")


def _composite_options(name: str, item: Mapping[str, Any]) -> Iterator[Finding]:
    if item.get("cpuClass"):
        yield Finding(PLUGIN_REFUSES, f"composite type {name!r} sets cpuClass {item['cpuClass']!r}, "
                                      f"which only its components may")
    present = [key for key in COMPOSITE_FORBIDDEN_SET if item.get(key) is not None] + \
        [key for key in COMPOSITE_FORBIDDEN_TRUE if item.get(key)]
    if present:
        yield Finding(PLUGIN_REFUSES, f"composite type {name!r} sets {', '.join(present)}, CPU allocation "
                                      f"options that only its components may set")


def _cycle(raw_types: Sequence[Mapping[str, Any]]) -> list[str]:
    graph = {_name(t): _components(t) for t in raw_types if t.get("components")}

    def walk(name: str, path: list[str]) -> list[str]:
        if name in path:
            return [*path[path.index(name):], name]
        for component in graph.get(name, ()):
            found = walk(component, [*path, name])
            if found:
                return found
        return []

    for start in graph:
        found = walk(start, [])
        if found:
            return found
    return []


def _reserved_cpu(spec: Mapping[str, Any]) -> str | None:
    value = (spec.get("reservedResources") or {}).get("cpu")
    return None if value is None else str(value).strip()


def _reserved_quantity(spec: Mapping[str, Any], raw_types: Sequence[Mapping[str, Any]]) -> Iterator[Finding]:
    """reservedResources.cpu readable at all, and, as a CPU count, agreeing with an explicit `reserved` type."""
    text = _reserved_cpu(spec)
    if text is None:
        return
    if text.startswith(("cpuset:", "exclude-cpuset:")):
        try:
            CPUSet.parse(text.partition(":")[2])
        except CPUSetError as exc:
            yield Finding(PLUGIN_REFUSES, f"reservedResources.cpu: {exc}")
        return
    try:
        count = math.ceil(cpu_milli(text) / 1000)
    except QuantityError as exc:
        yield Finding(PLUGIN_REFUSES, f"reservedResources.cpu: {exc}")
        return
    reserved = next((t for t in raw_types if _name(t) == RESERVED_TYPE), {})
    min_cpus, max_cpus = int(reserved.get("minCPUs") or 0), int(reserved.get("maxCPUs") or 0)
    if min_cpus and min_cpus != count:
        yield Finding(PLUGIN_REFUSES, f"reservedResources.cpu {text} means {count} reserved CPUs but the "
                                      f"reserved type's minCPUs is {min_cpus}")
    elif not min_cpus and max_cpus and max_cpus < count:
        yield Finding(PLUGIN_REFUSES, f"reservedResources.cpu {text} means {count} reserved CPUs but the "
                                      f"reserved type's maxCPUs is {max_cpus}")


def _lent_reserved(policy: BalloonsPolicy) -> Iterator[Finding]:
    text = policy.reserved_cpu or ""
    try:
        cpus = CPUSet.parse(text.partition(":")[2]) if text.startswith("cpuset:") else None
    except CPUSetError:
        return  # _reserved_quantity says so
    if cpus is not None and policy.lends_reserved(len(cpus)):
        yield Finding(LENDS_RESERVED, f"the reserved type sets neither minCPUs nor maxCPUs, so the plugin keeps none "
                                      f"of reservedResources {text} for kube-system and lends those CPUs to other "
                                      "balloons, which may then take them on another NUMA node than their own; the "
                                      f"extender refuses model pods that would need them: set the reserved type's "
                                      f"minCPUs to {len(cpus)}")


def _ignored_settings(raw_types: Sequence[Mapping[str, Any]]) -> Iterator[Finding]:
    for item in raw_types:
        if _name(item) != RESERVED_TYPE:
            continue
        for key in ("minBalloons", "maxBalloons"):
            value = int(item.get(key) or 0)
            if value not in (0, 1):
                yield Finding(IGNORED_SETTING, f"the reserved type's {key} {value} has no effect: the plugin "
                                               f"always runs exactly one reserved balloon")


# -- where it applies, and what it would do there -----------------------------------------------------------

def _applies_to(policy: BalloonsPolicy, cluster: ClusterState) -> list[str]:
    # The policy stored under the same namespace and name is the one this replaces; the plugin reads only its own
    # namespace, so a policy elsewhere applies to no node.
    if policy.namespace != cluster.settings.nri_config_namespace:
        return []
    others = [p for p in cluster.node_policies() if p.name != policy.name]
    candidates = [*others, policy]
    # Nodes a kubelet node group names run no balloons plugin.
    return [name for name in sorted(cluster.nodes) if not kubelet_selected(cluster.settings, cluster.nodes[name].labels)
            and policy_for_node(candidates, name, cluster.nodes[name].labels) is policy]


def _why_no_node(name: str) -> str:
    kind, _, rest = name.partition(".")
    if name == "default":
        return "every node known takes a node.<node> or group.<group> policy first"
    if kind == "node" and rest:
        return f"no node named {rest!r} is known"
    if kind == "group" and rest:
        return f"no node known has the label {GROUP_LABEL}={rest} (or each takes its own node.<node> policy)"
    return f"the plugin reads only `default`, `node.<node>` and `group.<group>` policies, not {name!r}"


def _span(policy: BalloonsPolicy, name: str) -> int:
    """NUMA nodes one balloon of the type takes: a plain type 1, a composite the sum of its components' (one of
    them, the widest, under balance-balloons). The plugin refuses cycles and missing types; both count 1 here."""

    def span(name: str, path: frozenset[str]) -> int:
        btype = policy.balloon_type(name)
        if btype is None or not btype.composite or name in path:
            return 1
        spans = [span(c, path | {name}) for c in btype.components]
        return max(spans) if btype.component_creation == "balance-balloons" else sum(spans)

    return span(name, frozenset())


def _narrow_types(policy: BalloonsPolicy, model_types: Sequence[str], prefix: str) -> Iterator[Finding]:
    """`<prefix>N` is what our webhook gives a TP=N pod: spanning fewer than N NUMA nodes, ranks share one."""
    for name in model_types:
        tail = name[len(prefix):]
        span = _span(policy, name)
        if tail.isdigit() and span < int(tail):
            yield Finding(SPAN_BELOW_TP, f"model type {name!r} spans {span} NUMA node{'s' if span > 1 else ''}, so "
                                         f"the {tail} ranks of a pod given it would share; make it a composite of "
                                         f"{tail} per-NUMA types, as `model-placement balloons-policy` writes it")


def _reachable(policy: BalloonsPolicy, name: str) -> list[str]:
    """The type and every type it is made of, recursively, each once."""
    out: list[str] = []
    todo = [name]
    while todo:
        current = todo.pop(0)
        if current in out:
            continue
        out.append(current)
        btype = policy.balloon_type(current)
        todo.extend(btype.components if btype is not None else ())
    return out


def nodes_text(names: Sequence[str]) -> str:
    shown = ", ".join(names[:NAMED_NODES])
    more = f" and {len(names) - NAMED_NODES:,} more" if len(names) > NAMED_NODES else ""
    return f"node{'s' if len(names) > 1 else ''} {shown}{more}"


def _grouped(found: Iterable[tuple[str, tuple[Any, ...], str]],
             render: Callable[[str, tuple[Any, ...], str, bool], str]) -> list[Finding]:
    """(check, key, node) triples -> one finding per (check, key), naming all of its nodes."""
    groups: dict[tuple[str, tuple[Any, ...]], list[str]] = {}
    for check, key, node in found:
        groups.setdefault((check, key), []).append(node)
    return [Finding(check, render(check, key, nodes_text(nodes), len(nodes) > 1))
            for (check, key), nodes in groups.items()]


def _node_findings(policy: BalloonsPolicy, ledgers: Sequence[NodeLedger],
                   model_types: Sequence[str]) -> tuple[list[Finding], list[Finding]]:
    refusals: list[tuple[str, tuple[Any, ...], str]] = []
    warnings: list[tuple[str, tuple[Any, ...], str]] = []
    spans = {name: _span(policy, name) for name in model_types}
    preferred = {(model, part): btype.close_numa for model in model_types for part in _reachable(policy, model)
                 if (btype := policy.balloon_type(part)) is not None and btype.close_numa is not None}
    named = _named_cpus(policy)
    wanted = _pre_created(policy)
    # A fleet has a handful of shapes, and a shape decides everything but the holdings: judged once per shape.
    by_shape: dict[tuple[Any, ...], list[NodeLedger]] = {}
    for ledger in ledgers:
        by_shape.setdefault((*ledger.topology.shape(), ledger.topology.source), []).append(ledger)
    for group in by_shape.values():
        topo = group[0].topology
        cpus = topo.cpus
        reserved = _reserved_on(policy, topo)
        found: list[tuple[str, tuple[Any, ...]]] = []
        if named is not None and named - cpus:
            found.append((RESERVED_NOT_ON_NODE, (str(named - cpus),)))
        if topo.source != "single-numa":
            numa = topo.numa_count
            found.extend((SPAN_EXCEEDS_NUMA, (name, span, numa)) for name, span in spans.items() if span > numa)
            found.extend((NUMA_DEVICE_MISSING, (model, part, device, numa))
                         for (model, part), device in preferred.items() if device >= numa)
        outside = len(cpus - reserved) if reserved is not None else len(cpus)
        if sum(n * c for _, n, c in wanted) > outside:
            found.append((MIN_BALLOONS_DO_NOT_FIT, (wanted, outside, reserved is not None)))
        refusals.extend((check, key, ledger.name) for check, key in found for ledger in group)
        if topo.source == "single-numa":
            warnings.extend((NUMA_UNKNOWN, (), ledger.name) for ledger in group)
        if reserved is None:
            continue
        capacity = [(numa.id, sum(1 for core in numa.cores if not any(t in reserved for t in core.threads)),
                     str(reserved & numa.cpus)) for numa in topo.numa_nodes]
        warnings.extend((RESERVES_HELD_CORES, key, ledger.name) for ledger in group
                        if ledger.holdings and reserved != ledger.reserved
                        for key in _held_conflicts(ledger, capacity))
    return _grouped(refusals, _render), _folded(_grouped(warnings, _render))


def _folded(warnings: list[Finding]) -> list[Finding]:
    """The held-cores warnings name pods, so each is one node's: past a few, the rest are counted."""
    held = [w for w in warnings if w.check == RESERVES_HELD_CORES]
    if len(held) <= NAMED_NODES:
        return warnings
    rest = len(held) - NAMED_NODES
    summary = Finding(RESERVES_HELD_CORES, f"likewise on {rest:,} more node{'s' if rest > 1 else ''}")
    return [w for w in warnings if w.check != RESERVES_HELD_CORES] + held[:NAMED_NODES] + [summary]


def _pre_created(policy: BalloonsPolicy) -> tuple[tuple[str, int, int], ...]:
    """(type, minBalloons, minCPUs) of the balloons the plugin creates with CPUs before any container arrives. The
    reserved one counts when reservedResources.cpu is a CPU count (it becomes its minCPUs); a reserved cpuset is
    where the others must not go."""
    wanted = [(t.name, t.min_balloons, t.min_cpus) for t in policy.balloon_types
              if t.name != RESERVED_TYPE and t.min_balloons > 0 and t.min_cpus > 0]
    text = policy.reserved_cpu
    if text and not text.startswith(("cpuset:", "exclude-cpuset:")):
        with contextlib.suppress(QuantityError):  # refused already, as the plugin refuses it
            wanted.insert(0, (RESERVED_TYPE, 1, math.ceil(cpu_milli(text) / 1000)))
    return tuple(wanted)


def _named_cpus(policy: BalloonsPolicy) -> CPUSet | None:
    """The CPUs a `cpuset:` reservedResources.cpu names; None for the other forms and for one that cannot be read
    (refused already, as the plugin refuses it)."""
    text = policy.reserved_cpu
    if not text or not text.startswith("cpuset:"):
        return None
    try:
        return CPUSet.parse(text[len("cpuset:"):])
    except CPUSetError:
        return None


def _reserved_on(policy: BalloonsPolicy, topo: Topology) -> CPUSet | None:
    """The cpuset the policy reserves on a node of this topology; None when it names only a CPU count (the plugin
    then reserves no particular CPUs) or nothing readable."""
    text = policy.reserved_cpu
    if not text or not text.startswith(("cpuset:", "exclude-cpuset:")):
        return None
    try:
        return reserved_from_spec(topo, text)
    except CPUSetError:
        return None


def _held_conflicts(ledger: NodeLedger, capacity: Sequence[tuple[int, int, str]]) -> Iterator[tuple[Any, ...]]:
    """Per NUMA node (id, model cores under the new reserved cpuset, its reserved CPUs there): fewer model cores
    left than running models hold there now."""
    for numa, cores, cpus in capacity:
        holders = [(h.pod, held) for h in ledger.holdings.values() for n, held in h.per_numa if n == numa and held]
        held = sum(c for _, c in holders)
        if held > cores:
            yield numa, cpus, cores, held, tuple(sorted(pod for pod, _ in holders))


def _render(check: str, key: tuple[Any, ...], nodes: str, plural: bool) -> str:
    have = "have" if plural else "has"
    if check == RESERVED_NOT_ON_NODE:
        (missing,) = key
        return f"reservedResources.cpu names CPUs {missing}, which {nodes} {'lack' if plural else 'lacks'}"
    if check == SPAN_EXCEEDS_NUMA:
        name, span, numa = key
        return (f"model type {name!r} spans {span} NUMA nodes but {nodes} {have} {numa}: its ranks would share "
                f"NUMA nodes")
    if check == NUMA_DEVICE_MISSING:
        model, part, device, numa = key
        via = "" if model == part else f" (a component of model type {model!r})"
        return (f"type {part!r}{via} prefers /sys/devices/system/node/node{device} but {nodes} {have} NUMA nodes "
                f"0-{numa - 1} only: the plugin drops the preference")
    if check == MIN_BALLOONS_DO_NOT_FIT:
        wanted, outside, has_reserved = key
        parts = ", ".join(f"{name!r} {n} × {c}" for name, n, c in wanted)
        where = "outside the reserved cpuset" if has_reserved else "in all"
        return (f"minBalloons × minCPUs ({parts}) is {sum(n * c for _, n, c in wanted)} CPUs but {nodes} {have} "
                f"{outside} {where}")
    if check == RESERVES_HELD_CORES:
        numa, cpus, capacity, held, pods = key
        return (f"on {nodes} the new reserved CPUs {cpus or 'none'} of NUMA node {numa} leave {capacity} model "
                f"cores where running models hold {held} ({', '.join(pods)}): the plugin re-places them when "
                f"the policy changes")
    if check == NUMA_UNKNOWN:
        return (f"the NUMA layout of {nodes} is unknown (no NodeResourceTopology, no NUMA-count label): the model "
                f"types' NUMA span is not checked there")
    raise ValueError(f"no text for check {check!r}")
