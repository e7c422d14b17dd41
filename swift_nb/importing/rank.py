"""What one rank's imported trace becomes: its run record (steps from the profiler's step
spans, the environment from the trace's metadata, the device's and collectives' summary),
with what a trace cannot say recorded as absent."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from swift_nb.analysis.comm import comm_per_step, comm_shares
from swift_nb.analysis.device import RUN_SUMMARY_KEYS, device_summary
from swift_nb.analysis.kernels import fill_summary
from swift_nb.analysis.ranks import RankAnalysis, analyze_rank
from swift_nb.analysis.trace.decode import DEFAULT_MAX_BYTES
from swift_nb.analysis.trace.tables import Trace, cat_in, save_tables
from swift_nb.core import trace_names as tn
from swift_nb.importing.files import RankTrace, copy_gzipped, read_trace_file
from swift_nb.record import SAMPLE_COLUMNS, STEP_COLUMNS, Run, summarize, tables_path, utc_now_iso

#: steps.csv's ``trigger`` of an imported step: the profiler's own ``ProfilerStep#N`` span
TRIGGER = "trace"
#: the ``[memory]`` events' device type code of CUDA (0 is the CPU)
_CUDA = 1


def _main_device(trace: Trace) -> int | None:
    """The GPU the rank's kernels ran on (Kineto gives device work the device's index as
    pid), or None for a trace without device work."""
    dev = trace.events.loc[cat_in(trace.events, *tn.DEVICE_WORK), "pid"]
    dev = pd.to_numeric(dev, errors="coerce").dropna()
    return int(dev.mode().iloc[0]) if len(dev) else None


def _steps(trace: Trace, device: int | None) -> pd.DataFrame:
    """steps.csv from the ProfilerStep spans, on a clock starting at the first one."""
    spans = trace.steps
    t0 = float(spans["start_us"].min())
    steps = pd.DataFrame(
        {
            "step": spans["step"].astype(int),
            "start_s": (spans["start_us"] - t0) / 1e6,
            "end_s": (spans["end_us"] - t0) / 1e6,
            "duration_s": spans["dur_us"] / 1e6,
            "phase": "active",
            "trigger": TRIGGER,
            "overhead_s": np.nan,
            "peak_tensor_bytes": _peak_per_step(trace, spans, device),
            "reserved_bytes": np.nan,
            "rss_bytes": np.nan,
        },
        columns=STEP_COLUMNS,
    )
    return steps.reset_index(drop=True)


def _peak_per_step(trace: Trace, spans: pd.DataFrame, device: int | None) -> np.ndarray:
    """Per step, the allocator's highest total in the trace's ``[memory]`` events on the
    rank's device (NaN without them: absent, not zero)."""
    mem = trace.memory
    if device is not None:
        mem = mem[(mem["device_type"] == _CUDA) & (mem["device_id"] == device)]
    else:
        mem = mem[mem["device_type"] != _CUDA]
    peaks = mem[mem["step"] >= 0].groupby("step")["total_allocated"].max()
    return spans["step"].map(peaks).astype(float).to_numpy()


def _started_at(rt: RankTrace) -> str:
    """When the trace's first step began (ISO, UTC), from the trace's clock: Kineto's
    ``baseTimeNanoseconds`` plus the timestamps, or timestamps in µs since the epoch;
    else the file's modification time."""
    t0_us = float(rt.trace.steps["start_us"].min())
    base_ns = rt.meta.get("baseTimeNanoseconds")
    if isinstance(base_ns, (int, float)) and base_ns > 0:
        epoch_s = base_ns / 1e9 + t0_us / 1e6
    elif t0_us > 1e15:  # µs since 1970 (later than 2001)
        epoch_s = t0_us / 1e6
    else:
        epoch_s = rt.path.stat().st_mtime
    return datetime.fromtimestamp(epoch_s, timezone.utc).isoformat(timespec="milliseconds")


def _environment(rt: RankTrace, device: int | None) -> dict[str, Any]:
    info = rt.meta.get("distributedInfo") or {}
    props = [p for p in rt.meta.get("deviceProperties") or [] if isinstance(p, dict)]
    env: dict[str, Any] = {
        "rank": rt.rank,
        "world_size": rt.world_size,
        "device": "cuda" if device is not None else "cpu",
        "host": str(rt.meta.get("host_name", "")),
    }
    if info.get("backend"):
        env["backend"] = str(info["backend"])
    if info.get("nccl_version"):
        env["nccl"] = str(info["nccl_version"])
    for key in ("cuda_runtime_version", "cuda_driver_version", "cupti_version"):
        if key in rt.meta:
            env[key.removesuffix("_version")] = str(rt.meta[key])
    used = [p for p in props if p.get("id") == device] or props
    if used:
        env["devices"] = [str(p.get("name", "")) for p in used]
        env["device_mem_total_bytes"] = used[0].get("totalGlobalMem")
    if device is not None:
        env["rank_device"] = f"cuda:{device}"
    return env


