"""kubelet-static held to the real kubelet: random machine shapes, kubelet settings and pod streams played on the
ledger and on the real CPU, Topology and Memory Managers (the `kube kubelet` peer), side by side.

Asserted over every scenario: no pod the ledger admits is rejected by the kubelet (any Reason), each admitted
container on the NUMA nodes the ledger predicted, ledgers rebuilt from a list agreeing with the live one, and
needless refusals (the kubelet would have admitted) under 5 % of the pods the kubelet admits.
"""

from __future__ import annotations

import os

import pytest
from tests.oracle.kubeletpeer import KubeletPeer

from placement.kubelet import free_per_numa
from placement.topology import CPUSet
from tests.oracle.kubeletscenarios import (
    NODE,
    KubeletNode,
    Tally,
    kubelet_json,
    machine_json,
    make_scenario,
    model_pod,
    play,
)

# 400 scenarios in CI; bench/bench_oracle.py plays more.
SCENARIOS = int(os.environ.get("KUBELET_ORACLE_SCENARIOS", "400"))
BATCHES = 8


def _merge(into: Tally, other: Tally) -> None:
    into.admitted_ok += other.admitted_ok
    for reason, n in other.admitted_rejected.items():
        into.admitted_rejected[reason] = into.admitted_rejected.get(reason, 0) + n
    into.refused_ok += other.refused_ok
    into.refused_needless += other.refused_needless
    into.drift += other.drift
    into.exact += other.exact
    into.problems.extend(other.problems)


def kub_reserved(node: KubeletNode) -> CPUSet:
    return node.ledger_reserved()


def play_batch(batch: int) -> Tally:
    total = Tally()
    for seed in range(batch, SCENARIOS, BATCHES):
        scenario = make_scenario(seed)
        with KubeletPeer() as peer:
            started = peer.start(machine_json(scenario), kubelet_json(scenario))
            assert started.ok, f"{scenario.label}: {started.error}"
            node = play(peer, scenario)
            if kub_reserved(node) != CPUSet(started.reserved):
                total.problems.append(f"{scenario.label}: the ledger reserves {kub_reserved(node)}, the kubelet "
                                      f"{CPUSet(started.reserved)}")
            _merge(total, node.tally)
            live = node.cluster.ledger(NODE)
            assert live is not None and live.kstate is not None
            # Rebuilt from the list (a relist, a restart, a standby) with the placements the Bindings wrote and the
            # node's NodeResourceTopology: the same free CPUs on every NUMA node as the live ledger.
            assert live.kubelet is not None
            again = node.rebuilt(with_nrt=True).ledger(NODE)
            assert again is not None and again.kstate is not None
            if free_per_numa(again.kubelet, again.kstate) != free_per_numa(live.kubelet, live.kstate):
                total.problems.append(f"{scenario.label}: rebuilt with the NRT has free CPUs "
                                      f"{free_per_numa(again.kubelet, again.kstate)} where the live ledger has "
                                      f"{free_per_numa(live.kubelet, live.kstate)}")
            # Every rebuilt ledger, with or without the placements and the NodeResourceTopology, judges what comes
            # next: whatever it admits, the kubelet admits.
            for annotated, with_nrt in ((True, False), (False, True), (False, False)):
                rebuilt = node.rebuilt(annotated=annotated, with_nrt=with_nrt)
                for i in range(3):
                    name = f"after{int(annotated)}{int(with_nrt)}{i}"
                    verdict, answer = node.judge(name, model_pod(name, 1, 2 + 6 * i), cluster=rebuilt)
                    if verdict.ok and answer.admit:
                        peer.remove(f"uid-{name}")
    return total


@pytest.mark.parametrize("batch", range(BATCHES))
def test_kubelet_static_streams_never_admit_what_the_kubelet_rejects(batch: int) -> None:
    tally = play_batch(batch)
    assert not tally.problems, "\n".join(tally.problems[:20])
    assert tally.admitted_ok > 0
    admitted_by_kubelet = tally.admitted_ok + tally.refused_needless
    assert tally.refused_needless <= 0.05 * admitted_by_kubelet, \
        f"{tally.refused_needless} needless refusals of {admitted_by_kubelet} pods the kubelet admits"
