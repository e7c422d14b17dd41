"""Findings only the GPU's own counters can make (``swift_nb.record.counters``: GPM's SM,
tensor-core, DRAM and PCIe activity per step, and the clocks' throttle reasons).

- ``idle_sms``: utilisation high, SM activity low: the kernels are too small for the card
  (the trace's launch records make the same finding on any NVIDIA GPU: ``analysis.kernels``;
  when both can, one finding carries both evidences);
- ``tensor_cores_idle``: GEMMs take most of the kernel time, the tensor cores idle: fp32
  matmuls, priced as ``fp32_gemm`` prices them (which it joins when it fired);
- ``dram_bound``: DRAM bandwidth near its peak with little tensor work;
- ``throttled``: the power cap or the temperature held the clocks down in many steps;
- ``pcie_saturated``: a step's copies ran the PCIe link near its bandwidth.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from swift_nb.analysis.advisor.findings import Finding
from swift_nb.analysis.advisor.rules.fp32_gemm import TENSOR_CORE_SPEEDUP
from swift_nb.analysis.kernels import IDLE_SMS_FIX
from swift_nb.core.units import fmt_bytes

BUSY_PCT = 80.0  # NVML's utilisation this high …
SM_ACTIVE_LOW_PCT = 50.0  # … with fewer SMs active than this: busy but idle
TENSOR_IDLE_PCT = 10.0  # tensor cores active under this …
GEMM_DOMINANT_PCT = 40.0  # … while GEMMs take this share of the kernel time
DRAM_BOUND_PCT = 70.0  # DRAM bandwidth used this much …
DRAM_TENSOR_LOW_PCT = 20.0  # … with tensor cores under this
THROTTLED_STEPS_PCT = 10.0
PCIE_SATURATED_PCT = 60.0

#: what to do about each limiting reason (``swift_nb.record.counters.REASONS``)
THROTTLE_FIX = {
    "power cap": "the board's power limit holds the clocks: `nvidia-smi -q -d POWER` shows it; "
    "raise it where the host allows (`nvidia-smi -pl`), or ask the provider for a card at its full limit",
    "thermal (software)": "the card is hot: check its cooling and the inlet air (`nvidia-smi -q -d TEMPERATURE`)",
    "thermal (hardware)": "the card hit its hardware thermal limit: a cooling fault; move to another node "
    "and tell the provider",
    "hardware slowdown": "the hardware slowed its clocks (power brake, power supply or temperature): a fault "
    "of the node; move to another one and tell the provider",
    "power brake": "an external power brake held the clocks: the node's power supply; move to another node",
    "sync boost": "sync boost holds every GPU of its group to the slowest one's clock: take this GPU out of "
    "the group, or fix the slowest one",
}


def _pct(x: float) -> str:
    return f"{x:.0f} %"


#: the summary's counters a verdict carries as evidence, under the verdict's names
VERDICT_EVIDENCE = {
    "mean_step_util_pct": "utilisation_pct",
    "mean_sm_active_pct": "sm_active_pct",
    "mean_tensor_active_pct": "tensor_active_pct",
    "mean_dram_bw_pct": "dram_bw_pct",
    "throttled_steps_pct": "throttled_steps_pct",
}


def counter_evidence(summary: Mapping[str, Any]) -> dict[str, float]:
    """What the GPU counted, for the verdict's evidence beside the trace's shares: a
    "compute-bound" step at 31 % SM activity reads differently from one at 95 %."""
    if summary.get("mean_sm_active_pct") is None and summary.get("throttled_steps_pct") is None:
        return {}
    return {
        name: round(float(summary[key]), 1)
        for key, name in VERDICT_EVIDENCE.items()
        if summary.get(key) is not None
    }


def counter_findings(
    summary: Mapping[str, Any], device: Mapping[str, Any], found: list[Finding]
) -> list[Finding]:
    """The counters' new findings for a run whose summary is ``summary`` (``device``: the
    trace's kernel figures, ``analysis.kernels.fill_summary``); the findings already made
    (``found``) that the counters confirm get their evidence added instead."""
    by_id = {f.id: f for f in found}
    out = []
    for make in (_idle_sms, _tensor_cores_idle, _dram_bound, _throttled, _pcie_saturated):
        finding = make(summary, device, by_id)
        if finding is not None:
            out.append(finding)
    return out


def _idle_sms(summary: Mapping[str, Any], device: Mapping[str, Any], by_id: dict) -> Finding | None:
    busy, active = summary.get("mean_step_util_pct"), summary.get("mean_sm_active_pct")
    if busy is None or active is None or busy < BUSY_PCT or active >= SM_ACTIVE_LOW_PCT:
        return None
    counted = {"utilisation_pct": round(busy, 1), "sm_active_pct": round(active, 1)}
    occupancy = summary.get("mean_sm_occupancy_pct")
    if occupancy is not None:
        counted["sm_occupancy_pct"] = round(occupancy, 1)
    if "idle_sms" in by_id:  # the trace said it already: the counters measure it
        by_id["idle_sms"].evidence.update(counted)
        return None
    more = 100.0 / max(active, 1.0)
    return Finding(
        id="idle_sms",
        title=f"The GPU reads {_pct(busy)} utilised, but only {_pct(active)} of its SMs are active",
        evidence=counted,
        suggestion=IDLE_SMS_FIX + ".",
        toggle="torch_compile",
        predicted_effect=(
            f"the same busy time could do up to {more:.1f}× the work with every SM active; how much of that "
            "a change wins depends on how many more SMs its kernels fill"
        ),
        formula="utilisation: NVML's share of time any kernel ran; SM activity: GPM's SM_UTIL over the steps",
        severity="warning",
    )


def _tensor_cores_idle(summary: Mapping[str, Any], device: Mapping[str, Any], by_id: dict) -> Finding | None:
    tensor, gemm = summary.get("mean_tensor_active_pct"), device.get("gemm_kernel_pct")
    if tensor is None or gemm is None or tensor >= TENSOR_IDLE_PCT or gemm < GEMM_DOMINANT_PCT:
        return None
    counted = {"tensor_active_pct": round(tensor, 1), "gemm_kernel_pct": round(gemm, 1)}
    if "fp32_gemm" in by_id:  # the trace named the sgemm kernels and priced them
        by_id["fp32_gemm"].evidence.update(counted)
        return None
    busy = float(summary.get("mean_step_util_pct") or 100.0) / 100.0
    cut = busy * gemm / 100.0 * (1 - 1 / TENSOR_CORE_SPEEDUP)
    return Finding(
        id="tensor_cores_idle",
        title=f"GEMMs take {_pct(gemm)} of the kernel time, yet the tensor cores are active {_pct(tensor)}",
        evidence=counted,
        suggestion=(
            "The matrix multiplies run in fp32 on the CUDA cores: torch.set_float32_matmul_precision('high') "
            "(TF32; torch.backends.cuda.matmul.allow_tf32 = True), or the forward under bf16 autocast — "
            "try it without editing the cell: %%swift_profile --compare bf16_autocast"
        ),
        toggle="bf16_autocast",
        predicted_effect=(
            f"≈ −{100 * cut:.0f} % of the step at least: the GEMMs' {_pct(gemm)} of the kernel time at "
            f"{TENSOR_CORE_SPEEDUP:g}× or more on the tensor cores"
        ),
        formula="cut ≥ busy × gemm share × (1 − 1/k), k ≥ 2 for TF32 or bf16 (datasheet ratios are 8–16×)",
        time_cut=cut,
        time_cut_bound=False,
        severity="warning",
    )


def _dram_bound(summary: Mapping[str, Any], device: Mapping[str, Any], by_id: dict) -> Finding | None:
    dram, tensor = summary.get("mean_dram_bw_pct"), summary.get("mean_tensor_active_pct")
    if dram is None or dram < DRAM_BOUND_PCT or (tensor is not None and tensor >= DRAM_TENSOR_LOW_PCT):
        return None
    return Finding(
        id="dram_bound",
        title=f"The step is memory-bandwidth bound: DRAM bandwidth {_pct(dram)} used"
        + (f", tensor cores {_pct(tensor)} active" if tensor is not None else ""),
        evidence={
            "dram_bw_pct": round(dram, 1),
            "tensor_active_pct": None if tensor is None else round(tensor, 1),
        },
        suggestion=(
            "The kernels move more bytes than they compute on: fuse them (torch.compile fuses the element-wise "
            "chains: normalisations, activations, the optimizer's update with fused=True or foreach), and raise "
            "the arithmetic intensity (a larger batch or sequence per step, where memory allows)"
        ),
        toggle="torch_compile",
        predicted_effect="less DRAM traffic per step: each fused chain reads and writes its tensors once",
        formula="GPM's DRAM_BW_UTIL and ANY_TENSOR_UTIL over the steps",
        severity="info",
    )


def _throttled(summary: Mapping[str, Any], device: Mapping[str, Any], by_id: dict) -> Finding | None:
    share = summary.get("throttled_steps_pct")
    if share is None or share < THROTTLED_STEPS_PCT:
        return None
    reasons = list(summary.get("throttle_reasons") or [])
    lost, top = summary.get("clock_lost_mhz"), summary.get("clock_max_mhz")
    what = " and ".join(reasons) or "a limiting reason"
    fixes = [THROTTLE_FIX[r] for r in reasons if r in THROTTLE_FIX]
    cut = share / 100.0 * lost / top if lost and top else None
    return Finding(
        id="throttled",
        title=f"The {what} held the GPU's clocks down in {_pct(share)} of the steps"
        + (f", {lost:.0f} MHz below their maximum" if lost else ""),
        evidence={
            "throttled_steps_pct": round(share, 1),
            "reasons": ", ".join(reasons) or None,
            "clock_lost_mhz": None if lost is None else round(lost),
            "clock_max_mhz": None if top is None else round(top),
        },
        suggestion="; ".join(fixes) + "."
        if fixes
        else "See `nvidia-smi -q -d PERFORMANCE` for what holds the clocks.",
        predicted_effect=(
            f"up to −{100 * cut:.0f} % of the step time, if the steps are compute-bound at the clock lost"
            if cut
            else "faster steps once the clocks run at their maximum"
        ),
        formula="cut ≤ throttled share × clock lost / max clock (compute scales with the clock at most)",
        time_cut=cut,
        time_cut_bound=True,
        severity="warning",
    )


def _pcie_saturated(summary: Mapping[str, Any], device: Mapping[str, Any], by_id: dict) -> Finding | None:
    peak, link = summary.get("pcie_peak_pct"), summary.get("pcie_max_bytes_per_s")
    if peak is None or peak < PCIE_SATURATED_PCT:
        return None
    counted = {"pcie_peak_pct": round(peak, 1), "pcie_link_bytes_per_s": link}
    if "pageable_copies" in by_id:  # the trace counted the copies: now their link is measured
        by_id["pageable_copies"].evidence.update(counted)
        return None
    return Finding(
        id="pcie_saturated",
        title=f"The busiest step ran the PCIe link at {_pct(peak)} of its bandwidth"
        + (f" ({fmt_bytes(link)}/s each way)" if link else ""),
        evidence=counted,
        suggestion=(
            "Copy less between host and GPU per step: keep the data, the model and its optimizer state on the "
            "GPU (no CPU offload unless memory needs it), pin the host memory (DataLoader(pin_memory=True)) and "
            "copy with non_blocking=True so the copies overlap the compute"
        ),
        predicted_effect="the copies' time off the step where they stop sharing the link or overlap the compute",
        formula="GPM's PCIE_TX/RX_PER_SEC per step over the link's generation × width",
        severity="info",
    )
