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

import os
import shutil
from collections.abc import Iterable
from concurrent.futures import Executor
from dataclasses import fields
from pathlib import Path

import pandas as pd

from swift_nb.analysis.cost import price
from swift_nb.analysis.ranks import RankAnalysis
from swift_nb.analysis.trace.decode import DEFAULT_MAX_BYTES
from swift_nb.capture.job import RANK_COLUMNS
from swift_nb.core.devices import check_price
from swift_nb.core.errors import ConfigError
from swift_nb.core.units import fmt_span
from swift_nb.importing.files import trace_files
from swift_nb.importing.pool import gather, reduce_in_workers, submit
from swift_nb.importing.rank import RankRecord, reduce_rank
from swift_nb.record import (
    RANK_STEPS_FILE,
    RANKS_FILE,
    TRACE_FILE,
    Run,
    default_root,
    ensure_writable,
    new_run_id,
    rank_folder,
    rank_trace_file,
    read_back,
    save,
    tables_path,
)


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

    Imported runs are never pruned by the import: it adds a folder and deletes nothing.

    Args:
        paths: trace files, or folders of them (``.json`` / ``.json.gz``); several ranks of
            one job make one job record.
        out_dir: the folder of run folders (default ``$SWIFT_NB_DIR`` or ``./swift_nb_runs``);
            the run's folder is created in it.
        label: a name for the run; its folder's name is made from the time and the label
            (``"import"`` when none is given).
        report: analyze the run and write its report.html (as ``swift_nb.report``; default
            True).
        max_bytes: the most JSON one trace may hold once decompressed (default 16 GiB); a
            larger file, or a gzip that would inflate past it, is refused as it decompresses.
        workers: processes that read the ranks' traces at once (default: one per core, at
            most one per trace; a job of under 16 MB of files is read in this process, as with
            ``workers=1``); each rank is reduced to its tables and record before the next, so
            memory does not grow with the number of ranks.
        executor: any ``concurrent.futures.Executor`` that reads the ranks instead (a Dask
            client's ``get_executor()``; it is not shut down): every trace is read and reduced
            where the executor runs it, its copy and tables written into a staging folder
            beside the run, so its workers must see the traces and ``out_dir`` at the same
            paths.
        price_per_hour: USD one GPU costs an hour, for the run's money keys
            (``swift_nb.analysis.cost``: default ``$SWIFT_NB_PRICE_PER_HOUR``, else the list
            price of the trace's GPU).
        price_per_kwh: USD per kWh (a trace records no energy: kept for runs compared with it).

    Returns:
        The imported Run, saved in its folder (analyzed, with its report, when ``report``).

    Raises:
        RanksNotReadError: a rank whose work fails other than on its trace (a worker killed or
            lost, a file it cannot see), naming the traces not read.
    """
    price_per_hour = check_price("price_per_hour", price_per_hour)
    price_per_kwh = check_price("price_per_kwh", price_per_kwh)
    files = trace_files(paths)
    _check_workers(max_bytes, workers, executor)
    root = ensure_writable(Path(out_dir) if out_dir is not None else default_root())
    folder = root / new_run_id(label or "import")
    folder.mkdir()
    # the ranks' copies and tables are written beside the run until they are placed in it:
    # a remote worker still writing when the import fails cannot leave a file in the run
    staging = Path(os.path.abspath(root / f".{folder.name}.staging"))
    # a job's report reads every rank's findings and collectives: each rank's are made
    # while its tables are held (in the workers), not by reading every trace again
    analyze = report and len(files) > 1
    try:
        staging.mkdir()
        reduced = _reduce_all(files, staging, max_bytes, workers, executor, analyze)
        run, analyzed = _assemble(reduced, folder, analyze)
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

        tables = reduced[0].trace if len(reduced) == 1 else None
        return reporting.report(run, trace_tables=tables, ranks=analyzed).run
    return run


#: below this many bytes of trace files in all, a job's ranks are read in this process: a
#: worker's start (its interpreter and imports) costs more than they take to read
IN_PROCESS_BYTES = 16 << 20


def _check_workers(max_bytes: int, workers: int | None, executor: Executor | None) -> None:
    """``max_bytes`` and ``workers`` are positive whole numbers; ``executor`` is an
    Executor, and not given with ``workers``."""
    if not isinstance(max_bytes, int) or max_bytes <= 0:
        raise ConfigError("max_bytes", "must be a positive number of bytes", max_bytes)
    if workers is not None and (not isinstance(workers, int) or workers < 1):
        raise ConfigError("workers", "must be a whole number ≥ 1", workers)
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
    analyze: bool,
) -> list[RankRecord]:
    """Every file reduced by ``reduce_rank``, its copy and tables staged in ``staging``:
    by ``executor``, else here or in local worker processes."""
    staged = [staging / f"{i}.json.gz" for i in range(len(files))]
    if executor is not None:
        # an executor's workers may run elsewhere, in another working directory
        futures = submit(executor, [Path(os.path.abspath(f)) for f in files], staged, max_bytes, analyze)
        return gather(futures, files)
    small = sum(f.stat().st_size for f in files) < IN_PROCESS_BYTES
    if len(files) == 1 or workers == 1 or (workers is None and small):
        # one trace's tables are kept for its report (read once); a job's are not
        keep = len(files) == 1
        return [reduce_rank(f, s, max_bytes, analyze, keep) for f, s in zip(files, staged, strict=True)]
    return reduce_in_workers(files, staged, max_bytes, workers, analyze)


def _assemble(
    reduced: list[RankRecord], folder: Path, analyze: bool
) -> tuple[Run, dict[int, RankAnalysis] | None]:
    """The run record of the reduced ranks in ``folder``, and (``analyze``) each rank's analysis."""
    by_rank = _by_rank(reduced)
    if len(by_rank) == 1:
        rr = next(iter(by_rank.values()))
        _place(rr, folder / TRACE_FILE)
        rr.record.files["trace"] = TRACE_FILE
        return rr.record, None
    analyzed = {r: rr.analysis for r, rr in by_rank.items() if rr.analysis is not None}
    return _job_record(by_rank, folder), (analyzed if analyze else None)


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
    job.ranks = read_back(pd.DataFrame(rows, columns=RANK_COLUMNS), RANKS_FILE)
    job.rank_steps = read_back(
        pd.concat([rec.steps.assign(rank=r) for r, rec in records.items()], ignore_index=True),
        RANK_STEPS_FILE,
    )
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
