"""The BalloonsPolicy as the NRI balloons plugin reads it: balloon types, the routing of containers to them, and
which policy applies to a node (`node.<name>` > `group.<label>` > `default`). Immutable values and pure functions.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from fnmatch import fnmatchcase
from typing import Any

NUMA_DEVICE = re.compile(r"^/sys/devices/system/node/node(\d+)/?$")
RESERVED_TYPE = "reserved"
DEFAULT_TYPE = "default"
COMPONENT_BALANCE = "balance-balloons"


@dataclass(frozen=True, slots=True)
class BalloonType:
    """One entry of `spec.balloonTypes`, as much of it as decides where the plugin puts CPUs."""

    name: str
    hide_hyperthreads: bool = False
    min_cpus: int = 0
    max_cpus: int = 0  # 0: no limit (the plugin's NoLimit)
    min_balloons: int = 0
    max_balloons: int = 0  # 0: unlimited
    namespaces: tuple[str, ...] = ()
    components: tuple[str, ...] = ()  # a composite type: one balloon of each (or one, balance-balloons)
    component_creation: str = ""  # "" / "all" | "balance-balloons"
    close_numa: int | None = None  # preferCloseToDevices names /sys/devices/system/node/nodeN
    prefer_new_balloons: bool = False
    spread_on_physical_cores: bool | None = None  # None: the policy's setting
    match_expressions: bool = False  # routes by expressions we do not evaluate

    @property
    def composite(self) -> bool:
        return bool(self.components)


# Hashed by identity: a policy is parsed once per object version, and per-policy answers are memoised on it.
@dataclass(frozen=True, slots=True, eq=False)
class BalloonsPolicy:
    name: str
    namespace: str
    reserved_cpu: str | None
    balloon_types: tuple[BalloonType, ...]
    node_status: Mapping[str, str] = field(default_factory=dict)  # node -> "Success" | "Failure"
    reserved_pool_namespaces: tuple[str, ...] = ("kube-system",)
    spread_on_physical_cores: bool = False
    topology_balancing: bool = False
    pin_memory: bool = True
    _by_name: Mapping[str, BalloonType] = field(init=False, repr=False, compare=False)
    _routing: tuple[BalloonType, ...] = field(init=False, repr=False, compare=False)
    _numa_preferring: bool = field(init=False, repr=False, compare=False)
    _shared: frozenset[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_name", {t.name: t for t in self.balloon_types})
        # The plugin's own list: `reserved` prepended and `default` appended when not named, reserved always
        # catching kube-system and reservedPoolNamespaces (fillBuiltinBalloonDefs), first match wins.
        routing = list(self.balloon_types)
        if RESERVED_TYPE not in self._by_name:
            routing.insert(0, BalloonType(RESERVED_TYPE, min_balloons=1, max_balloons=1))
        if DEFAULT_TYPE not in self._by_name:
            routing.append(BalloonType(DEFAULT_TYPE, min_balloons=1, max_balloons=1))
        routing = [replace(t, namespaces=(*t.namespaces, "kube-system", *self.reserved_pool_namespaces))
                   if t.name == RESERVED_TYPE else t for t in routing]
        object.__setattr__(self, "_routing", tuple(routing))
        object.__setattr__(self, "_numa_preferring", any(t.close_numa is not None for t in self.balloon_types))
        object.__setattr__(self, "_shared", frozenset(
            (RESERVED_TYPE, DEFAULT_TYPE, *(t.name for t in self.balloon_types if t.namespaces))))

    def balloon_type(self, name: str) -> BalloonType | None:
        return self._by_name.get(name)

    def known_type(self, name: str) -> BalloonType:
        """The type `name`, which the caller knows the policy defines (KeyError if it does not)."""
        return self._by_name[name]

    def route(self, namespace: str) -> BalloonType:
        """The type a container without a balloon annotation lands in: the first whose namespaces match
        (glob, as filepath.Match), else `default` (chooseBalloonDef). matchExpressions are not evaluated:
        a type routed by them alone is not predicted."""
        for btype in self._routing:
            if any(fnmatchcase(namespace, pattern) for pattern in btype.namespaces):
                return btype
        return self.route_type(DEFAULT_TYPE)

    def route_type(self, name: str) -> BalloonType:
        """A type of the plugin's own list (the built-in reserved and default included); `default` for a name
        it lacks."""
        for btype in self._routing:
            if btype.name == name:
                return btype
        return self.route_type(DEFAULT_TYPE)

    @property
    def shared_types(self) -> frozenset[str]:
        """The types pods land in by namespace (reserved, default and those naming namespaces): one balloon each,
        sized to all its containers' requests, whose growth beyond the reserved cpuset takes model cores. Every
        other type is dedicated: its balloons are held by the containers annotated to it."""
        return self._shared

    def spreads(self, btype: BalloonType) -> bool:
        return self.spread_on_physical_cores if btype.spread_on_physical_cores is None \
            else btype.spread_on_physical_cores

    def lends_reserved(self, reserved_cpus: int) -> bool:
        """The plugin lends the node's reserved cpuset to every other balloon: with reservedResources a cpuset and
        a reserved type that sets neither minCPUs nor maxCPUs, the reserved balloon's MinCpus resolves to 0
        (fillBuiltinBalloonDefs takes MaxCpus, 0, as soon as the cpuset is not smaller than it). The reserved
        balloon then starts empty and the reserved CPUs are free CPUs that other balloons take last (they prefer
        to be far from them). tests/oracle/test_plugin_facts.py holds this to the plugin."""
        btype = self.route_type(RESERVED_TYPE)
        return bool(reserved_cpus) and (self.reserved_cpu or "").startswith("cpuset:") \
            and not btype.min_cpus and not btype.max_cpus

    @property
    def reserves_a_count(self) -> bool:
        """reservedResources.cpu is a quantity: the reserved balloon is sized, not placed (a cpuset pins it)."""
        return self.reserved_cpu is not None and not self.reserved_cpu.startswith(("cpuset:", "exclude-cpuset:"))

    @property
    def numa_preferring(self) -> bool:
        """Some type prefers a NUMA node, so every other type is pushed away from it (fillFarFromDevices)."""
        return self._numa_preferring


def _int(value: Any, default: int = 0) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def _close_numa(devices: object) -> int | None:
    for dev in devices if isinstance(devices, list) else ():
        match = NUMA_DEVICE.match(str(dev))
        if match:
            return int(match.group(1))
    return None


def _opt_bool(value: object) -> bool | None:
    return None if value is None else bool(value)


def parse_balloon_type(item: Mapping[str, Any]) -> BalloonType:
    components = tuple(str(c.get("balloonType", "")) for c in item.get("components") or () if isinstance(c, Mapping))
    return BalloonType(
        name=str(item["name"]),
        hide_hyperthreads=bool(item.get("hideHyperthreads", False)),
        min_cpus=_int(item.get("minCPUs")),
        max_cpus=_int(item.get("maxCPUs")),
        min_balloons=_int(item.get("minBalloons")),
        max_balloons=_int(item.get("maxBalloons")),
        namespaces=tuple(str(n) for n in item.get("namespaces") or () if isinstance(n, str)),
        components=components,
        component_creation=str(item.get("componentCreation") or ""),
        close_numa=_close_numa(item.get("preferCloseToDevices")),
        prefer_new_balloons=bool(item.get("preferNewBalloons", False)),
        spread_on_physical_cores=_opt_bool(item.get("preferSpreadOnPhysicalCores")),
        match_expressions=bool(item.get("matchExpressions")),
    )


def parse_balloons_policy(obj: Mapping[str, Any]) -> BalloonsPolicy:
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    types = [parse_balloon_type(item) for item in spec.get("balloonTypes") or ()
             if isinstance(item, Mapping) and item.get("name")]
    status: dict[str, str] = {}
    for node, entry in ((obj.get("status") or {}).get("nodes") or {}).items():
        if isinstance(entry, Mapping) and entry.get("status"):
            status[str(node)] = str(entry["status"])
    reserved = (spec.get("reservedResources") or {}).get("cpu")
    pool = spec.get("reservedPoolNamespaces")
    return BalloonsPolicy(
        name=str(meta.get("name", "")),
        namespace=str(meta.get("namespace", "")),
        reserved_cpu=None if reserved is None else str(reserved),
        balloon_types=tuple(types),
        node_status=status,
        # Absent, the plugin defaults it to kube-system (setOmittedDefaults); present, it is taken as given.
        reserved_pool_namespaces=("kube-system",) if pool is None else tuple(str(n) for n in pool or ()),
        spread_on_physical_cores=bool(spec.get("preferSpreadOnPhysicalCores", False)),
        topology_balancing=bool(spec.get("allocatorTopologyBalancing", False)),
        pin_memory=bool(spec.get("pinMemory", True)),
    )


GROUP_LABEL = "config.nri/group"


def policy_for_node(
    policies: Iterable[BalloonsPolicy], node_name: str, labels: Mapping[str, str]
) -> BalloonsPolicy | None:
    """`node.<name>` > `group.<g>` (node label config.nri/group) > `default`. A node with the group
    label does not fall back to `default`."""
    by_name = {p.name: p for p in policies}
    if f"node.{node_name}" in by_name:
        return by_name[f"node.{node_name}"]
    group = labels.get(GROUP_LABEL)
    if group:
        return by_name.get(f"group.{group}")
    return by_name.get("default")
