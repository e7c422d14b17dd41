"""Turn torch.profiler traces recorded elsewhere into swift_nb runs.

``import_trace(paths)`` reads Kineto/Chrome traces as torch.profiler writes them
(``tensorboard_trace_handler`` files, ``export_chrome_trace``; ``.json`` or ``.json.gz``;
one file per rank) and writes an ordinary run folder: run.json, steps.csv from the
``ProfilerStep#N`` spans, the trace itself, and for several ranks a job record (ranks.csv,
rank_steps.csv, every rank's trace). Rank, world size and backend come from the trace's
``distributedInfo``, the devices from ``deviceProperties``. What a trace cannot say is
recorded as absent (empty), never as zero: resource samples, the process's memory, the
swift_nb step hook's cost; per-step tensor memory only when the trace has ``[memory]``
events (``profile_memory=True``).

The report, the results panel (``%swift_profile --open DIR``) and ``compare`` then work on
the folder as on any captured run.
"""

from __future__ import annotations

import contextlib
import gzip
import multiprocessing
import os
import shutil
import sys
from collections.abc import Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from swift_nb import trace_names as tn
from swift_nb.analysis.comm import comm_per_step, comm_shares
from swift_nb.analysis.device import RUN_SUMMARY_KEYS, device_summary
from swift_nb.analysis.ranks import RankAnalysis, analyse_rank
from swift_nb.analysis.trace import Trace, read_trace_with_meta, save_tables
from swift_nb.analysis.trace_decode import DEFAULT_MAX_BYTES, GZIP_MAGIC
from swift_nb.capture.job import RANK_COLUMNS
from swift_nb.errors import ConfigError, RecordError
from swift_nb.record import (
    SAMPLE_COLUMNS,
    STEP_COLUMNS,
    TRACE_FILE,
    Run,
    default_root,
    ensure_writable,
    new_run_id,
    rank_folder,
    rank_trace_file,
    save,
    summarize,
    tables_path,
    utc_now_iso,
)
from swift_nb.units import fmt_span

#: the file names torch.profiler gives traces (``*.pt.trace.json`` too)
TRACE_SUFFIXES = (".json", ".json.gz")
#: steps.csv's ``trigger`` of an imported step: the profiler's own ``ProfilerStep#N`` span
TRIGGER = "trace"
#: the ``[memory]`` events' device type code of CUDA (0 is the CPU)
_CUDA = 1


@dataclass
class RankTrace:
    """One trace file, read: its top-level metadata (everything but the events) and its
    tables."""

    path: Path
    meta: dict[str, Any]
    trace: Trace

    @property
    def rank(self) -> int:
        return int(self.meta.get("distributedInfo", {}).get("rank", 0) or 0)

    @property
    def world_size(self) -> int:
        return int(self.meta.get("distributedInfo", {}).get("world_size", 1) or 1)


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


def trace_files(paths: str | os.PathLike | Iterable[str | os.PathLike]) -> list[Path]:
    """The trace files ``paths`` name: files as given, folders expanded to the ``.json``
    / ``.json.gz`` files directly in them. A path that does not exist, or a folder without
    a trace, is a ``ConfigError`` saying so, before anything is read."""
    given = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    if not given:
        raise ConfigError("paths", "must name at least one trace file or folder of traces", given)
    files: list[Path] = []
    for p in map(Path, given):
        if p.is_dir():
            found = sorted(f for f in p.iterdir() if f.is_file() and f.name.endswith(TRACE_SUFFIXES))
            if not found:
                raise ConfigError(
                    "paths", f"a folder must hold trace files ({' or '.join(TRACE_SUFFIXES)})", str(p)
                )
            files += found
        elif p.is_file():
            files.append(p)
        else:
            raise ConfigError("paths", "must be existing trace files or folders", str(p))
    return list(dict.fromkeys(files))


