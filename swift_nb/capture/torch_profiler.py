"""A scheduled ``torch.profiler.profile`` driven by step boundaries, exporting a gzipped
Chrome/Perfetto trace into the run folder.

Schedule: ``wait`` steps skip start-up noise, ``warmup`` steps let the profiler settle
(traced, then discarded), ``active`` steps are recorded; the cycle runs ``repeat`` times
(0 = until the run ends). Step ``k`` of the run is the profiler's step span ``k`` in the
trace (``trace_names.STEP_PREFIX`` + k).
"""

from __future__ import annotations

import gzip
import os
import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import torch
from torch.profiler import ProfilerActivity

from swift_nb.gc_pause import paused
from swift_nb.options import ProfileOptions, check_schedule
from swift_nb.record import TRACE_FILE
from swift_nb.trace_names import step_of


@dataclass
class ProfilerConfig:
    """What to profile and when; validated before any work starts."""

    wait: int = 1
    warmup: int = 2
    active: int = 3
    repeat: int = 1
    record_shapes: bool = True
    profile_memory: bool = True
    with_stack: bool = False

    def __post_init__(self) -> None:
        check_schedule(self.wait, self.warmup, self.active, self.repeat)

    @classmethod
    def from_options(cls, o: ProfileOptions) -> ProfilerConfig:
        return cls(o.wait, o.warmup, o.active, o.repeat, o.record_shapes, o.profile_memory, o.with_stack)

    @property
    def cycle(self) -> int:
        return self.wait + self.warmup + self.active

    @property
    def total_steps(self) -> int | None:
        """Steps the schedule spans (None when it repeats until the end)."""
        return self.cycle * self.repeat if self.repeat else None

    def phase(self, step: int) -> str:
        """The schedule's phase for ``step``: wait, warmup, active, or none once done."""
        total = self.total_steps
        if total is not None and step >= total:
            return "none"
        pos = step % self.cycle
        if pos < self.wait:
            return "wait"
        return "warmup" if pos < self.wait + self.warmup else "active"


#: What the layers above do with a finished trace while the cell still runs (for
#: ``swift_nb.api``: build the analyses' tables, draw the figures the trace alone
#: determines), handed to ``TraceRecorder`` by whoever starts the capture. Called off the
#: training thread as soon as the profiler's last cycle is exported, as
#: ``on_trace(events, trace_path, written)``: ``trace_path`` is the name the trace will
#: have, ``written`` the file holding it until then (its bytes already final). What it
#: returns is ``TraceResult.tables``.
OnTrace = Callable[[list[dict[str, Any]], Path, Path], Any]


@dataclass
class TraceResult:
    """The merged trace file, its events (for the memory replay), the recorded steps, and
    what was derived from the events while the cell ran (None: not derived): what
    ``on_trace`` returned (``tables``) and the memory replay (``TraceRecorder.digest``)."""

    path: Path | None
    events: list[dict[str, Any]]
    recorded_steps: list[int]
    tables: Any = None
    memory: Any = None


class _ExportedCycle:
    """One exported cycle, worked on in a background thread while the training goes on:
    gzipped into ``gz`` (when it is the trace's only cycle), decoded, handed to ``build``
    (``OnTrace``) and replayed for memory (``memory``). ``result()`` waits for it; an error
    in reading or writing the trace is raised there, on the caller's thread."""

    def __init__(
        self, part: Path, gz: Path | None, build: OnTrace | None, memory: Callable | None, out: Path
    ) -> None:
        self.part, self.gz = part, gz
        self._jobs: dict[str, Callable[[list[dict[str, Any]]], Any] | None] = {
            "tables": (lambda events: build(events, out, gz))
            if build is not None and gz is not None
            else None,
            "memory": memory,
        }
        self.doc: dict[str, Any] | None = None
        self.derived: dict[str, Any] = {}
        self._error: BaseException | None = None
        # Not a daemon: an interpreter exiting right after the cell still completes the file.
        self._thread = threading.Thread(target=self._run, name="swift_nb-trace", daemon=False)
        self._thread.start()

    def _run(self) -> None:
        try:
            data = self.part.read_bytes()
            if self.gz is not None:
                with gzip.open(self.gz, "wb", compresslevel=3) as dst:
                    dst.write(data)  # zlib lets the training thread run meanwhile
            with paused():  # decoding makes millions of objects at once (see gc_pause)
                self.doc = orjson.loads(data)
            del data
            self.derived["recorded"] = recorded_steps(self.doc["traceEvents"])
        except BaseException as e:
            self._error = e
            return
        for name, job in self._jobs.items():
            if job is not None:
                try:
                    self.derived[name] = job(self.doc["traceEvents"])
                except Exception:  # done again after the cell, where a failure is reported
                    pass

    def wait(self) -> None:
        self._thread.join()

    def result(self) -> dict[str, Any]:
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self.doc


