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
the folder as on any captured run. A job's ranks are read in local worker processes, or by
any ``concurrent.futures.Executor`` (a Dask cluster's ``Client.get_executor()``): each rank
is read and reduced where the executor runs it.
"""

from __future__ import annotations

import contextlib
import gzip
import multiprocessing
import os
import shutil
import sys
from collections.abc import Iterable, Iterator
from concurrent.futures import FIRST_EXCEPTION, CancelledError, Executor, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import pandas as pd

from swift_nb.analysis.cost import check_price, price
from swift_nb.analysis.ranks import RankAnalysis, analyse_rank
from swift_nb.analysis.trace.decode import DEFAULT_MAX_BYTES, GZIP_MAGIC
from swift_nb.analysis.trace.tables import Trace, read_trace_with_meta, save_tables
from swift_nb.capture.job import RANK_COLUMNS
from swift_nb.core import trace_names as tn
from swift_nb.core.errors import ConfigError, RecordError
from swift_nb.core.units import fmt_span
from swift_nb.importing.rank import rank_record
from swift_nb.record import (
    TRACE_FILE,
    Run,
    default_root,
    ensure_writable,
    new_run_id,
    rank_folder,
    rank_trace_file,
    save,
    tables_path,
)

#: the file names torch.profiler gives traces (``*.pt.trace.json`` too)
TRACE_SUFFIXES = (".json", ".json.gz")
#: what to do when a local worker process dies
_LOCAL_ADVICE = "Try again with fewer workers (import_trace(..., workers=1)) or on a machine with more memory"
#: what to do when an executor's worker is lost or fails
_EXECUTOR_ADVICE = (
    "No run was written: import again once the executor's workers are healthy; they must see the "
    "trace files and the output folder at the same paths as this process (shared storage)"
)


class RanksNotReadError(RuntimeError):
    """Traces an import could not read because the worker reading them died, was lost or
    failed; no run folder is left. ``unread``: those files; ``ranks``: their ranks where
    the ranks read tell (every rank of the job given), else None."""

    def __init__(self, message: str, unread: list[Path], ranks: list[int] | None) -> None:
        super().__init__(message)
        self.unread, self.ranks = unread, ranks


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
    executor: Executor | None = None,
    price_per_hour: float | None = None,
    price_per_kwh: float | None = None,
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
    ``executor``: any ``concurrent.futures.Executor`` that reads the ranks instead (a Dask
    client's ``get_executor()``; it is not shut down): every trace is read and reduced
    where the executor runs it, its copy and tables written into a staging folder beside
    the run, so its workers must see the traces and ``out_dir`` at the same paths. A rank
    whose work fails other than on its trace (a worker killed or lost, a file it cannot
    see) is a ``RanksNotReadError`` naming the traces not read.
    ``price_per_hour``: USD one GPU costs an hour, for the run's money keys
    (``swift_nb.analysis.cost``: default ``$SWIFT_NB_PRICE_PER_HOUR``, else the list price of
    the trace's GPU); ``price_per_kwh``: USD per kWh (a trace records no energy: kept for
    runs compared with it).
    Imported runs are never pruned by the import: it adds a folder and deletes nothing.
    """
    price_per_hour = check_price("price_per_hour", price_per_hour)
    price_per_kwh = check_price("price_per_kwh", price_per_kwh)
    files = trace_files(paths)
    if not isinstance(max_bytes, int) or max_bytes <= 0:
        raise ConfigError("max_bytes", "must be a positive number of bytes", max_bytes)
    if workers is not None and (not isinstance(workers, int) or workers < 1):
        raise ConfigError("workers", "must be a whole number ≥ 1", workers)
    _check_executor(executor, workers)
    root = ensure_writable(Path(out_dir) if out_dir is not None else default_root())
    folder = root / new_run_id(label or "import")
    folder.mkdir()
    # the ranks' copies and tables are written beside the run until they are placed in it:
    # a remote worker still writing when the import fails cannot leave a file in the run
    staging = Path(os.path.abspath(root / f".{folder.name}.staging"))
    # a job's report reads every rank's findings and collectives: each rank's are made
    # while its tables are held (in the workers), not by reading every trace again
    analyse = report and len(files) > 1
    try:
        staging.mkdir()
        reduced = _reduce_all(files, staging, max_bytes, workers, executor, analyse)
        run, analysed = _assemble(reduced, folder, analyse)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)  # no half-imported run is left behind
        raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    run.id, run.label, run.path = folder.name, label, folder
    price(run, price_per_hour, price_per_kwh)
    save(run)
    if report:
        from swift_nb import reporting  # the API composes the layers above

        return reporting.report(run, ranks=analysed).run
    return run


#: below this many bytes of trace files in all, a job's ranks are read in this process: a
#: worker's start (its interpreter and imports) costs more than they take to read
IN_PROCESS_BYTES = 16 << 20


def _check_executor(executor: Executor | None, workers: int | None) -> None:
    """``executor`` is an Executor, and not given with ``workers``."""
    if executor is None:
        return
    if not isinstance(executor, Executor):
        raise ConfigError(
            "executor", "must be a concurrent.futures.Executor (a Dask client's get_executor())", executor
        )
    if workers is not None:
        raise ConfigError("workers", "sizes the local worker processes: give workers= or executor=", workers)