def rank_record(rt: RankTrace) -> Run:
    """The record of one rank's trace."""
    device = _main_device(rt.trace)
    steps = _steps(rt.trace, device)
    samples = pd.DataFrame(columns=SAMPLE_COLUMNS)
    ts, te = rt.trace.events["ts_us"], rt.trace.events["end_us"]
    run = Run(
        id="",
        status="ok",
        started_at=_started_at(rt),
        wall_s=float((te.max() - ts.min()) / 1e6) if len(ts) else float(steps["end_s"].max()),
        source={"imported_from": [str(rt.path.resolve())], "imported_at": utc_now_iso()},
        environment=_environment(rt, device),
        context={"toggles": [], "world_size": rt.world_size},
        host=str(rt.meta.get("host_name", "")),
        steps=steps,
        samples=samples,
    )
    run.summary.update(summarize(steps, samples))
    run.summary["recorded_steps"] = [int(s) for s in steps["step"]]
    run.summary["trace_events"] = len(rt.trace.events)
    work = device_summary(rt.trace)
    run.summary.update({k: round(float(work[k]), 3) for k in RUN_SUMMARY_KEYS if work.get(k) is not None})
    run.summary.update(fill_summary(rt.trace))  # how well its kernels fill the GPU
    collective_s, share = _collective_summary(rt.trace)
    if np.isfinite(collective_s) and collective_s > 0:
        run.summary["collective_s_per_step"] = collective_s
        run.summary["collective_share"] = share
    run.notes.append(
        f"imported from {rt.path.name}: resource samples, process memory and swift_nb's step "
        "hook are not in a trace, so they are absent here"
    )
    if steps["peak_tensor_bytes"].isna().all():
        run.notes.append(
            "the trace has no [memory] events (recorded without profile_memory=True): "
            "memory per step and by category are absent"
        )
    return run


def _collective_summary(trace: Trace) -> tuple[float, float]:
    """(collective seconds per recorded step, their share of the recorded steps' time),
    as ``capture.job.collective_summary`` measures a captured rank's, from the tables."""
    per_step = comm_per_step(trace)
    if per_step.empty:
        return float("nan"), float("nan")
    return float(per_step["collective_s"].mean()), comm_shares(per_step)[0]


@dataclass
class RankRecord:
    """What is kept of one rank's trace once it is reduced: its record (a Run with its
    steps and summary) and where its trace and tables were written."""

    path: Path
    rank: int
    world_size: int
    record: Run
    staged: Path
    analysis: RankAnalysis | None = None  # made while the tables were held, for a job's report
    trace: Trace | None = None  # the tables, when kept for the report (a run of one trace)


def reduce_rank(
    path: Path, staged: Path, max_bytes: int = DEFAULT_MAX_BYTES, analyze: bool = False, keep: bool = False
) -> RankRecord:
    """Read one rank's trace, copy it (gzipped) to ``staged`` with its tables beside it,
    and keep only its record (and, ``analyze``, its ``RankAnalysis``; ``keep``, its
    tables): otherwise the events and tables are dropped when this returns. Runs in a
    worker process for a job's ranks. The copy is compressed on a thread of its own while
    the trace is decoded (zlib leaves the interpreter's lock: a second core does it)."""
    with ThreadPoolExecutor(1, thread_name_prefix="swift_nb-copy") as pool:
        copied = pool.submit(copy_gzipped, Path(path), staged)
        try:
            rt = read_trace_file(path, max_bytes, halves=keep)  # a trace read alone: two processes
        except BaseException:
            copied.exception()  # waited for: the trace's own error is the one to tell
            raise
        copied.result()  # its error (a full disk) is the import's
    save_tables(rt.trace, tables_path(staged), source=staged)
    record = rank_record(rt)
    analysis = analyze_rank(record, rt.trace, rt.rank, rt.world_size) if analyze else None
    return RankRecord(rt.path, rt.rank, rt.world_size, record, staged, analysis, rt.trace if keep else None)
