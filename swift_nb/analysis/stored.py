"""A run's analysis kept beside it, so that reopening the run (``swift_nb.report(folder)``,
``swift-nb report``, a comparison's findings) does not analyze its trace again.

The file, ``analysis.json`` in the run folder, holds the ``Analysis`` as JSON and the key
it is valid for: a digest of everything an analysis reads — the run's record as it stands
in memory (``run.meta()``, less the files it names), each of the folder's data files by
name, size and modification time, and swift_nb's own code with the versions of pandas and
numpy. Any change to one of them, or a file that cannot be read whole, is a miss, and
the run is analysed again. It is written only when what it decodes to is the analysis it
was made from (checked at write), and it is read as data only: every object it names is a
dataclass or enum of swift_nb's own modules, rebuilt field by field, never code or a
pickle, so a shared run folder cannot run anything by it.

What a trace of millions of events costs to analyze (tens of seconds at 1 GB) is paid
once; a reopen reads a file of kilobytes to megabytes.
"""

from __future__ import annotations

import base64
import dataclasses
import enum
import functools
import hashlib
import importlib
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pandas as pd

from swift_nb.record import (
    ANALYSIS_FILE,
    COMPARE_FILE,
    MODULES_FILE,
    REPORT_FILE,
    RUN_FILE,
    Run,
    atomic_write_bytes,
)

#: the file's format; another is a miss
FORMAT = 1
#: files of the folder that an analysis does not read (the report and what it writes)
NOT_READ = {ANALYSIS_FILE, REPORT_FILE, COMPARE_FILE, MODULES_FILE, RUN_FILE}
#: only objects of these modules are rebuilt from the file
OWN_PACKAGE = "swift_nb."


class UnstorableError(TypeError):
    """A value the file cannot hold exactly; the analysis is then not kept."""


# -- the key ----------------------------------------------------------------------------


@functools.cache
def code_digest() -> str:
    """swift_nb's code and the libraries its analyses compute with: another version of
    any of them is another analysis."""
    root = Path(__file__).resolve().parents[1]
    digest = hashlib.sha1(f"pandas {pd.__version__} numpy {np.__version__}".encode())
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def run_key(run: Run) -> str | None:
    """What ``run``'s analysis depends on, as a digest; None for a run not saved."""
    if run.path is None:
        return None
    folder = Path(run.path)
    meta = {k: v for k, v in run.meta().items() if k != "files"}
    digest = hashlib.sha1(code_digest().encode())
    digest.update(json.dumps(meta, sort_keys=True, default=str).encode())
    for path in sorted(folder.rglob("*")):
        name = path.relative_to(folder).as_posix()
        if path.name in NOT_READ or path.name.startswith(".") or not path.is_file():
            continue
        stat = path.stat()
        digest.update(f"{name}\0{stat.st_size}\0{stat.st_mtime_ns}\0".encode())
    return digest.hexdigest()


# -- values to JSON and back ------------------------------------------------------------


def _name(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def encode(value: Any) -> Any:
    """``value`` as JSON-able data that ``decode`` turns back into an equal value;
    ``UnstorableError`` for what it cannot hold exactly."""
    if value is None or type(value) in (bool, str, int):
        return value
    if type(value) is float:
        return value if math.isfinite(value) else {"~float": repr(value)}
    if isinstance(value, np.generic) and value.dtype.kind in "biufcmM":  # its type kept
        return {"~scalar": _array(np.asarray(value))}
    if isinstance(value, pd.DataFrame):
        return {"~frame": _frame(value)}
    if isinstance(value, pd.Series):
        return {"~series": _frame(value.to_frame(name=0)), "name": encode(value.name)}
    if isinstance(value, np.ndarray):
        return {"~array": _array(value)}
    if isinstance(value, enum.Enum):
        return {"~enum": _name(type(value)), "name": value.name}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: encode(getattr(value, f.name)) for f in dataclasses.fields(value)}
        return {"~object": _name(type(value)), "fields": fields}
    if isinstance(value, Path):
        return {"~path": str(value)}
    return _container(value)


