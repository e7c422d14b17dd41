"""The verdict: the step's dominant limit, from the evidence, and the tests the rules
share with it (slow loading, a tiny step, launch overhead); and what the limit and each
finding's predicted time are worth in money where the run has a price (``priced``,
``priced_findings``: ``swift_nb.analysis.cost``)."""

from __future__ import annotations

import math
from dataclasses import replace

from swift_nb.analysis import cost
from swift_nb.analysis.advisor.evidence import DeviceTime, Evidence, Thresholds
from swift_nb.analysis.advisor.findings import Finding, Verdict
from swift_nb.analysis.advisor.words import ms, pct
from swift_nb.core.units import fmt_bytes, fmt_seconds
from swift_nb.record import Run


def bottleneck(ev: Evidence, th: Thresholds | None = None) -> Verdict:
    """The step's dominant limit, from the evidence: what keeps the GPU from computing when
    the run has device work (``device_verdict``), else the host's breakdown of the step."""
    th = th or Thresholds()
    c = ev.compiled
    if c is not None and c.compile_s > 0 and c.share >= th.compile_share:
        return compile_verdict(ev, th)
    s = ev.shares
    if not math.isfinite(ev.step_s):
        return Verdict("unknown", "the profiler recorded no step", {})
    if ev.device is not None:
        return device_verdict(ev, th)
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
        if near:
            assert ev.limit_bytes is not None  # near: the limit is known (and not 0)
            why = f"peak tensor memory {fmt_bytes(ev.peak_bytes)} is {pct(ev.peak_bytes / ev.limit_bytes)} % of the device"
        else:
            why = f"explicit attention materialises {ev.attention_seq}×{ev.attention_seq} score matrices"
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


