"""The ``forecast`` check; ``check``'s docstring says what it runs and tests."""

from __future__ import annotations

from ..common import Ctx, apart_pct, categories_total, device_memory_bytes, mib, step_peak, train, within

TITLE = "the forecast from a run at batch B against the measured peak at 2B"


def check(ctx: Ctx) -> None:
    """``swift_nb.forecast`` from a run at batch B, for 2B, against a run at 2B."""
    import swift_nb

    b = ctx.sizes.batch // 2
    cfg = ctx.config()
    runs = {}
    for batch in (b, 2 * b):
        model, opt = ctx.model_and_optimizer(cfg)
        x, y = ctx.batch(cfg, batch)
        runs[batch] = ctx.profiled(
            f"batch-{batch}", lambda model=model, opt=opt, x=x, y=y: train(model, opt, x, y, ctx.sizes.steps)
        )
    capacity = device_memory_bytes(ctx)
    same = swift_nb.forecast(runs[b], capacity)
    double = swift_nb.forecast(runs[b], capacity, batch_size=2 * b)
    measured = {k: {"step_peak": step_peak(r), "categories": categories_total(r)} for k, r in runs.items()}
    tol = ctx.sizes.tolerance_pct
    ctx.details.update(
        runs={k: str(r.path) for k, r in runs.items()},
        capacity_mib=mib(capacity),
        read_from_run=double.measured_config,
        measured_mib={k: {m: mib(v) for m, v in d.items()} for k, d in measured.items()},
        forecast_at_b_mib=mib(same.total_bytes),
        forecast_at_2b_mib=mib(double.total_bytes),
        forecast_at_2b_categories_mib={c: mib(v) for c, v in double.categories.items()},
        error_at_b_pct=apart_pct(same.total_bytes, measured[b]["step_peak"]),
        error_at_2b_pct=apart_pct(double.total_bytes, measured[2 * b]["step_peak"]),
        error_at_2b_vs_categories_pct=apart_pct(double.total_bytes, measured[2 * b]["categories"]),
        expected_error_pct=double.expected_error_pct,
        expected_error=double.expected_error,
        derivation=double.derivation,
        tolerance_pct=tol,
    )
    ctx.expect(f"the forecast read the run's batch ({b})", double.measured_config.get("batch_size") == b)
    ctx.expect(
        f"the forecast at B is within {tol:g} % of the measured step peak at B",
        within(same.total_bytes, measured[b]["step_peak"], tol),
    )
    ctx.expect(
        f"the forecast at 2B is within {tol:g} % of the measured step peak at 2B",
        within(double.total_bytes, measured[2 * b]["step_peak"], tol),
    )
