"""The ``cost_ratio`` check; ``check``'s docstring says what it runs and tests."""

from __future__ import annotations

import itertools
import math
import statistics
import time

from ..common import Ctx, train

TITLE = "a profiled cell's cost: median step time profiled vs bare, after the profiler's window"


def check(ctx: Ctx) -> None:
    """The median step time of a profiled cell against the same steps bare, after the
    profiler's window (wait + warmup + active steps); bare rounds before and after it. Then
    nothing left behind: the profiler off, and (CUDA) the bare round after the cell within
    3 % of the one before (torch.profiler's CUPTI torn down, PyTorch PR #146604)."""
    import torch

    from swift_nb.demo import GPT, GPTConfig
    from swift_nb.vocabulary.options import ProfileOptions

    n = ctx.sizes.cost_steps
    torch.manual_seed(0)
    cfg = GPTConfig(**ctx.sizes.cost_model, attn_impl="sdpa")
    model = GPT(cfg).to(ctx.device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    x, y = ctx.batch(cfg, ctx.sizes.cost_batch)
    train(model, opt, x, y, 10)  # warm: kernels chosen, allocator and optimizer state settled

    def bare(steps: int) -> list[float]:
        marks = [time.perf_counter()]
        train(model, opt, x, y, steps, marks=marks)
        return [b - a for a, b in itertools.pairwise(marks)]

    o = ProfileOptions()
    window = o.wait + o.warmup + o.active
    before = bare(n // 2)
    run = ctx.profiled("cost", lambda: train(model, opt, x, y, n))
    after = bare(n // 2)
    steps = run.steps[run.steps["trigger"] != "end"].sort_values("step")  # not the span after the loop
    profiled = steps["duration_s"].astype(float).tolist()
    bare_after_window = before[window:] + after[window:]
    ratio = statistics.median(profiled[window:]) / statistics.median(bare_after_window)
    ctx.details.update(
        run=str(run.path),
        steps=n,
        window_steps=window,
        bare_median_ms=1e3 * statistics.median(bare_after_window),
        profiled_median_ms=1e3 * statistics.median(profiled[window:]),
        profiled_in_window_median_ms=1e3 * statistics.median(profiled[:window]),
        profiled_last_half_median_ms=1e3 * statistics.median(profiled[n // 2 :]),
        bare_rounds_median_ms=[1e3 * statistics.median(r[window:]) for r in (before, after)],
        ratio=ratio,
        ratio_limit=ctx.sizes.cost_limit,
        hook_overhead_ms_median=1e3 * float(run.steps["overhead_s"].median()),
    )
    left = statistics.median(after[window:]) / statistics.median(before[window:])
    ctx.details["bare_after_vs_before"] = left
    ctx.expect("the profiler is off once the cell is over", not torch.autograd._profiler_enabled())
    if ctx.cuda:  # the smoke's shared CPU drifts by more than 3 % between two rounds
        ctx.expect("the bare loop after the profiled cell runs within 3 % of its speed before", left <= 1.03)
    ctx.expect("the profiled run recorded every step", len(profiled) >= n)
    if ctx.sizes.cost_limit is None:
        ctx.expect("a cost ratio was measured", math.isfinite(ratio) and ratio > 0)
    else:
        ctx.expect(
            f"the profiled cell's median step after the window is under {ctx.sizes.cost_limit}x the bare one's",
            ratio < ctx.sizes.cost_limit,
        )
