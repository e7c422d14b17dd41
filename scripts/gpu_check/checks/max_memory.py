"""The ``max_memory_allocated`` check; ``check``'s docstring says what it runs and tests."""

from __future__ import annotations

from ..common import (
    CATEGORY_COLUMNS,
    Ctx,
    apart_pct,
    categories_total,
    mib,
    recorded_steps,
    step_peak,
    train,
    within,
)

TITLE = "torch.cuda.max_memory_allocated against the run's memory categories at the peak"


def check(ctx: Ctx) -> None:
    """``torch.cuda.max_memory_allocated`` against the memory categories at the peak: as
    swift_nb recorded it per step, and for a bare step after the run."""
    import torch

    cfg = ctx.config()
    model, opt = ctx.model_and_optimizer(cfg)
    x, y = ctx.batch(cfg, ctx.sizes.batch)
    run = ctx.profiled("max-memory", lambda: train(model, opt, x, y, ctx.sizes.steps))
    recorded = recorded_steps(run)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    train(model, opt, x, y, 1)
    torch.cuda.synchronize()
    bare = float(torch.cuda.max_memory_allocated())
    recorded_peak, total = step_peak(run), categories_total(run)
    tol = ctx.sizes.tolerance_pct
    ctx.details.update(
        run=str(run.path),
        per_recorded_step=[
            {
                "step": int(r["step"]),
                "peak_tensor_mib": mib(r["peak_tensor_bytes"]),
                "categories_mib": mib(sum(r[c] for c in CATEGORY_COLUMNS)),
            }
            for _, r in recorded.iterrows()
        ],
        categories_at_peak_mib=mib(total),
        recorded_max_memory_allocated_mib=mib(recorded_peak),
        bare_step_max_memory_allocated_mib=mib(bare),
        categories_vs_recorded_pct=apart_pct(total, recorded_peak),
        categories_vs_bare_pct=apart_pct(total, bare),
        recorded_vs_bare_pct=apart_pct(recorded_peak, bare),
        tolerance_pct=tol,
    )
    ctx.expect("the profiler recorded steps with memory by category", len(recorded) > 0)
    ctx.expect(
        f"the categories' sum at the peak is within {tol:g} % of the step's max_memory_allocated as recorded",
        within(total, recorded_peak, tol),
    )
    ctx.expect(
        f"the categories' sum at the peak is within {tol:g} % of a bare step's max_memory_allocated",
        within(total, bare, tol),
    )
    ctx.expect(
        f"the recorded step peak is within {tol:g} % of a bare step's max_memory_allocated",
        within(recorded_peak, bare, tol),
    )
