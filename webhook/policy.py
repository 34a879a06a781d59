"""POST /validate for a BalloonsPolicy CREATE or UPDATE: `placement.policycheck` in the wire format.

Advisory (`failurePolicy: Ignore`): the plugin judges the policy again on every node. So whatever keeps us from
judging it (no time left, a fault of ours) admits it with a warning saying so, as the failure policy would.
"""

from __future__ import annotations

import logging
from typing import Any, NamedTuple

from placement.cluster import ClusterState
from placement.policycheck import UNREADABLE, check_policy
from webhook.review import Review, allow, deny

log = logging.getLogger("model_placement.webhook")

BALLOONS_POLICY = ("config.nri", "BalloonsPolicy")


class Judged(NamedTuple):
    review: dict[str, Any]
    decision: str  # allowed | denied | warned | skipped | degraded
    reason: str  # a check id or a fixed word
    label: str
    message: str


def policy_label(review: Review) -> str:
    return f"BalloonsPolicy {review.namespace or '-'}/{review.name or review.object_meta.get('name') or '*'}"


def judge_policy(review: Review, cluster: ClusterState, affords: bool) -> Judged:
    uid, label = review.uid, policy_label(review)
    if review.operation not in ("CREATE", "UPDATE") or review.sub_resource:
        return Judged(allow(uid), "skipped", "not-judged", label, "")
    if review.object is None:
        text = f"{review.operation} of {label} without request.object: nothing to judge"
        return Judged(deny(uid, text, code=400), "denied", UNREADABLE, label, text)
    if not affords:
        text = f"model-placement had no time left within the apiserver's timeout to check {label}; admitted"
        return Judged(allow(uid, [text]), "degraded", "timeout", label, text)
    try:
        verdict = check_policy(review.object, cluster)
    except Exception as exc:
        log.exception("policy check failed", extra={"verb": "validate", "pod": label, "uid": review.uid})
        text = f"model-placement could not check {label} ({type(exc).__name__}); admitted unchecked"
        return Judged(allow(uid, [text]), "degraded", "internal-error", label, text)
    notes = [f"{label}: {w.message}" for w in verdict.warnings]
    if verdict.refusals:
        first = verdict.refusals[0]
        text = f"model-placement refuses {label}: {'; '.join(r.message for r in verdict.refusals)}."
        code = 400 if first.check == UNREADABLE else 403
        return Judged(deny(uid, text, code=code, warnings=notes), "denied", first.check, label, text)
    if notes:
        text = "; ".join(w.message for w in verdict.warnings)
        return Judged(allow(uid, notes), "warned", verdict.warnings[0].check, label, text)
    return Judged(allow(uid), "allowed", "policy-ok", label, f"applies to {len(verdict.nodes)} nodes")
