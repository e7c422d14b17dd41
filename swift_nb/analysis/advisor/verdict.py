"""The verdict: the step's dominant limit, from the evidence, and the tests the rules
share with it (slow loading, a tiny step, launch overhead)."""

from __future__ import annotations

import math

from swift_nb.analysis.advisor.evidence import Evidence, Thresholds
from swift_nb.analysis.advisor.words import ms, pct
from swift_nb.analysis.findings import Verdict
from swift_nb.units import fmt_bytes


def bottleneck(ev: Evidence, th: Thresholds | None = None) -> Verdict:
    """The step's dominant limit, from the evidence."""
    th = th or Thresholds()
    s = ev.shares
    if not math.isfinite(ev.step_s):
        return Verdict("unknown", "the profiler recorded no step", {})
    compute = s["forward"] + s["backward"] + s["optimizer"]
    base = {"step_s": round(ev.step_s, 6), **{f"{k}_pct": pct(v) for k, v in s.items()}}
    if ev.exposed_comm_share >= th.comm_share and ev.exposed_comm_share >= s["data"]:
        why = f"{pct(ev.exposed_comm_share)} % of the step is exposed communication"
        return Verdict("communication-bound", why, base)
    loading = {**base, "data_s_per_step": round(ev.loader.data_s, 6)}
    if slow_loading(ev, th):
        why = f"{pct(s['data'])} % of the step ({ms(ev.loader.data_s)} per step) waits for the next batch"
        return Verdict("data-bound", why, loading)
    if tiny_step(ev, th):
        why = (
            f"the step is tiny ({ms(ev.step_s)}): the DataLoader's {ms(ev.loader.data_s)} per step, "
            f"the time of a few Python calls, is {pct(s['data'])} % of it"
        )
        return Verdict("overhead-bound", why, loading)
    near = ev.limit_bytes and ev.peak_bytes >= th.near_limit * ev.limit_bytes
    if near or ev.attention_seq >= th.attention_seq:
        why = (
            f"peak tensor memory {fmt_bytes(ev.peak_bytes)} is {pct(ev.peak_bytes / ev.limit_bytes)} % of the device"
            if near
            else f"explicit attention materialises {ev.attention_seq}×{ev.attention_seq} score matrices"
        )
        return Verdict(
            "memory-bound", why, {**base, "peak_mem_bytes": ev.peak_bytes, "attention_seq": ev.attention_seq}
        )
    if overhead(ev, th):
        return Verdict(
            "overhead-bound",
            f"{round(ev.ops_per_step)} ops per step; ops of ≥ {th.tiny_op_us:g} µs fill only "
            f"{pct(ev.heavy_op_share)} % of it",
            {**base, "ops_per_step": round(ev.ops_per_step), "heavy_op_pct": pct(ev.heavy_op_share)},
        )
    return Verdict(
        "compute-bound", f"{pct(compute)} % of the step is forward, backward and optimizer work", base
    )


def overhead(ev: Evidence, th: Thresholds) -> bool:
    return ev.ops_per_step >= th.tiny_op_count and ev.heavy_op_share < th.heavy_op_share


def slow_loading(ev: Evidence, th: Thresholds) -> bool:
    """Waiting for batches is a large part of the step and long in itself: real work
    (collate, transforms, I/O) that worker processes can take off the step."""
    return ev.shares["data"] >= th.data_share and ev.loader.data_s >= th.data_min_s


def tiny_step(ev: Evidence, th: Thresholds) -> bool:
    """Loading is a large part of the step but only the loader's fixed per-batch cost:
    the step is tiny (under ``data_min_s / data_share``)."""
    return ev.shares["data"] >= th.data_share and ev.loader.data_s < th.data_min_s
