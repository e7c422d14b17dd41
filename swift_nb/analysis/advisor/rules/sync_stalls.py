"""Synchronisation stalls: the host blocks until the GPU drains (``.item()``, ``.cpu()``,
``nonzero``, printing a tensor), then the GPU idles until the host launches again."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from swift_nb.analysis.advisor.evidence import Evidence, Thresholds
from swift_nb.analysis.advisor.findings import Finding
from swift_nb.analysis.advisor.words import pct
from swift_nb.core.units import fmt_seconds

#: what a synchronising call's operator is in the user's code
CALLERS = {
    "aten::item": ".item()",
    "aten::_local_scalar_dense": ".item() / float(tensor)",
    "aten::is_nonzero": "a tensor used as a Python bool (if t: …)",
    "aten::nonzero": "nonzero() / boolean-mask indexing",
    "aten::masked_select": "boolean-mask indexing",
    "aten::_to_copy": ".cpu() / .to('cpu') / .numpy()",
    "aten::to": ".cpu() / .to('cpu')",
    "aten::copy_": "a copy to the host",
    "aten::unique": "unique()",
}


def rule(ev: Evidence, th: Thresholds, context: Mapping[str, Any]) -> Finding | None:
    d = ev.device
    if d is None or not d.window_s:
        return None
    stall = d.idle.get("sync_s", 0.0)
    share = stall / d.window_s
    if share < th.min_part_share:
        return None
    calls = sum(d.syncs.values())
    named = "; ".join(f"{n} × {CALLERS.get(op, op)}" for op, n in list(d.syncs.items())[:5])
    if d.sync_sites:
        named += "; at " + ", ".join(f"{site} ({n}×)" for site, n in list(d.sync_sites.items())[:3])
    return Finding(
        id="sync_stalls",
        title=f"Synchronisations inside the step idle the GPU {pct(share)} % of the window",
        evidence={
            "sync_stall_s": round(stall, 6),
            "window_s": round(d.window_s, 6),
            "sync_stall_pct": pct(share),
            "sync_calls": calls,
            "sync_calls_per_step": round(calls / d.steps, 2),
            "callers": dict(d.syncs),
            "call_sites": dict(d.sync_sites),
        },
        suggestion=(
            f"The host waits for the GPU to drain {calls} times ({named}), and the GPU then idles until the "
            "host launches again. Keep values on the device inside the step: accumulate the loss as a tensor "
            "and call .item() once per logging interval, avoid data-dependent shapes (nonzero, boolean masks) "
            "or move them out of the step, do not print tensors in the loop; copies to the host with "
            "non_blocking=True into pinned memory."
        ),
        predicted_effect=f"up to −{pct(share)} % of the GPU's window: the stalls, {fmt_seconds(stall)}",
        formula="t' ≥ t − t_sync: each stall runs from the synchronising call to the next launch",
        time_cut=share,
        time_cut_bound=True,
        severity="critical" if share >= 0.3 else "warning",
    )
