"""The advisor's rules, in the order their findings are listed. A rule is one file under
``rules/`` with ``rule(evidence, thresholds, context) -> Finding | None``, and one line here."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from swift_nb.analysis.advisor.evidence import Evidence, Thresholds
from swift_nb.analysis.advisor.findings import Finding
from swift_nb.analysis.advisor.rules import (
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
    pageable_copies,
    recompile,
    sequence_parallel,
    sync_stalls,
)

Rule = Callable[[Evidence, Thresholds, Mapping[str, Any]], Finding | None]

RULES: list[Rule] = [
    data_loading.rule,
    lora_small_batch.rule,  # overhead.rule, or its LoRA small-batch finding in its place
    compile_time.rule,
    recompile.rule,
    graph_break.rule,
    eager_attention.rule,
    lora_activations.rule,  # activations.rule, or its LoRA finding in its place
    frozen_grad.rule,
    fp32_activations.rule,
    frozen_fp32.rule,
    optimizer_state.rule,
    sequence_parallel.rule,
    leak.rule,
    communication.rule,
    sync_stalls.rule,
    pageable_copies.rule,
    fp32_gemm.rule,
]
