"""A scheduled ``torch.profiler.profile`` driven by step boundaries, exporting a gzipped
Chrome/Perfetto trace into the run folder.

Schedule: ``wait`` steps skip start-up noise, ``warmup`` steps let the profiler settle
(traced, then discarded), ``active`` steps are recorded; the cycle runs ``repeat`` times
(0 = until the run ends). Step ``k`` of the run is the profiler's step span ``k`` in the
trace (``trace_names.STEP_PREFIX`` + k).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from torch.profiler import ProfilerActivity

from swift_nb.capture.digest import DigestJob, DigestResult, digest
from swift_nb.capture.helper import Helper, Pending
from swift_nb.capture.memory.categories import ReplayInput
from swift_nb.record import TRACE_FILE
from swift_nb.vocabulary.options import ProfileOptions, check_schedule


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


class OnTrace(Protocol):
    """What the layers above do with a finished trace, handed to ``TraceRecorder`` by
    whoever starts the capture: ``build`` names a function (``"module:function"``) that
    the trace's digest calls with ``(events, trace_path, written)`` in the helper process
    (``trace_path``: the name the trace will have; ``written``: the file holding it until
    then, its bytes already final), e.g. to build the analyses' tables and draw the
    figures the trace alone determines. What it returns is ``TraceResult.tables``."""

    build: str


@dataclass
class TraceResult:
    """The merged trace file, its number of events, the recorded steps, and what the
    digest derived from it (``capture.digest.DigestResult``): what ``OnTrace.build``
    returned (``tables``; None: not built) and the memory replay (``memory``)."""

    path: Path | None
    events: int
    recorded_steps: list[int]
    tables: Any = None
    memory: Any = None
    digested: DigestResult | None = None


#: the digest, as the helper process finds it
DIGEST = f"{digest.__module__}:{digest.__name__}"


class TraceRecorder:
    """Owns one scheduled torch profiler for a run. The exported cycles are digested
    (``capture.digest``) by ``helper``, off the training process: a one-cycle trace as
    soon as it is exported, several cycles once the run ends. ``build``: what the digest
    hands the events to (``OnTrace.build``; None: nothing); ``rank``: the run is a rank of
    a job, whose digest measures what the rank reports about itself."""

    def __init__(
        self,
        cfg: ProfilerConfig,
        folder: Path,
        note: Callable[[str], None],
        name: str = TRACE_FILE,
        *,
        helper: Helper,
        build: str | None = None,
        rank: bool = False,
    ) -> None:
        self.cfg = cfg
        self._folder = folder
        self._name = name
        self._note = note
        self._helper = helper
        self._build = build
        self._rank = rank
        self._parts: list[Path] = []
        self._pending: Pending | None = None
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
        """Whether the trace's only cycle was exported and not yet given to the helper."""
        return self.cfg.repeat == 1 and bool(self._parts) and self._pending is None

    def digest(self, replay: ReplayInput | None = None) -> None:
        """Give the exported cycles to the helper, to digest while the cell goes on;
        ``replay``: the optimizers' snapshots and device for the memory replay
        (``MemoryRecorder.replay_input``)."""
        if self._pending is not None or not self._parts:
            return
        snapshots, device = replay if replay is not None else (None, 0)
        job = DigestJob(
            list(self._parts), self._gz_tmp, self._out, snapshots, device, self._rank, self._build
        )
        self._pending = self._helper.submit(DIGEST, job)

    def ready(self, within: float) -> bool:
        """Whether the digest given to the helper is done within ``within`` seconds (True:
        none was given)."""
        return self._pending is None or self._pending.wait(within)

    def outlasts(self, seconds: float, replay: ReplayInput | None = None) -> bool:
        """Whether the trace's digest (started now where it was not: a trace of several
        cycles; ``replay`` as for ``digest``) is still running ``seconds`` from now."""
        try:
            self.digest(replay)
            return not self.ready(seconds)
        except Exception:  # said when the trace is taken (``finish``)
            return False

    @property
    def _out(self) -> Path:
        return self._folder / self._name

    @property
    def _gz_tmp(self) -> Path:
        return self._folder / f".{self._name}.tmp"

    def finish(self, replay: ReplayInput | None = None) -> TraceResult:
        """The digested trace, complete once it has its name (a trace of several cycles
        is digested now: ``replay`` as for ``digest``)."""
        self.digest(replay)
        if self._pending is None:
            return TraceResult(None, 0, [])
        out, tmp = self._out, self._gz_tmp
        try:
            done: DigestResult = self._pending.result()
            os.replace(tmp, out)
        finally:
            for p in self._parts:
                p.unlink(missing_ok=True)
            tmp.unlink(missing_ok=True)
        for problem in done.problems:
            self._note(problem)
        return TraceResult(out, done.events, done.recorded, done.built, done.memory, done)


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
