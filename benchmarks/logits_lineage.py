"""What following the loss's logits costs in the recorded steps (capture.memory.logits): a
Llama-shaped language model built from its config (CPU), profiled with the default schedule
with the lineage on and off, interleaved round by round. Per mode: the median duration of
the recorded (active) steps and of the steps outside the window, and the logits category it
found. The lineage runs only in recorded steps: outside them the two modes must agree.

    python benchmarks/logits_lineage.py [--rounds 3] [--vocab 32000] [--hidden 256] [--layers 4]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from contextlib import contextmanager

import torch
import transformers

import swift_nb
from swift_nb.capture.memory import logits as lineage_module


@contextmanager
def lineage(on: bool):
    """The lineage as shipped (on), or never armed (off)."""
    original = lineage_module.Lineage.arm
    if not on:
        lineage_module.Lineage.arm = lambda self, armed: original(self, False)  # type: ignore[method-assign]
    try:
        yield
    finally:
        lineage_module.Lineage.arm = original  # type: ignore[method-assign]


def one(model, opt, ids, out: str, on: bool) -> tuple[float, float, float]:
    with lineage(on), swift_nb.profile(out_dir=out, report=False, wait=1, warmup=2, active=3) as run:
        for _ in range(10):
            model(input_ids=ids, labels=ids).loss.backward()
            opt.step()
            opt.zero_grad()
    found = swift_nb.load_run(run.path).steps
    active = found[found["phase"] == "active"]
    rest = found[(found["phase"] == "none") & (found["step"] > 0)]
    logits = float(active["logits_bytes"].dropna().median()) if "logits_bytes" in active else 0.0
    return float(active["duration_s"].median()), float(rest["duration_s"].median()), logits


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--vocab", type=int, default=32_000)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=256)
    a = ap.parse_args()
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=a.vocab,
        hidden_size=a.hidden,
        intermediate_size=2 * a.hidden,
        num_hidden_layers=a.layers,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=a.seq,
    )
    model = transformers.LlamaForCausalLM(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, a.vocab, (a.batch, a.seq))
    results: dict[bool, list[tuple[float, float, float]]] = {True: [], False: []}
    with tempfile.TemporaryDirectory() as out:
        for _ in range(a.rounds):
            for on in (False, True):
                results[on].append(one(model, opt, ids, out, on))
    print(
        f"Llama h{a.hidden} × {a.layers} layers, V = {a.vocab:,}, batch {a.batch} × {a.seq}, {a.rounds} rounds"
    )
    print(
        f"{'lineage':<8} {'recorded step (ms)':>20} {'unrecorded step (ms)':>22} {'logits at peak (MiB)':>22}"
    )
    for on in (False, True):
        rec = statistics.median(r[0] for r in results[on]) * 1e3
        rest = statistics.median(r[1] for r in results[on]) * 1e3
        logits = statistics.median(r[2] for r in results[on]) / 2**20
        print(f"{'on' if on else 'off':<8} {rec:>20.1f} {rest:>22.1f} {logits:>22.1f}")


if __name__ == "__main__":
    main()
