"""Overhead: many tiny operators (launch and Python overhead set the step time), or a
tiny step whose fixed per-step costs dominate it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from swift_nb.analysis.advisor import frameworks
from swift_nb.analysis.advisor.evidence import Evidence, Thresholds
from swift_nb.analysis.advisor.findings import Finding
from swift_nb.analysis.advisor.frameworks import Recorded
from swift_nb.analysis.advisor.verdict import overhead, tiny_step
from swift_nb.analysis.advisor.words import loader_evidence, ms, pct, per_sample

#: the toggle that compiles the loop (an eager loop only: a compiled one already is)
COMPILE = "torch_compile"


def fuse(ev: Evidence) -> str:
    """Fewer, larger operators, in the run's terms: torch.compile for an eager loop, CUDA
    graphs where the step runs on a GPU."""
    if ev.compiled is not None:
        return "use fewer Python-level ops outside the compiled code"
    graphs = (
        ", and capture the step with CUDA graphs (torch.compile(model, mode='reduce-overhead'))"
        if ev.tensors_on == "cuda"
        else ""
    )
    return f"use fewer Python-level ops (fuse them with torch.compile(model)){graphs}"


def rule(ev: Evidence, th: Thresholds, context: Mapping[str, Any]) -> Finding | None:
    if ev.device is not None:
        return _launch_gaps(ev, th, context)
    tiny = tiny_step(ev, th)
    if not (tiny or overhead(ev, th)):
        return None
    evidence = {
        "ops_per_step": round(ev.ops_per_step),
        "median_op_us": round(ev.median_op_us, 2),
        "heavy_op_pct": pct(ev.heavy_op_share),
        "outside_ops_pct": pct(ev.shares["untraced"]),
    }
    if not tiny:
        # the step's time outside substantial operators, less what loading and communication
        # hold: their own findings claim that time
        light = max(0.0, 1.0 - ev.heavy_op_share - ev.shares["data"] - ev.exposed_comm_share)
        if light < th.min_part_share:
            return None
        evidence["overhead_pct"] = pct(light)
        return Finding(
            id="overhead",
            title=f"Many tiny operators: {round(ev.ops_per_step)} per step, median {ev.median_op_us:.1f} µs",
            evidence=evidence,
            suggestion="The step is dominated by launch and Python overhead, not math: "
            + (frameworks.phrased(context, fix) or f"raise the batch size, {fuse(ev)}."),
            toggle=COMPILE if ev.compiled is None else None,
            predicted_effect=(
                f"up to −{pct(light)} % step time (the part not spent in substantial operators, loading or "
                "communication)"
                + (", with torch.compile fusing the small ops" if ev.compiled is None else "")
            ),
            formula=(
                "t_step' ≈ t_step × (heavy_op_share + data_share + comm_share) once fused; a k× larger batch "
                "costs ≈ the same overhead per step"
            ),
            time_cut=light,
            time_cut_bound=True,
        )
    ld = ev.loader
    workers = (
        f" Its {ld.where()} already cost more than they save (every batch is pickled through a queue): "
        "num_workers=0 loads it in the training process without that IPC."
        if ld.in_workers
        else ""
    )
    fixed = min(1.0, ev.shares["data"] + ev.shares["untraced"])
    return Finding(
        id="overhead",
        title=(
            f"The step is tiny: {ms(ev.step_s)} per step, so fixed per-step costs dominate it "
            f"(loading {ms(ld.data_s)}, Python between ops {pct(ev.shares['untraced'])} %)"
        ),
        evidence={**loader_evidence(ev), **evidence},
        suggestion=(
            f"The data-loading share ({pct(ev.shares['data'])} %) is high only because the step is tiny: "
            f"loading takes {ms(ld.data_s)} per step{per_sample(ld)} — the time of a few Python calls (the "
            "DataLoader's own per-batch work: sampler, indexing, collate), not slow collate, transforms or I/O. "
            "More workers would add IPC cost, not save time."
            + workers
            + " Make the step larger instead: "
            + (
                frameworks.phrased(context, fix_tiny_step)
                or f"raise the batch size so each step's fixed costs are shared by more samples, {fuse(ev)}; for "
                "tensors already in memory, index a whole batch at once (x[idx]) instead of one __getitem__ "
                "per sample."
            )
        ),
        predicted_effect=(
            f"up to −{pct(fixed)} % time per sample: the part of the step that is loading and Python between "
            "ops rather than the model's operators"
        ),
        formula="t_sample' ≥ (t_step − t_data − t_untraced) / B: a larger batch or fused ops shrink only the overhead",
        time_cut=fixed,
        time_cut_bound=True,
        severity="info",
    )


def fix(rec: Recorded) -> str | None:
    """Fewer Python-level ops and larger micro-batches."""
    if rec.is_trainer:
        fields: dict[str, Any] = {}
        if not rec.get("torch_compile", False):
            fields["torch_compile"] = True
        fields.update(frameworks.same_samples_larger_batch(rec))
        compiled = "torch.compile fuses the model's small ops; " if "torch_compile" in fields else ""
        return f"{frameworks.set_arguments(rec, **fields)}: {compiled}larger micro-batches share each one's fixed cost {frameworks.samples_text(rec)}."
    parts = []
    if str(rec.get("dynamo_backend", "NO")).upper() in ("NO", "NONE"):
        parts.append(
            f"compile the prepared model with {frameworks.call('Accelerator', dynamo_backend='inductor')} ({rec.name} has "
            f"dynamo_backend={rec.get('dynamo_backend', 'NO')!r})"
        )
    accumulation = rec.accumulation
    batch = "raise the DataLoader's batch_size"
    if accumulation >= 2:
        batch += (
            f" and lower {frameworks.call('Accelerator', gradient_accumulation_steps=accumulation // 2)} "
            f"(now {accumulation}) to keep the samples per optimizer step"
        )
    parts.append(batch)
    return "; ".join(parts) + "."


def fix_tiny_step(rec: Recorded) -> str | None:
    """A tiny step: larger micro-batches, and no worker processes for cheap loading."""
    if not rec.is_trainer:
        return None
    fields: dict[str, Any] = dict(frameworks.same_samples_larger_batch(rec))
    if int(rec.get("dataloader_num_workers", 0)) > 0:
        fields["dataloader_num_workers"] = 0
    if not rec.get("torch_compile", False):
        fields["torch_compile"] = True
    return f"{frameworks.set_arguments(rec, **fields)}, so each step's fixed costs are shared by more samples {frameworks.samples_text(rec)}."


def _launch_gaps(ev: Evidence, th: Thresholds, context: Mapping[str, Any]) -> Finding | None:
    """A GPU run: the GPU idles while the host has not launched its next work."""
    d = ev.device
    assert d is not None
    gaps = d.idle.get("host_bound_s", 0.0) + d.idle.get("other_s", 0.0)
    share = gaps / d.window_s if d.window_s else 0.0
    if share < th.min_part_share:
        return None
    per_step = d.kernels / d.steps
    small = per_step >= th.small_kernels_per_step and d.kernel_median_us < th.small_kernel_us
    kernels = (
        f" The step launches {per_step:,.0f} kernels of median {d.kernel_median_us:.1f} µs: fuse them "
        "(torch.compile(model)) so that each launch does more work."
        if small
        else ""
    )
    return Finding(
        id="overhead",
        title=f"Host launch gaps: the GPU idles {pct(share)} % of the window waiting for the host",
        evidence={
            "launch_gap_s": round(gaps, 6),
            "window_s": round(d.window_s, 6),
            "launch_gap_pct": pct(share),
            "device_idle_pct": round(d.idle_pct, 1),
            "kernels_per_step": round(per_step, 1),
            "kernel_median_us": round(d.kernel_median_us, 2),
        },
        suggestion=(
            "The host, not the GPU, sets the pace: it has not launched the next work when the GPU is done. "
            + (
                frameworks.phrased(context, fix)
                or "Capture the step with CUDA graphs (torch.compile(model, mode='reduce-overhead')), raise the "
                "batch size so each launch does more work, and keep Python work (logging, metrics) out of the "
                "step."
            )
            + kernels
        ),
        toggle=COMPILE if ev.compiled is None else None,
        predicted_effect=f"up to −{pct(share)} % of the GPU's window: the launch gaps",
        formula="t' ≥ t − t_gaps: CUDA graphs replay the step's launches at once; a k× batch keeps the launches per step",
        time_cut=share,
        time_cut_bound=True,
        severity="critical" if share >= 0.5 else "warning",
    )
