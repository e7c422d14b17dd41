"""Models forecast from their configs (``swift_nb.forecast(model=...)``: one training step on
fake tensors, nothing allocated).

1. Proxies: small Llama configs profiled for real on this CPU (fp32, AdamW foreach) against
   their forecasts from config, category by category; a model 4x the proxy's size forecast
   with the proxy's run, plain, under LoRA r=16 and gradient checkpointing (both run on the
   fake model).
2. Presets at 1 x 2048 tokens in bf16 with AdamW: the time each fake step takes here (full,
   and LoRA's own), the peak as a full fine-tune, under LoRA r=16 and QLoRA r=16 (LoRA's
   step, its base at NF4's packed size), and whether each fits on a 24, 40 and 80 GB card.

    python benchmarks/forecast_models.py [--models llama-2-7b,llama-3-8b,llama-3-70b] [--no-proxies]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import warnings
from pathlib import Path

import swift_nb
from swift_nb.analysis.forecast import forecast, measure
from swift_nb.core.units import fmt_bytes
from swift_nb.model_forecast import measured_model
from swift_nb.record import MEMORY_CATEGORIES

# the proxy model and its profiled loop are the tests' own (tests/support/llama_proxy.py)
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from support.llama_proxy import B, T, config, profiled, step_peak

CARDS = ("RTX4090-24GB", "A100-40GB", "H100-80GB")


def proxies() -> None:
    print("## Proxies: measured here (CPU, fp32) against the forecast from config, MiB\n")
    print(f"{'case':>22} {'category':>18} {'measured':>10} {'forecast':>10} {'error':>8}")
    out = tempfile.mkdtemp()
    small = profiled(out, config(128, 2))
    cases = [("proxy 128x2, itself", config(128, 2), (), None, small)]
    for label, toggles in (
        ("4x", ()),
        ("4x LoRA r=16", ("lora:r=16",)),
        ("4x checkpointing", ("grad_checkpointing",)),
    ):
        cases.append((label, config(256, 4), toggles, small, profiled(out, config(256, 4), toggles)))
    for label, cfg, toggles, proxy, run in cases:
        f = swift_nb.forecast(
            proxy, model=cfg, dtype="fp32", batch_size=B, seq_len=T, toggles=list(toggles), progress=False
        )
        measured = measure(run).categories
        rows = [
            (c, measured[c], f.categories[c]) for c in MEMORY_CATEGORIES if measured[c] or f.categories[c]
        ]
        peak = step_peak(run)  # a typical step's
        rows.append(("peak", peak, f.total_bytes))
        for c, m, p in rows:
            err = f"{(p / m - 1) * 100:+.1f} %" if m else "—"
            print(f"{label:>22} {c:>18} {m / 2**20:>10.2f} {p / 2**20:>10.2f} {err:>8}")


def presets(models: list[str]) -> None:
    print("\n## Presets at 1 x 2048 tokens, bf16, AdamW (foreach)\n")
    print(
        f"{'model':>12} {'method':>11} {'fake step s':>11} {'peak':>10}  "
        + "  ".join(f"{c:>13}" for c in CARDS)
    )
    for name in models:
        steps = {}
        for method, toggles in (("full", ()), ("LoRA r=16", ("lora(r=16)",))):
            t0 = time.perf_counter()
            steps[method] = (
                measured_model(name, None, 1, 2048, "bfloat16", "AdamW", toggles, False),
                time.perf_counter() - t0,
            )
        for method, toggles, step in (
            ("full", [], "full"),
            ("LoRA r=16", ["lora(r=16)"], "LoRA r=16"),
            ("QLoRA r=16", ["qlora(r=16)"], "LoRA r=16"),
        ):
            measured, seconds = steps[step]
            fits = []
            for card in CARDS:
                f = forecast(measured, card, toggles=toggles)
                fits.append("fits" if f.fits else f"short {fmt_bytes(-f.headroom_bytes)}")
            shown = f"{seconds:.1f}" if step == method else "(LoRA's)"
            print(
                f"{name:>12} {method:>11} {shown:>11} {fmt_bytes(f.total_bytes):>10}  "
                + "  ".join(f"{x:>13}" for x in fits)
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="llama-2-7b,llama-3-8b,qwen2.5-7b,llama-3-70b")
    parser.add_argument("--no-proxies", action="store_true")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    if not args.no_proxies:
        proxies()
    presets(args.models.split(","))


if __name__ == "__main__":
    main()
