"""/prioritize: a score 0..10 per candidate, from the fit's score under the configured strategy
(`scoring_strategy`, default MostAllocated: pack, so whole NUMA nodes stay free for large models)."""

from __future__ import annotations

from extender.filter import MIN_SCORE, Judge, PodRef


def prioritize(judge: Judge, ref: PodRef, names: list[str]) -> list[int]:
    """Scores aligned with `names`. A node where the pod does not fit, a node the ledger does not know,
    and every node for a non-model or unreadable pod score 0: the extender then has no preference."""
    if ref.demand is None or ref.unreadable is not None:
        return [MIN_SCORE] * len(names)
    # A verdict's score is clamped to 0..10 (MinExtenderPriority..MaxExtenderPriority); 0 when it does not fit.
    return [MIN_SCORE if v is None else v.score for v in judge.verdicts(ref, names)]
