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
import math
import os
import re
import shutil
import socket
import tempfile
import uuid
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, NamedTuple

import pandas as pd

from swift_nb.errors import ConfigError, RecordError, RunDirError

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
STATUSES = ("running", "ok", "failed", "oom", "interrupted", "terminated", "crashed")

# steps.csv columns. Times in seconds from the run's start (perf_counter clock), bytes.
#   step: 0-based step index; start_s/end_s/duration_s: the step's span;
#   phase: profiler schedule action for the step (none|wait|warmup|active);
#   trigger: what ended the step (optimizer|explicit|end; trace: a step imported from a
#     trace, its profiler's ProfilerStep#N span — swift_nb.importer);
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

#: the context's key for the training framework found around the loop (a Trainer or an
#: Accelerator: ``swift_nb.capture.frameworks.detect``)
TRAINER_KEY = "trainer"
#: a Trainer's checkpointing switch, by the name transformers 5 gives it, then the older one
#: (a deprecated alias since); the context records which the installed one has
CHECKPOINTING_FIELDS = ("activation_checkpointing", "gradient_checkpointing")


@dataclass(frozen=True)
class OutOfMemory:
    """What was in memory when a run failed allocating (its status ``oom``), as
    ``swift_nb.capture.oom.post_mortem`` read it from the failure.

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
_TABLES = {"steps", "samples", "memory", "ranks", "rank_steps", "rank_samples", "path", "problems"}
_RANK_TABLES = {
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
    return save_meta(run)


def save_meta(run: Run) -> Path:
    """Write only ``run.json`` of a saved run (its tables stay as they are on disk: a
    report must not rewrite, or invent, the tables it read)."""
    if run.path is None:
        raise ValueError("save_meta() needs a saved run (run.path is None)")
    atomic_write_text(run.path / RUN_FILE, json.dumps(run.meta(), indent=2, default=str))
    return run.path


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


# -- reading a folder back, every file checked ------------------------------------------


def _json_kind(value: Any) -> str:
    """What a JSON value is, as a message names it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    return "an object" if isinstance(value, dict) else type(value).__name__


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _is_whole(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


class _Kind(NamedTuple):
    """A JSON type a field must have: its name in messages and the test."""

    name: str
    holds: Callable[[Any], bool]


_STRING = _Kind("a string", lambda v: isinstance(v, str))
_NUMBER = _Kind("a number", _is_number)
_WHOLE = _Kind("a whole number", _is_whole)
_OBJECT = _Kind("an object", lambda v: isinstance(v, dict))
_STRINGS = _Kind("a list of strings", lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v))
_WHOLES = _Kind("a list of whole numbers", lambda v: isinstance(v, list) and all(map(_is_whole, v)))
_NUMBER_OR_NULL = _Kind("a number or null", lambda v: v is None or _is_number(v))
_WHOLE_OR_NULL = _Kind("a whole number or null", lambda v: v is None or _is_whole(v))
_STRING_OR_NULL = _Kind("a string or null", lambda v: v is None or isinstance(v, str))

#: run.json's fields and what each must hold; a field left out takes the Run's default
#: (``id`` excepted), an unknown one is ignored (a newer swift_nb may add some).
META_SCHEMA: dict[str, _Kind] = {
    "id": _STRING,
    "label": _STRING_OR_NULL,
    "status": _STRING,  # and one of STATUSES
    "started_at": _STRING,
    "wall_s": _NUMBER,
    "source": _OBJECT,
    "environment": _OBJECT,
    "context": _OBJECT,
    "schedule": _OBJECT,
    "summary": _OBJECT,
    "notes": _STRINGS,
    "files": _OBJECT,  # of strings: file names relative to the folder
    "oom": _Kind("an object or null", lambda v: v is None or isinstance(v, dict)),
    "pid": _WHOLE,
    "host": _STRING,
    "schema_version": _WHOLE,
}
_SCHEDULE_KEYS = ("wait", "warmup", "active", "repeat")  # a recorded schedule has them all
#: keys inside run.json's objects that readers use, and what each must hold when present
#: (so that no reader meets a type it cannot format).
NESTED_SCHEMA: dict[str, dict[str, _Kind]] = {
    "summary": {
        "steps": _WHOLE_OR_NULL,
        **dict.fromkeys(
            (
                "step_time_median_s",
                "step_time_p90_s",
                "steps_per_s",
                "peak_mem_bytes",
                "peak_rss_bytes",
                "mean_util_pct",
                "peak_util_pct",
            ),
            _NUMBER_OR_NULL,
        ),
        "util_source": _STRING_OR_NULL,
        "recorded_steps": _WHOLES,
        "traceback": _STRING,
    },
    # context: anything the user passed as context=; readers take it as it comes
    "environment": {"rank": _WHOLE, "world_size": _WHOLE, "devices": _STRINGS},
    "schedule": dict.fromkeys(_SCHEDULE_KEYS, _WHOLE),
}


