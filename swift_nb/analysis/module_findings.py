"""The findings that name a module (from ``analysis.modules``' table), and the module's word
added to the findings the rules made without it:

- ``fp32_module``: an embedding or a norm whose parameters are fp32 in a model whose other
  parameters are mostly bf16/fp16;
- ``lm_head``: the LM head (the model's output embeddings) and the loss after it taking a
  large share of the step's time; joined to the ``logits`` finding when that one fired;
- ``activations``: the modules whose saved activations make up what checkpointing would
  recompute, named in its prediction.
"""

from __future__ import annotations

import dataclasses

import pandas as pd

from swift_nb.analysis.advisor.findings import Finding
from swift_nb.analysis.modules import blocks
from swift_nb.core.units import fmt_bytes

#: the LM head and its loss taking this share of the step (forward + backward) is a finding
LM_HEAD_SHARE = 0.25
#: the share of the parameter bytes of a model's other layers (not its norms and embeddings)
#: in 16-bit types that makes it a 16-bit model
LOW_PRECISION_SHARE = 0.8
_LOW = ("bfloat16", "float16")


def with_modules(findings: list[Finding], table: pd.DataFrame) -> list[Finding]:
    """``findings`` with the module-naming ones added and the rules' findings told which
    modules they are about."""
    if table.empty:
        return findings
    out = [_activations_by_module(f, table) if f.id == "activations" else f for f in findings]
    head = _lm_head(table)
    if head is not None:
        logits = next((i for i, f in enumerate(out) if f.id == "logits"), None)
        if logits is not None:
            out[logits] = _join_logits(out[logits], head)
        elif head["share"] >= LM_HEAD_SHARE:
            out.append(_lm_head_finding(head))
    fp32 = fp32_module_finding(table)
    if fp32 is not None:
        out.append(fp32)
    return out


# -- activations -----------------------------------------------------------------------------


def saved_by(table: pd.DataFrame) -> tuple[str, float, float] | None:
    """(who keeps most of what the forward saves, its bytes, its share of the root's):
    the stack of blocks when it has one, else the largest single module below the root."""
    roots = table[table["depth"] == 0]
    total = float(roots["saved_bytes"].sum())
    if not total > 0:
        return None
    stack = blocks(table)
    if len(stack) >= 2:
        kept = float(stack["saved_bytes"].sum())
        first, last = stack["path"].iloc[0], stack["path"].iloc[-1]
        who = f"{first} … {last} ({len(stack)} blocks of class {stack['class'].iloc[0]})"
    else:
        below = table[table["depth"] == 1]
        if below.empty:
            return None
        top = below.loc[below["saved_bytes"].astype(float).idxmax()]
        kept, who = float(top["saved_bytes"]), f"{top['path']} ({top['class']})"
    return who, kept, kept / total


def _activations_by_module(f: Finding, table: pd.DataFrame) -> Finding:
    found = saved_by(table)
    if found is None:
        return f
    who, kept, share = found
    named = (
        f"; by module, {who} keep {fmt_bytes(kept)} per step ({share:.0%} of what the forward saves): "
        "the blocks checkpointing recomputes"
    )
    return dataclasses.replace(
        f,
        evidence={**f.evidence, "saved_by": who, "saved_by_bytes": kept, "saved_by_share": round(share, 3)},
        predicted_effect=f.predicted_effect + named,
    )


# -- the LM head and the loss ----------------------------------------------------------------


def _lm_head(table: pd.DataFrame) -> dict | None:
    """The LM head's row, its time with the loss's backward (the backward nodes of no
    module, ``attrs["unattributed_backward_s"]``) and their share of the step."""
    heads = table[table["role"].astype(str) == "lm_head"]
    if heads.empty:
        return None
    row = heads.iloc[0]
    loss_s = float(table.attrs.get("unattributed_backward_s") or 0.0)
    share = float(row["step_share"]) if pd.notna(row["step_share"]) else 0.0
    root_total = float(table.loc[table["depth"] == 0, "total_s"].sum())
    step_s = float(row["total_s"]) / share if share > 0 else None
    seconds = float(row["total_s"]) + loss_s
    return {
        "path": str(row["path"]),
        "class": str(row["class"]),
        "seconds": seconds,
        "share": seconds / step_s if step_s else 0.0,
        "saved_bytes": float(row["saved_bytes"]),
        "of_model": float(row["total_s"]) / root_total if root_total > 0 else None,
    }


