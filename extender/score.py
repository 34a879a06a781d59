"""/prioritize: a score 0..10 per candidate, from the fit's score under the configured strategy
(`scoring_strategy`, default MostAllocated: pack, so whole NUMA nodes stay free for large models)."""

from __future__ import annotations

from extender.filter import MIN_SCORE, Judge, PodRef


def prioritize(judge: Judge, ref: PodRef, names: list[str]) -> list[int]:
    """Scores aligned with `names`. A node where the pod does not fit, a node the ledger does not know,
    and every node for a non-model or unreadable pod score 0: the extender then has no preference."""
    return rank(judge, ref, names)[0]


def rank(judge: Judge, ref: PodRef, names: list[str]) -> tuple[list[int], str | None]:
    """`prioritize`, and the first node of the highest score where the pod fits (None: no such node)."""
    if ref.demand is None or ref.unreadable is not None:
        return [MIN_SCORE] * len(names), None
    # A verdict's score is clamped to 0..10 (MinExtenderPriority..MaxExtenderPriority); 0 where it does not fit.
    verdicts = judge.verdicts(ref, names)
    scores = [v.score if v is not None and v.ok else MIN_SCORE for v in verdicts]
    top = max(scores, default=MIN_SCORE)
    if top > MIN_SCORE:
        return scores, names[scores.index(top)]
    return scores, next((n for n, v in zip(names, verdicts) if v is not None and v.ok), None)


def standouts(names: list[str], scores: list[int]) -> list[tuple[str, int]]:
    """The entries of the /prioritize answer: each candidate's score less the lowest of them, the candidates
    left at 0 left out. kube-scheduler adds score x weight to each node the answer lists and nothing to one it
    leaves out, and every name it sent is a candidate: lowering them all by one amount keeps their order and
    their ties. It cuts the answer from an entry per candidate (32 KB at 1,000 nodes, which kube-scheduler
    decodes in its scheduling cycle) to the nodes that stand out. A node left out also gets no random
    tie-break (schedule_one.go sets `Randomizer` only for listed nodes), as under a scheduler without
    extenders."""
    floor = min(scores, default=MIN_SCORE)
    return [(name, score - floor) for name, score in zip(names, scores) if score > floor]
