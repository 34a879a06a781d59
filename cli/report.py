"""`report`: the ledger as a person reads it, in fixed-width columns that fit 120 characters, a bar of each NUMA
node's model cores, and a legend."""

from __future__ import annotations

import math
import sys
import textwrap
from collections.abc import Sequence
from typing import Any

from placement import kubelet as kub
from placement.cluster import ClusterState
from placement.ledger import NodeLedger
from placement.reasons import fmt_bytes
from server.inputs import plural

WIDTH = 120
# (title, width, right-aligned); the last column takes what is left of WIDTH.
COLUMNS = (("NUMA", 6, True), ("CPUS", 22, False), ("RESERVED", 14, False), ("CORES", 5, True),
           ("FREE", 5, True), ("MEM", 6, True))
POD_TITLE = "MODEL PODS (balloon, cores held here)"
# Each NUMA node's model cores also as a bar, so that where there is room reads at a glance down a fleet.
HELD, SHARED, FREE = "█", "▒", "·"
BAR_CELLS = 64  # the widest bar (it fits WIDTH with its counts); bigger NUMA nodes draw a cell for every few cores
LEGEND = ("CORES: physical cores of the NUMA node that no reserved CPU touches (what model pods can hold). "
          "FREE: of those, not held by model pods nor lent to the shared pool. MEM: free memory a model rank could "
          f"still pin there. The bar under each NUMA node draws its CORES: {HELD} held, {SHARED} in the shared pool, "
          f"{FREE} free. "
          "assumed: bound by the extender, not yet seen running. observed: where the NRI plugin "
          "reports it; '!' marks a pod it spread or put on shared cores. placement unknown: no recorded placement "
          "(bound by another scheduler or before the install) nor exported balloon: counted on every NUMA node it "
          "could use.")


def report(state: ClusterState) -> list[dict[str, Any]]:
    return [ledger.to_json() for ledger in state.ledgers()]


def _cells(text: str, width: int) -> list[str]:
    """A cell's text as lines of at most `width`, broken after commas or semicolons."""
    if len(text) <= width:
        return [text]
    lines: list[str] = []
    line = ""
    for part in text.replace("; ", ";\0").replace(",", ",\0").split("\0"):
        if line and len(line) + len(part) > width:
            lines.append(line.rstrip())
            line = ""
        line += part
    return [*lines, line] if line else lines


def row(values: list[str]) -> list[str]:
    widths = [w for _, w, _ in COLUMNS]
    rest = WIDTH - sum(widths) - len(widths)
    cells = [_cells(v, w) for v, w in zip(values, [*widths, rest])]
    out = []
    for i in range(max(len(c) for c in cells)):
        parts = []
        for (_, w, right), c in zip([*COLUMNS, ("", rest, False)], cells):
            text = c[i] if i < len(c) else ""
            parts.append(text.rjust(w) if right else text.ljust(w))
        out.append(" ".join(parts).rstrip())
    return out


def bar(held: int, shared: int, free: int) -> str:
    """Cores held, in the shared pool and free as one cell a core, or, past BAR_CELLS, one cell for every
    `per` cores, each part drawn in proportion and none that has a core drawn empty; then the counts."""
    counts = (held, shared, free)
    per = max(1, math.ceil(sum(counts) / BAR_CELLS))
    cells = _apportion(counts, math.ceil(sum(counts) / per), per)
    scale = f"; a cell is {per} cores" if per > 1 else ""
    drawn = "".join(mark * n for mark, n in zip((HELD, SHARED, FREE), cells))
    return f"{drawn}  {held} held, {shared} shared, {free} free{scale}"


