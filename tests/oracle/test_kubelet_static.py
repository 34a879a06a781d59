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

from placement.topology import CPUSet
from tests.oracle.kubeletscenarios import NODE, Tally, kubelet_json, machine_json, make_scenario, play

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


def play_batch(batch: int) -> Tally:
    total = Tally()
    for seed in range(batch, SCENARIOS, BATCHES):
        scenario = make_scenario(seed)
        with KubeletPeer.start(machine_json(scenario), kubelet_json(scenario)) as peer:
            node = play(peer, scenario)
            _merge(total, node.tally)
            live = node.cluster.ledger(NODE)
            assert live is not None and live.kstate is not None
            # Rebuilt from the list with the placements the Bindings wrote (a relist, a restart, a standby): the same
            # CPUs held, with the node's NodeResourceTopology and without.
            for with_nrt in (False, True):
                again = node.rebuilt(with_nrt=with_nrt).ledger(NODE)
                assert again is not None and again.kstate is not None
                if again.kstate.default != live.kstate.default:
                    total.problems.append(f"{scenario.label}: rebuilt (NRT {with_nrt}) holds "
                                          f"{CPUSet.of(range(live.kstate.default.bit_length())) and again.free()} "
                                          f"where the live ledger holds {live.free()}")
            # Without them but with the NodeResourceTopology: whatever it admits next, the kubelet admits.
            blind = node.rebuilt(annotated=False, with_nrt=True)
            for i in range(4):
                from tests.oracle.kubeletscenarios import model_pod
                verdict, answer = node.judge(f"after{i}", model_pod(f"after{i}", 1, 2 + 4 * i), cluster=blind)
                if verdict.ok and answer.admit:
                    peer.remove(f"uid-after{i}")
    return total


@pytest.mark.parametrize("batch", range(BATCHES))
def test_kubelet_static_streams_never_admit_what_the_kubelet_rejects(batch: int) -> None:
    tally = play_batch(batch)
    assert not tally.problems, "\n".join(tally.problems[:20])
    assert tally.admitted_ok > 0
    admitted_by_kubelet = tally.admitted_ok + tally.refused_needless
    assert tally.refused_needless <= 0.05 * admitted_by_kubelet, \
        f"{tally.refused_needless} needless refusals of {admitted_by_kubelet} pods the kubelet admits"
