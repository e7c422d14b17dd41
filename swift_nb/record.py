"""The Run record: plain data about one profiled run, saved to and loaded from a folder.

A run folder holds
- ``run.json``: identity, status, environment, context, schedule, summary metrics, notes;
- ``steps.csv``: one row per step (see ``STEP_COLUMNS``);
- ``samples.csv``: one row per resource sample (see ``SAMPLE_COLUMNS``);
- ``memory.csv``: tensor bytes by category over the recorded steps (``MEMORY_COLUMNS``);
- ``trace.json.gz``: the profiler's Chrome/Perfetto trace (written by the capture layer),
  and ``trace.tables.npz``, its parsed tables cached by the analysis (``tables_path``);
- ``report.html``: the report (``swift_nb.render.report``); ``compare.html``: a
  comparison whose baseline this run is;
- ``PINNED``: present when the run is exempt from retention.

This module is the whole on-disk contract: every file and folder name of a run folder is
spelled here and only here.

A job of several ranks (see ``swift_nb.capture.job``) keeps rank 0's view in those
files, every rank's trace as ``trace.rank<R>.json.gz`` (``rank_trace_file``), and adds
- ``ranks.csv``: one row per rank (``swift_nb.capture.job.RANK_COLUMNS``);
- ``rank_steps.csv`` / ``rank_samples.csv``: every rank's steps and (decimated) samples,
  with a ``rank`` column;
- ``rank<R>/``: each rank's own record, written before rank 0 gathered them
  (``rank_folder``).

Every write is atomic (temp file + rename), so a reader never sees half a file. This
module knows nothing of torch, IPython or the capture machinery: any layer can load a
record without them.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import socket
import tempfile
import uuid
import warnings
from dataclasses import dataclass, field, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd

from swift_nb.errors import ConfigError, RunDirError

SCHEMA_VERSION = 1
DEFAULT_KEEP = 20
ENV_DIR = "SWIFT_NB_DIR"
ENV_KEEP = "SWIFT_NB_KEEP"
RUN_FILE = "run.json"
STEPS_FILE = "steps.csv"
SAMPLES_FILE = "samples.csv"
MEMORY_FILE = "memory.csv"
TRACE_FILE = "trace.json.gz"
RANKS_FILE = "ranks.csv"
RANK_STEPS_FILE = "rank_steps.csv"
RANK_SAMPLES_FILE = "rank_samples.csv"
PIN_FILE = "PINNED"
REPORT_FILE = "report.html"
COMPARE_FILE = "compare.html"
TABLES_SUFFIX = ".tables.npz"  # a trace's cached tables, beside it (see tables_path)


def rank_trace_file(rank: int) -> str:
    """The trace of ``rank`` in a job folder (``trace.rank<R>.json.gz``, rank 0 too)."""
    return f"trace.rank{rank}.json.gz"


def rank_folder(job: Path, rank: int) -> Path:
    """Where ``rank`` of a job keeps its own record, inside the job folder."""
    return Path(job) / f"rank{rank}"


def tables_path(trace_path: Path) -> Path:
    """Where a trace's tables are cached: ``trace.json.gz`` → ``trace.tables.npz``,
    ``trace.rank3.json.gz`` → ``trace.rank3.tables.npz``."""
    trace_path = Path(trace_path)
    return trace_path.with_name(trace_path.name.removesuffix(".json.gz") + TABLES_SUFFIX)


#: ok: ended normally; failed: the code raised; interrupted: Ctrl-C / the kernel's stop;
#: terminated: SIGTERM or SIGHUP (a scheduler, `timeout`, a shutdown), saved in full;
#: crashed: the process died while running (SIGKILL, OOM killer, power loss) — the record
#: holds what was flushed until then; running: still being written by a live process.
STATUSES = ("running", "ok", "failed", "interrupted", "terminated", "crashed")

# steps.csv columns. Times in seconds from the run's start (perf_counter clock), bytes.
#   step: 0-based step index; start_s/end_s/duration_s: the step's span;
#   phase: profiler schedule action for the step (none|wait|warmup|active);
#   trigger: what ended the step (optimizer|explicit|end);
#   overhead_s: time swift_nb's own step hook took at the boundary that began the step
#     (not part of duration_s; the profiler's trace export shows up here);
#   peak_tensor_bytes: peak bytes held by tensors during the step — CUDA: the caching
#     allocator's max_memory_allocated (every step); CPU: resident optimizer state
#     (params, grads, optimizer state) at the step's start plus the highest rise of the
#     profiler's allocation counter within the step (steps the profiler recorded; empty
#     elsewhere);
#   reserved_bytes: CUDA allocator reserved bytes at the step's end;
#   rss_bytes: process resident set size at the step's end;
#   parameters_bytes … other_bytes (recorded steps, with memory profiling): tensor bytes of
#     each category at the step's peak (see memory.csv).
STEP_COLUMNS = [
    "step",
    "start_s",
    "end_s",
    "duration_s",
    "phase",
    "trigger",
    "overhead_s",
    "peak_tensor_bytes",
    "reserved_bytes",
    "rss_bytes",
]

# samples.csv columns. t_s: seconds from the run's start; kind: periodic|step;
# step: the step in progress when sampled; cpu_pct: process CPU % (100 = one core);
# rss_bytes: process RSS; sys_mem_used_bytes / sys_mem_pct: whole machine;
# cuda{i}_allocated_bytes / cuda{i}_reserved_bytes: torch's caching allocator;
# gpu{i}_util_pct, gpu{i}_mem_util_pct (memory controller), gpu{i}_mem_used_bytes,
# gpu{i}_mem_total_bytes, gpu{i}_sm_clock_mhz, gpu{i}_temp_c, gpu{i}_power_w: NVML.
SAMPLE_COLUMNS = [
    "t_s",
    "kind",
    "step",
    "rank",
    "cpu_pct",
    "rss_bytes",
    "sys_mem_used_bytes",
    "sys_mem_pct",
]


# memory.csv: tensor bytes by category over the recorded steps (see
# swift_nb.capture.memory_categories): t_s (run clock), step, then one column per category.
MEMORY_CATEGORIES = ["parameters", "gradients", "optimizer_state", "activations", "other"]
MEMORY_COLUMNS = ["t_s", "step", *(f"{c}_bytes" for c in MEMORY_CATEGORIES)]


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
    pid: int = 0
    host: str = ""
    steps: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=STEP_COLUMNS))
    samples: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=SAMPLE_COLUMNS))
    memory: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=MEMORY_COLUMNS))
    ranks: pd.DataFrame = field(default_factory=pd.DataFrame)
    rank_steps: pd.DataFrame = field(default_factory=pd.DataFrame)
    rank_samples: pd.DataFrame = field(default_factory=pd.DataFrame)
    path: Path | None = None

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
        out = {0: self.trace_path} if self.trace_path is not None else {}
        for key, name in self.files.items():
            if key.startswith("trace_rank"):
                out[int(key.removeprefix("trace_rank"))] = self.path / name
        if not len(self.ranks) and out:
            out = {int(self.environment.get("rank", 0)): out[0]}
        return dict(sorted(out.items()))

    @property
    def pinned(self) -> bool:
        return self.path is not None and (self.path / PIN_FILE).exists()

    def meta(self) -> dict[str, Any]:
        """The JSON-serialisable part of the record (everything but the tables)."""
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in _TABLES}
        d["schema_version"] = SCHEMA_VERSION
        return d

    def __repr__(self) -> str:
        s = self.summary
        return (
            f"<swift_nb.Run {self.id} status={self.status} steps={s.get('steps', 0)} "
            f"wall_s={self.wall_s:.2f} path={self.path}>"
        )


_TABLES = {"steps", "samples", "memory", "ranks", "rank_steps", "rank_samples", "path"}
_RANK_TABLES = {
    "ranks": RANKS_FILE,
    "rank_steps": RANK_STEPS_FILE,
    "rank_samples": RANK_SAMPLES_FILE,
}  # Run fields that are not stored in run.json


def new_run_id(label: str | None = None, now: datetime | None = None) -> str:
    """A sortable, unique folder name: ``YYYYmmdd-HHMMSS-<label>-<hex>``."""
    now = now or datetime.now()
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", label or "").strip("-.")[:40]
    parts = [now.strftime("%Y%m%d-%H%M%S"), slug, uuid.uuid4().hex[:6]]
    return "-".join(p for p in parts if p)


def utc_now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def default_root() -> Path:
    """Where run folders go: ``$SWIFT_NB_DIR`` or ``./swift_nb_runs``."""
    return Path(os.environ.get(ENV_DIR) or "swift_nb_runs")


def default_keep() -> int:
    raw = os.environ.get(ENV_KEEP)
    if raw is None:
        return DEFAULT_KEEP
    try:
        keep = int(raw)
    except ValueError:
        keep = 0
    if keep < 1:
        raise ConfigError(ENV_KEEP, "must be a whole number of runs to keep, at least 1", raw)
    return keep


def ensure_writable(root: Path) -> Path:
    """Create ``root`` if needed and prove it is writable; raise ``RunDirError`` if not."""
    root = Path(root)
    try:
        root.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=root, prefix=".probe-"):
            pass
    except OSError as e:
        raise RunDirError(
            f"swift_nb cannot write run records to {str(root)!r} ({e.strerror or e}). "
            f"Pass a writable folder (out_dir=... or --out DIR) or set {ENV_DIR}."
        ) from None
    return root


def atomic_write_bytes(path: Path, data: bytes) -> None:
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def _frame_to_csv(df: pd.DataFrame) -> str:
    buf = io.StringIO()
    df.to_csv(buf, index=False)
    return buf.getvalue()


def save(run: Run, path: Path | str | None = None) -> Path:
    """Write ``run`` into its folder (``path``, else ``run.path``) and return the folder."""
    folder = Path(path) if path is not None else run.path
    if folder is None:
        raise ValueError("save() needs a folder: pass path=... or set run.path")
    folder.mkdir(parents=True, exist_ok=True)
    run.path = folder
    run.files.setdefault("steps", STEPS_FILE)
    run.files.setdefault("samples", SAMPLES_FILE)
    atomic_write_text(folder / STEPS_FILE, _frame_to_csv(run.steps))
    atomic_write_text(folder / SAMPLES_FILE, _frame_to_csv(run.samples))
    if len(run.memory):
        run.files.setdefault("memory", MEMORY_FILE)
        atomic_write_text(folder / MEMORY_FILE, _frame_to_csv(run.memory))
    for name, file in _RANK_TABLES.items():
        table = getattr(run, name)
        if len(table):
            run.files.setdefault(name, file)
            atomic_write_text(folder / file, _frame_to_csv(table))
    # run.json last: its presence means the tables it names are complete.
    atomic_write_text(folder / RUN_FILE, json.dumps(run.meta(), indent=2, default=str))
    return folder


def _max_or_none(values: pd.Series) -> float | None:
    values = pd.to_numeric(values, errors="coerce").dropna()
    return float(values.max()) if len(values) else None


def summarize(steps: pd.DataFrame, samples: pd.DataFrame) -> dict[str, Any]:
    """Headline metrics of a run from its tables (seconds, bytes, percent)."""
    out: dict[str, Any] = {"steps": int((steps["trigger"] != "end").sum()) if len(steps) else 0}
    dur = pd.to_numeric(steps["duration_s"], errors="coerce").dropna()
    out["step_time_median_s"] = float(dur.median()) if len(dur) else None
    out["step_time_p90_s"] = float(dur.quantile(0.9)) if len(dur) else None
    total = float(dur.sum())
    out["steps_per_s"] = out["steps"] / total if out["steps"] and total > 0 else None
    out["peak_mem_bytes"] = _max_or_none(steps["peak_tensor_bytes"]) if len(steps) else None
    rss = [_max_or_none(t["rss_bytes"]) for t in (steps, samples) if "rss_bytes" in t and len(t)]
    out["peak_rss_bytes"] = max((r for r in rss if r is not None), default=None)
    gpu_cols = [
        c for c in samples.columns if c.startswith("gpu") and c.endswith("_util_pct") and "mem" not in c
    ]
    if gpu_cols:
        util = samples[gpu_cols].apply(pd.to_numeric, errors="coerce").mean(axis=1).dropna()
        out["util_source"] = "gpu"
    elif "cpu_pct" in samples and len(samples):
        util = pd.to_numeric(samples["cpu_pct"], errors="coerce").dropna()
        out["util_source"] = "cpu"
    else:
        util = pd.Series(dtype="float64")
        out["util_source"] = None
    out["mean_util_pct"] = float(util.mean()) if len(util) else None
    out["peak_util_pct"] = float(util.max()) if len(util) else None
    return out


def _read_csv(path: Path, columns: list[str]) -> pd.DataFrame:
    if not path.exists() or path.stat().st_size == 0:
        return pd.DataFrame(columns=columns)
    return pd.read_csv(path)


def load_run(path: Path | str) -> Run:
    """Rebuild a Run from its folder (or from the folder's ``run.json``)."""
    folder = Path(path)
    if folder.name == RUN_FILE:
        folder = folder.parent
    meta_path = folder / RUN_FILE
    if not meta_path.exists():
        raise FileNotFoundError(f"{str(folder)!r} is not a swift_nb run folder (no {RUN_FILE})")
    meta = json.loads(meta_path.read_text("utf-8"))
    meta.pop("schema_version", None)
    known = {f.name for f in fields(Run)} - _TABLES
    run = Run(**{k: v for k, v in meta.items() if k in known})
    run.status = status_of(meta)
    run.steps = _read_csv(folder / STEPS_FILE, STEP_COLUMNS)
    run.samples = _read_csv(folder / SAMPLES_FILE, SAMPLE_COLUMNS)
    run.memory = _read_csv(folder / MEMORY_FILE, MEMORY_COLUMNS)
    for name, file in _RANK_TABLES.items():
        if name in run.files:
            setattr(run, name, _read_csv(folder / file, []))
    run.path = folder
    return run


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def status_of(meta: dict[str, Any]) -> str:
    """A record's status as every reader shows it: a ``running`` record whose process is
    gone (on this host) is ``crashed``."""
    status = str(meta.get("status") or "running")
    if status == "running" and not _is_live(meta):
        return "crashed"
    return status


def _is_live(meta: dict[str, Any]) -> bool:
    """Whether a ``running`` record is still being written by a live process here."""
    if meta.get("status") != "running":
        return False
    if meta.get("host") != socket.gethostname():
        return True  # cannot tell for another machine: assume alive, never delete it
    return _pid_alive(int(meta.get("pid") or 0))


def _scan(root: Path) -> list[tuple[Path, dict[str, Any]]]:
    """(folder, run.json contents) of readable run folders under ``root``, oldest first."""
    found: list[tuple[Path, dict[str, Any]]] = []
    if not root.is_dir():
        return found
    for folder in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        meta_path = folder / RUN_FILE
        if not meta_path.exists():
            continue
        try:
            meta = json.loads(meta_path.read_text("utf-8"))
            if not isinstance(meta, dict) or "id" not in meta:
                raise ValueError("not a run record")
        except (OSError, ValueError) as e:
            warnings.warn(f"swift_nb: skipping unreadable run folder {str(folder)!r}: {e}", stacklevel=3)
            continue
        found.append((folder, meta))
    found.sort(key=lambda fm: (str(fm[1].get("started_at") or ""), fm[0].name))
    return found


RUNS_COLUMNS = [
    "id",
    "label",
    "status",
    "started_at",
    "wall_s",
    "steps",
    "step_time_median_s",
    "peak_mem_bytes",
    "pinned",
    "path",
    "world_size",
]


def runs(root: Path | str | None = None, limit: int | None = None) -> pd.DataFrame:
    """Recent runs under ``root`` (default ``default_root()``), newest first.

    Columns: id, label, status, started_at (ISO, UTC), wall_s, steps, step_time_median_s,
    peak_mem_bytes, pinned, path, world_size (ranks of the job; 1 for a single process). A record left ``running`` by a process that no longer
    exists shows status ``crashed``. Unreadable folders are skipped with a warning.
    """
    root = Path(root) if root is not None else default_root()
    rows = []
    for folder, meta in reversed(_scan(root)):
        summary = meta.get("summary") or {}
        status = status_of(meta)
        rows.append(
            {
                "id": meta["id"],
                "label": meta.get("label"),
                "status": status,
                "started_at": meta.get("started_at"),
                "wall_s": meta.get("wall_s"),
                "steps": summary.get("steps"),
                "step_time_median_s": summary.get("step_time_median_s"),
                "peak_mem_bytes": summary.get("peak_mem_bytes"),
                "pinned": (folder / PIN_FILE).exists(),
                "path": str(folder),
                "world_size": (meta.get("context") or {}).get("world_size", 1),
            }
        )
        if limit is not None and len(rows) >= limit:
            break
    return pd.DataFrame(rows, columns=RUNS_COLUMNS)


def pin(run: Run | Path | str, pinned: bool = True) -> None:
    """Protect a run folder from retention (or lift the protection)."""
    folder = run.path if isinstance(run, Run) else Path(run)
    if folder is None:
        raise ValueError("this run has not been saved yet; there is nothing to pin")
    marker = Path(folder) / PIN_FILE
    if pinned:
        marker.touch()
    else:
        marker.unlink(missing_ok=True)


def prune(root: Path | str | None = None, keep: int | None = None, spare: Path | None = None) -> list[Path]:
    """Delete the oldest run folders beyond the newest ``keep``; return what was deleted.

    Pinned runs do not count against ``keep`` and are never deleted; runs still being
    written by a live process, and ``spare``, count but are never deleted.
    """
    root = Path(root) if root is not None else default_root()
    keep = default_keep() if keep is None else keep
    if keep < 1:
        raise ConfigError("keep", "must be at least 1", keep)
    spare_resolved = Path(spare).resolve() if spare is not None else None
    unpinned = [(folder, meta) for folder, meta in _scan(root) if not (folder / PIN_FILE).exists()]
    doomed = [
        folder
        for folder, meta in unpinned[: max(0, len(unpinned) - keep)]
        if not _is_live(meta) and folder.resolve() != spare_resolved
    ]
    for folder in doomed:
        shutil.rmtree(folder, ignore_errors=True)
    return doomed
