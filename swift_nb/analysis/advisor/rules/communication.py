"""Exposed communication: gradient synchronisation no compute hides."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from swift_nb.analysis.advisor import frameworks
from swift_nb.analysis.advisor.evidence import Evidence, Thresholds
from swift_nb.analysis.advisor.findings import Finding
from swift_nb.analysis.advisor.frameworks import Recorded
from swift_nb.analysis.advisor.words import pct
from swift_nb.core.units import fmt_bytes


def _grad_bytes(ev: Evidence, context: Mapping[str, Any]) -> tuple[float, str]:
    """Gradient bytes synchronised per step: the all-reduce payload measured in the trace
    (DDP), else the parameters × their element size."""
    comm = ev.comm
    if comm is not None and len(comm):
        ar = comm[comm["kind"] == "all_reduce"]["bytes_per_step"].sum()
        if ar > 0:
            return float(ar), "all-reduce payload in the trace"
        rs = comm[comm["kind"] == "reduce_scatter"]["bytes_per_step"].sum()
        if rs > 0:
            return float(rs), "reduce-scatter payload in the trace"
    params = float(context.get("params") or 0)
    size = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}.get(str(context.get("dtype")), 4)
    return params * size, "parameters × element size"


def rule(ev: Evidence, th: Thresholds, context: Mapping[str, Any]) -> Finding | None:
    share = ev.exposed_comm
    if share < th.comm_share:
        return None
    p = max(ev.world_size, 2)
    grad, grad_source = _grad_bytes(ev, context)
    ring = (p - 1) / p
    now = 2 * ring * grad  # DDP's ring all-reduce of the gradients, each rank sends this
    # a run in 16 bits already: bf16 (a policy, a hook) halves nothing of what it sends
    sixteen = str(context.get("dtype")) in ("bfloat16", "float16")
    fsdp_bf16 = 3 * ring * grad / (1 if sixteen else 2)  # all-gather (forward, backward) + reduce-scatter
    bf16 = now / 2
    bucket_mb = 25
    evidence = {
        "exposed_comm_pct": pct(share),
        "exposed_comm_s_per_step": round(share * ev.step_s, 6),
        "collective_pct": pct(ev.collective_share),
        "world_size": ev.world_size,
        "gradient_bytes": grad,
        "gradient_bytes_from": grad_source,
        "allreduce_wire_bytes_per_step": now,
    }
    framework = frameworks.phrased(context, fix)
    lead = f". {framework} In a loop of your own: " if framework else ": "
    if ev.comm is not None and len(ev.comm):
        evidence["measured_wire_bytes_per_step"] = float(ev.comm["wire_bytes_per_step"].sum())
    policy = (
        ""
        if sixteen
        else " with bf16 mixed precision (MixedPrecisionPolicy(param_dtype=torch.bfloat16, "
        "reduce_dtype=torch.bfloat16))"
    )
    fixes = [
        f"FSDP (fully_shard){policy}: ≈ {fmt_bytes(fsdp_bf16)} sent per rank and step instead of "
        f"{fmt_bytes(now)} ({pct(fsdp_bf16 / now - 1) if now else 0:+} %), and parameters, gradients and "
        "optimizer state sharded P ways",
        *(
            []
            if sixteen
            else [
                "or keep DDP and halve the bytes with a bf16 gradient hook "
                f"(ddp.register_comm_hook(None, bf16_compress_hook)): ≈ {fmt_bytes(bf16)} per step"
            ]
        ),
        f"DDP(bucket_cap_mb=…): the same {fmt_bytes(now)} in fewer, larger messages "
        f"(≈ {max(1, math.ceil(grad / (bucket_mb * 2**20)))} all-reduces of ≤ {bucket_mb} MB now; "
        "raise it when many small buckets each pay the latency)",
        "gradient accumulation with ddp.no_sync() on all but the last of k micro-batches: "
        f"{fmt_bytes(now)} per optimizer step instead of per micro-batch (÷k per sample)",
        f"DDP(gradient_as_bucket_view=True): bytes unchanged, saves one {fmt_bytes(grad)} gradient copy "
        "and the copy into the buckets",
        "with FSDP, prefetch the next block's all-gather while this one computes "
        "(module.set_modules_to_forward_prefetch / set_modules_to_backward_prefetch on fully_shard'ed blocks) "
        "so that communication hides behind compute",
    ]
    of = "the GPU's window" if ev.device is not None else "each step"
    return Finding(
        id="communication",
        title=f"Exposed communication takes {pct(share)} % of {of}",
        evidence=evidence,
        suggestion=f"Reduce and overlap gradient synchronisation{lead}" + "; ".join(fixes) + ".",
        predicted_effect=(
            f"communicated bytes per step {fmt_bytes(now)} → {fmt_bytes(fsdp_bf16)} (FSDP)"
            if sixteen
            else f"communicated bytes per step {fmt_bytes(now)} → {fmt_bytes(fsdp_bf16)} (FSDP + bf16) or "
            f"{fmt_bytes(bf16)} (bf16 hook); step time ≈ {ev.step_s * (1 - share / 2):.4f} s with half the bytes"
        ),
        formula=(
            "DDP ring all-reduce: 2·(P−1)/P × G bytes per rank; FSDP: all-gather twice + reduce-scatter, "
            f"3·(P−1)/P × N × 2 bytes{'' if sixteen else ' in bf16'}; t_comm' ≈ t_comm × bytes'/bytes"
        ),
        time_cut=None if sixteen else share / 2,
        severity="critical" if share >= 0.5 else "warning",
    )


def fix(rec: Recorded) -> str | None:
    if not rec.is_trainer:
        accumulation = rec.accumulation
        return (
            f"With accelerate: {frameworks.call('Accelerator', gradient_accumulation_steps=2 * accumulation)} (now "
            f"{accumulation}) inside `with accelerator.accumulate(model):` synchronises once per "
            f"{2 * accumulation} micro-batches."
        )
    accumulation = rec.accumulation
    if rec.is_lightning:
        tail = (
            "Trainer(strategy=DDPStrategy(bucket_cap_mb=…)) sets the bucket size, and strategy='fsdp' with "
            "precision='bf16-mixed' shards parameters, gradients and optimizer state."
        )
    else:
        tail = (
            "ddp_bucket_cap_mb=… sets the bucket size, and fsdp='full_shard' with bf16=True shards parameters, "
            "gradients and optimizer state."
        )
    return (
        f"The Trainer owns the DDP wrapper: {frameworks.set_arguments(rec, gradient_accumulation_steps=2 * accumulation)} "
        f"synchronises the gradients once per {2 * accumulation} micro-batches (the Trainer skips the "
        f"all-reduce on the others), {tail}"
    )
