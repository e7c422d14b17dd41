"""The ``tokens`` check; ``check``'s docstring says what it runs and tests."""

from __future__ import annotations

import importlib.util
from typing import Any

from ..common import Ctx, apart_pct, device_memory_bytes, mib, step_peak, within

TITLE = "padded batches of a large-vocabulary LM: fused_ce, liger and packing against the forecast, same loss"

GPU_MODEL = {"vocab_size": 128_256, "hidden_size": 512, "intermediate_size": 1024, "num_hidden_layers": 2}
SMOKE_MODEL = {"vocab_size": 4_096, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1}
LENGTHS = (1.0, 0.4, 0.25, 0.15)  # each row's real share: 55 % padding


def check(ctx: Ctx) -> None:
    """A Llama from a config with Llama-3's vocabulary (the smoke: a small one), right-padded
    rows of 55 % padding, profiled as it is and with ``fused_ce``, ``packing`` and (CUDA, with
    liger-kernel installed) ``liger``: the first step's loss against the plain run's, the
    padding counted, and each toggle's peak against ``swift_nb.forecast`` of the plain run
    with that toggle. Packing runs FlashAttention-2's variable-length kernel where flash-attn
    is installed (CUDA, bf16), the exact block-diagonal path elsewhere."""
    import swift_nb

    flash = ctx.cuda and importlib.util.find_spec("flash_attn") is not None
    liger = ctx.cuda and importlib.util.find_spec("liger_kernel") is not None
    variants: dict[str, list[str]] = {"plain": [], "fused_ce": ["fused_ce"], "packing": ["packing"]}
    if liger:
        variants["liger"] = ["liger"]
    runs, losses = {}, {}
    for name, toggles in variants.items():
        runs[name], losses[name] = _profiled(ctx, name, toggles, "sdpa")
    if flash:
        runs["packing_fa2"], losses["packing_fa2"] = _profiled(
            ctx, "packing_fa2", ["packing"], "flash_attention_2"
        )
    capacity = device_memory_bytes(ctx)
    plain = runs["plain"]
    found: dict[str, Any] = {"flash_attn_installed": flash, "liger_installed": liger}
    for name, run in runs.items():
        toggles = variants.get(name, ["packing"])
        predicted = swift_nb.forecast(plain, capacity, toggles=toggles).total_bytes
        found[name] = {
            "run": str(run.path),
            "first_loss": losses[name][0],
            "loss_rel_diff": abs(losses[name][0] - losses["plain"][0]) / abs(losses["plain"][0]),
            "step_peak_mib": mib(step_peak(run)),
            "predicted_mib": mib(predicted),
            "error_pct": apart_pct(predicted, step_peak(run)),
            "padding_pct": run.summary.get("padding_pct"),
            "real_tokens_per_s": run.summary.get("real_tokens_per_s"),
            "logits_at_peak_mib": mib((run.summary.get("memory_categories_at_peak") or {}).get("logits")),
            "toggle_report": run.context.get("toggles"),
        }
    ctx.details.update(found)
    tol = 10.0 if ctx.cuda else 15.0
    ctx.expect(
        "the plain run counts 55 % padding (±1)", abs((found["plain"]["padding_pct"] or 0) - 55.0) <= 1.0
    )
    if flash:  # bf16 against the fp32 plain run: the same loss to bf16's precision
        ctx.expect(
            "packing_fa2: the first step's loss is the plain run's (2e-2 relative, bf16)",
            found["packing_fa2"]["loss_rel_diff"] <= 2e-2,
        )
    for name in variants:
        if name == "plain":
            continue
        ctx.expect(
            f"{name}: the first step's loss is the plain run's (1e-3 relative)",
            found[name]["loss_rel_diff"] <= 1e-3,
        )
        ctx.expect(
            f"{name}: the peak is within {tol:g} % of the forecast's",
            within(found[name]["predicted_mib"], found[name]["step_peak_mib"], tol),
        )
    ctx.expect(
        "fused_ce: the peak is at most 0.6x the plain run's",
        found["fused_ce"]["step_peak_mib"] <= 0.6 * found["plain"]["step_peak_mib"],
    )
    ctx.expect("packing: no padding is computed", found["packing"]["padding_pct"] == 0.0)


def _profiled(ctx: Ctx, name: str, toggles: list[str], attn: str):
    import torch
    import transformers

    sizes = GPU_MODEL if ctx.cuda else SMOKE_MODEL
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        **sizes, num_attention_heads=4, num_key_value_heads=2, attn_implementation=attn
    )
    dtype = torch.bfloat16 if attn.startswith("flash") else torch.float32
    model = transformers.LlamaForCausalLM(cfg).to(ctx.device, dtype)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    t = 512 if ctx.cuda else 64
    b = len(LENGTHS)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 1000, (b, t), generator=g)
    mask = torch.zeros(b, t, dtype=torch.long)
    for i, share in enumerate(LENGTHS):
        mask[i, : int(t * share)] = 1
    labels = ids.masked_fill(mask == 0, -100)
    ids, mask, labels = ids.to(ctx.device), mask.to(ctx.device), labels.to(ctx.device)
    losses: list[float] = []

    def cell() -> None:
        for _ in range(ctx.sizes.steps):
            loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
            losses.append(float(loss))
            loss.backward()
            opt.step()
            opt.zero_grad()

    run = ctx.profiled(name, cell, toggles=toggles, namespace={"model": model, "opt": opt})
    return run, losses