def read_trace_file(path: Path, max_bytes: int = DEFAULT_MAX_BYTES) -> RankTrace:
    """One trace file (gzipped or not) read and parsed; ``RecordError`` saying what is
    wrong with a file that is not a torch.profiler trace of profiler steps, or holds more
    than ``max_bytes`` of JSON."""
    trace, meta = read_trace_with_meta(path, max_bytes)
    if trace.empty:
        raise RecordError(
            path,
            f"no profiler step in it (no '{tn.STEP_PREFIX}N' spans): record it with a schedule and "
            "call prof.step() once per training step",
        )
    return RankTrace(Path(path), meta, trace)


def import_trace(
    paths: str | os.PathLike | Iterable[str | os.PathLike],
    out_dir: str | os.PathLike | None = None,
    *,
    label: str | None = None,
    report: bool = True,
    max_bytes: int = DEFAULT_MAX_BYTES,
    workers: int | None = None,
) -> Run:
    """Import torch.profiler traces (one per rank) as a swift_nb run and return it.

    ``paths``: trace files, or folders of them (``.json`` / ``.json.gz``); several ranks of
    one job make one job record. ``out_dir``: the folder of run folders (default
    ``$SWIFT_NB_DIR`` or ``./swift_nb_runs``); the run's folder is created in it.
    ``report``: analyse the run and write its report.html (as ``swift_nb.report``).
    ``max_bytes``: the most JSON one trace may hold once decompressed (default 16 GiB); a
    larger file, or a gzip that would inflate past it, is refused as it decompresses.
    ``workers``: processes that read the ranks' traces at once (default: one per core, at
    most one per trace; a job of under 16 MB of files is read in this process, as with
    ``workers=1``); each rank is reduced to its tables and record before the next, so
    memory does not grow with the number of ranks.
    Imported runs are never pruned by the import: it adds a folder and deletes nothing.
    """
    files = trace_files(paths)
    if not isinstance(max_bytes, int) or max_bytes <= 0:
        raise ConfigError("max_bytes", "must be a positive number of bytes", max_bytes)
    if workers is not None and (not isinstance(workers, int) or workers < 1):
        raise ConfigError("workers", "must be a whole number ≥ 1", workers)
    root = ensure_writable(Path(out_dir) if out_dir is not None else default_root())
    folder = root / new_run_id(label or "import")
    folder.mkdir()
    try:
        # a job's report reads every rank's findings and collectives: each rank's are made
        # while its tables are held (in the workers), not by reading every trace again
        run, analysed = _import_into(files, folder, max_bytes, workers, analyse=report and len(files) > 1)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)  # no half-imported run is left behind
        raise
    run.id, run.label, run.path = folder.name, label, folder
    save(run)
    if report:
        from swift_nb import reporting  # the API composes the layers above

        return reporting.report(run, ranks=analysed).run
    return run


#: below this many bytes of trace files in all, a job's ranks are read in this process: a
#: worker's start (its interpreter and imports) costs more than they take to read
IN_PROCESS_BYTES = 16 << 20


def _import_into(
    files: list[Path], folder: Path, max_bytes: int, workers: int | None, analyse: bool = False
) -> tuple[Run, dict[int, RankAnalysis] | None]:
    """The run record of ``files`` in ``folder``, and (``analyse``) each rank's analysis."""
    small = sum(f.stat().st_size for f in files) < IN_PROCESS_BYTES
    if len(files) == 1 or workers == 1 or (workers is None and small):
        reduced = [
            reduce_rank(f, folder / f".staged-{i}.json.gz", max_bytes, analyse) for i, f in enumerate(files)
        ]
    else:
        reduced = _reduce_in_workers(files, folder, max_bytes, workers, analyse)
    by_rank = _by_rank(reduced)
    if len(by_rank) == 1:
        rr = next(iter(by_rank.values()))
        _place(rr, folder / TRACE_FILE)
        rr.record.files["trace"] = TRACE_FILE
        return rr.record, None
    analysed = {r: rr.analysis for r, rr in by_rank.items() if rr.analysis is not None}
    return _job_record(by_rank, folder), (analysed if analyse else None)