def _apportion(counts: Sequence[int], cells: int, per: int) -> list[int]:
    """`cells` shared out in proportion to `counts` (largest remainder), at least one to each count above 0."""
    out = [max(c // per, 1 if c else 0) for c in counts]
    while sum(out) < cells:
        out[max(range(len(counts)), key=lambda i: counts[i] / per - out[i])] += 1
    while sum(out) > cells:
        out[max((i for i in range(len(counts)) if out[i] > 1), key=lambda i: out[i] - counts[i] / per)] -= 1
    return out


def describe_node(ledger: NodeLedger) -> str:
    topo = ledger.topology
    cores = len(topo.numa_nodes[0].cores) if topo.numa_nodes else 0
    if ledger.kubelet is not None and ledger.kstate is not None:
        free = kub.free_per_numa(ledger.kubelet, ledger.kstate)
        return (f"{ledger.name}: {plural(topo.numa_count, 'NUMA node')} × {plural(cores, 'core')} × "
                f"{plural(ledger.threads_per_core, 'thread')} (topology from {topo.source}); {ledger.agent()}, CPU "
                f"Manager options {', '.join(sorted(ledger.kubelet.config.cpu_options)) or 'none'}, Memory Manager "
                f"{ledger.kubelet.config.memory_policy}; reserved {ledger.reserved}; free CPUs "
                + ", ".join(f"NUMA {i}: {f}" for i, f in enumerate(free)))
    nri = ledger.nri
    policy = f"BalloonsPolicy {nri.policy.namespace}/{nri.policy.name}" if nri.policy else "no BalloonsPolicy"
    status = "" if nri.running else f", NRI {nri.status or 'absent'}"
    lent = f", {plural(ledger.elastic_cores, 'model core')} lent to it" if ledger.elastic_cores else ""
    return (f"{ledger.name}: {plural(topo.numa_count, 'NUMA node')} × {plural(cores, 'core')} × "
            f"{plural(ledger.threads_per_core, 'thread')} (topology from {topo.source}); reserved {ledger.reserved} "
            f"from {ledger.reserved_source}; {policy}{status}; shared pool: {ledger.shared_milli / 1000:g} of "
            f"{plural(ledger.shared_pool_cpus, 'CPU')} requested{lent}")


def print_table(state: ClusterState, out: Any = sys.stdout) -> None:
    print(*row([t for t, _, _ in COLUMNS] + [POD_TITLE]), sep="\n", file=out)
    print("-" * WIDTH, file=out)
    free_total = cores_total = 0
    for ledger in state.ledgers():
        print(textwrap.fill(describe_node(ledger), WIDTH, subsequent_indent="    ", break_on_hyphens=False),
              file=out)
        free = ledger.free()
        memory = ledger.free_memory()
        for numa in ledger.topology.numa_nodes:
            held = sum(c for h in ledger.holdings.values() for n, c in h.per_numa if n == numa.id)
            shared = max(0, ledger.capacity[numa.id] - held - free[numa.id])
            pods = [f"{'!' if h.note else ''}{h.pod.split('/', 1)[-1]} ({h.balloon_type or 'kubelet-static'}, {c}"
                    f"{', assumed' if h.assumed else ''}{', observed' if h.observed else ''}"
                    f"{', placement unknown' if h.unknown else ''}"
                    f"{': ' + h.note if h.note else ''})"
                    for h in ledger.holdings.values() for n, c in h.per_numa if n == numa.id]
            values = [str(numa.id), str(numa.cpus), str(ledger.reserved & numa.cpus) or "-",
                      str(ledger.capacity[numa.id]), str(free[numa.id]),
                      fmt_bytes(memory[numa.id]) if memory else "-", "; ".join(pods) or "-"]
            print(*row(values), sep="\n", file=out)
            print(" " * (COLUMNS[0][1] + 1) + bar(held, shared, free[numa.id]), file=out)
        free_total += sum(free)
        cores_total += sum(ledger.capacity)
    print(file=out)
    print(f"{plural(len(state.nodes), 'node')}, {free_total:,} of {plural(cores_total, 'model core')} free",
          file=out)
    print(textwrap.fill(LEGEND, WIDTH), file=out)
    for note in state.notes:
        print(textwrap.fill(f"note: {note}", WIDTH, subsequent_indent="    ", break_on_hyphens=False), file=out)
