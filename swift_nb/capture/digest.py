"""What is done with a finished trace, as one job for the helper process (``helper``).

The training process exports each profiler cycle as a JSON part and goes on; ``digest``
turns the parts into the run's gzipped trace (under a temporary name the training process
gives it once the run ends), reads which steps it recorded, replays the tensor memory by
category (``memory_categories``), measures what a rank of a job reports about itself
(``job``), and hands the events to the layers above (``DigestJob.build``: the trace's
tables and the figures it alone determines). It runs in the helper, or in a thread of the
training process where there is no helper; nothing of it needs the training process's
objects, only the job.
"""

from __future__ import annotations

import gzip
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from swift_nb.capture import job
from swift_nb.capture.memory import categories as memcat
from swift_nb.core.gc_pause import paused
from swift_nb.core.trace_names import step_of


@dataclass
class DigestJob:
    """``parts``: the exported cycles, in order; ``gz``: where the merged, gzipped trace
    goes; ``out``: the name it will have. ``snapshots``/``device``: the optimizers'
    storages at the recorded steps' edges and their device type, for the memory replay
    (None: no replay). ``rank``: measure what a rank of a job reports about itself.
    ``build``: ``"module:function"`` called with ``(events, out, gz)`` (the layers above:
    tables and figures); what it returns is ``DigestResult.built``."""

    parts: list[Path]
    gz: Path
    out: Path
    snapshots: dict[int, memcat.Snapshot] | None = None
    device: int = 0
    rank: bool = False
    build: str | None = None


@dataclass
class DigestResult:
    """What the training process takes back: the steps the trace recorded, its number of
    events, the memory replay (None: not done), a rank's collective seconds per step and
    share and the data-parallel wrappers its trace names, what ``build`` returned (None:
    not asked, or it failed) and the problems met on the way, as notes."""

    recorded: list[int]
    events: int
    memory: dict[int, memcat.StepMemory] | None = None
    collective: tuple[float, float] | None = None
    wrappers: list[str] = field(default_factory=list)
    built: Any = None
    problems: list[str] = field(default_factory=list)
    pid: int | None = None  # the process that digested it


def digest(work: DigestJob) -> DigestResult:
    """Do ``work``; an error reading or writing the trace is raised, a failing replay or
    build is a problem in the result (the report derives those again after the cell)."""
    with paused():  # decoding makes millions of objects at once (see gc_pause)
        events = _merge(work)
    result = DigestResult(recorded_steps(events), len(events), pid=os.getpid())
    if work.snapshots is not None:
        try:
            result.memory = memcat.step_memory(events, work.snapshots, work.device)
        except Exception as e:
            result.problems.append(f"memory by category could not be replayed ({type(e).__name__}: {e})")
    if work.rank:
        result.collective = job.collective_summary(events)
        result.wrappers = job.wrappers(events)
    if work.build is not None:
        from swift_nb.capture.helper import resolve

        try:
            result.built = resolve(work.build)(events, work.out, work.gz)
        except Exception:  # built again after the cell, where a failure is reported
            pass
    return result


def _merge(work: DigestJob) -> list[dict[str, Any]]:
    """The parts' events, written gzipped into ``work.gz``."""
    if len(work.parts) == 1:
        data = work.parts[0].read_bytes()
        # zlib lets go of the GIL: the file is compressed on one core while it is decoded
        # on the other (a quarter of the digest's decoding, for a 50 MB trace at the end)
        with ThreadPoolExecutor(1, thread_name_prefix="swift_nb-gzip") as pool:
            written = pool.submit(_write_gz, work.gz, data)
            try:
                events = orjson.loads(data)["traceEvents"]
            finally:
                written.result()
        return events
    doc: dict[str, Any] | None = None
    for part in work.parts:
        extra = orjson.loads(part.read_bytes())
        if doc is None:
            doc = extra
        else:
            doc["traceEvents"].extend(extra["traceEvents"])
    assert doc is not None, "a digest has parts"
    _write_gz(work.gz, orjson.dumps(doc))
    return doc["traceEvents"]


def _write_gz(path: Path, data: bytes) -> None:
    with gzip.open(path, "wb", compresslevel=3) as dst:
        dst.write(data)


def recorded_steps(events: list[dict[str, Any]]) -> list[int]:
    """The steps whose spans the trace holds, in order."""
    return sorted(k for e in events if e.get("ph") == "X" and (k := step_of(e.get("name", ""))) is not None)
