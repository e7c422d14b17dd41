"""Fine-tuning measured: a full fine-tune, LoRA, and LoRA with gradient checkpointing, on
two model shapes, profiled on CPU (where the peak by category is the profiler's allocations
replayed, exactly). For each: the median step time, the peak and its categories (the
frozen base among them), and how far the forecast of twice the batch, made from the run,
lands from a run at twice the batch.

Models (fp32, AdamW over what trains, random weights built from configs, synthetic tokens):
  llama   LlamaForCausalLM, hidden 256, 4 layers, 8 heads (8 key/value), intermediate 688,
          vocab 4096, SDPA attention, B=4, T=128
  qwen2   Qwen2ForCausalLM (grouped-query attention: 8 heads, 2 key/value), hidden 256,
          4 layers, intermediate 704, vocab 4096, eager attention, B=4, T=128
Variants: full (every weight trains), lora (peft r=8 on q_proj/k_proj/v_proj/o_proj),
lora+ckpt (the same with the grad_checkpointing toggle).

    python benchmarks/finetune.py [--steps 6] [--models llama,qwen2]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import statistics
import tempfile
import warnings

import torch

import swift_nb
from swift_nb.core.units import fmt_bytes
from swift_nb.record import MEMORY_CATEGORIES

SHAPES = {
    "llama": dict(
        cls="LlamaForCausalLM",
        config="LlamaConfig",
        kwargs=dict(
            hidden_size=256,
            num_hidden_layers=4,
            num_attention_heads=8,
            num_key_value_heads=8,
            intermediate_size=688,
            attn_implementation="sdpa",
        ),
    ),
    "qwen2": dict(
        cls="Qwen2ForCausalLM",
        config="Qwen2Config",
        kwargs=dict(
            hidden_size=256,
            num_hidden_layers=4,
            num_attention_heads=8,
            num_key_value_heads=2,
            intermediate_size=704,
            attn_implementation="eager",
        ),
    ),
}
VOCAB, BATCH, SEQ = 4096, 4, 128
VARIANTS = ("full", "lora", "lora+ckpt")


def build(shape: str, variant: str) -> torch.nn.Module:
    import transformers

    s = SHAPES[shape]
    torch.manual_seed(0)
    config = getattr(transformers, s["config"])(
        vocab_size=VOCAB, max_position_embeddings=4 * SEQ, **s["kwargs"]
    )
    model = getattr(transformers, s["cls"])(config)
    if variant != "full":
        import peft

        lora = peft.LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
        model = peft.get_peft_model(model, lora)
    return model


def profile(shape: str, variant: str, batch: int, steps: int, folder: str):
    model = build(shape, variant)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, VOCAB, (batch, SEQ), generator=g)
    toggles = ["grad_checkpointing"] if variant == "lora+ckpt" else []
    namespace = {"model": model, "opt": opt}
    with swift_nb.profile(
        out_dir=folder,
        label=f"{shape}-{variant}-b{batch}",
        toggles=toggles,
        namespace=namespace,
        report=False,
    ) as run:
        for _ in range(steps):
            model(input_ids=x, labels=x).loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    return swift_nb.load_run(run.path)


def peak(run) -> float:
    recorded = run.steps.dropna(subset=["parameters_bytes"])
    return float(recorded["peak_tensor_bytes"].median())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--models", default=",".join(SHAPES))
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(2)
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for shape in args.models.split(","):
            for variant in VARIANTS:
                with contextlib.redirect_stdout(io.StringIO()):
                    run = profile(shape, variant, BATCH, args.steps, folder)
                    double = profile(shape, variant, 2 * BATCH, args.steps, folder)
                    forecast = swift_nb.forecast(run, batch_size=2 * BATCH)
                cats = run.summary.get("memory_categories_at_peak") or {}
                ft = run.context.get("finetune") or {}
                measured = peak(double)
                rows.append(
                    {
                        "model": shape,
                        "variant": variant,
                        "trains": f"{ft.get('trainable_pct', 100):.1f} %",
                        "step (median)": f"{1e3 * run.summary['step_time_median_s']:.0f} ms",
                        "peak": fmt_bytes(peak(run)),
                        **{c: fmt_bytes(cats.get(c, 0)) for c in MEMORY_CATEGORIES},
                        "forecast 2B": fmt_bytes(forecast.total_bytes),
                        "measured 2B": fmt_bytes(measured),
                        "error": f"{100 * (forecast.total_bytes - measured) / measured:+.1f} %",
                    }
                )
                print(" · ".join(f"{k} {v}" for k, v in rows[-1].items()), flush=True)
    import pandas as pd

    print()
    print(pd.DataFrame(rows).to_string(index=False))
    errors = [abs(float(r["error"].split()[0])) for r in rows]
    print(f"\nforecast of 2B: mean |error| {statistics.mean(errors):.1f} %, worst {max(errors):.1f} %")


if __name__ == "__main__":
    main()