def reduce_rank(
    path: Path, staged: Path, max_bytes: int = DEFAULT_MAX_BYTES, analyse: bool = False
) -> RankRecord:
    """Read one rank's trace, copy it (gzipped) to ``staged`` with its tables beside it,
    and keep only its record (and, ``analyse``, its ``RankAnalysis``): the events and
    tables are dropped when this returns. Runs in a worker process for a job's ranks."""
    rt = read_trace_file(path, max_bytes)
    _copy_gzipped(rt.path, staged)
    save_tables(rt.trace, tables_path(staged), source=staged)
    record = _rank_record(rt)
    analysis = analyse_rank(record, rt.trace, rt.rank, rt.world_size) if analyse else None
    return RankRecord(rt.path, rt.rank, rt.world_size, record, staged, analysis)


def _context() -> multiprocessing.context.BaseContext:
    # forkserver (or spawn): a fork of a process that has started torch's or CUDA's threads
    # can deadlock in the child
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    ctx = multiprocessing.get_context("forkserver")
    # the server imports this module once; each worker forked from it starts with it loaded
    ctx.set_forkserver_preload([__name__])
    return ctx


@contextlib.contextmanager
def _main_script_hidden() -> Iterator[None]:
    """While workers start, the caller's script is not named as the main module: spawn and
    forkserver would run it again in each worker (as ``__mp_main__``), and a script that
    calls ``import_trace`` at its top level, without ``if __name__ == "__main__":``, would
    then import again in every worker. The workers need nothing of it."""
    main = sys.modules.get("__main__")
    saved = {k: main.__dict__[k] for k in ("__file__", "__spec__") if main is not None and k in main.__dict__}
    try:
        for k in saved:
            setattr(main, k, None)
        yield
    finally:
        for k, v in saved.items():
            setattr(main, k, v)


def _reduce_in_workers(
    files: list[Path], folder: Path, max_bytes: int, workers: int | None, analyse: bool = False
) -> list[RankRecord]:
    """Every file reduced by ``reduce_rank`` in at most ``workers`` processes (default:
    the cores); a worker that dies (killed, out of memory) is an error naming the traces
    it left unread, never a wait."""
    n = min(len(files), workers or os.cpu_count() or 1)
    staged = [folder / f".staged-{i}.json.gz" for i in range(len(files))]
    with ProcessPoolExecutor(max_workers=n, mp_context=_context()) as pool:
        with _main_script_hidden():  # the workers start as these are submitted
            futures = [
                pool.submit(reduce_rank, f, s, max_bytes, analyse) for f, s in zip(files, staged, strict=True)
            ]
        try:
            return [f.result() for f in futures]
        except BrokenProcessPool:
            unread = [str(p) for p, fut in zip(files, futures, strict=True) if fut.exception() is not None]
            raise RuntimeError(
                f"a worker process reading the traces died (killed, or out of memory) before it finished; "
                f"{len(unread)} of {len(files)} traces were not read: {', '.join(unread[:4])}"
                f"{' …' if len(unread) > 4 else ''}. Try again with fewer workers (import_trace(..., "
                "workers=1)) or on a machine with more memory"
            ) from None
        except BaseException:
            for fut in futures:
                fut.cancel()
            raise


def _place(rr: RankRecord, dest: Path) -> None:
    """Move a reduced rank's staged trace and its tables to their names in the run."""
    rr.staged.replace(dest)
    tables_path(rr.staged).replace(tables_path(dest))


def _by_rank(ranks: list[RankRecord]) -> dict[int, RankRecord]:
    """The traces keyed by rank, checked to be one job's: one file per rank, one world size."""
    by_rank: dict[int, RankRecord] = {}
    for rt in ranks:
        if rt.rank in by_rank:
            raise ConfigError(
                "paths",
                f"must hold one trace per rank; rank {rt.rank} is in both {by_rank[rt.rank].path} and "
                f"{rt.path} (import each profiling cycle separately)",
                [str(r.path) for r in ranks],
            )
        by_rank[rt.rank] = rt
    worlds = {rt.world_size for rt in ranks}
    if len(worlds) > 1:
        raise ConfigError(
            "paths",
            f"must be the ranks of one job; these traces disagree on its size ({sorted(worlds)} ranks)",
            [str(r.path) for r in ranks],
        )
    return dict(sorted(by_rank.items()))


