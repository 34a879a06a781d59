"""The ledger against the real NRI balloons plugin, at scale: the differential scenarios of
tests/oracle/test_differential.py (random node shapes, policies and pod streams with deletes and one rebuild
each, played on the ledger and on the real plugin), as many as asked, and the table.

    python bench/bench_oracle.py [--scenarios 5000]
    python bench/bench_oracle.py --kubelet [--scenarios 5000]

With --kubelet, the kubelet-static scenarios of tests/oracle/test_kubelet_streams.py instead (random machines, kubelet
settings and pod streams on the ledger and on the real kubelet's CPU, Topology and Memory Managers), and their
table: admit/ok, admit/rejected by the kubelet's Reason, refuse/ok (the kubelet rejects it too), refuse/needless
(the kubelet admits it), drift (a container on other NUMA nodes than predicted), exact (every cpuset as predicted).

Prints, over all scenarios and per policy kind: admit/ok (the ledger admits, the plugin runs every rank with its
whole share on a NUMA node of its own, on cores nothing else uses), admit/bad (the ledger admits, the plugin fails,
spreads or shares it; a best-effort fallback or a non-model pod it fails where the ledger saw room), refuse/ok (a
needless refusal), refuse/bad (a refusal the plugin proves right), drift (both run it, on other NUMA nodes or core
counts), fallback (best-effort fallbacks the ledger admits / refuses needlessly), shared (non-model pods the plugin
runs / of them the ledger saw no room for), forgotten (a rebuilt ledger that holds a pod elsewhere). Exits 1 when
the ledger admitted anything bad, forgot a pod or drifted under the generated policy. `.ci/run` plays 628 of these
scenarios; 5,000 take about half an hour here.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

if __package__ in (None, ""):  # `python bench/bench_oracle.py` from a checkout
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.oracle.kubeletscenarios import Tally as KubeletTally
from tests.oracle.kubeletscenarios import play_scenario
from tests.oracle.test_differential import GENERATED, STREAMS_PER_PEER, Tally, groups, report, run_group

COLUMNS = ("admit/ok", "admit/bad", "refuse/ok", "refuse/bad", "drift", "fallback", "shared", "forgotten")


def row(tally: Tally) -> tuple[int | str, ...]:
    t = tally.table
    return (t["admit/local"], len(tally.bad) + len(tally.other_failures), t["refuse/local"],
            t["refuse/spread or shared"] + t["refuse/fails"], len(tally.drift),
            f"{t['fallback admit/runs']}/{t['fallback refuse/runs']}", f"{t['shared/runs']}/{len(tally.misjudged)}",
            len(tally.forgotten))


def kubelet(scenarios: int) -> int:
    started = time.perf_counter()
    total = KubeletTally()
    with ThreadPoolExecutor(max_workers=3) as pool:  # peers are processes: threads only wait on them
        for tally in pool.map(play_scenario, range(scenarios)):
            total.merge(tally)
    seconds = time.perf_counter() - started
    rejected = ", ".join(f"{reason} {n}" for reason, n in sorted(total.admitted_rejected.items())) or "0"
    print(f"{'scenarios':>9} {'admit/ok':>9} {'admit/rejected':>16} {'refuse/ok':>9} {'refuse/needless':>15} "
          f"{'drift':>6} {'exact':>6}")
    print(f"{total.scenarios:9} {total.admitted_ok:9} {rejected:>16} {total.refused_ok:9} {total.refused_needless:15} "
          f"{total.drift:6} {total.exact:6}")
    admitted = total.admitted_ok + total.refused_needless
    print(f"\nneedless refusals: {total.refused_needless / max(1, admitted):.1%} of the {admitted} pods the kubelet "
          f"admits; {total.scenarios} scenarios in {seconds:.0f} s")
    for problem in total.problems[:20]:
        print(problem)
    return 1 if total.problems else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenarios", type=int, default=5000)
    parser.add_argument("--kubelet", action="store_true", help="the kubelet-static scenarios instead")
    args = parser.parse_args()
    if args.kubelet:
        return kubelet(args.scenarios)
    jobs = groups(max(1, args.scenarios // STREAMS_PER_PEER))
    started = time.perf_counter()
    total, by_policy = Tally(), defaultdict(Tally)
    with ThreadPoolExecutor(max_workers=3) as pool:  # peers are processes: threads only wait on them
        for (group, _), tally in zip(jobs, pool.map(lambda job: run_group(*job), jobs)):
            total.merge(tally)
            by_policy[group.policy + (" lacking" if group.lacking else "")].merge(tally)
    seconds = time.perf_counter() - started
    print(report(total, examples=20))
    print(f"\n{'policy':18} {'scenarios':>9} " + " ".join(f"{c:>10}" for c in COLUMNS))
    for name, tally in [*sorted(by_policy.items()), ("all", total)]:
        print(f"{name:18} {tally.scenarios:9} " + " ".join(f"{v:>10}" for v in row(tally)))
    print(f"\n{total.scenarios} scenarios in {seconds:.0f} s")
    generated_drift = sum(len(by_policy[p].drift) for p in GENERATED)
    return 1 if total.bad or total.other_failures or total.forgotten or generated_drift else 0


if __name__ == "__main__":
    sys.exit(main())
