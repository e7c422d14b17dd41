"""Effect of each toggle on the demo model (CPU, fp32, batch 1, explicit attention in the
baseline), measured by swift_nb's own capture and analysis.

For every sequence length and variant (baseline, each toggle, all three) a fresh model and
AdamW run a few steps under ``swift_nb.profile(toggles=...)``. Columns:
  step_s      fastest of the steps after the profiler's window (unprofiled; the
              minimum is the statistic least disturbed by other load on the machine)
  peak        tensor memory at the step peak (sum of the categories, median over the
              recorded steps), and each category at that peak
  ×base       ratio to the baseline of the same sequence length

    python benchmarks/toggles.py [--seq 2048,4096] [--steps 6] [--layers 4] [--width 256]
"""

from __future__ import annotations

import argparse
import tempfile

import torch

import swift_nb
from swift_nb.core.units import fmt_bytes
from swift_nb.demo import GPTConfig, make_model

VARIANTS = {
    "baseline": [],
    "flash_attention": ["flash_attention"],
    "grad_checkpointing": ["grad_checkpointing"],
    "galore": ["galore"],
    "all three": ["flash_attention", "grad_checkpointing", "galore"],
}
CATEGORIES = ["parameters", "gradients", "optimizer_state", "activations", "other"]


def measure(seq: int, toggles: list[str], args, root: str) -> dict:
    torch.manual_seed(0)
    cfg = dict(seq_len=seq, n_layer=args.layers, d_model=args.width, n_head=args.heads, attn_impl="eager")
    model = make_model(**cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    rank = args.width // 4
    specs = [f"galore:rank={rank}" if t == "galore" else t for t in toggles]
    x = torch.randint(0, GPTConfig.vocab_size, (1, seq))
    prof = swift_nb.profile(
        wait=0, warmup=1, active=2, out_dir=root, toggles=specs, namespace={"model": model, "opt": opt}
    )
    with prof as run:
        for _ in range(args.steps):
            model(x, x).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    steps = run.steps
    after_window = steps[steps["step"] >= 3]["duration_s"]
    fp = prof.analysis.footprint.set_index("category")["at_peak_bytes"]
    row = {"step_s": float(after_window.min()), "peak": float(fp.sum())}
    row.update({c: float(fp.get(c, 0.0)) for c in CATEGORIES})
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seq", default="2048,4096")
    ap.add_argument("--steps", type=int, default=7, help="steps per variant; 3 are profiled (≥ 4)")
    ap.add_argument("--layers", type=int, default=GPTConfig.n_layer)
    ap.add_argument("--width", type=int, default=GPTConfig.d_model)
    ap.add_argument("--heads", type=int, default=GPTConfig.n_head)
    args = ap.parse_args()
    torch.set_num_threads(torch.get_num_threads())
    print(
        f"demo GPT: {args.layers} layers, d_model {args.width}, {args.heads} heads, batch 1, fp32, "
        f"{torch.get_num_threads()} threads; galore rank {args.width // 4}\n"
    )
    head = f"{'seq':>5} {'variant':<19} {'step_s':>7} {'×base':>6} {'peak':>10} {'×base':>6} " + " ".join(
        f"{c[:10]:>10}" for c in CATEGORIES
    )
    print(head)
    print("-" * len(head))
    with tempfile.TemporaryDirectory() as root:
        for seq in (int(s) for s in args.seq.split(",")):
            base = None
            for name, toggles in VARIANTS.items():
                row = measure(seq, toggles, args, root)
                base = base or row
                cats = " ".join(f"{fmt_bytes(row[c]):>10}" for c in CATEGORIES)
                print(
                    f"{seq:>5} {name:<19} {row['step_s']:>7.2f} {row['step_s'] / base['step_s']:>6.2f} "
                    f"{fmt_bytes(row['peak']):>10} {row['peak'] / base['peak']:>6.2f} {cats}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