def _container(value: Any) -> Any:
    if isinstance(value, tuple):
        return {"~tuple": [encode(v) for v in value]}
    if isinstance(value, list):
        return [encode(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return {"~set": [encode(v) for v in value], "frozen": isinstance(value, frozenset)}
    if isinstance(value, dict):
        if all(isinstance(k, str) and not k.startswith("~") for k in value):
            return {k: encode(v) for k, v in value.items()}
        return {"~dict": [[encode(k), encode(v)] for k, v in value.items()]}
    raise UnstorableError(f"{type(value).__name__} is not kept")


def _array(a: np.ndarray) -> dict:
    if a.dtype.kind in "biufcmM":
        data = base64.b64encode(np.ascontiguousarray(a).tobytes()).decode("ascii")
        return {"dtype": a.dtype.str, "shape": list(a.shape), "bytes": data}
    if a.dtype.kind == "O" and a.ndim == 1:
        return {"dtype": "object", "shape": list(a.shape), "values": [encode(v) for v in a]}
    raise UnstorableError(f"an array of {a.dtype} is not kept")


def _labels(index: pd.Index) -> dict:
    if isinstance(index, pd.RangeIndex):
        return {"range": [index.start, index.stop, index.step], "name": encode(index.name)}
    if isinstance(index, pd.MultiIndex):
        return {"levels": _frame(index.to_frame(index=False)), "names": encode(list(index.names))}
    return {"values": _column(pd.Series(index, copy=False)), "name": encode(index.name)}


def _column(s: pd.Series) -> dict:
    dtype = s.dtype
    if isinstance(dtype, pd.CategoricalDtype):
        return {
            "category": _column(pd.Series(dtype.categories)),
            "codes": _array(s.cat.codes.to_numpy()),
            "ordered": bool(dtype.ordered),
        }
    if isinstance(dtype, np.dtype) and dtype.kind != "O":
        return {"array": _array(s.to_numpy())}
    # object columns and pandas' own dtypes (Int64, boolean, string): value by value
    values = [None if v is pd.NA else v for v in s.to_numpy(dtype=object)]
    return {"dtype": str(dtype), "values": [encode(v) for v in values]}


def _frame(df: pd.DataFrame) -> dict:
    if not df.columns.is_unique:
        raise UnstorableError("a table with repeated column names is not kept")
    return {
        "columns": _labels(df.columns),
        "index": _labels(df.index),
        "data": [_column(df.iloc[:, i]) for i in range(df.shape[1])],
        "attrs": encode(dict(df.attrs)),
    }


def _own(name: str) -> Any:
    """The class ``module:qualname`` names, if it is swift_nb's own."""
    module, _, qualname = name.partition(":")
    if not module.startswith(OWN_PACKAGE) or not qualname:
        raise ValueError(f"{name}: not one of swift_nb's own types")
    found: Any = importlib.import_module(module)
    for part in qualname.split("."):
        found = getattr(found, part)
    return found


def decode(data: Any) -> Any:
    """The value ``encode`` gave ``data`` for; ValueError/KeyError/TypeError for data that
    is not such an encoding (a damaged or foreign file)."""
    if isinstance(data, list):
        return [decode(v) for v in data]
    if not isinstance(data, dict):
        return data
    if not any(isinstance(k, str) and k.startswith("~") for k in data):
        return {k: decode(v) for k, v in data.items()}
    tag = next(k for k in data if k.startswith("~"))
    decoders: dict[str, Callable[[dict], Any]] = {
        "~float": lambda d: float(_one_of(d["~float"], ("nan", "inf", "-inf"))),
        "~frame": lambda d: _unframe(d["~frame"]),
        "~series": lambda d: _unframe(d["~series"]).iloc[:, 0].rename(decode(d["name"])),
        "~array": lambda d: _unarray(d["~array"]),
        "~scalar": lambda d: _unarray(d["~scalar"])[()],
        "~enum": _enum,
        "~object": _object,
        "~path": lambda d: Path(d["~path"]),
        "~tuple": lambda d: tuple(decode(v) for v in d["~tuple"]),
        "~set": lambda d: (frozenset if d["frozen"] else set)(decode(v) for v in d["~set"]),
        "~dict": lambda d: {decode(k): decode(v) for k, v in d["~dict"]},
    }
    if tag not in decoders:
        raise ValueError(f"{tag}: not a kept value")
    return decoders[tag](data)


def _one_of(value: str, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise ValueError(f"{value!r}: not one of {allowed}")
    return value


def _enum(d: dict) -> Any:
    cls = _own(d["~enum"])
    if not (isinstance(cls, type) and issubclass(cls, enum.Enum)):
        raise ValueError(f"{d['~enum']}: not an enum")
    return cls[d["name"]]


def _object(d: dict) -> Any:
    cls = _own(d["~object"])
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        raise ValueError(f"{d['~object']}: not a dataclass")
    names = {f.name for f in dataclasses.fields(cls)}
    given = d["fields"]
    if set(given) != names:
        raise ValueError(f"{d['~object']}: fields {sorted(given)} are not its {sorted(names)}")
    obj = cls.__new__(cls)
    for name, value in given.items():  # as they were, without running its __init__
        object.__setattr__(obj, name, decode(value))
    return obj


def _unarray(d: dict) -> np.ndarray:
    shape = tuple(int(n) for n in d["shape"])
    if d["dtype"] == "object":
        values = np.empty(len(d["values"]), dtype=object)
        values[:] = [decode(v) for v in d["values"]]
        return values.reshape(shape)
    dtype = np.dtype(d["dtype"])
    if dtype.kind not in "biufcmM":
        raise ValueError(f"{dtype}: not a kept array type")
    return np.frombuffer(base64.b64decode(d["bytes"]), dtype=dtype).reshape(shape).copy()


def _unlabels(d: dict) -> pd.Index:
    if "range" in d:
        start, stop, step = (int(x) for x in d["range"])
        return pd.RangeIndex(start, stop, step, name=decode(d["name"]))
    if "levels" in d:
        return pd.MultiIndex.from_frame(_unframe(d["levels"]), names=decode(d["names"]))
    return pd.Index(_uncolumn(d["values"]), name=decode(d["name"]), tupleize_cols=False)


def _uncolumn(d: dict) -> pd.Series:
    if "category" in d:
        categories = pd.Index(_uncolumn(d["category"]))
        codes = _unarray(d["codes"])
        return pd.Series(pd.Categorical.from_codes(codes, categories, ordered=bool(d["ordered"])))
    if "array" in d:
        return pd.Series(_unarray(d["array"]), copy=False)
    values = [decode(v) for v in d["values"]]
    if d["dtype"] == "object":
        column = np.empty(len(values), dtype=object)
        column[:] = values
        return pd.Series(column, dtype=object, copy=False)
    return pd.Series(values, dtype=object).astype(pd.api.types.pandas_dtype(d["dtype"]))


def _unframe(d: dict) -> pd.DataFrame:
    columns = _unlabels(d["columns"])
    data = [_uncolumn(c) for c in d["data"]]
    if len(data) != len(columns):
        raise ValueError(f"{len(data)} columns for {len(columns)} names")
    index = _unlabels(d["index"])
    df = pd.concat([s.set_axis(index) for s in data], axis=1) if data else pd.DataFrame(index=index)
    df.columns = columns
    df.attrs.update(decode(d["attrs"]))
    return df


# -- equality, exact ---------------------------------------------------------------------


def same(a: Any, b: Any) -> bool:
    """``a`` and ``b`` equal in value and type, tables by their dtypes, index, attrs and
    cells (NaN equal to NaN)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, pd.DataFrame):
        try:
            pd.testing.assert_frame_equal(a, b, check_exact=True, check_freq=False)
        except (AssertionError, TypeError, ValueError):
            return False
        return same(dict(a.attrs), dict(b.attrs))
    if isinstance(a, pd.Series):
        return same(a.to_frame(name=0), b.to_frame(name=0)) and same(a.name, b.name)
    if isinstance(a, np.ndarray):
        return (
            a.dtype == b.dtype
            and a.shape == b.shape
            and bool(np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"))
        )
    if isinstance(a, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if dataclasses.is_dataclass(a) and not isinstance(a, type):
        return all(same(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a))
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    try:
        return bool(a == b)
    except (TypeError, ValueError):
        return False


# -- the file -----------------------------------------------------------------------------


@dataclasses.dataclass
class Kept:
    """What the file holds: the analysis, and the digest of the timeline viewer the report
    written with it embedded (``None``: none), which a report written again may take from
    that report instead of reading the trace."""

    analysis: Any
    viewer: str | None = None


def save_analysis(run: Run, analysis: Any, viewer: str | None = None) -> bool:
    """Keep ``analysis`` beside ``run`` (the Analysis ``run`` as it stands now was analysed
    to) with its report's ``viewer`` digest; False, and nothing kept, when it cannot be
    kept exactly or the folder cannot be written. Best effort: the run is analysed again
    next time."""
    key = run_key(run)
    if key is None:
        return False
    try:
        encoded = encode(analysis)
        if not same(decode(orjson.loads(orjson.dumps(encoded))), analysis):
            _forget(run)
            return False
        data = orjson.dumps({"format": FORMAT, "key": key, "viewer": viewer, "analysis": encoded})
        atomic_write_bytes(Path(run.path) / ANALYSIS_FILE, data)  # type: ignore[arg-type]
    except (UnstorableError, TypeError, ValueError, OSError):
        _forget(run)
        return False
    return True


def load_analysis(run: Run, kind: type | None = None) -> Kept | None:
    """What is kept beside ``run`` if it is still ``run``'s analysis (and of ``kind``, where
    given); None when there is none, it is stale, or the file is not whole."""
    key = run_key(run)
    if key is None:
        return None
    try:
        kept = orjson.loads((Path(run.path) / ANALYSIS_FILE).read_bytes())  # type: ignore[arg-type]
        if not isinstance(kept, dict) or kept.get("format") != FORMAT or kept.get("key") != key:
            return None
        analysis = decode(kept["analysis"])
        viewer = kept.get("viewer")
    except (OSError, ValueError, KeyError, TypeError, AttributeError, ImportError):
        return None
    if kind is not None and not isinstance(analysis, kind):
        return None
    return Kept(analysis, viewer if isinstance(viewer, str) else None)


def _forget(run: Run) -> None:
    if run.path is not None:
        try:
            (Path(run.path) / ANALYSIS_FILE).unlink(missing_ok=True)
        except OSError:
            pass
