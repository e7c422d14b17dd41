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
import shutil
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import torch
from torch.profiler import ProfilerActivity

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


@dataclass
class TraceResult:
    """The merged trace file, its events (for the memory replay) and the recorded steps."""

    path: Path | None
    events: list[dict[str, Any]]
    recorded_steps: list[int]


class TraceRecorder:
    """Owns one scheduled torch profiler for a run."""

    def __init__(
        self, cfg: ProfilerConfig, folder: Path, note: Callable[[str], None], name: str = TRACE_FILE
    ) -> None:
        self.cfg = cfg
        self._folder = folder
        self._name = name
        self._note = note
        self._parts: list[Path] = []
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

    def step(self) -> None:
        self._prof.step()

    def stop(self) -> None:
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

    def finish(self) -> TraceResult:
        """Merge the exported cycles into the gzipped trace and read the step memory."""
        parts = [p for p in self._parts if p.exists()]
        if not parts:
            return TraceResult(None, [], [])
        out = self._folder / self._name
        try:
            docs = [orjson.loads(p.read_bytes()) for p in parts]
            doc = docs[0]
            for extra in docs[1:]:
                doc["traceEvents"].extend(extra["traceEvents"])
            events = doc["traceEvents"]
            recorded = sorted(
                k for e in events if e.get("ph") == "X" and (k := step_of(e.get("name", ""))) is not None
            )
            tmp = out.with_name(f".{out.name}.tmp")
            if len(parts) == 1:
                with parts[0].open("rb") as src, gzip.open(tmp, "wb", compresslevel=3) as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)
            else:
                with gzip.open(tmp, "wb", compresslevel=3) as dst:
                    dst.write(orjson.dumps(doc))
            os.replace(tmp, out)
        finally:
            for p in parts:
                p.unlink(missing_ok=True)
        return TraceResult(out, events, recorded)


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
