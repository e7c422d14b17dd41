"""A job's ranks read in local worker processes (``ProcessPoolExecutor``, forkserver) or by any
``concurrent.futures.Executor`` (a Dask cluster's ``Client.get_executor()``): each rank is
reduced (``rank.reduce_rank``) where its worker runs. A worker that dies or is lost is a
``RanksNotReadError`` naming the traces it left unread, within seconds: the surviving local
workers are killed, never waited for."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_EXCEPTION, CancelledError, Executor, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

from swift_nb.core.errors import ConfigError, RecordError
from swift_nb.core.units import fmt_span
from swift_nb.importing.rank import RankRecord, reduce_rank

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


#: a reduction: ``(trace, staged, max_bytes, analyze) -> RankRecord`` (``rank.reduce_rank``)
Reduce = Callable[[Path, Path, int, bool], RankRecord]
#: how long a killed worker may take to be reaped before the import gives up on it
KILL_WAIT_S = 5.0


def _context() -> multiprocessing.context.BaseContext:
    # forkserver (or spawn): a fork of a process that has started torch's or CUDA's threads
    # can deadlock in the child
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    ctx = multiprocessing.get_context("forkserver")
    # the server imports the reduction's module once; each worker forked from it starts
    # with it loaded
    ctx.set_forkserver_preload([reduce_rank.__module__])
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


def reduce_in_workers(
    files: list[Path],
    staged: list[Path],
    max_bytes: int,
    workers: int | None,
    analyze: bool = False,
    reduce: Reduce = reduce_rank,
) -> list[RankRecord]:
    """Every file reduced by ``reduce`` in at most ``workers`` processes (default: the
    cores). A worker that dies (killed, out of memory) is a ``RanksNotReadError`` naming
    the traces left unread, never a wait: the other workers are killed, not joined
    (``concurrent.futures`` would wait for an idle one that never gets its sentinel)."""
    n = min(len(files), workers or os.cpu_count() or 1)
    pool = ProcessPoolExecutor(max_workers=n, mp_context=_context())
    done = False
    try:
        with _main_script_hidden():  # the workers start as these are submitted
            futures = submit(pool, files, staged, max_bytes, analyze, reduce)
        records = gather(futures, files, local=True, broken=lambda: bool(getattr(pool, "_broken", False)))
        done = True
        return records
    finally:
        if done:
            pool.shutdown(wait=True)
        else:
            _kill(pool)


def _kill(pool: ProcessPoolExecutor) -> None:
    """The pool's workers killed and reaped, its queued work cancelled, and its manager
    left to finish on its own (it does once no worker is alive)."""
    processes = list((getattr(pool, "_processes", None) or {}).values())
    for proc in processes:
        with contextlib.suppress(OSError, ValueError):
            proc.kill()
    pool.shutdown(wait=False, cancel_futures=True)
    for proc in processes:
        with contextlib.suppress(OSError, ValueError, AssertionError):
            proc.join(KILL_WAIT_S)


def submit(
    executor: Executor,
    files: list[Path],
    staged: list[Path],
    max_bytes: int,
    analyze: bool,
    reduce: Reduce = reduce_rank,
) -> list[Future]:
    """``reduce`` of every file submitted (by reference to its module's function, so any
    executor can send it to its workers); those submitted are cancelled if one fails to be."""
    futures: list[Future] = []
    try:
        for f, s in zip(files, staged, strict=True):
            futures.append(executor.submit(reduce, f, s, max_bytes, analyze))
    except BaseException:
        _cancel(futures)
        raise
    return futures


def gather(
    futures: list[Future], files: list[Path], local: bool, broken: Callable[[], bool] = lambda: False
) -> list[RankRecord]:
    """The futures' records, in order. At the first failure the rest are cancelled and it
    is raised: a trace's own error (``RecordError``, ``ConfigError``) as it is; a lost
    worker as ``RanksNotReadError``: of the ``local`` process pool, a ``BrokenProcessPool``
    or any error while the pool is ``broken`` (a worker killed mid-reply reads as an
    ``EOFError``); any other error of a local worker is raised as it is; of another
    executor, any other error (a worker killed or lost, a file it cannot see)."""
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
    if isinstance(cause, (RecordError, ConfigError)):
        raise cause
    if local and not (isinstance(cause, (BrokenProcessPool, EOFError)) or broken()):
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
