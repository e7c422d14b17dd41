"""What ``swift_nb.plan`` proposes, checked by running it: three model shapes (the demo
GPT, CPU, fp32, AdamW, eager attention), each profiled plain at its batch; then budgets of
the plain run's peak ÷ 1.2, ÷ 1.4 and ÷ 2. For each budget the planner's first plan is run
for real. Columns:
  plain       the plain run's peak tensor memory (sum of categories at the step's peak)
  budget      the memory budget given to plan()
  plan        the first plan's toggles (— when none fits)
  predicted   its forecast peak (± the forecast's expected error)
  measured    the peak of the run with those toggles
  err         measured / predicted − 1
  within      measured ≤ budget
  step pred   predicted step time (the plain run's median step × the plan's factor)
  step meas   the toggled run's median step

    python benchmarks/plan.py [--steps 5]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import tempfile

import torch

import swift_nb
from swift_nb.analysis.forecast import measure
from swift_nb.analysis.forecast.plan import applied_toggles
from swift_nb.core.units import fmt_bytes, fmt_seconds
from swift_nb.demo import make_model

SHAPES = {
    "GPT 4×128, T=256, B=8": dict(n_layer=4, n_head=4, d_model=128, vocab_size=256, seq_len=256, batch=8),
    "GPT 6×192, T=128, B=16": dict(n_layer=6, n_head=6, d_model=192, vocab_size=512, seq_len=128, batch=16),
    "GPT 2×256, T=512, B=4": dict(n_layer=2, n_head=4, d_model=256, vocab_size=512, seq_len=512, batch=4),
}
BUDGETS = (1.2, 1.4, 2.0)


def run(shape: dict, toggles: list[str], steps: int, root: str):
    cfg = {k: v for k, v in shape.items() if k != "batch"}
    torch.manual_seed(0)
    model = make_model(attn_impl="eager", **cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randint(0, cfg["vocab_size"], (shape["batch"], cfg["seq_len"]))
    with contextlib.redirect_stdout(io.StringIO()):
        prof = swift_nb.profile(
            out_dir=root, wait=0, warmup=1, active=2, profile_memory=True, report=False, toggles=toggles
        )
        with prof as r:
            for _ in range(steps):
                model(x, x).backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
    return swift_nb.load_run(r.path)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=12)
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="swift_nb_plan_")
    head = [
        "shape",
        "plain",
        "budget",
        "plan",
        "predicted",
        "measured",
        "err",
        "within",
        "step pred",
        "step meas",
    ]
    print(" | ".join(head))
    print(" | ".join("---" for _ in head))
    for name, shape in SHAPES.items():
        plain = run(shape, [], args.steps, root)
        total = measure(plain).total
        for cut in BUDGETS:
            budget = total / cut
            table = swift_nb.plan(plain, memory_bytes=budget)
            best = table.iloc[0]
            if not best["fits"]:
                print(f"{name} | {fmt_bytes(total)} | ÷{cut:g} {fmt_bytes(budget)} | — | | | | | |")
                continue
            toggles = applied_toggles(best)
            got = run(shape, toggles, args.steps, root)
            peak = measure(got).total
            step = got.summary.get("step_time_median_s")
            print(
                f"{name} | {fmt_bytes(total)} | ÷{cut:g} {fmt_bytes(budget)} | {best['toggles']} | "
                f"{fmt_bytes(best['predicted_peak_bytes'])} ± {best['expected_error_pct']:.0f} % | {fmt_bytes(peak)} | "
                f"{peak / best['predicted_peak_bytes'] - 1:+.1%} | {'yes' if peak <= budget else 'NO'} | "
                f"{fmt_seconds(best['predicted_step_s'])} | {fmt_seconds(step) if step else '?'}"
            )


if __name__ == "__main__":
    main()