def _copy_gzipped(src: Path, dest: Path) -> None:
    with open(src, "rb") as f:
        gzipped = f.read(2) == GZIP_MAGIC
    if gzipped:
        shutil.copyfile(src, dest)
        return
    with open(src, "rb") as f, gzip.open(dest, "wb", compresslevel=1) as out:
        shutil.copyfileobj(f, out, 1 << 20)


# -- one rank ---------------------------------------------------------------------------


def _main_device(trace: Trace) -> int | None:
    """The GPU the rank's kernels ran on (Kineto gives device work the device's index as
    pid), or None for a trace without device work."""
    dev = trace.events.loc[trace.events["cat"].isin(tn.DEVICE_WORK), "pid"]
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


def _rank_record(rt: RankTrace) -> Run:
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
    device = device_summary(rt.trace)
    run.summary.update({k: round(float(device[k]), 3) for k in RUN_SUMMARY_KEYS if device.get(k) is not None})
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


# -- several ranks ----------------------------------------------------------------------


def _job_record(by_rank: dict[int, RankRecord], folder: Path) -> Run:
    """One job record from several ranks' reduced traces, laid out as a captured job's
    (``swift_nb.capture.job``): every rank's trace beside the record, each rank's own
    record in its rank folder, the lowest rank's view in the job's own tables, every
    rank's row in ranks.csv and steps in rank_steps.csv."""
    records = {r: rr.record for r, rr in by_rank.items()}
    first = min(records)
    for r, rec in records.items():
        _place(by_rank[r], folder / rank_trace_file(r))
        rec.files["trace"] = f"../{rank_trace_file(r)}"
        rec.id = f"{folder.name}-rank{r}"
        save(rec, rank_folder(folder, r))
    job = Run(**{f.name: getattr(records[first], f.name) for f in fields(Run)})
    job.files = {"trace": rank_trace_file(first)}
    job.files.update({f"trace_rank{r}": rank_trace_file(r) for r in records if r != first})
    world = next(iter(by_rank.values())).world_size
    rows = []
    for r in range(world):
        if r not in records:
            continue
        rec = records[r]
        s = rec.summary
        rows.append(
            {
                **dict.fromkeys(RANK_COLUMNS),
                "rank": r,
                "host": rec.host or None,  # as ranks.csv reads an empty one back
                "device": rec.environment.get("rank_device", rec.environment["device"]),
                "status": "ok",
                "source": "trace",
                "steps": s.get("steps"),
                "step_time_median_s": s.get("step_time_median_s"),
                "step_time_p90_s": s.get("step_time_p90_s"),
                "peak_mem_bytes": s.get("peak_mem_bytes"),
                "collective_s_per_step": s.get("collective_s_per_step"),
                "collective_share": s.get("collective_share"),
                "device_idle_pct": s.get("device_idle_pct"),
                "trace": rank_trace_file(r),
                "record": str(rank_folder(folder, r)),
                "error": "",
                "started_at": rec.started_at,
            }
        )
    job.ranks = pd.DataFrame(rows, columns=RANK_COLUMNS)
    job.rank_steps = pd.concat([rec.steps.assign(rank=r) for r, rec in records.items()], ignore_index=True)
    job.source["imported_from"] = [str(rt.path.resolve()) for rt in by_rank.values()]
    job.notes[0] = (
        f"imported from the traces of {len(records)} ranks: resource samples, process memory and "
        "swift_nb's step hook are not in a trace, so they are absent here"
    )
    missing = [r for r in range(world) if r not in records]
    if missing:
        job.notes.append(
            f"the job had {world} ranks; only the traces of ranks {fmt_span(sorted(records))} were "
            f"imported, so comparisons across ranks leave out ranks {fmt_span(missing)}"
        )
    job.context.update(world_size=world, ranks_reported=sorted(records), missing_ranks=missing)
    job.summary["world_size"] = world
    return job
