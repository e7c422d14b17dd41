"""The ``memory_kit`` check; ``check``'s docstring says what it runs and tests."""

from __future__ import annotations

import importlib.util
from typing import Any

from ..common import Ctx, apart_pct, device_memory_bytes, mib, step_peak, within

TITLE = "optim_8bit, activation_offload, fp8 and regional_compile against the forecast, same losses"


def check(ctx: Ctx) -> None:
    """The quickstart GPT (eager attention, AdamW) profiled plain and with each toggle of the
    memory kit that runs here: ``optim_8bit`` (CPU and CUDA), ``activation_offload`` (CUDA),
    ``fp8`` (CUDA of capability ≥ 8.9 with torchao installed), ``regional_compile``. Each
    memory toggle's step peak against ``swift_nb.forecast`` of the plain run with it; the
    first step's loss against the plain run's (exact-math toggles: 1e-4 relative; fp8: 5e-2);
    optim_8bit's state at most 0.3× of fp32 AdamW's; regional_compile's compile time against
    whole-model torch_compile's. Off CUDA, activation_offload and fp8 must be refused."""
    from swift_nb import toggles as toggle_registry
    from swift_nb.core.errors import ConfigError

    found = _measured(ctx, _variants(ctx))
    ctx.details.update(found)
    tol = 10.0 if ctx.cuda else 15.0
    for name in ("optim_8bit", "activation_offload"):
        if name in found:
            ctx.expect(
                f"{name}: the peak is within {tol:g} % of the forecast's",
                within(found[name]["predicted_mib"], found[name]["step_peak_mib"], tol),
            )
    for name in ("activation_offload", "torch_compile", "regional_compile"):
        if name in found:
            ctx.expect(
                f"{name}: the first step's loss is the plain run's (1e-4)",
                found[name]["loss_rel_diff"] <= 1e-4,
            )
    if "fp8" in found:
        ctx.expect(
            "fp8: the first step's loss is within 5e-2 of the plain run's",
            found["fp8"]["loss_rel_diff"] <= 5e-2,
        )
    details = found["optim_8bit"]["toggle_report"][0]["details"]
    ctx.expect(
        "optim_8bit: its state is the predicted layout (8-bit moments, fp32 below 4096 elements)",
        details.get("optimizer_state_bytes_measured") == details.get("optimizer_state_bytes_after"),
    )
    if ctx.cuda:  # the smoke's tiny tensors are mostly under 4096 elements: fp32 state
        ctx.expect(
            "optim_8bit: its state is at most 0.3x fp32 AdamW's",
            (found["optim_8bit"]["optimizer_state_mib"] or 0)
            <= 0.3 * (found["plain"]["optimizer_state_mib"] or 0),
        )
    blocks = found["regional_compile"]["toggle_report"][0]["details"].get("compiled_blocks", 0)
    ctx.expect("regional_compile compiles every repeated block", blocks == ctx.config().n_layer)
    if ctx.cuda:  # Inductor's compile time; the smoke's aot_eager on a tiny model says nothing of it
        ctx.expect(
            "regional_compile compiles in at most 0.6x the whole model's time",
            (found["regional_compile"]["compile_s"] or 0) <= 0.6 * (found["torch_compile"]["compile_s"] or 0),
        )
    if not ctx.cuda:
        for name in ("activation_offload", "fp8"):
            try:
                toggle_registry.get(name)
                refused = False
            except ConfigError as e:
                refused = "CUDA" in str(e)
            ctx.expect(f"{name} is refused off CUDA, naming CUDA", refused)


def _variants(ctx: Ctx) -> dict[str, list[str]]:
    """The toggles this machine runs, by variant name."""
    import torch

    variants: dict[str, list[str]] = {"plain": [], "optim_8bit": ["optim_8bit"]}
    if ctx.cuda:
        variants["activation_offload"] = ["activation_offload"]
        if torch.cuda.get_device_capability() >= (8, 9) and importlib.util.find_spec("torchao"):
            variants["fp8"] = ["fp8"]
    variants["torch_compile"] = ["torch_compile" if ctx.cuda else "torch_compile:backend=aot_eager"]
    variants["regional_compile"] = ["regional_compile" if ctx.cuda else "regional_compile:backend=aot_eager"]
    return variants


def _measured(ctx: Ctx, variants: dict[str, list[str]]) -> dict[str, Any]:
    """Each variant profiled: its first loss against the plain run's, its peak, its state,
    its compile time, and for a memory toggle the forecast of the plain run with it."""
    import swift_nb

    runs, losses = {}, {}
    for name, toggles in variants.items():
        runs[name], losses[name] = _profiled(ctx, name, toggles)
    plain = runs["plain"]
    capacity = device_memory_bytes(ctx)
    found: dict[str, Any] = {}
    for name, run in runs.items():
        row: dict[str, Any] = {
            "run": str(run.path),
            "first_loss": losses[name][0],
            "loss_rel_diff": abs(losses[name][0] - losses["plain"][0]) / abs(losses["plain"][0]),
            "step_peak_mib": mib(step_peak(run)),
            "optimizer_state_mib": mib(
                (run.summary.get("memory_categories_at_peak") or {}).get("optimizer_state")
            ),
            "compile_s": run.summary.get("compile_s"),
            "toggle_report": run.context.get("toggles"),
        }
        if name in ("optim_8bit", "activation_offload", "fp8"):
            predicted = swift_nb.forecast(plain, capacity, toggles=variants[name]).total_bytes
            row.update(predicted_mib=mib(predicted), error_pct=apart_pct(predicted, step_peak(run)))
        found[name] = row
    return found


def _profiled(ctx: Ctx, name: str, toggles: list[str]):
    import torch

    cfg = ctx.config(attn_impl="eager")
    model, opt = ctx.model_and_optimizer(cfg)
    x, y = ctx.batch(cfg, ctx.sizes.batch)
    losses: list[float] = []

    def cell() -> None:
        for _ in range(ctx.sizes.steps):
            loss = model(x, y)
            losses.append(loss.item())
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

    torch._dynamo.reset()  # each compile variant pays its own compiling
    run = ctx.profiled(name, cell, toggles=toggles, namespace={"model": model, "opt": opt})
    return run, losses
