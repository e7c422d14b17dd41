"""The advisor's rules, in the order their findings are listed. A rule is one file under
``rules/`` with ``rule(evidence, thresholds, context) -> Finding | None``, and one line here.

A rule that extends another and runs in its place (one cause, one finding) names it with
``replaces=``: the replaced rule's file is registered through it, and every file under
``rules/`` is registered one way or the other (``tests`` check it)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from swift_nb.analysis.advisor.evidence import Evidence, Thresholds
from swift_nb.analysis.advisor.findings import Finding
from swift_nb.analysis.advisor.rules import (
    activations,
    communication,
    compile_time,
    data_loading,
    eager_attention,
    fp32_activations,
    fp32_gemm,
    frozen_fp32,
    frozen_grad,
    graph_break,
    leak,
    lora_activations,
    lora_small_batch,
    optimizer_state,
    overhead,
    pageable_copies,
    recompile,
    sequence_parallel,
    sync_stalls,
)
from swift_nb.analysis.advisor.rules.memory import stale_models
from swift_nb.analysis.advisor.rules.tokens import logits, packed_attention, padding

Rule = Callable[[Evidence, Thresholds, Mapping[str, Any]], Finding | None]


@dataclass(frozen=True)
class Registered:
    """A rule in the registry; ``replaces``: the rule it runs in place of (it calls that
    rule itself, and gives its finding unchanged where its own case does not hold)."""

    rule: Rule
    replaces: Rule | None = None

    def __call__(self, ev: Evidence, th: Thresholds, context: Mapping[str, Any]) -> Finding | None:
        return self.rule(ev, th, context)


RULES: list[Rule] = [
    Registered(packed_attention.rule),
    Registered(data_loading.rule),
    Registered(padding.rule),
    Registered(lora_small_batch.rule, replaces=overhead.rule),
    Registered(compile_time.rule),
    Registered(recompile.rule),
    Registered(graph_break.rule),
    Registered(eager_attention.rule),
    Registered(logits.rule),
    Registered(lora_activations.rule, replaces=activations.rule),
    Registered(frozen_grad.rule),
    Registered(fp32_activations.rule),
    Registered(frozen_fp32.rule),
    Registered(optimizer_state.rule),
    Registered(sequence_parallel.rule),
    Registered(stale_models.rule),
    Registered(leak.rule),
    Registered(communication.rule),
    Registered(sync_stalls.rule),
    Registered(pageable_copies.rule),
    Registered(fp32_gemm.rule),
]


def registered_modules(rules: list[Rule] | None = None) -> set[str]:
    """The modules of the rules in ``rules`` (default ``RULES``) and of those they replace."""
    found: set[str] = set()
    for r in RULES if rules is None else rules:
        for fn in (r.rule, r.replaces) if isinstance(r, Registered) else (r,):
            if fn is not None:
                found.add(fn.__module__)
    return found