def _reduce_all(
    files: list[Path],
    staging: Path,
    max_bytes: int,
    workers: int | None,
    executor: Executor | None,
    analyse: bool,
) -> list[RankRecord]:
    """Every file reduced by ``reduce_rank``, its copy and tables staged in ``staging``:
    by ``executor``, else here or in local worker processes."""
    staged = [staging / f"{i}.json.gz" for i in range(len(files))]
    if executor is not None:
        # an executor's workers may run elsewhere, in another working directory
        futures = _submit(executor, [Path(os.path.abspath(f)) for f in files], staged, max_bytes, analyse)
        return _gather(futures, files, local=False)
    small = sum(f.stat().st_size for f in files) < IN_PROCESS_BYTES
    if len(files) == 1 or workers == 1 or (workers is None and small):
        return [reduce_rank(f, s, max_bytes, analyse) for f, s in zip(files, staged, strict=True)]
    return _reduce_in_workers(files, staged, max_bytes, workers, analyse)


def _assemble(
    reduced: list[RankRecord], folder: Path, analyse: bool
) -> tuple[Run, dict[int, RankAnalysis] | None]:
    """The run record of the reduced ranks in ``folder``, and (``analyse``) each rank's analysis."""
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
    record = rank_record(rt)
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
    files: list[Path], staged: list[Path], max_bytes: int, workers: int | None, analyse: bool = False
) -> list[RankRecord]:
    """Every file reduced by ``reduce_rank`` in at most ``workers`` processes (default:
    the cores); a worker that dies (killed, out of memory) is an error naming the traces
    it left unread, never a wait."""
    n = min(len(files), workers or os.cpu_count() or 1)
    with ProcessPoolExecutor(max_workers=n, mp_context=_context()) as pool:
        with _main_script_hidden():  # the workers start as these are submitted
            futures = _submit(pool, files, staged, max_bytes, analyse)
        return _gather(futures, files, local=True)


def _submit(
    executor: Executor, files: list[Path], staged: list[Path], max_bytes: int, analyse: bool
) -> list[Future]:
    """``reduce_rank`` of every file submitted (by reference to this module's function, so
    any executor can send it to its workers); those submitted are cancelled if one fails to be."""
    futures: list[Future] = []
    try:
        for f, s in zip(files, staged, strict=True):
            futures.append(executor.submit(reduce_rank, f, s, max_bytes, analyse))
    except BaseException:
        _cancel(futures)
        raise
    return futures


def _gather(futures: list[Future], files: list[Path], local: bool) -> list[RankRecord]:
    """The futures' records, in order. At the first failure the rest are cancelled and it
    is raised: a trace's own error (``RecordError``, ``ConfigError``) as it is; a lost
    worker as ``RanksNotReadError``: of the ``local`` process pool a ``BrokenProcessPool``
    (any other error is raised as it is), of another executor any other error (a worker
    killed or lost, a file it cannot see)."""
    try:
        wait(futures, return_when=FIRST_EXCEPTION)
    except BaseException:
        _cancel(futures)
        raise
    if all(_read(fut) for fut in futures):
        return [fut.result() for fut in futures]
    read = [fut.result() for fut in futures if _read(fut)]
    unread = [p for p, fut in zip(files, futures, strict=True) if not _read(fut)]
    cause = next(e for e in map(_failure, futures) if e is not None)
    _cancel(futures)
    if isinstance(cause, (RecordError, ConfigError)) or (local and not isinstance(cause, BrokenProcessPool)):
        raise cause
    raise _not_read(files, unread, read, cause, local) from cause


def _read(fut: Future) -> bool:
    return fut.done() and not fut.cancelled() and fut.exception() is None


def _failure(fut: Future) -> BaseException | None:
    if not fut.done():
        return None
    return CancelledError() if fut.cancelled() else fut.exception()


def _cancel(futures: list[Future]) -> None:
    for fut in futures:
        fut.cancel()


def _not_read(
    files: list[Path], unread: list[Path], read: list[RankRecord], cause: BaseException, local: bool
) -> RanksNotReadError:
    """The error naming the traces not read, and their ranks where the ranks read tell."""
    ranks = _unread_ranks(len(files), read)
    shown = ", ".join(map(str, unread[:4])) + (" …" if len(unread) > 4 else "")
    if local:
        what = "a worker process reading the traces died (killed, or out of memory) before it finished"
    else:
        what = f"a worker reading the traces was lost or failed ({_said(cause)})"
    return RanksNotReadError(
        f"{what}; {len(unread)} of {len(files)} traces were not read: {shown}"
        f"{f' (ranks not read: {fmt_span(ranks)})' if ranks else ''}. "
        f"{_LOCAL_ADVICE if local else _EXECUTOR_ADVICE}",
        unread,
        ranks,
    )


def _said(error: BaseException) -> str:
    """An error's type and first sentence (Dask's KilledWorker goes on for a paragraph)."""
    text = str(error).strip()
    first = text.splitlines()[0].split(". ")[0][:300] if text else ""
    return f"{type(error).__name__}: {first}" if first else type(error).__name__


def _unread_ranks(n_files: int, read: list[RankRecord]) -> list[int] | None:
    """The job's ranks missing from ``read`` when ``n_files`` traces are all its ranks."""
    worlds = {rr.world_size for rr in read}
    if len(worlds) != 1 or next(iter(worlds)) != n_files:
        return None
    missing = sorted(set(range(n_files)) - {rr.rank for rr in read})
    return missing if len(missing) == n_files - len(read) else None


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
