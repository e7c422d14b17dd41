"""The padding and the logits of a causal LM's fine-tune, and what ``fused_ce`` and
``packing`` do to them, on CPU where the peak by category is measured exactly.

A Qwen2-shaped model (hidden 32, 1 layer, AdamW, fp32, random weights) is built with a
vocabulary of 32 000, 128 256 and 151 936 and fed right-padded rows of B=4 × T=128 at 0, 30
and 55 % padding. Each is profiled as it is, with ``fused_ce`` and with ``packing``; for each:
the median step, real tokens per second, the peak and its logits, the first step's loss
against the plain run's, and the forecast of the toggle from the plain run against the
measured peak ((forecast − measured) / measured).

    python benchmarks/tokens.py [--steps 5]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import tempfile
import warnings

import torch

import swift_nb
from swift_nb.analysis.forecast import forecast

VOCABS = (32_000, 128_256, 151_936)
PADDING = (0.0, 0.30, 0.55)
B, T = 4, 128
MIB = 2**20


def rows(padding: float) -> list[int]:
    """Real tokens per row for a batch with this share of padding (the first row full)."""
    if not padding:
        return [T] * B
    rest = round(B * T * (1 - padding)) - T
    each = [rest // (B - 1) + (1 if i < rest % (B - 1) else 0) for i in range(B - 1)]
    return [T, *each]


def run(vocab: int, padding: float, toggles: list[str], steps: int, out: str):
    import transformers

    torch.manual_seed(0)
    cfg = transformers.Qwen2Config(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
    )
    model = transformers.Qwen2ForCausalLM(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 1000, (B, T), generator=g)
    mask = torch.zeros(B, T, dtype=torch.long)
    for i, n in enumerate(rows(padding)):
        mask[i, :n] = 1
    labels = ids.masked_fill(mask == 0, -100)
    losses = []
    with (
        contextlib.redirect_stdout(io.StringIO()),
        swift_nb.profile(out_dir=out, toggles=toggles, wait=0, warmup=1, active=2, report=False) as r,
    ):
        for _ in range(steps):
            loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
            losses.append(loss.item())
            loss.backward()
            opt.step()
            opt.zero_grad()
    return r, losses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    head = f"{'vocab':>8} {'pad %':>6} {'variant':>9} {'step ms':>8} {'real tok/s':>10} {'peak MiB':>9} "
    head += f"{'logits MiB':>10} {'loss Δ rel':>10} {'forecast MiB':>12} {'error %':>8}"
    print(head)
    with tempfile.TemporaryDirectory() as out:
        for vocab in VOCABS:
            for padding in PADDING:
                plain, base_losses = run(vocab, padding, [], args.steps, out)
                for name, toggles in (("plain", []), ("fused_ce", ["fused_ce"]), ("packing", ["packing"])):
                    r, losses = (
                        (plain, base_losses) if not toggles else run(vocab, padding, toggles, args.steps, out)
                    )
                    s = r.summary
                    peak = s["peak_mem_bytes"]
                    predicted = forecast(plain, toggles=toggles).total_bytes
                    logits = (s.get("memory_categories_at_peak") or {}).get("logits", 0.0)
                    diff = abs(losses[0] - base_losses[0]) / abs(base_losses[0])
                    print(
                        f"{vocab:>8,} {100 * padding:>6.0f} {name:>9} {1e3 * s['step_time_median_s']:>8.1f} "
                        f"{s['real_tokens_per_s']:>10,.0f} {peak / MIB:>9.1f} {logits / MIB:>10.1f} {diff:>10.1e} "
                        f"{predicted / MIB:>12.1f} {100 * (predicted - peak) / peak:>+8.1f}"
                    )


if __name__ == "__main__":
    main()
