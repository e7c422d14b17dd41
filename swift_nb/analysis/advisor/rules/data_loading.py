"""Data loading: the step waits for its batches, and the loading is real work that worker
processes can take off the step."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from swift_nb.analysis.advisor import frameworks
from swift_nb.analysis.advisor.evidence import Evidence, Thresholds
from swift_nb.analysis.advisor.findings import Finding
from swift_nb.analysis.advisor.frameworks import Recorded
from swift_nb.analysis.advisor.verdict import slow_loading
from swift_nb.analysis.advisor.words import loader_evidence, ms, pct, per_sample


def rule(ev: Evidence, th: Thresholds, context: Mapping[str, Any]) -> Finding | None:
    if not slow_loading(ev, th):
        return None
    share, ld = ev.shares["data"], ev.loader
    if ld.in_workers:
        diagnosis = (
            f"The batches already come from {ld.where()} and the step still waits {ms(ld.data_s)} per step"
            f"{per_sample(ld)} for the next one ({ms(ld.ops_s)} of it in torch ops in the training process, "
            "the rest waiting on the workers' queue): the workers do not keep up."
        )
        change = (
            "Raise num_workers (up to the free cores) and prefetch_factor, keep them alive with "
            "persistent_workers=True (starting them counts in the first steps otherwise), and make the "
            "per-sample work cheaper (decode or tokenise once and cache the result"
            + (", move tensor transforms to the GPU" if ev.tensors_on == "cuda" else "")
            + "). If the samples are tensors already in memory, num_workers=0 can be faster: every "
            "batch crosses a process boundary."
        )
    else:
        diagnosis = (
            f"Loading is real work here, more than the DataLoader's own per-batch cost (under "
            f"{ms(th.data_min_s)}): {ms(ld.data_s)} per step{per_sample(ld)} in the training process, "
            f"{ms(ld.ops_s)} in torch ops (indexing, collate, tensor transforms) and {ms(ld.python_s)} in "
            "Python (__getitem__, decoding, transforms, I/O)."
        )
        pin = ", pin_memory=True" if ev.tensors_on == "cuda" else ""
        change = (
            "Load batches in worker processes and keep them alive: DataLoader(num_workers=4, "
            f"persistent_workers=True, prefetch_factor=4{pin}); move per-sample work out of collate_fn."
        )
    suggestion = f"{diagnosis} {frameworks.phrased(context, fix) or change}"
    return Finding(
        id="data_loading",
        title=f"Data loading takes {pct(share)} % of each step: {ms(ld.data_s)} per step",
        evidence=loader_evidence(ev),
        suggestion=suggestion,
        predicted_effect=(
            f"step time ≈ {ev.step_s - ld.data_s:.4f} s (−{pct(share)} %) once loading overlaps compute"
        ),
        formula="t_step' ≈ t_step − t_data (workers prepare the next batch while this one trains)",
        time_cut=share,
        severity="critical" if share >= 0.5 else "warning",
    )


def fix(rec: Recorded) -> str | None:
    if not rec.is_trainer:
        return None
    workers = int(rec.get("dataloader_num_workers", 0))
    fields: dict[str, Any] = {"dataloader_num_workers": 2 * workers if workers else 4}
    if not rec.get("dataloader_persistent_workers", False):
        fields["dataloader_persistent_workers"] = True
    if int(rec.get("dataloader_prefetch_factor", 2)) < 4:
        fields["dataloader_prefetch_factor"] = 4
    return (
        f"The Trainer builds this DataLoader from its arguments: {frameworks.set_arguments(rec, **fields)}; move per-sample work "
        "(tokenising, decoding) out of the dataset's __getitem__ and the data collator, e.g. tokenise the dataset "
        "once with dataset.map(..., batched=True)."
    )
