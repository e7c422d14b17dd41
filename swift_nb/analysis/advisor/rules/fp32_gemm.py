"""fp32 GEMMs on the CUDA cores: the tensor cores (TF32, bf16) multiply several times faster."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from swift_nb.analysis.advisor.evidence import Evidence, Thresholds
from swift_nb.analysis.advisor.findings import Finding
from swift_nb.analysis.advisor.words import pct
from swift_nb.core.units import fmt_seconds

#: how much faster the slowest tensor-core path (TF32) multiplies than fp32 on CUDA cores,
#: at the least: NVIDIA's A100 and H100 datasheets give 8× and more for dense TF32 vs FP32
TENSOR_CORE_SPEEDUP = 2.0


def rule(ev: Evidence, th: Thresholds, context: Mapping[str, Any]) -> Finding | None:
    d = ev.device
    if d is None or not d.window_s:
        return None
    share = d.simt_sgemm_s / d.window_s
    if share < th.min_part_share:
        return None
    saved = d.simt_sgemm_s * (1 - 1 / TENSOR_CORE_SPEEDUP)
    return Finding(
        id="fp32_gemm",
        title=f"fp32 matrix multiplies on the CUDA cores take {pct(share)} % of the GPU's window",
        evidence={
            "simt_sgemm_s": round(d.simt_sgemm_s, 6),
            "gemm_s": round(d.gemm_s, 6),
            "window_s": round(d.window_s, 6),
            "simt_sgemm_pct_of_gemm": pct(d.simt_sgemm_s / d.gemm_s) if d.gemm_s else None,
        },
        suggestion=(
            "Let the tensor cores multiply: torch.set_float32_matmul_precision('high') (TF32 on Ampere and "
            "newer; torch.backends.cudnn.allow_tf32 for convolutions), or run the forward under bf16 "
            "autocast (fp16 on Volta) — try it without editing the cell: %%swift_profile --compare bf16_autocast"
        ),
        toggle="bf16_autocast",
        predicted_effect=(
            f"≈ {fmt_seconds(saved)} less GPU time in the window (−{pct(saved / d.window_s)} %), at least: "
            f"the sgemm kernels' {fmt_seconds(d.simt_sgemm_s)} at {TENSOR_CORE_SPEEDUP:g}× or more"
        ),
        formula="t_gemm' ≤ t_sgemm / k, k ≥ 2 for TF32 or bf16 on tensor cores (datasheet ratios are 8–16×)",
        time_cut=saved / d.window_s,
        severity="info",
    )
