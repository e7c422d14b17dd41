"""The Run record: plain data about one profiled run, saved to and loaded from a folder.

A run folder holds
- ``run.json``: identity, status, environment, context, schedule, summary metrics, notes;
- ``steps.csv``: one row per step (see ``STEP_COLUMNS``);
- ``samples.csv``: one row per resource sample (see ``SAMPLE_COLUMNS``);
- ``memory.csv``: tensor bytes by category over the recorded steps (``MEMORY_COLUMNS``);
- ``modules.csv``: the recorded steps by module, written with the report (``MODULES_COLUMNS``);
- ``trace.json.gz``: the profiler's Chrome/Perfetto trace (written by the capture layer),
  and ``trace.tables.npz``, its parsed tables cached by the analysis (``tables_path``);
- ``report.html``: the report (``swift_nb.render.document``); ``compare.html``: a
  comparison whose baseline this run is;
- ``analysis.json``: the analysis the report was written from, with what it was valid for
  (``swift_nb.analysis.stored``): a reopen takes it instead of analysing the trace again;
- ``PINNED``: present when the run is exempt from retention.

This package is the whole on-disk contract: every file and folder name of a run folder is
spelled in ``layout.py`` and only there; ``run.py`` holds the record, ``write.py`` and
``read.py`` save and load it (every file checked on the way in), ``folders.py`` lists,
pins and prunes a folder of runs.

A job of several ranks (see ``swift_nb.capture.job``) keeps rank 0's view in those
files, every rank's trace as ``trace.rank<R>.json.gz`` (``rank_trace_file``), and adds
- ``ranks.csv``: one row per rank (``swift_nb.capture.job.RANK_COLUMNS``);
- ``rank_steps.csv`` / ``rank_samples.csv``: every rank's steps and (decimated) samples,
  with a ``rank`` column;
- ``rank<R>/``: each rank's own record, written before rank 0 gathered them
  (``rank_folder``).

Every write is atomic (temp file + rename), so a reader never sees half a file. This
package knows nothing of torch, IPython or the capture machinery: any layer can load a
record without them.
"""

from __future__ import annotations

from swift_nb.record.finetune import FINETUNE_KEY, FINETUNE_METHODS, finetune_label, repeated_blocks
from swift_nb.record.folders import (
    DAMAGED,
    RUNS_COLUMNS,
    pin,
    prune,
    runs,
)
from swift_nb.record.layout import (
    ANALYSIS_FILE,
    CHECKPOINTING_FIELDS,
    COMPARE_FILE,
    DEFAULT_KEEP,
    ENV_DIR,
    ENV_KEEP,
    MEMORY_CATEGORIES,
    MEMORY_COLUMNS,
    MEMORY_FILE,
    MODULES_COLUMNS,
    MODULES_FILE,
    PIN_FILE,
    RANK_SAMPLES_FILE,
    RANK_STEPS_FILE,
    RANKS_FILE,
    REPORT_FILE,
    RUN_FILE,
    SAMPLE_COLUMNS,
    SAMPLES_FILE,
    SCHEMA_VERSION,
    STALE_MODELS_KEY,
    STATUSES,
    STEP_COLUMNS,
    STEPS_FILE,
    TABLES_SUFFIX,
    TRACE_FILE,
    TRAINER_KEY,
    rank_folder,
    rank_trace_file,
    tables_path,
)
from swift_nb.record.read import (
    STEPS_MISSING,
    check_meta,
    load_run,
    read_back,
    read_meta,
    status_as_found,
    steps_missing,
)
from swift_nb.record.run import (
    OutOfMemory,
    Run,
    new_run_id,
    utc_now_iso,
)
from swift_nb.record.write import (
    atomic_write_bytes,
    atomic_write_text,
    default_keep,
    default_root,
    ensure_writable,
    save,
    save_meta,
    save_modules,
    step_durations,
    summarize,
    tabulate,
)

__all__ = [
    "ANALYSIS_FILE",
    "CHECKPOINTING_FIELDS",
    "COMPARE_FILE",
    "DAMAGED",
    "DEFAULT_KEEP",
    "ENV_DIR",
    "ENV_KEEP",
    "FINETUNE_KEY",
    "FINETUNE_METHODS",
    "MEMORY_CATEGORIES",
    "MEMORY_COLUMNS",
    "MEMORY_FILE",
    "MODULES_COLUMNS",
    "MODULES_FILE",
    "PIN_FILE",
    "RANKS_FILE",
    "RANK_SAMPLES_FILE",
    "RANK_STEPS_FILE",
    "REPORT_FILE",
    "RUNS_COLUMNS",
    "RUN_FILE",
    "SAMPLES_FILE",
    "SAMPLE_COLUMNS",
    "SCHEMA_VERSION",
    "STALE_MODELS_KEY",
    "STATUSES",
    "STEPS_FILE",
    "STEPS_MISSING",
    "STEP_COLUMNS",
    "TABLES_SUFFIX",
    "TRACE_FILE",
    "TRAINER_KEY",
    "OutOfMemory",
    "Run",
    "atomic_write_bytes",
    "atomic_write_text",
    "check_meta",
    "default_keep",
    "default_root",
    "ensure_writable",
    "finetune_label",
    "load_run",
    "new_run_id",
    "pin",
    "prune",
    "rank_folder",
    "rank_trace_file",
    "read_back",
    "read_meta",
    "repeated_blocks",
    "runs",
    "save",
    "save_meta",
    "save_modules",
    "status_as_found",
    "step_durations",
    "steps_missing",
    "summarize",
    "tables_path",
    "tabulate",
    "utc_now_iso",
]