def _join_logits(f: Finding, head: dict) -> Finding:
    said = (
        f" By module: {head['path']} and the loss after it take {head['share']:.0%} of the step "
        f"({head['seconds'] * 1e3:.1f} ms) and keep {fmt_bytes(head['saved_bytes'])} for backward."
    )
    return dataclasses.replace(
        f,
        evidence={
            **f.evidence,
            "lm_head": head["path"],
            "lm_head_loss_s": head["seconds"],
            "lm_head_loss_share": round(head["share"], 3),
        },
        suggestion=f.suggestion + said,
    )


def _lm_head_finding(head: dict) -> Finding:
    return Finding(
        id="lm_head",
        title=f"The LM head ({head['path']}) and the loss take {head['share']:.0%} of the step",
        evidence={
            "lm_head": head["path"],
            "lm_head_loss_s": head["seconds"],
            "lm_head_loss_share": round(head["share"], 3),
            "lm_head_saved_bytes": head["saved_bytes"],
        },
        suggestion=(
            "The output layer multiplies every token by the whole vocabulary, and the loss reads the result "
            "back: a fused linear cross-entropy (the fused_ce toggle) computes both in chunks without the "
            "whole logits; shorter padding or packing cuts the tokens it runs on."
        ),
        toggle="fused_ce",
        predicted_effect="less time in the head and the loss, and their logits never held whole",
        formula="(LM head forward + backward + the loss's backward) / the mean recorded step",
        severity="info",
    )


# -- fp32 modules in a 16-bit model ----------------------------------------------------------


def _is_norm_or_embedding(cls: str) -> bool:
    return "Norm" in cls or "Embedding" in cls


def fp32_module_finding(table: pd.DataFrame) -> Finding | None:
    """Embeddings and norms whose own parameters are fp32 while the model's parameters are
    mostly 16-bit: their outputs are fp32, so the next layer casts (or autocast does), and
    their parameters, gradients and state take twice the bytes."""
    own = table[table["dtype"].astype(str) != ""]
    if own.empty:
        return None
    # each module's own bytes: the table's parameter_bytes include the children's
    children = table.groupby("parent")["parameter_bytes"].sum()
    own_bytes = (own["parameter_bytes"] - own["path"].map(children).fillna(0.0)).clip(lower=0)
    # the model's precision: that of its other layers (an fp32 embedding can be most of a
    # small model's bytes)
    kind = own["class"].astype(str).map(_is_norm_or_embedding)
    rest = own_bytes[~kind]
    total = float(rest.sum())
    low = float(rest[own.loc[~kind, "dtype"].isin(_LOW)].sum())
    if not total > 0 or low / total < LOW_PRECISION_SHARE:
        return None
    wide = own[(own["dtype"] == "float32") & kind]
    if wide.empty:
        return None
    model_dtype = "bfloat16" if rest[own.loc[~kind, "dtype"] == "bfloat16"].sum() >= low / 2 else "float16"
    wide_bytes = float(own_bytes[wide.index].sum())
    names = ", ".join(f"{p} ({c})" for p, c in zip(wide["path"].head(4), wide["class"].head(4), strict=True))
    more = f" and {len(wide) - 4} more" if len(wide) > 4 else ""
    return Finding(
        id="fp32_module",
        title=f"{len(wide)} norm or embedding module{'s' if len(wide) > 1 else ''} in fp32 in a {model_dtype} model",
        evidence={
            "modules": names + more,
            "count": len(wide),
            "fp32_parameter_bytes": wide_bytes,
            "model_dtype": model_dtype,
            "low_precision_share": round(low / total, 3),
        },
        suggestion=(
            f"Cast them with the rest of the model (model.to(torch.{model_dtype}), or load it with "
            f"torch_dtype=torch.{model_dtype}): an fp32 norm or embedding makes fp32 outputs the next layer "
            "casts back, and its parameters, gradients and optimizer state take twice the bytes. Keep them "
            "in fp32 only where the model asks for it (Hugging Face's _keep_in_fp32_modules)."
        ),
        predicted_effect=f"≈ −{fmt_bytes(wide_bytes / 2)} of parameters, and as much of gradients, for these modules",
        formula="their fp32 parameter bytes / 2 (a 16-bit copy is half the size)",
        severity="info",
    )
