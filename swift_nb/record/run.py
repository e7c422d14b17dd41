"""The Run record and the out-of-memory post-mortem it may hold: plain data."""

from __future__ import annotations

import re
import uuid
from dataclasses import asdict, dataclass, field, fields, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd

from swift_nb.record.layout import (
    MEMORY_COLUMNS,
    MODULES_COLUMNS,
    PIN_FILE,
    RANK_SAMPLES_FILE,
    RANK_STEPS_FILE,
    RANKS_FILE,
    SAMPLE_COLUMNS,
    SCHEMA_VERSION,
    STEP_COLUMNS,
)


@dataclass(frozen=True)
class OutOfMemory:
    """What was in memory when a run failed allocating (its status ``oom``), as
    ``swift_nb.capture.memory.oom.post_mortem`` read it from the failure.

    categories: bytes live by category (``MEMORY_CATEGORIES``) at the failure;
    requested_bytes: the allocation that failed (from the error's message; None if it
    does not say); step, phase (data loading|forward|backward|optimizer), module (the
    deepest module running, by path: ``model.layers.7.attn``), op (the source line that
    asked), where (the user's own line: ``file:line in function``); top_tensors: the
    largest live tensors (bytes, shape, dtype, device, category, name, made_by);
    capacity_bytes and capacity_source (the device, RLIMIT_AS, a cgroup limit or the
    machine's memory); outside_tensors_bytes: what counts against that capacity besides
    the tensors (the CUDA context; the process's own memory on CPU); square_bytes: the
    activations shaped ``[.., T, T]`` (attention scores); blocks: the model's repeated
    blocks (its longest ModuleList), blocks_reached: the failing block's number counting
    from 1 (None outside the blocks); CUDA only: allocated_bytes, reserved_bytes,
    fragmentation_bytes (reserved but unallocated), expandable_segments.
    """

    error: str = ""
    requested_bytes: int | None = None
    step: int | None = None
    phase: str | None = None
    module: str | None = None
    op: str | None = None
    where: str | None = None
    device: str = "cpu"
    categories: dict[str, int] = field(default_factory=dict)
    top_tensors: list[dict[str, Any]] = field(default_factory=list)
    capacity_bytes: int | None = None
    capacity_source: str | None = None
    outside_tensors_bytes: int | None = None
    square_bytes: int = 0
    blocks: int | None = None
    blocks_reached: int | None = None
    allocated_bytes: int | None = None
    reserved_bytes: int | None = None
    fragmentation_bytes: int | None = None
    expandable_segments: bool | None = None

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> OutOfMemory:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})

    @property
    def live_bytes(self) -> int:
        return sum(self.categories.values())


@dataclass
class Run:
    """One profiled run: metadata plus its step and sample tables.

    ``summary`` holds the headline metrics (``steps``, ``step_time_median_s``,
    ``step_time_p90_s``, ``steps_per_s``, ``peak_mem_bytes``, ``peak_rss_bytes``,
    ``mean_util_pct``, ``peak_util_pct``, ``util_source``); ``path`` is the run folder
    once saved.
    """

    id: str
    label: str | None = None
    status: str = "running"
    started_at: str = ""
    wall_s: float = 0.0
    source: dict[str, Any] = field(default_factory=dict)
    environment: dict[str, Any] = field(default_factory=dict)
    context: dict[str, Any] = field(default_factory=dict)
    schedule: dict[str, Any] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    files: dict[str, str] = field(default_factory=dict)
    oom: OutOfMemory | None = None  # the post-mortem of a run that ran out of memory
    pid: int = 0
    host: str = ""
    steps: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=STEP_COLUMNS))
    samples: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=SAMPLE_COLUMNS))
    memory: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=MEMORY_COLUMNS))
    modules: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=MODULES_COLUMNS))
    ranks: pd.DataFrame = field(default_factory=pd.DataFrame)
    rank_steps: pd.DataFrame = field(default_factory=pd.DataFrame)
    rank_samples: pd.DataFrame = field(default_factory=pd.DataFrame)
    path: Path | None = None
    #: what is wrong with the folder as found (a missing table, a line cut off by a kill,
    #: a report whose analysis could not run); each is also in ``notes``, and none is
    #: written back to run.json: it describes the files, not the run.
    problems: list[str] = field(default_factory=list)

    @property
    def trace_path(self) -> Path | None:
        """The gzipped Chrome/Perfetto trace, if the profiler recorded one."""
        if self.path is None or "trace" not in self.files:
            return None
        return self.path / self.files["trace"]

    def rank_trace_paths(self) -> dict[int, Path]:
        """Each rank's trace file in this folder (rank 0's is ``trace_path``)."""
        if self.path is None:
            return {}
        # the record's own trace is its rank's: a job's lowest rank, which need not be 0
        # when a job is imported in part
        own = int(self.environment.get("rank", 0))
        out = {own: self.trace_path} if self.trace_path is not None else {}
        for key, name in self.files.items():
            if key.startswith("trace_rank"):
                out[int(key.removeprefix("trace_rank"))] = self.path / name
        return dict(sorted(out.items()))

    def copy(self, note: str | None = None) -> Run:
        """A copy whose summary, context, notes, files and problems are its own (the tables
        are shared), ``note`` added to its notes."""
        return replace(
            self,
            summary=dict(self.summary),
            context=dict(self.context),
            notes=[*self.notes, *([note] if note is not None else [])],
            files=dict(self.files),
            problems=list(self.problems),
        )

    @property
    def pinned(self) -> bool:
        return self.path is not None and (self.path / PIN_FILE).exists()

    def meta(self) -> dict[str, Any]:
        """The JSON-serialisable part of the record (everything but the tables)."""
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in NOT_IN_JSON}
        d["oom"] = asdict(self.oom) if self.oom is not None else None
        d["notes"] = [n for n in self.notes if n not in self.problems]
        d["schema_version"] = SCHEMA_VERSION
        return d

    def __repr__(self) -> str:
        s = self.summary
        return (
            f"<swift_nb.Run {self.id} status={self.status} steps={s.get('steps', 0)} "
            f"wall_s={self.wall_s:.2f} path={self.path}>"
        )


# Run fields that are not stored in run.json
NOT_IN_JSON = {
    "steps",
    "samples",
    "memory",
    "modules",
    "ranks",
    "rank_steps",
    "rank_samples",
    "path",
    "problems",
}
RANK_TABLES = {
    "ranks": RANKS_FILE,
    "rank_steps": RANK_STEPS_FILE,
    "rank_samples": RANK_SAMPLES_FILE,
}


def new_run_id(label: str | None = None, now: datetime | None = None) -> str:
    """A sortable, unique folder name: ``YYYYmmdd-HHMMSS-<label>-<hex>``."""
    now = now or datetime.now()
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", label or "").strip("-.")[:40]
    parts = [now.strftime("%Y%m%d-%H%M%S"), slug, uuid.uuid4().hex[:6]]
    return "-".join(p for p in parts if p)


def utc_now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")