def _read_text(path: Path) -> str:
    """A record file's text; ``RecordError`` when it cannot be read as UTF-8."""
    try:
        return path.read_bytes().decode("utf-8")
    except OSError as e:
        raise RecordError(path, f"cannot be read ({e.strerror or e})") from None
    except UnicodeDecodeError:
        raise RecordError(path, "not UTF-8 text") from None


def _load_json(path: Path) -> Any:
    text = _read_text(path)
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise RecordError(path, f"not valid JSON ({e.msg} at line {e.lineno} column {e.colno})") from None


def _check_fields(path: Path, obj: dict[str, Any], schema: dict[str, _Kind], prefix: str = "") -> None:
    for key, kind in schema.items():
        if key in obj and not kind.holds(obj[key]):
            raise RecordError(path, f"'{prefix}{key}' must be {kind.name}, got {_json_kind(obj[key])}")


def check_meta(meta: Any, path: Path) -> dict[str, Any]:
    """``meta`` (run.json's contents) if it is a run record; raise ``RecordError`` naming the
    first field that is missing or of the wrong type."""
    if not isinstance(meta, dict):
        raise RecordError(path, f"must be a JSON object, got {_json_kind(meta)}")
    if "id" not in meta:
        raise RecordError(path, "'id' is missing: not a swift_nb run record")
    _check_fields(path, meta, META_SCHEMA)
    if not meta["id"]:
        raise RecordError(path, "'id' is empty")
    if "status" in meta and meta["status"] not in STATUSES:
        raise RecordError(path, f"'status' must be one of {', '.join(STATUSES)}; got {meta['status']!r}")
    for name, value in meta.get("files", {}).items():
        if not isinstance(value, str):
            raise RecordError(path, f"'files.{name}' must be a string, got {_json_kind(value)}")
    for name, schema in NESTED_SCHEMA.items():
        _check_fields(path, meta.get(name, {}), schema, f"{name}.")
    schedule = meta.get("schedule")
    if schedule and any(k not in schedule for k in _SCHEDULE_KEYS):
        missing = ", ".join(k for k in _SCHEDULE_KEYS if k not in schedule)
        raise RecordError(path, f"'schedule' lacks {missing}")
    return meta


def read_meta(path: Path) -> dict[str, Any]:
    """run.json's contents, checked (``check_meta``); ``RecordError`` if damaged."""
    return check_meta(_load_json(path), path)


#: the columns of the run tables that hold text; every other known column holds numbers.
_TEXT_COLUMNS = {"phase", "trigger", "kind"}
#: the columns without which a file is not that table (a foreign CSV); the table's other
#: known columns may be absent (records of older versions lack some) and read as missing.
REQUIRED_COLUMNS = {
    STEPS_FILE: ["step", "duration_s"],
    SAMPLES_FILE: ["t_s"],
    MEMORY_FILE: ["t_s", "step"],
}


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def _read_csv(path: Path, columns: list[str], problems: list[str]) -> pd.DataFrame:
    """A table of the folder, checked: its ``REQUIRED_COLUMNS`` present (the others of
    ``columns`` added, empty, when absent), those that hold numbers numeric (empty cells
    are missing values). A last line without its line end is a row whose write was cut
    (the process was killed while appending it): it is dropped and noted in ``problems``.
    Anything else wrong raises ``RecordError``."""
    text = _read_text(path)
    if text and not text.endswith("\n"):
        whole, _, cut = text.rpartition("\n")
        text = whole + "\n" if whole else ""
        problems.append(
            f"{path.name}: its last line was cut off (a write stopped midway, e.g. by a kill); "
            f"dropped {cut[:80]!r}"
        )
    if not text.strip():
        return pd.DataFrame(columns=columns)
    try:
        with warnings.catch_warnings():
            # a row longer than the header: pandas would drop its extra fields silently
            warnings.simplefilter("error", pd.errors.ParserWarning)
            df = pd.read_csv(io.StringIO(text), index_col=False)
    except pd.errors.ParserWarning:
        raise RecordError(path, "not a readable CSV table (a row has more fields than the header)") from None
    except ValueError as e:  # ParserError, EmptyDataError
        raise RecordError(path, f"not a readable CSV table ({_first_line(e)})") from None
    missing = [c for c in REQUIRED_COLUMNS.get(path.name, []) if c not in df.columns]
    if missing:
        raise RecordError(path, f"lacks the columns {', '.join(missing)}: not a swift_nb {path.name}")
    df = df.reindex(columns=[*df.columns, *(c for c in columns if c not in df.columns)])
    for col in columns:
        if col in _TEXT_COLUMNS or pd.api.types.is_numeric_dtype(df[col]):
            continue
        numbers = pd.to_numeric(df[col], errors="coerce")
        bad = (numbers.isna() & df[col].notna()).to_numpy()
        if bad.any():
            i = int(bad.argmax())
            raise RecordError(path, f"'{col}' must hold numbers; line {i + 2} holds {df[col].iloc[i]!r}")
        df[col] = numbers
    return df