def compile_verdict(ev: Evidence, th: Thresholds) -> Verdict:
    """torch.compile's compiling holds most of the steps' time: that is the run's limit,
    and the steady steps' own verdict is quoted beside it, never mixed with it."""
    c = ev.compiled
    assert c is not None
    steady = bottleneck(replace(ev, compiled=None), th)
    why = (
        f"compiling took {_secs(c.compile_s)}, {pct(c.share)} % of the steps' time "
        f"({c.compiling_steps} of {c.steps} steps compiled)"
    )
    if math.isfinite(c.steady_step_s):
        why += f"; the steady steps (median {ms(c.steady_step_s)}) are {steady.kind}: {steady.reason}"
    return Verdict(
        "compile-bound",
        why,
        {
            "compile_s": round(c.compile_s, 6),
            "compile_pct": pct(c.share),
            "compiling_steps": c.compiling_steps,
            "steady_step_s": round(c.steady_step_s, 6) if math.isfinite(c.steady_step_s) else None,
            "steady_verdict": steady.kind,
            **steady.evidence,
        },
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


def _secs(seconds: float) -> str:
    return fmt_seconds(seconds)


def _kinds_text(d: DeviceTime, top: int = 3) -> str:
    busy = sum(d.kinds.values())
    ranked = sorted(d.kinds.items(), key=lambda kv: -kv[1])[:top]
    return ", ".join(f"{k} {pct(v / busy)} %" for k, v in ranked) if busy else ""


def device_verdict(ev: Evidence, th: Thresholds) -> Verdict:
    """What keeps the GPU from computing. Each limit's seconds in the device's window
    (``DeviceTime.limits``: communication no compute hides, the host's launch gaps and
    stalls, data loading, copies); the largest decides when it holds at least
    ``th.device_limit_share`` of the window; else memory near the device's capacity, else
    the GPU is compute-bound. The reason quotes the device's own figures."""
    d = ev.device
    assert d is not None
    limits = d.limits()
    kind, held = max(limits.items(), key=lambda kv: kv[1])
    share = held / d.window_s if d.window_s else 0.0
    evidence = {
        "device_idle_pct": round(d.idle_pct, 1),
        "device_compute_pct": round(d.compute_pct, 1),
        "device_non_compute_pct": round(d.non_compute_pct, 1),
        "comm_compute_overlap_pct": None if d.overlap_pct is None else round(d.overlap_pct, 1),
        "window_s": round(d.window_s, 6),
        **{f"{k.removesuffix('-bound')}_s": round(v, 6) for k, v in limits.items()},
    }
    idle = f"the GPU idles {pct(d.idle_pct / 100)} % of the window"
    if share >= th.device_limit_share:
        if kind == "communication-bound":
            largest = f" (the largest collective: {d.collective.replace('_', '-')})" if d.collective else ""
            why = (
                f"the GPU waits on communication {pct(share)} % of the window: {_secs(d.comm_exposed_s)} of "
                f"communication kernels no compute hides and {_secs(d.idle.get('comm_wait_s', 0.0))} of its "
                f"{_secs(d.idle_s)} idle waiting for collectives{largest}"
            )
        elif kind == "overhead-bound":
            sync = d.idle.get("sync_s", 0.0)
            why = (
                f"{idle}; for {_secs(held)} of its {_secs(d.idle_s)} idle it waits for the host to launch work "
                + (f"(launch gaps, and {_secs(sync)} of synchronisation stalls)" if sync else "(launch gaps)")
            )
        elif kind == "data-bound":
            why = f"{idle}; for {_secs(held)} of its {_secs(d.idle_s)} idle the host is loading data"
        else:
            why = (
                f"{pct(share)} % of the window the GPU only copies or waits on the host's copy calls "
                f"({_secs(d.idle.get('copy_s', 0.0))} idle in copy calls)"
            )
        return Verdict(kind, why, evidence)
    near = ev.limit_bytes and ev.peak_bytes >= th.near_limit * ev.limit_bytes
    if near:
        assert ev.limit_bytes is not None  # near: the limit is known (and not 0)
        why = f"peak tensor memory {fmt_bytes(ev.peak_bytes)} is {pct(ev.peak_bytes / ev.limit_bytes)} % of the device"
        return Verdict("memory-bound", why, {**evidence, "peak_mem_bytes": ev.peak_bytes})
    kinds = _kinds_text(d)
    why = f"the GPU computes {pct(d.compute_pct / 100)} % of the window" + (
        f" ({kinds} of its device time)" if kinds else ""
    )
    if d.compute_pct < 50:
        why += f"; no single limit keeps it idle more than {pct(share)} % of the window"
    return Verdict("compute-bound", why, evidence)


def _per_1k_usd(run: Run) -> float | None:
    step_s = run.summary.get("step_time_median_s")
    return cost.usd_per_1k_steps(float(step_s), run) if step_s else None


def priced(verdict: Verdict, run: Run) -> Verdict:
    """``verdict`` with what 1 000 of the run's median steps cost and, where the GPU's
    idle share is known, the part of that paid while it idles (the summary's
    ``cost_per_1k_steps_usd`` and ``idle_cost_per_1k_steps_usd``); as it was without a price."""
    per_1k = _per_1k_usd(run)
    if per_1k is None:
        return verdict
    evidence = {**verdict.evidence, "cost_per_1k_steps_usd": round(per_1k, 6)}
    # the summary's share where it has it (unrounded: the same figure as its idle cost)
    idle = run.summary.get("device_idle_pct", verdict.evidence.get("device_idle_pct"))
    if idle is not None and verdict.evidence.get("device_idle_pct") is not None:
        idle_usd = cost.idle_cost_per_1k_steps_usd(per_1k, float(idle))
        evidence["idle_cost_per_1k_steps_usd"] = round(idle_usd, 6)
        idles = f"the GPU idles {pct(float(idle) / 100)} % of the window"
        money = f"{idles}: {cost.fmt_usd(idle_usd)} of every {cost.fmt_usd(per_1k)} per 1 000 steps"
        if idles in verdict.reason:  # said once, with its price
            return replace(verdict, reason=verdict.reason.replace(idles, money, 1), evidence=evidence)
    else:
        money = f"1 000 steps cost {cost.fmt_usd(per_1k)}"
    return replace(verdict, reason=f"{verdict.reason}; {money}", evidence=evidence)


def priced_findings(findings: list[Finding], run: Run) -> list[Finding]:
    """Each finding that predicts time also predicts the dollars per 1 000 steps it saves
    (``saved_per_1k_steps_usd`` in its evidence, words after its predicted effect), at the
    run's price; unchanged without one."""
    per_1k = _per_1k_usd(run)
    if per_1k is None:
        return findings
    out = []
    for f in findings:
        cut = f.time_cut
        if cut is None:
            out.append(f)
            continue
        saved = per_1k * cut
        bound = "up to " if f.time_cut_bound else "≈ "
        out.append(
            replace(
                f,
                predicted_effect=f"{f.predicted_effect}; {bound}{cost.fmt_usd(saved)} less per 1 000 steps "
                f"(of {cost.fmt_usd(per_1k)})",
                evidence={**f.evidence, "saved_per_1k_steps_usd": round(saved, 6)},
            )
        )
    return out