class TraceRecorder:
    """Owns one scheduled torch profiler for a run. ``on_trace``: called with the trace of
    a one-cycle schedule once it is exported (``OnTrace``); None: nothing is."""

    def __init__(
        self,
        cfg: ProfilerConfig,
        folder: Path,
        note: Callable[[str], None],
        name: str = TRACE_FILE,
        on_trace: OnTrace | None = None,
    ) -> None:
        self.cfg = cfg
        self._folder = folder
        self._name = name
        self._note = note
        self._on_trace = on_trace
        self._parts: list[Path] = []
        self._cycles: list[_ExportedCycle] = []
        self._steps = 0  # step() calls so far
        self._stopped = False
        with warnings.catch_warnings():
            # warmup=0 is the user's explicit choice; torch warns about it regardless
            warnings.simplefilter("ignore")
            schedule = torch.profiler.schedule(
                wait=cfg.wait, warmup=cfg.warmup, active=cfg.active, repeat=cfg.repeat
            )
        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        self._prof = torch.profiler.profile(
            activities=activities,
            schedule=schedule,
            on_trace_ready=self._export,
            record_shapes=cfg.record_shapes,
            profile_memory=cfg.profile_memory,
            with_stack=cfg.with_stack,
        )

    def start(self) -> None:
        self._prof.start()

    @property
    def recording(self) -> bool:
        """Whether the schedule has steps left: once its last cycle is exported the
        profiler is stopped, and the steps after it pay no profiler at all (torch's own
        ``ProfilerStep`` spans and callbacks on every op would go on otherwise)."""
        return not self._stopped

    def step(self) -> None:
        if self._stopped:
            return
        self._prof.step()
        self._steps += 1
        total = self.cfg.total_steps
        if total is not None and self._steps >= total:
            self.stop()

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        with warnings.catch_warnings():
            # "Incorrect schedule: Stop called during warmup" is expected when a cell
            # ends before the active steps; the run's notes say what was recorded.
            warnings.simplefilter("ignore")
            self._prof.stop()

    def _export(self, prof: torch.profiler.profile) -> None:
        part = self._folder / f".{self._name.removesuffix('.json.gz')}-part{len(self._parts)}.json"
        prof.export_chrome_trace(str(part))
        self._parts.append(part)
        _release_results(prof)

    @property
    def undigested(self) -> bool:
        """Whether a cycle was exported that ``digest`` has not been started on."""
        return len(self._cycles) < len(self._parts)

    def digest(self, memory: Callable[[list[dict[str, Any]]], Any] | None = None) -> None:
        """Start working on the exported cycles in the background, while the cell goes on.
        With one cycle (the default) its part is the whole trace: it is gzipped, decoded,
        handed to ``on_trace`` and replayed for memory (``memory``) there, instead of
        after the cell's last step."""
        only = self.cfg.repeat == 1
        for part in self._parts[len(self._cycles) :]:
            build = self._on_trace if only else None
            self._cycles.append(
                _ExportedCycle(
                    part, self._gz_tmp if only else None, build, memory if only else None, self._out
                )
            )

    @property
    def _out(self) -> Path:
        return self._folder / self._name

    @property
    def _gz_tmp(self) -> Path:
        return self._folder / f".{self._name}.tmp"

    def finish(self) -> TraceResult:
        """Merge the exported cycles into the gzipped trace (complete once it has its
        name) and read the step memory."""
        self.digest()
        digests = [d for d in self._cycles if d.part.exists()]
        if not digests:
            return TraceResult(None, [], [])
        out, tmp = self._out, self._gz_tmp
        try:
            docs = [d.result() for d in digests]
            doc = docs[0]
            for extra in docs[1:]:
                doc["traceEvents"].extend(extra["traceEvents"])
            events = doc["traceEvents"]
            recorded = digests[0].derived["recorded"] if len(digests) == 1 else recorded_steps(events)
            if digests[0].gz is None or len(digests) > 1:
                with gzip.open(tmp, "wb", compresslevel=3) as dst:
                    dst.write(orjson.dumps(doc))
            os.replace(tmp, out)
        finally:
            for d in self._cycles:
                d.wait()
                d.part.unlink(missing_ok=True)
            tmp.unlink(missing_ok=True)
        derived = digests[0].derived if len(digests) == 1 else {}
        return TraceResult(out, events, recorded, derived.get("tables"), derived.get("memory"))


def recorded_steps(events: list[dict[str, Any]]) -> list[int]:
    """The steps whose spans the trace holds, in order."""
    return sorted(k for e in events if e.get("ph") == "X" and (k := step_of(e.get("name", ""))) is not None)


def _release_results(prof: torch.profiler.profile) -> None:
    """Drop the finished cycle's results once exported.

    torch keeps a cycle's results on ``prof.profiler`` until the next cycle starts or the
    profiler object dies; with None there, the next cycle starts a fresh one and nothing
    accumulates across cycles or runs (no ``gc.collect()``: the results hold no cycles,
    and a full collection cost 0.2 s in a step). What else a profiled round adds to RSS is freed
    memory that glibc keeps for reuse (the profiler's small allocations pin the heap
    between large tensor buffers): ``malloc_trim`` would return it, but made the following
    steps of a CPU GPT ~25 % slower (every buffer faulted in again), so we leave it.
    """
    prof.profiler = None
