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
    scores: list[int] = []
    best, best_score = None, MIN_SCORE - 1
    # A verdict's score is clamped to 0..10 (MinExtenderPriority..MaxExtenderPriority); 0 when it does not fit.
    for name, verdict in zip(names, judge.verdicts(ref, names)):
        if verdict is None or not verdict.ok:
            scores.append(MIN_SCORE)
            continue
        scores.append(verdict.score)
        if verdict.score > best_score:
            best, best_score = name, verdict.score
    return scores, best
