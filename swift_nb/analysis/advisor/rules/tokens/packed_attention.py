"""Packed rows attended across samples: ``position_ids`` restart inside a row (a collator
such as ``DataCollatorWithFlattening`` or TRL's ``padding_free`` joined several samples),
but nothing keeps the samples apart. Only a variable-length attention (FlashAttention-2/3,
which reads the restarts) or a per-sample mask does; sdpa and eager attention given packed
rows and no such mask let every token attend to the samples before it in the row, so the
model trains on the wrong attention and nothing fails."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from swift_nb.analysis.advisor.evidence import Evidence, Thresholds
from swift_nb.analysis.advisor.findings import Finding

#: attention kernels that keep packed samples apart from position_ids alone
VARLEN = (
    "flash_attention_2",
    "flash_attention_3",
    "kernels-community/flash-attn",
    "kernels-community/flash-attn3",
)


def rule(ev: Evidence, th: Thresholds, context: Mapping[str, Any]) -> Finding | None:
    tok = ev.tokens
    if tok is None or not tok.packed:
        return None
    attn = context.get("attn_implementation")
    if isinstance(attn, str) and any(v in attn for v in VARLEN):
        return None
    if context.get("packed_separated_by"):  # cu_seqlens or a per-query mask of its own
        return None
    kernel = f"attn_implementation={attn!r}" if attn else "an attention of its own"
    return Finding(
        id="packed_attention",
        title=f"Packed rows are attended across samples: {kernel} does not keep them apart",
        evidence={
            "restarts_per_run": tok.packed,
            "attn_implementation": attn,
            "tokens_per_step": round(tok.per_step),
        },
        suggestion=(
            "Load the model with attn_implementation='flash_attention_2' (CUDA), which reads the samples' bounds "
            "from position_ids; elsewhere pass a block-diagonal 4-D attention mask, or stop packing "
            "(%%swift_profile --compare packing packs with an exact attention on every device)."
        ),
        predicted_effect="the loss as if each sample were its own row: each token attends to its own sample only",
        formula="packed rows: position_ids restart at 0 inside a row; sdpa and eager attention see one causal row",
        severity="critical",
    )
