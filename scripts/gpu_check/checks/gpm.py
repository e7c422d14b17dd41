"""The ``gpm`` check; ``check``'s docstring says what it runs and tests."""

from __future__ import annotations

import re
import time

TITLE = "NVML GPM tells two loops of the same utilisation apart: bf16 GEMMs and tiny element-wise kernels"

STEPS = 12
STEP_S = 0.25  # each step long enough for two GPM windows of 100 ms


def _loop(work) -> None:
    """``STEPS`` steps of ``work`` repeated for ``STEP_S`` each, every step a boundary."""
    import torch

    import swift_nb

    for _ in range(STEPS):
        end = time.perf_counter() + STEP_S
        while time.perf_counter() < end:
            for _ in range(20):
                work()
            torch.cuda.synchronize()
        swift_nb.step()


def _means(run, suffix: str) -> float | None:
    cols = [c for c in run.steps.columns if re.fullmatch(rf"gpu\d+_{suffix}", c)]
    if not cols:
        return None
    values = run.steps[run.steps["trigger"] != "end"][cols].mean(axis=1).dropna()
    return float(values.mean()) if len(values) else None


def check(ctx) -> None:
    """Two loops that NVML's utilisation reads alike (a kernel always running): 8192² bf16
    GEMMs, which should keep the tensor cores ≥ 50 % and the SMs ≥ 80 % active, and
    element-wise adds on 1 024 floats (one block), which should leave the SMs ≤ 20 % active
    at ≥ 80 % utilisation; and each recorded step's GPM means in steps.csv, aligned with the
    steps. Where the GPU has no GPM the check records that, with the note the run gives."""
    import torch

    import swift_nb

    a = torch.randn(8192, 8192, device=ctx.device, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=ctx.device, dtype=torch.bfloat16)
    tiny = torch.zeros(1024, device=ctx.device)
    # one traced step (the tiny loop launches tens of thousands of kernels per step)
    schedule = {"interval_ms": 50, "wait": STEPS - 3, "warmup": 1, "active": 1}
    gemm = ctx.profiled("gpm_gemm", lambda: _loop(lambda: a @ b), **schedule)
    small = ctx.profiled("gpm_tiny", lambda: _loop(lambda: tiny.add_(1.0)), **schedule)
    gpm_notes = [n for n in gemm.notes if "GPM" in n]
    supported = not gpm_notes
    figures = {
        name: {
            key: run.summary.get(key)
            for key in (
                "mean_step_util_pct",
                "mean_sm_active_pct",
                "mean_sm_occupancy_pct",
                "mean_tensor_active_pct",
                "mean_dram_bw_pct",
                "throttled_steps_pct",
                "throttle_reasons",
                "clock_lost_mhz",
            )
        }
        for name, run in (("gemm", gemm), ("tiny", small))
    }
    ctx.details.update(
        gpm_supported=supported,
        device=torch.cuda.get_device_name(ctx.device),
        notes=gpm_notes,
        figures=figures,
        steps_with_sm_active={
            name: int(run.steps.filter(regex=r"^gpu\d+_sm_active_pct$").notna().any(axis=1).sum())
            for name, run in (("gemm", gemm), ("tiny", small))
        },
    )
    ctx.expect("throttle reasons are read", "throttled_steps_pct" in gemm.summary)
    if not supported:
        ctx.expect(
            "no GPM: one note says so, utilisation is still read",
            len(gpm_notes) == 1 and gemm.summary.get("mean_step_util_pct") is not None,
        )
        return
    g, t = figures["gemm"], figures["tiny"]
    ctx.expect("bf16 GEMMs: tensor cores >= 50 % active", (g["mean_tensor_active_pct"] or 0) >= 50)
    ctx.expect("bf16 GEMMs: SMs >= 80 % active", (g["mean_sm_active_pct"] or 0) >= 80)
    ctx.expect("tiny kernels: utilisation >= 80 %", (t["mean_step_util_pct"] or 0) >= 80)
    ctx.expect(
        "tiny kernels: SMs <= 20 % active",
        (t["mean_sm_active_pct"] if t["mean_sm_active_pct"] is not None else 100) <= 20,
    )
    ctx.expect(
        "each recorded step has its GPM means in steps.csv",
        ctx.details["steps_with_sm_active"]["gemm"] >= STEPS - 2
        and _means(gemm, "sm_active_pct") is not None,
    )
    found = {f.id for f in swift_nb.report(small).analysis.findings}
    ctx.details["tiny_findings"] = sorted(found)
    ctx.expect("tiny kernels: the busy-but-idle finding", "idle_sms" in found)
