"""The ``import_trace`` check; ``check``'s docstring says what it runs and tests."""

from __future__ import annotations

from ..common import Ctx, train

TITLE = "the run's own trace imported and analyzed: device figures, verdict and findings"


DEVICE_FIGURES = ("device_idle_pct", "device_compute_pct", "device_non_compute_pct")


def check(ctx: Ctx) -> None:
    """A profiled run's own trace imported as a run and analyzed: the device's figures, the
    verdict and the findings, against the captured run's own analysis."""
    import swift_nb
    from swift_nb.analysis import analyze
    from swift_nb.analysis.trace.tables import load_trace

    cfg = ctx.config()
    model, opt = ctx.model_and_optimizer(cfg)
    x, y = ctx.batch(cfg, ctx.sizes.batch)
    run = ctx.profiled("captured", lambda: train(model, opt, x, y, ctx.sizes.steps))
    imported = swift_nb.import_trace(run.trace_path, ctx.runs / "imported", label="imported")
    a, captured = analyze(imported), analyze(run)
    traced = len(load_trace(run).steps)
    ctx.details.update(
        run=str(run.path),
        imported=str(imported.path),
        traced_steps=traced,
        imported_steps=len(imported.steps),
        device=a.device,
        captured_device=captured.device,
        kernel_kinds=a.kernel_kinds.to_dict("records")[:10],
        idle_causes=a.idle_causes.to_dict("records")[:10],
        verdict={"kind": a.verdict.kind, "reason": a.verdict.reason},
        captured_verdict={"kind": captured.verdict.kind, "reason": captured.verdict.reason},
        findings=[{"id": f.id, "title": f.title, "toggle": f.toggle} for f in a.findings],
        captured_findings=[f.id for f in captured.findings],
    )
    ctx.expect("the import holds every traced step", traced > 0 and len(imported.steps) == traced)
    ctx.expect("report.html was written for the import", (imported.path / "report.html").exists())
    if ctx.cuda:
        ctx.expect(
            "analysis.device has the idle, compute and non-compute percentages",
            all(isinstance(a.device.get(k), float) for k in DEVICE_FIGURES),
        )
    ctx.expect(
        "the import's device figures are the captured run's (±0.5 points)",
        all(same_figure(a.device.get(k), captured.device.get(k)) for k in DEVICE_FIGURES),
    )
    ctx.expect("a verdict was drawn", bool(a.verdict.kind and a.verdict.reason))


def same_figure(a: float | None, b: float | None) -> bool:
    return (a is None and b is None) or (a is not None and b is not None and abs(a - b) <= 0.5)
