"""A job's ranks read in local worker processes (forkserver) or by any
``concurrent.futures.Executor`` (a Dask cluster's ``Client.get_executor()``): each rank is
reduced (``rank.reduce_rank``) where its worker runs. A worker that dies or is lost is a
``RanksNotReadError`` naming the traces it left unread, within seconds: the surviving local
workers are killed, never waited for.

The local workers are plain processes, each with a pipe of its own: one trace sent, its
record or its error sent back. No queue or lock is shared between them, so nothing is
registered with multiprocessing's resource tracker, and a worker killed anywhere (between
traces, mid-reply, as it starts) reads here as the end of its pipe."""

from __future__ import annotations

import contextlib
import os
import signal
import traceback
import warnings
from collections import deque
from collections.abc import Callable
from concurrent.futures import FIRST_EXCEPTION, CancelledError, Executor, Future, wait
from multiprocessing.connection import Connection
from multiprocessing.connection import wait as ready
from pathlib import Path
from typing import Any

from swift_nb.core.errors import ConfigError, RecordError
from swift_nb.core.units import fmt_span
from swift_nb.importing.processes import context, main_script_hidden
from swift_nb.importing.rank import RankRecord, reduce_rank

#: what to do when a local worker process dies
_LOCAL_ADVICE = "Try again with fewer workers (import_trace(..., workers=1)) or on a machine with more memory"
#: what a local worker's death is
_DIED = "a worker process reading the traces died (killed, or out of memory) before it finished"
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


class WorkerError(Exception):
    """Where a local worker's error was raised: its traceback, as text (the cause of the
    error raised here, which a pipe carries without its frames)."""

    def __str__(self) -> str:
        return str(self.args[0])


#: a reduction: ``(trace, staged, max_bytes, analyze) -> RankRecord`` (``rank.reduce_rank``)
Reduce = Callable[[Path, Path, int, bool], RankRecord]
#: how long a worker may take to end (asked to, or killed) before the import gives up on it
KILL_WAIT_S = 5.0
#: the warning multiprocessing gives where its resource tracker was killed since it last
#: wrote to it (it starts another as a worker is started)
_TRACKER_RELAUNCHED = "resource_tracker: process died unexpectedly"


def _serve(conn: Connection) -> None:
    """A local worker: each ``(reduce, args)`` received is run, and ``("ok", record, "")``
    or ``("error", exception, its traceback)`` sent back, until ``None`` or until the
    importing process is gone."""
    # an interrupt is the importing process's to handle: it kills its workers
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    while True:
        try:
            task = conn.recv()
        except (EOFError, OSError):
            return
        if task is None:
            return
        reduce, args = task
        try:
            reply: tuple[str, Any, str] = ("ok", reduce(*args), "")
        except Exception as e:
            reply = ("error", e, traceback.format_exc())
        try:
            conn.send(reply)
        except OSError:
            return
        except Exception as e:  # it does not pickle (nothing was sent)
            unsent = RuntimeError(f"{args[0]}: its {reply[0]} cannot be sent back ({e!r})")
            with contextlib.suppress(OSError):
                conn.send(("error", unsent, reply[2]))


class _Worker:
    """A local worker process (``_serve``) and this end of its pipe; ``reading``: the
    index of the trace it was last sent."""

    def __init__(self, ctx: Any) -> None:
        self.conn, theirs = ctx.Pipe()
        self.process = ctx.Process(target=_serve, args=(theirs,))
        self.reading = -1
        try:
            self.process.start()
        except BaseException:
            self.conn.close()
            raise
        finally:
            theirs.close()  # the worker's end is the worker's alone: its death ends the pipe

    def end(self, kill: bool) -> None:
        """Asked to end once its trace is read, or killed."""
        with contextlib.suppress(OSError, ValueError):
            if kill:
                self.process.kill()
            else:
                self.conn.send(None)

    def reap(self) -> None:
        """Waited for (killed past ``KILL_WAIT_S``), its pipe closed."""
        with contextlib.suppress(OSError, ValueError, AssertionError):
            self.process.join(KILL_WAIT_S)
            if self.process.exitcode is None:
                self.process.kill()
                self.process.join(KILL_WAIT_S)
        self.conn.close()


