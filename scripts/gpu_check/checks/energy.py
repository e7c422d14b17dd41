"""The ``energy`` check; ``check``'s docstring says what it runs and tests."""

from __future__ import annotations

import re

from ..common import Ctx, train, within

TITLE = "energy per step from NVML's total energy counter, the power within the card's limit"


def check(ctx: Ctx) -> None:
    """Energy per step from NVML's total energy counter: gpuN_energy_j in run.samples, the
    summary's energy_j, energy_per_step_j and avg_power_w, the power within the card's
    enforced limit, and the counter's joules against the sampled power integrated."""
    import pynvml
    import torch

    from swift_nb.capture.resources.sampler import _nvml_handle
    from swift_nb.demo import GPT, GPTConfig

    torch.manual_seed(0)
    cfg = GPTConfig(**ctx.sizes.cost_model, attn_impl="sdpa")
    model = GPT(cfg).to(ctx.device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    x, y = ctx.batch(cfg, ctx.sizes.cost_batch)
    train(model, opt, x, y, 5)
    run = ctx.profiled(
        "energy", lambda: train(model, opt, x, y, ctx.sizes.energy_steps), interval_ms=50, price_per_kwh=0.2
    )
    pynvml.nvmlInit()
    try:
        limit_w = pynvml.nvmlDeviceGetEnforcedPowerLimit(_nvml_handle(pynvml, ctx.device.index or 0)) / 1000.0
    finally:
        pynvml.nvmlShutdown()
    s, samples = run.summary, run.samples
    energy_cols = [c for c in samples.columns if re.fullmatch(r"gpu\d+_energy_j", c)]
    power_cols = [c.replace("_energy_j", "_power_w") for c in energy_cols]
    t = samples["t_s"].astype(float)
    integrated = sum(
        float(
            (
                (samples[p].iloc[1:].to_numpy() + samples[p].iloc[:-1].to_numpy())
                / 2
                * t.diff().iloc[1:].to_numpy()
            ).sum()
        )
        for p in power_cols
    )
    ctx.details.update(
        run=str(run.path),
        steps=len(run.steps),
        energy_columns=energy_cols,
        energy_j=s.get("energy_j"),
        energy_per_step_j=s.get("energy_per_step_j"),
        avg_power_w=s.get("avg_power_w"),
        power_w_max=max((float(samples[p].max()) for p in power_cols), default=None),
        power_limit_w=limit_w,
        power_integrated_j=integrated,
        energy_cost_usd=s.get("energy_cost_usd"),
        notes=[n for n in run.notes if "energy" in n or "RAPL" in n],
    )
    ctx.expect("run.samples has gpuN_energy_j", bool(energy_cols))
    ctx.expect(
        "each GPU's energy only grows", all(samples[c].dropna().is_monotonic_increasing for c in energy_cols)
    )
    ctx.expect("energy per step > 0", (s.get("energy_per_step_j") or 0) > 0)
    ctx.expect(
        "the run's energy > 0 and priced",
        (s.get("energy_j") or 0) > 0 and s.get("energy_cost_usd") is not None,
    )
    ctx.expect(
        "the average power is within the card's enforced limit",
        0 < (s.get("avg_power_w") or 0) <= limit_w * 1.02,
    )
    ctx.expect(
        "NVML's counter is read (no power integration note)",
        not any("no total energy counter" in n for n in run.notes),
    )
    ctx.expect(
        "the counter's joules are within 25 % of the sampled power integrated",
        within(s.get("energy_j"), integrated, 25.0),
    )
