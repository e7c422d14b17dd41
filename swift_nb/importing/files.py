"""The trace files an import names, and one of them read: torch.profiler's Kineto/Chrome
traces (``tensorboard_trace_handler`` files, ``export_chrome_trace``; ``.json`` or
``.json.gz``; one file per rank)."""

from __future__ import annotations

import gzip
import os
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from swift_nb.analysis.trace.decode import DEFAULT_MAX_BYTES, GZIP_MAGIC, decode_events
from swift_nb.analysis.trace.tables import Trace, read_trace_with_meta
from swift_nb.core import trace_names as tn
from swift_nb.core.errors import ConfigError, RecordError
from swift_nb.importing.halves import decode_in_halves

#: the file names torch.profiler gives traces (``*.pt.trace.json`` too)
TRACE_SUFFIXES = (".json", ".json.gz")


@dataclass
class RankTrace:
    """One trace file, read: its top-level metadata (everything but the events) and its
    tables."""

    path: Path
    meta: dict[str, Any]
    trace: Trace

    @property
    def rank(self) -> int:
        return int(self.meta.get("distributedInfo", {}).get("rank", 0) or 0)

    @property
    def world_size(self) -> int:
        return int(self.meta.get("distributedInfo", {}).get("world_size", 1) or 1)


def trace_files(paths: str | os.PathLike | Iterable[str | os.PathLike]) -> list[Path]:
    """The trace files ``paths`` name: files as given, folders expanded to the ``.json``
    / ``.json.gz`` files directly in them. A path that does not exist, or a folder without
    a trace, is a ``ConfigError`` saying so, before anything is read."""
    given = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    if not given:
        raise ConfigError("paths", "must name at least one trace file or folder of traces", given)
    files: list[Path] = []
    for p in map(Path, given):
        if p.is_dir():
            found = sorted(f for f in p.iterdir() if f.is_file() and f.name.endswith(TRACE_SUFFIXES))
            if not found:
                raise ConfigError(
                    "paths", f"a folder must hold trace files ({' or '.join(TRACE_SUFFIXES)})", str(p)
                )
            files += found
        elif p.is_file():
            files.append(p)
        else:
            raise ConfigError("paths", "must be existing trace files or folders", str(p))
    return list(dict.fromkeys(files))


def read_trace_file(path: Path, max_bytes: int = DEFAULT_MAX_BYTES, halves: bool = False) -> RankTrace:
    """One trace file (gzipped or not) read and parsed; ``RecordError`` saying what is
    wrong with a file that is not a torch.profiler trace of profiler steps, or holds more
    than ``max_bytes`` of JSON. ``halves``: a large trace's events are decoded by two
    processes (``halves.decode_in_halves``; for a trace read alone, not in a worker)."""
    trace, meta = read_trace_with_meta(path, max_bytes, decode_in_halves if halves else decode_events)
    if trace.empty:
        raise RecordError(
            path,
            f"no profiler step in it (no '{tn.STEP_PREFIX}N' spans): record it with a schedule and "
            "call prof.step() once per training step",
        )
    return RankTrace(Path(path), meta, trace)


def copy_gzipped(src: Path, dest: Path) -> None:
    with open(src, "rb") as f:
        gzipped = f.read(2) == GZIP_MAGIC
    if gzipped:
        shutil.copyfile(src, dest)
        return
    with open(src, "rb") as f, gzip.open(dest, "wb", compresslevel=1) as out:
        shutil.copyfileobj(f, out, 1 << 20)
