"""Reading a run folder back, every file checked: a damaged file is a clear problem, not a crash."""

from __future__ import annotations

import io
import json
import os
import socket
import warnings
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import Any, NamedTuple

import pandas as pd

from swift_nb.core.errors import RecordError
from swift_nb.record.layout import (
    MEMORY_CATEGORIES,
    MEMORY_COLUMNS,
    MEMORY_FILE,
    MODULES_COLUMNS,
    MODULES_FILE,
    RUN_FILE,
    SAMPLE_COLUMNS,
    SAMPLES_FILE,
    STALE_MODELS_KEY,
    STATUSES,
    STEP_COLUMNS,
    STEPS_FILE,
)
from swift_nb.record.run import NOT_IN_JSON, RANK_TABLES, OutOfMemory, Run

# -- reading a folder back, every file checked ------------------------------------------


CATEGORY_COLUMNS = [f"{c}_bytes" for c in MEMORY_CATEGORIES]


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


def _is_stale_model(v: Any) -> bool:
    return (
        isinstance(v, dict)
        and isinstance(v.get("variable"), str)
        and isinstance(v.get("class"), str)
        and _is_number(v.get("bytes"))
    )


_STALE_MODELS = _Kind(
    "a list of objects with variable, class and bytes",
    lambda v: isinstance(v, list) and all(map(_is_stale_model, v)),
)

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
        STALE_MODELS_KEY: _STALE_MODELS,
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


def load_json(path: Path) -> Any:
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
    return check_meta(load_json(path), path)


#: the columns of the run tables that hold text; every other known column holds numbers.
_TEXT_COLUMNS = {"phase", "trigger", "kind", "path", "parent", "class", "role", "dtype"}
#: the columns without which a file is not that table (a foreign CSV); the table's other
#: known columns may be absent (records of older versions lack some) and read as missing.
REQUIRED_COLUMNS = {
    STEPS_FILE: ["step", "duration_s"],
    SAMPLES_FILE: ["t_s"],
    MEMORY_FILE: ["t_s", "step"],
    MODULES_FILE: ["path", "parent", "forward_s"],
}


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def _read_csv(path: Path, columns: list[str], problems: list[str]) -> pd.DataFrame:
    """A table of the folder, checked: its ``REQUIRED_COLUMNS`` present (the others of
    ``columns`` added, empty, when absent), those that hold numbers numeric (empty cells
    are missing values). A last line without its line end is a row whose write was cut
    (the process was killed while appending it): it is dropped and noted in ``problems``.
    Anything else wrong raises ``RecordError``."""
    return _parse_csv(_read_text(path), path, columns, problems)


def _parse_csv(text: str, path: Path, columns: list[str], problems: list[str]) -> pd.DataFrame:
    """``_read_csv`` of ``text``, the file ``path``'s."""
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


def read_back(table: pd.DataFrame, name: str) -> pd.DataFrame:
    """``table`` as ``load_run`` reads it back from its file ``name`` (a job's rank tables):
    an empty text cell missing, a column of numbers and missing values float. A run
    analysed as it was assembled then reads the table its reopened folder will."""
    if not len(table.columns):
        return table
    return _parse_csv(table.to_csv(index=False), Path(name), [], [])


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

    Every file is checked as it is read. A missing table, or a last line cut off by a kill,
    loads: what it means goes to ``run.problems`` and ``run.notes``.

    Args:
        path: the run's folder, or its ``run.json``.

    Returns:
        The Run, its tables read and ``run.path`` the folder.

    Raises:
        RecordError: a damaged or foreign file (a ValueError), naming the file and what is
            wrong.
        FileNotFoundError: a folder without ``run.json``.
    """
    folder = Path(path)
    if folder.name == RUN_FILE:
        folder = folder.parent
    meta_path = folder / RUN_FILE
    if not meta_path.exists():
        raise FileNotFoundError(f"{str(folder)!r} is not a swift_nb run folder (no {RUN_FILE})")
    meta = read_meta(meta_path)
    known = {f.name for f in fields(Run)} - NOT_IN_JSON
    run = Run(**{k: v for k, v in meta.items() if k in known})
    if isinstance(meta.get("oom"), dict):
        run.oom = OutOfMemory.from_dict(meta["oom"])
    run.status = status_as_found(meta)
    problems: list[str] = []
    run.steps = _read_table(folder, STEPS_FILE, STEP_COLUMNS, problems, "the steps of this run are unknown")
    if any(c in run.steps.columns for c in CATEGORY_COLUMNS):
        # a run recorded before a category existed (frozen_parameters): unknown, not 0
        run.steps = run.steps.reindex(
            columns=[*run.steps.columns, *(c for c in CATEGORY_COLUMNS if c not in run.steps)]
        )
    run.samples = _read_table(
        folder, SAMPLES_FILE, SAMPLE_COLUMNS, problems, "the resource samples of this run are unknown"
    )
    memory_lost = "the memory categories of this run are unknown" if "memory" in run.files else None
    run.memory = _read_table(folder, MEMORY_FILE, MEMORY_COLUMNS, problems, memory_lost)
    modules_lost = "the recorded steps by module are unknown" if "modules" in run.files else None
    run.modules = _read_table(folder, MODULES_FILE, MODULES_COLUMNS, problems, modules_lost)
    for text in ("parent", "role", "dtype"):  # a root's parent, no role (CSV has no empty text)
        run.modules[text] = ["" if pd.isna(v) else str(v) for v in run.modules[text]]
    for name, file in RANK_TABLES.items():
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


def status_as_found(meta: dict[str, Any]) -> str:
    """A record's status as every reader shows it: a ``running`` record whose process is
    gone (on this host) is ``crashed``."""
    status = str(meta.get("status") or "running")
    if status == "running" and not is_live(meta):
        return "crashed"
    return status


def is_live(meta: dict[str, Any]) -> bool:
    """Whether a ``running`` record is still being written by a live process here."""
    if meta.get("status") != "running":
        return False
    if meta.get("host") != socket.gethostname():
        return True  # cannot tell for another machine: assume alive, never delete it
    return _pid_alive(int(meta.get("pid") or 0))
