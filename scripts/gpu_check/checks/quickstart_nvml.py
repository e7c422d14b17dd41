"""The ``quickstart_nvml`` check; ``check``'s docstring says what it runs and tests."""

from __future__ import annotations

import re

from ..common import Ctx, mib

TITLE = "the quickstart's profiled cell on CUDA, with NVML series in run.samples"


def check(ctx: Ctx) -> None:
    """The quickstart notebook's profiled cell (its model, loader and loop; the batch moved
    to the GPU) with NVML's series in ``run.samples``."""
    from swift_nb.demo import make_loader

    n = ctx.sizes.quickstart_steps
    cfg = ctx.config()
    model, opt = ctx.model_and_optimizer(cfg)
    loader = make_loader(cfg, batch_size=ctx.sizes.batch, n_samples=ctx.sizes.batch * n)
    dev = ctx.device

    def cell() -> None:
        for x, y in loader:
            x, y = x.to(dev), y.to(dev)
            loss = model(x, y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        print(f"final loss {loss.item():.3f}")

    run = ctx.profiled("quickstart", cell, interval_ms=50, report=True)
    samples = run.samples

    def columns(pattern: str) -> list[str]:
        return [c for c in samples.columns if re.fullmatch(pattern, c)]

    util, used = columns(r"gpu\d+_util_pct"), columns(r"gpu\d+_mem_used_bytes")
    allocated = columns(r"cuda\d+_allocated_bytes")
    filled = {c: int(samples[c].notna().sum()) for c in util + used + allocated}
    ctx.details.update(
        run=str(run.path),
        status=run.status,
        steps=len(run.steps),
        samples=len(samples),
        sample_columns=list(samples.columns),
        values_per_column=filled,
        util_pct_max=max((float(samples[c].max()) for c in util), default=None),
        util_pct_mean=max((float(samples[c].mean()) for c in util), default=None),
        mem_used_max_mib=mib(max((float(samples[c].max()) for c in used), default=None)),
        summary={
            k: run.summary.get(k) for k in ("steps", "step_time_median_s", "mean_util_pct", "util_source")
        },
        notes=run.notes,
    )
    ctx.expect("the run ended ok", run.status == "ok")
    ctx.expect(f"every one of the {n} training steps is in run.steps", len(run.steps) >= n)
    ctx.expect(
        "run.samples has NVML's GPU utilisation (gpuN_util_pct) with values", any(filled[c] for c in util)
    )
    ctx.expect(
        "run.samples has NVML's GPU memory (gpuN_mem_used_bytes) with values", any(filled[c] for c in used)
    )
    ctx.expect(
        "run.samples has the CUDA allocator's bytes (cudaN_allocated_bytes)",
        any(filled[c] for c in allocated),
    )
    ctx.expect(
        "the trace and report.html were written",
        run.trace_path is not None and run.trace_path.exists() and (run.path / "report.html").exists(),
    )
