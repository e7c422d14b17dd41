"""The files a rerun worker writes beside its spec, which the launcher reads: its progress
and its result (one per rank). Apart from the worker, so that the launcher reads their
names without importing the worker (and torch) and ``python -m swift_nb.rerun.worker``
runs a module the package has not imported yet."""

from __future__ import annotations

PROGRESS_FILE = "progress.json"
RESULT_FILE = "result.json"


def result_file(rank: int) -> str:
    """The result file of ``rank`` (rank 0's is ``result.json``)."""
    return RESULT_FILE if rank == 0 else f"result.rank{rank}.json"