def _missing_note(name: str, what: str) -> str:
    return f"{name} is missing: {what}"


#: the note of a run folder without steps.csv (load_run's, and the report's reason to skip
#: the analysis).
STEPS_MISSING = _missing_note(STEPS_FILE, "the steps of this run are unknown")


def steps_missing(run: Run) -> bool:
    """Whether ``run``'s folder has lost its steps.csv (nothing can be said about its steps)."""
    return run.path is not None and not (Path(run.path) / STEPS_FILE).exists()


def _read_table(
    folder: Path, name: str, columns: list[str], problems: list[str], if_missing: str | None
) -> pd.DataFrame:
    """``folder/name`` checked (``_read_csv``); when it does not exist an empty table, and
    ``if_missing`` (what its loss means) noted in ``problems`` unless None."""
    path = folder / name
    if not path.exists():
        if if_missing is not None:
            problems.append(_missing_note(name, if_missing))
        return pd.DataFrame(columns=columns)
    return _read_csv(path, columns, problems)


def load_run(path: Path | str) -> Run:
    """Rebuild a Run from its folder (or from the folder's ``run.json``).

    Every file is checked as it is read: a damaged or foreign one raises ``RecordError``
    (a ValueError) naming the file and what is wrong; a folder without ``run.json`` raises
    FileNotFoundError. A missing table, or a last line cut off by a kill, loads: what it
    means goes to ``run.problems`` and ``run.notes``.
    """
    folder = Path(path)
    if folder.name == RUN_FILE:
        folder = folder.parent
    meta_path = folder / RUN_FILE
    if not meta_path.exists():
        raise FileNotFoundError(f"{str(folder)!r} is not a swift_nb run folder (no {RUN_FILE})")
    meta = read_meta(meta_path)
    known = {f.name for f in fields(Run)} - _TABLES
    run = Run(**{k: v for k, v in meta.items() if k in known})
    if isinstance(meta.get("oom"), dict):
        run.oom = OutOfMemory.from_dict(meta["oom"])
    run.status = status_of(meta)
    problems: list[str] = []
    run.steps = _read_table(folder, STEPS_FILE, STEP_COLUMNS, problems, "the steps of this run are unknown")
    run.samples = _read_table(
        folder, SAMPLES_FILE, SAMPLE_COLUMNS, problems, "the resource samples of this run are unknown"
    )
    memory_lost = "the memory categories of this run are unknown" if "memory" in run.files else None
    run.memory = _read_table(folder, MEMORY_FILE, MEMORY_COLUMNS, problems, memory_lost)
    for name, file in _RANK_TABLES.items():
        if name in run.files:
            table = _read_table(
                folder, file, [], problems, f"this job's {name.replace('_', ' ')} are unknown"
            )
            setattr(run, name, table)
    run.path = folder
    run.problems = problems
    run.notes += [p for p in problems if p not in run.notes]
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


class _Found(NamedTuple):
    """A run folder under a root: its checked run.json, or why it is damaged."""

    folder: Path
    meta: dict[str, Any] | None  # None: damaged
    problem: str | None  # "run.json: 'context' must be an object, got a list"
    started_at: str


