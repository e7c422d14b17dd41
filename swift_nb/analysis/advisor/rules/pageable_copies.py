"""Copies from pageable host memory: the host stages each one, and the GPU waits."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from swift_nb.analysis.advisor.evidence import Evidence, Thresholds
from swift_nb.analysis.advisor.findings import Finding
from swift_nb.analysis.advisor.words import pct
from swift_nb.core.units import fmt_seconds


def rule(ev: Evidence, th: Thresholds, context: Mapping[str, Any]) -> Finding | None:
    d = ev.device
    if d is None or not d.window_s or not d.pageable_copies:
        return None
    held = d.pageable_copy_s + d.idle.get("copy_s", 0.0)
    share = held / d.window_s
    if share < th.min_part_share:
        return None
    return Finding(
        id="pageable_copies",
        title=f"{d.pageable_copies} copies from pageable memory hold the GPU {pct(share)} % of the window",
        evidence={
            "pageable_copies": d.pageable_copies,
            "pageable_copy_s": round(d.pageable_copy_s, 6),
            "idle_in_copy_calls_s": round(d.idle.get("copy_s", 0.0), 6),
            "window_s": round(d.window_s, 6),
        },
        suggestion=(
            "Copy from pinned memory and without blocking: DataLoader(pin_memory=True) and "
            "batch.to('cuda', non_blocking=True); for tensors you build yourself, tensor.pin_memory() once. "
            "A pinned copy runs on the copy engine while the GPU computes."
        ),
        predicted_effect=(
            f"up to −{pct(share)} % of the GPU's window: the copies ({fmt_seconds(d.pageable_copy_s)}) and "
            "the host's staging overlap compute instead"
        ),
        formula="t' ≥ t − (t_pageable_copies + t_idle_in_copy_calls) once copies are pinned and asynchronous",
        time_cut=share,
        time_cut_bound=True,
    )