def reduce_in_workers(
    files: list[Path],
    staged: list[Path],
    max_bytes: int,
    workers: int | None,
    analyze: bool = False,
    reduce: Reduce = reduce_rank,
) -> list[RankRecord]:
    """Every file reduced by ``reduce`` in at most ``workers`` processes (default: the
    cores), a trace at a time each. A trace's own error (``RecordError``, ...) is raised as
    it is; a worker that dies (killed, out of memory) or cannot be started is a
    ``RanksNotReadError`` naming the traces left unread, never a wait: the other workers
    are killed, not joined."""
    n = min(len(files), workers or os.cpu_count() or 1)
    tasks = [(reduce, (f, s, max_bytes, analyze)) for f, s in zip(files, staged, strict=True)]
    todo = deque(range(len(files)))
    records: dict[int, RankRecord] = {}
    started: list[_Worker] = []
    busy: list[_Worker] = []

    def not_read(what: str) -> RanksNotReadError:
        unread = [f for i, f in enumerate(files) if i not in records]
        return _not_read(files, unread, list(records.values()), what, _LOCAL_ADVICE)

    def give(worker: _Worker) -> None:
        """The next trace sent to ``worker``, if one is left."""
        if not todo:
            return
        worker.reading = todo.popleft()
        try:
            worker.conn.send(tasks[worker.reading])
        except OSError as e:
            raise not_read(_DIED) from e
        busy.append(worker)

    done = False
    try:
        ctx = context()
        for _ in range(n):
            try:
                with main_script_hidden(), warnings.catch_warnings():
                    # these workers register nothing with the tracker: its replacement has
                    # nothing of theirs to miss
                    warnings.filterwarnings("ignore", _TRACKER_RELAUNCHED, UserWarning)
                    worker = _Worker(ctx)
            except (OSError, EOFError) as e:  # the fork server died as it forked it
                raise not_read(f"a worker process could not be started ({_said(e)})") from e
            started.append(worker)
            give(worker)
        while busy:
            replied = ready([w.conn for w in busy])
            for worker in [w for w in busy if w.conn in replied]:
                busy.remove(worker)
                try:
                    status, value, where = worker.conn.recv()
                except (EOFError, OSError) as e:  # the pipe ended: the worker is gone
                    raise not_read(_DIED) from e
                if status != "ok":
                    raise value from WorkerError(where)
                records[worker.reading] = value
                give(worker)
        done = True
        return [records[i] for i in range(len(files))]
    finally:
        for worker in started:
            worker.end(kill=not done)
        for worker in started:
            worker.reap()


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


def gather(futures: list[Future], files: list[Path]) -> list[RankRecord]:
    """An executor's records, in order. At the first failure the rest are cancelled and it
    is raised: a trace's own error (``RecordError``, ``ConfigError``) as it is; any other
    (a worker killed or lost, a file it cannot see) as ``RanksNotReadError``."""
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
    what = f"a worker reading the traces was lost or failed ({_said(cause)})"
    raise _not_read(files, unread, read, what, _EXECUTOR_ADVICE) from cause


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
    files: list[Path], unread: list[Path], read: list[RankRecord], what: str, advice: str
) -> RanksNotReadError:
    """The error naming the traces not read, and their ranks where the ranks read tell:
    ``what`` happened, then ``advice``."""
    ranks = _unread_ranks(len(files), read)
    shown = ", ".join(map(str, unread[:4])) + (" …" if len(unread) > 4 else "")
    return RanksNotReadError(
        f"{what}; {len(unread)} of {len(files)} traces were not read: {shown}"
        f"{f' (ranks not read: {fmt_span(ranks)})' if ranks else ''}. {advice}",
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
