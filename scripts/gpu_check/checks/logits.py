"""The ``logits`` check; ``check``'s docstring says what it runs and tests."""

from __future__ import annotations

from ..common import Ctx, apart_pct, mib, recorded_steps

TITLE = "logits known by where they come from on CUDA: a power-of-two vocabulary against 32 000"

GPU_SIZES = {"hidden_size": 512, "intermediate_size": 1024, "num_hidden_layers": 2, "batch": 8, "seq": 500}
SMOKE_SIZES = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1, "batch": 2, "seq": 125}
VOCABS = (32_768, 32_000)


def check(ctx: Ctx) -> None:
    """Two Mistral-shaped models (eager attention), identical but for the vocabulary: 32 768
    (whose B·T × V allocations have the sizes of power-of-two activations) and 32 000, with
    B·T a multiple of 125 (1 000 on a GPU, 250 in the smoke). On CUDA the logits' gradients are made on the autograd engine's
    device thread, which the lineage's dispatch mode and marks must reach. The logits at the
    peak differ by the vocabularies' ratio (±5 %), the activations agree (±10 %)."""
    found = {v: _profiled(ctx, v) for v in VOCABS}
    ctx.details.update({str(v): f for v, f in found.items()})
    big, small = found[VOCABS[0]], found[VOCABS[1]]
    ratio = big["logits_mib"] / small["logits_mib"] if small["logits_mib"] else None
    ctx.details["logits_ratio"] = ratio
    ctx.details["activations_apart_pct"] = apart_pct(big["activations_mib"], small["activations_mib"])
    ctx.expect("both runs have a logits category", bool(big["logits_mib"]) and bool(small["logits_mib"]))
    ctx.expect(
        f"the logits differ by the vocabularies' ratio {VOCABS[0] / VOCABS[1]:.3f} (±5 %)",
        ratio is not None and abs(ratio / (VOCABS[0] / VOCABS[1]) - 1) <= 0.05,
    )
    ctx.expect(
        "the activations agree (±10 %)",
        ctx.details["activations_apart_pct"] is not None and abs(ctx.details["activations_apart_pct"]) <= 10,
    )


def _profiled(ctx: Ctx, vocab: int) -> dict:
    import torch
    import transformers

    sizes = dict(GPU_SIZES if ctx.cuda else SMOKE_SIZES)
    b, t = sizes.pop("batch"), sizes.pop("seq")
    torch.manual_seed(0)
    cfg = transformers.MistralConfig(
        vocab_size=vocab,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=t,
        attn_implementation="eager",
        **sizes,
    )
    model = transformers.MistralForCausalLM(cfg).to(ctx.device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, vocab, (b, t), generator=torch.Generator().manual_seed(1)).to(ctx.device)

    def cell() -> None:
        for _ in range(ctx.sizes.steps):
            model(input_ids=ids, labels=ids).loss.backward()
            opt.step()
            opt.zero_grad()

    run = ctx.profiled(f"logits_{vocab}", cell, namespace={"model": model, "opt": opt})
    row = recorded_steps(run).iloc[-1]
    return {
        "run": str(run.path),
        "logits_mib": mib(float(row["logits_bytes"])),
        "activations_mib": mib(float(row["activations_bytes"])),
        "one_fp32_copy_mib": mib(b * t * vocab * 4),
    }
