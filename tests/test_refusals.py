"""Every kind of admission refusal has its sentence, rendered in one place (placement/refusals.py), and keeps its
check id, which metrics, logs and the admission decision key on."""

from __future__ import annotations

import dataclasses
import typing

from placement import reasons, refusals
from placement.refusals import Refusal, render

SAMPLES = {str: "x", int: 3, bool: True, "tuple[str, ...]": ("a", "b"), "tuple[tuple[str, str], ...]": (("n", "r"),),
           "int | None": 4, tuple[tuple[str, reasons.Reason], ...]: (("n", reasons.NoCpu()),)}


def sample(kind: type) -> Refusal:
    hints = typing.get_type_hints(kind)
    values = {}
    for f in dataclasses.fields(kind):
        hint = hints[f.name]
        values[f.name] = SAMPLES.get(hint, SAMPLES.get(str(hint).replace("typing.", ""), "x"))
    return typing.cast(Refusal, kind(**values))


def test_every_kind_of_refusal_renders_a_sentence_and_keeps_a_check_id() -> None:
    kinds = typing.get_args(Refusal)
    assert len(kinds) >= 10
    checks = set()
    for kind in kinds:
        refusal = sample(kind)
        text = render(refusal)
        assert text and "{" not in text, (kind, text)
        checks.add(refusal.check)
    assert {refusals.POD_SPEC, refusals.NO_ELIGIBLE_NODE, refusals.REPLICAS, refusals.NOT_MUTATED} <= checks


def test_the_kubelet_static_refusal_names_the_resource_that_is_missing() -> None:
    memory = render(refusals.NotGuaranteed("llm/a", ("main", "sidecar"), "memory"))
    cpu = render(refusals.NotGuaranteed("llm/a", ("sidecar",), "cpu"))
    assert "main, sidecar set no memory request or limit" in memory and "resources.limits.memory" in memory
    assert "sidecar set no cpu request or limit" in cpu and "Burstable" in cpu
    assert refusals.NotGuaranteed("p", (), "memory").check == refusals.MEMORY_MISSING
    assert refusals.NotGuaranteed("p", (), "cpu").check == refusals.CPU_MISSING
