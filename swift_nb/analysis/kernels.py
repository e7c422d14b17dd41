"""How well a step's kernels fill the GPU, from the trace alone, on any NVIDIA GPU.

"GPU utilisation" (NVML's, and the device's busy share) is the time some kernel runs: a
loop of tiny kernels on one SM reads 100 %. Kineto records each kernel's launch beside its
time: ``est. achieved occupancy %`` (the share of the SMs' warp slots its blocks could
fill) and ``blocks per SM`` (its grid over the device's SMs: below 1, some SMs get no
block at all). Weighted by each kernel's time, per profiler step:

- ``occupancy_pct``: the kernel-time-weighted achieved occupancy (kernels that record it);
- ``under_filled_share``: the share of kernel time in kernels launching fewer blocks than
  the device has SMs;
- ``tensor_core_gemm_share``: the share of GEMM time (``trace_names.kernel_kind`` ``gemm``)
  in kernels that are not CUDA-core fp32 GEMMs (``trace_names.SIMT_SGEMM``: cuBLAS's
  ``*_sgemm`` kernels; the others, ``xmma``/``s16816``/``tensorop``/``nvjet``/``wgmma`` …,
  run on the tensor cores).

Empty on a trace without kernels (a CPU run).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from swift_nb.analysis.advisor.findings import Finding
from swift_nb.analysis.trace.tables import Trace, cat_in, per_name
from swift_nb.core import trace_names as tn

COLUMNS = ["step", "kernel_s", "occupancy_pct", "under_filled_share", "gemm_s", "tensor_core_gemm_share"]
#: the run summary's keys (over the recorded steps' kernels)
SUMMARY_KEYS = ("kernel_occupancy_pct", "kernel_under_filled_pct", "tensor_core_gemm_pct", "gemm_kernel_pct")


def _kernels(trace: Trace) -> pd.DataFrame:
    ev = trace.events
    is_kernel = (cat_in(ev, "kernel")) & (ev["step"].to_numpy() >= 0)
    gemm = per_name(trace, lambda n: tn.kernel_kind(str(n)) == "gemm")
    simt = per_name(trace, lambda n: tn.SIMT_SGEMM.search(str(n)) is not None)
    k = ev.loc[is_kernel, ["step", "dur_us", "occupancy_pct", "blocks_per_sm"]].copy()
    k["gemm"], k["simt"] = gemm[is_kernel], simt[is_kernel]
    return k


def _fill(k: pd.DataFrame) -> dict[str, float]:
    dur = k["dur_us"].to_numpy(dtype=float)
    occ = k["occupancy_pct"].to_numpy(dtype=float)
    blocks = k["blocks_per_sm"].to_numpy(dtype=float)
    has_occ, has_blocks = ~np.isnan(occ), ~np.isnan(blocks)
    gemm = k["gemm"].to_numpy(dtype=bool)
    gemm_us = float(dur[gemm].sum())
    return {
        "kernel_s": float(dur.sum()) / 1e6,
        "occupancy_pct": float(np.average(occ[has_occ], weights=dur[has_occ]))
        if has_occ.any() and dur[has_occ].sum() > 0
        else np.nan,
        "under_filled_share": float(dur[has_blocks & (blocks < 1)].sum() / dur[has_blocks].sum())
        if has_blocks.any() and dur[has_blocks].sum() > 0
        else np.nan,
        "gemm_s": gemm_us / 1e6,
        "tensor_core_gemm_share": float(dur[gemm & ~k["simt"].to_numpy(dtype=bool)].sum() / gemm_us)
        if gemm_us > 0
        else np.nan,
    }


def kernel_fill(trace: Trace) -> pd.DataFrame:
    """One row per recorded step with kernels (``COLUMNS``; see the module's docstring)."""
    if trace.events.empty or "occupancy_pct" not in trace.events:
        return pd.DataFrame(columns=COLUMNS)
    k = _kernels(trace)
    if k.empty:
        return pd.DataFrame(columns=COLUMNS)
    rows = [{"step": int(step), **_fill(group)} for step, group in k.groupby("step", sort=True)]
    return pd.DataFrame(rows, columns=COLUMNS)


def fill_summary(trace: Trace) -> dict[str, float]:
    """``SUMMARY_KEYS`` over every recorded step's kernels (percentages), those the trace
    can tell; empty on a trace without kernels."""
    if trace.events.empty or "occupancy_pct" not in trace.events:
        return {}
    k = _kernels(trace)
    if k.empty:
        return {}
    f = _fill(k)
    out = {
        "kernel_occupancy_pct": f["occupancy_pct"],
        "kernel_under_filled_pct": 100 * f["under_filled_share"],
        "tensor_core_gemm_pct": 100 * f["tensor_core_gemm_share"],
        "gemm_kernel_pct": 100 * f["gemm_s"] / f["kernel_s"] if f["kernel_s"] > 0 else np.nan,
    }
    return {key: round(v, 1) for key, v in out.items() if np.isfinite(v)}


#: a step whose kernels spend this share of their time on fewer blocks than SMs, or whose
#: kernel-time-weighted occupancy is this low, leaves the GPU's SMs idle while it is "busy"
UNDER_FILLED_SHARE = 0.30
LOW_OCCUPANCY_PCT = 25.0
#: the device busy at least this share of its window: the gap between busy and filled matters
BUSY_PCT = 50.0


def _under_filled_kernels(trace: Trace, n: int = 3) -> list[tuple[str, float]]:
    """The kernels with the most time on fewer blocks than SMs: (short name, seconds)."""
    ev = trace.events
    k = ev[(cat_in(ev, "kernel")) & (ev["step"].to_numpy() >= 0) & (ev["blocks_per_sm"] < 1).to_numpy()]
    top = k.groupby("name")["dur_us"].sum().nlargest(n)
    return [(_short(str(name)), us / 1e6) for name, us in top.items()]


def _short(name: str, limit: int = 60) -> str:
    """A kernel's name without its template arguments and parameters, cut at ``limit``."""
    base = name.split("<", 1)[0].split("(", 1)[0].removeprefix("void ").strip() or name
    return base if len(base) <= limit else base[: limit - 1] + "…"


IDLE_SMS_FIX = (
    "Give each kernel more work: a larger batch or sequence per step (the forecast, "
    "%%swift_profile --forecast, says whether it fits), fused kernels (torch.compile: fewer, larger "
    "kernels), and CUDA graphs (torch.compile(mode='reduce-overhead')) where the step launches many "
    "small ones. Busy time counts any kernel running, however few SMs it uses"
)


def idle_sms_finding(trace: Trace, device: dict) -> Finding | None:
    """ "Busy but idle SMs": the device runs kernels most of its window, but they fill few of
    its SMs (``UNDER_FILLED_SHARE``, ``LOW_OCCUPANCY_PCT``)."""
    idle = device.get("device_idle_pct")
    occupancy, under = device.get("kernel_occupancy_pct"), device.get("kernel_under_filled_pct")
    if idle is None or 100 - float(idle) < BUSY_PCT or (occupancy is None and under is None):
        return None
    low = occupancy is not None and occupancy <= LOW_OCCUPANCY_PCT
    thin = under is not None and under >= 100 * UNDER_FILLED_SHARE
    if not (low or thin):
        return None
    busy = 100 - float(idle)
    kernels = _under_filled_kernels(trace)
    named = "; ".join(f"{name} {s * 1e3:.1f} ms" for name, s in kernels)
    what = []
    if occupancy is not None:
        what.append(f"an achieved occupancy of {occupancy:.0f} %")
    if under is not None:
        what.append(f"{under:.0f} % of kernel time on fewer blocks than the GPU has SMs")
    return Finding(
        id="idle_sms",
        title=f"The GPU is busy {busy:.0f} % of the time, but its kernels fill few of its SMs",
        evidence={
            "device_busy_pct": round(busy, 1),
            "kernel_occupancy_pct": occupancy,
            "kernel_under_filled_pct": under,
            "under_filled_kernels": named or None,
        },
        suggestion=IDLE_SMS_FIX + (f"; the most time under-filled: {named}." if named else "."),
        toggle="torch_compile",
        predicted_effect=(
            "throughput up where the kernels grow: the same busy time does more work once more SMs take part "
            f"({', '.join(what)} now)"
        ),
        formula="occupancy: kernel-time-weighted 'est. achieved occupancy %'; under-filled: kernels whose "
        "'blocks per SM' < 1, by time (Kineto's launch records)",
        severity="warning",
    )