def _scan(root: Path) -> list[_Found]:
    """The run folders under ``root`` (those with a run.json), oldest first; a damaged
    run.json makes its folder a ``_Found`` without meta and with the problem."""
    found: list[_Found] = []
    if not root.is_dir():
        return found
    for folder in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        meta_path = folder / RUN_FILE
        if not meta_path.exists():
            continue
        raw: Any = None
        try:
            raw = _load_json(meta_path)
            meta = check_meta(raw, meta_path)
        except RecordError as e:
            started = raw.get("started_at") if isinstance(raw, dict) else None
            problem = f"{RUN_FILE}: {e.problem}"
            found.append(_Found(folder, None, problem, started if isinstance(started, str) else ""))
            continue
        found.append(_Found(folder, meta, None, meta.get("started_at", "")))
    found.sort(key=lambda f: (f.started_at, f.folder.name))
    return found


#: runs()'s status of a folder whose run.json is damaged (never a record's own status).
DAMAGED = "damaged"

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
    "problem",
]


def _runs_row(found: _Found) -> dict[str, Any]:
    folder, meta = found.folder, found.meta
    row: dict[str, Any] = {"pinned": (folder / PIN_FILE).exists(), "path": str(folder)}
    if meta is None:
        return {
            **row,
            "id": folder.name,
            "status": DAMAGED,
            "started_at": found.started_at or None,
            "problem": found.problem,
        }
    summary = meta.get("summary", {})
    return {
        **row,
        "id": meta["id"],
        "label": meta.get("label"),
        "status": status_of(meta),
        "started_at": meta.get("started_at"),
        "wall_s": meta.get("wall_s"),
        "steps": summary.get("steps"),
        "step_time_median_s": summary.get("step_time_median_s"),
        "peak_mem_bytes": summary.get("peak_mem_bytes"),
        "world_size": meta.get("context", {}).get("world_size", 1),
        "problem": STEPS_MISSING if not (folder / STEPS_FILE).exists() else None,
    }


def runs(root: Path | str | None = None, limit: int | None = None) -> pd.DataFrame:
    """Recent runs under ``root`` (default ``default_root()``), newest first.

    Columns: id, label, status, started_at (ISO, UTC), wall_s, steps, step_time_median_s,
    peak_mem_bytes, pinned, path, world_size (ranks of the job; 1 for a single process),
    problem. A record left ``running`` by a process that no longer exists shows status
    ``crashed``. A folder whose run.json is damaged is a row too, status ``damaged``
    (id: the folder's name), with what is wrong in ``problem``: listing it, rather than
    skipping it with a warning, keeps it in sight in a notebook, where warnings go
    unseen, and says where it is. ``problem`` also names a missing steps.csv.
    """
    root = Path(root) if root is not None else default_root()
    found = list(reversed(_scan(root)))
    if limit is not None:
        found = found[:limit]
    rows = [_runs_row(f) for f in found]
    table = pd.DataFrame(rows, columns=RUNS_COLUMNS)
    for col in ("steps", "world_size"):  # whole numbers stay whole beside a row without one
        values = [r.get(col) for r in rows]
        table[col] = pd.Series(
            [math.nan if v is None else v for v in values], index=table.index, dtype=object
        )
    return table


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
    """Delete the oldest finished runs beyond the newest ``keep``; return what was deleted.

    ``keep`` counts finished runs (every status but a live ``running``). ``spare`` (the
    run that has just finished) is one of them whatever its age: a run that ran while a
    newer one started and ended is kept at its own end, and the other goes. Runs still
    being written by a live process do not count and are never deleted: their own end,
    or any later prune, brings the folder back to ``keep``. Pinned runs do not count and
    are never deleted, nor are damaged folders (``runs()`` lists them: look before
    deleting what cannot be read).
    """
    root = Path(root) if root is not None else default_root()
    keep = default_keep() if keep is None else keep
    if keep < 1:
        raise ConfigError("keep", "must be at least 1", keep)
    spare_resolved = Path(spare).resolve() if spare is not None else None
    finished = [
        f.folder
        for f in _scan(root)
        if f.meta is not None and not (f.folder / PIN_FILE).exists() and not _is_live(f.meta)
    ]
    spared = [f for f in finished if f.resolve() == spare_resolved]
    others = [f for f in finished if f not in spared]
    doomed = others[: max(0, len(others) - (keep - len(spared)))]
    for folder in doomed:
        shutil.rmtree(folder, ignore_errors=True)
    return doomed
