"""A synthetic Linux sysfs tree for a Xeon-like node shape, as the balloons plugin and NFD's topology-updater
discover it.

Linux numbers a Xeon's CPUs primary threads first: package by package, NUMA node by NUMA node (sub-NUMA
clusters split a package), core by core; then the second threads in the same order, so with N cores
cpu i and cpu i+N are the two threads of one core. The balloons plugin reads CPU topology (package, die, core,
thread siblings), caches (L1/L2 per core, L3 per package), NUMA nodes (cpulist, distance, meminfo) and the
online/possible/present sets, and /proc/interrupts. NFD's topology-updater (ghw) walks each NUMA node's cpuN
links, caches, distance, meminfo and hugepages pools, the memory block size, and /sys/bus/node/devices;
this writes exactly those files, as the kernel lays them out.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from placement.topology import CPUSet


@dataclass(frozen=True)
class NodeShape:
    packages: int = 2
    numa_per_package: int = 1
    cores_per_numa: int = 16
    threads_per_core: int = 2
    memory_gib_per_numa: int = 64

    def __post_init__(self) -> None:
        if self.packages < 1 or self.numa_per_package < 1 or self.cores_per_numa < 1:
            raise ValueError(f"a node shape needs at least one package, NUMA node and core: {self}")
        if self.threads_per_core not in (1, 2):
            raise ValueError(f"threads_per_core is 1 (SMT off) or 2 (SMT on), not {self.threads_per_core}")

    @property
    def numa_nodes(self) -> int:
        return self.packages * self.numa_per_package

    @property
    def cores(self) -> int:
        return self.numa_nodes * self.cores_per_numa

    @property
    def cpus(self) -> int:
        return self.cores * self.threads_per_core

    def core_of(self, cpu: int) -> int:
        """The physical core (0..cores-1) a logical CPU belongs to."""
        return cpu % self.cores

    def numa_of(self, cpu: int) -> int:
        return self.core_of(cpu) // self.cores_per_numa

    def package_of(self, cpu: int) -> int:
        return self.numa_of(cpu) // self.numa_per_package

    def threads(self, core: int) -> list[int]:
        return [core + t * self.cores for t in range(self.threads_per_core)]

    def numa_cpus(self, numa: int) -> list[int]:
        first = numa * self.cores_per_numa
        return sorted(cpu for core in range(first, first + self.cores_per_numa) for cpu in self.threads(core))

    def package_cpus(self, package: int) -> list[int]:
        nodes = range(package * self.numa_per_package, (package + 1) * self.numa_per_package)
        return sorted(cpu for node in nodes for cpu in self.numa_cpus(node))

    def distance(self, a: int, b: int) -> int:
        if a == b:
            return 10
        return 12 if a // self.numa_per_package == b // self.numa_per_package else 21


def cpulist(cpus: Iterable[int]) -> str:
    """Linux's list format ("0-3,8-11")."""
    return str(CPUSet.of(cpus))


def sysfs_files(shape: NodeShape) -> tuple[dict[str, str], dict[str, str]]:
    """The files (path under the host root -> content) and symlinks (path -> target) of shape's sysfs."""
    files: dict[str, str] = {}
    links: dict[str, str] = {}
    cpu_dir, node_dir = "sys/devices/system/cpu", "sys/devices/system/node"
    everything = cpulist(range(shape.cpus))
    for name in ("possible", "present", "online"):
        files[f"{cpu_dir}/{name}"] = everything
    files[f"{cpu_dir}/isolated"] = files[f"{cpu_dir}/offline"] = ""
    files[f"{cpu_dir}/kernel_max"] = "8191"
    for cpu in range(shape.cpus):
        core, numa, package = shape.core_of(cpu), shape.numa_of(cpu), shape.package_of(cpu)
        here = f"{cpu_dir}/cpu{cpu}"
        siblings = cpulist(shape.threads(core))
        package_cpus = cpulist(shape.package_cpus(package))
        topology = {
            "physical_package_id": str(package), "die_id": "0", "cluster_id": str(core),
            "core_id": str(core - package * shape.numa_per_package * shape.cores_per_numa),
            "core_cpus_list": siblings, "thread_siblings_list": siblings,
            "core_siblings_list": package_cpus, "package_cpus_list": package_cpus, "die_cpus_list": package_cpus,
            "cluster_cpus_list": siblings,
        }
        for name, value in topology.items():
            files[f"{here}/topology/{name}"] = value
        files[f"{here}/online"] = "1"
        caches = [(1, "Data", "48K", siblings, core), (1, "Instruction", "32K", siblings, core),
                  (2, "Unified", "2048K", siblings, core), (3, "Unified", "107520K", package_cpus, package)]
        for index, (level, kind, size, shared, ident) in enumerate(caches):
            for name, value in {"level": str(level), "type": kind, "size": size, "shared_cpu_list": shared,
                                "id": str(ident)}.items():
                files[f"{here}/cache/index{index}/{name}"] = value
        links[f"{here}/node{numa}"] = f"../../node/node{numa}"
    nodes = cpulist(range(shape.numa_nodes))
    for name in ("possible", "online", "has_cpu", "has_memory", "has_normal_memory"):
        files[f"{node_dir}/{name}"] = nodes
    kib = shape.memory_gib_per_numa * 1024 * 1024
    files["sys/devices/system/memory/block_size_bytes"] = "8000000"  # hex: 128 MiB, x86-64's usual
    for numa in range(shape.numa_nodes):
        here = f"{node_dir}/node{numa}"
        links[f"sys/bus/node/devices/node{numa}"] = f"../../../devices/system/node/node{numa}"
        for cpu in shape.numa_cpus(numa):
            links[f"{here}/cpu{cpu}"] = f"../../cpu/cpu{cpu}"
        for pool in ("hugepages-2048kB", "hugepages-1048576kB"):  # none reserved
            for name in ("nr_hugepages", "free_hugepages", "surplus_hugepages"):
                files[f"{here}/hugepages/{pool}/{name}"] = "0"
        files[f"{here}/cpulist"] = cpulist(shape.numa_cpus(numa))
        files[f"{here}/distance"] = " ".join(str(shape.distance(numa, other)) for other in range(shape.numa_nodes))
        files[f"{here}/meminfo"] = (f"Node {numa} MemTotal:       {kib} kB\n"
                                    f"Node {numa} MemFree:        {kib * 9 // 10} kB\n"
                                    f"Node {numa} MemUsed:        {kib - kib * 9 // 10} kB")
    # The plugin reads the interrupts it may steer at start-up; a node without device interrupts has none.
    files["proc/interrupts"] = " ".join(f"CPU{cpu}" for cpu in range(shape.cpus))
    return files, links


def write_sysfs(root: Path, shape: NodeShape) -> Path:
    """Lay out root/sys (and root/proc/interrupts) for shape and return root (the plugin's --host-root)."""
    files, links = sysfs_files(shape)
    for directory in sorted({os.path.dirname(path) for path in [*files, *links]}):
        os.makedirs(root / directory, exist_ok=True)
    for path, text in files.items():
        with open(root / path, "w") as out:
            out.write(text + "\n")
    for path, target in links.items():
        os.symlink(target, root / path)
    return root
