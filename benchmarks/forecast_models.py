"""Models forecast from their configs (``swift_nb.forecast(model=...)``: one training step on
fake tensors, nothing allocated): the time each takes on this machine, the peak in bf16 as a
full fine-tune (AdamW), under LoRA r=16 and QLoRA r=16 (by the forecast's formulas from the
full step), at 1 × 2048 tokens, and whether each fits on a 24, 40 and 80 GB card.

The proxies — small Llama configs profiled for real on this CPU against their fake
forecasts — are in tests/integration/test_forecast_from_model.py (within 2 % and 10 %).

    python benchmarks/forecast_models.py [--models llama-2-7b,llama-3-8b,llama-3-70b]
"""

from __future__ import annotations

import argparse
import time
import warnings

from swift_nb.analysis.forecast import forecast
from swift_nb.analysis.forecast.from_model import measured_from
from swift_nb.capture.fake_step import fake_step
from swift_nb.core.units import fmt_bytes

CARDS = ("RTX4090-24GB", "A100-40GB", "H100-80GB")
METHODS = (("full", []), ("LoRA r=16", ["lora(r=16)"]), ("QLoRA r=16", ["qlora(r=16)"]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="llama-2-7b,llama-3-8b,llama-3-70b")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    print(
        f"{'model':>12} {'fake step s':>11} {'params':>14} {'method':>11} {'peak':>10}  "
        + "  ".join(f"{c:>13}" for c in CARDS)
    )
    for name in args.models.split(","):
        t0 = time.perf_counter()
        step = fake_step(name, 1, 2048, "bfloat16", "AdamW")
        seconds = time.perf_counter() - t0
        measured = measured_from(step)
        for method, toggles in METHODS:
            fits = []
            for card in CARDS:
                f = forecast(measured, card, toggles=toggles)
                fits.append("fits" if f.fits else f"short {fmt_bytes(-f.headroom_bytes)}")
            print(
                f"{name:>12} {seconds:>11.1f} {step.params:>14,} {method:>11} {fmt_bytes(f.total_bytes):>10}  "
                + "  ".join(f"{x:>13}" for x in fits)
            )


if __name__ == "__main__":
    main()
