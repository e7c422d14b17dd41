"""A large trace's events decoded by two processes at once: the second half of its events
in a worker while this process decodes the first.

Decoding a trace's events into columns is Python work, one core's worth; a trace of a
million events or more is split at its middle event. The second half's JSON text is
written to a file in memory (``/dev/shm`` where there is one), its pages in this process
given back, and a worker (reading the file mapped, not copied) (forkserver, as the import's other workers) decodes it into the
same columns and sends them back; they follow the first half's, so the tables are those
one process makes. A worker that dies leaves its half to this process; an error in its
events is the import's, as it would have been here.
"""

from __future__ import annotations

import mmap
import os
import signal
import tempfile
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from swift_nb.analysis.trace.decode import ColumnBuilder, decode_events, release_range
from swift_nb.core.errors import RecordError
from swift_nb.core.gc_pause import paused
from swift_nb.importing.processes import context, main_script_hidden

#: fewer events than this are decoded in one process: a worker's start costs more
MIN_EVENTS = 1_000_000
#: how long the worker may take to end once it has sent its half (s)
_JOIN_S = 10.0
_split = msgspec.json.Decoder(list[msgspec.Raw])


def _address(buffer) -> int:
    return np.frombuffer(buffer, dtype=np.uint8).ctypes.data


def _room_for(size: int) -> str | None:
    """Where a file of ``size`` bytes fits twice over: ``/dev/shm`` (memory), else the temp
    folder; None where neither has the room (a container's /dev/shm is often 64 MB)."""
    for folder in ("/dev/shm", tempfile.gettempdir()):
        try:
            st = os.statvfs(folder)
        except (OSError, AttributeError):  # no such folder; no statvfs (Windows)
            continue
        if os.access(folder, os.W_OK) and st.f_bavail * st.f_frsize > 2 * size:
            return folder
    return None


def _write_half(text: bytearray, start: int, end: int) -> Any:
    """The events of ``text[start:end]`` as a JSON array in a temporary file (open; gone
    when closed), or None when there is no room for it."""
    folder = _room_for(end - start)
    if folder is None:
        return None
    half = tempfile.NamedTemporaryFile(dir=folder, prefix="swift_nb-events-", suffix=".json")  # noqa: SIM115 (handed to the caller open)
    try:
        half.write(b"[")
        half.write(memoryview(text)[start:end])
        half.write(b"]")
        half.flush()
    except OSError:  # filled meanwhile: decoded in one process
        half.close()
        return None
    return half


def decode_in_halves(path: Path, events: list[msgspec.Raw], text: bytearray) -> ColumnBuilder:
    """``decode_events(path, events, text)``, its second half in a worker process when
    there are ``MIN_EVENTS`` or more and more than one core. ``events`` must not be read
    afterwards (the second half's pages of ``text`` are given back to the system)."""
    if len(events) < MIN_EVENTS or (os.cpu_count() or 1) < 2 or not len(text):
        return decode_events(path, events, text)
    mid = len(events) // 2
    base = _address(text)
    start = _address(events[mid]) - base
    end = _address(events[-1]) - base + len(events[-1])
    if not 0 <= start < end <= len(text):  # not views of the text: nothing to hand over
        return decode_events(path, events, text)
    half = _write_half(text, start, end)
    if half is None:
        return decode_events(path, events, text)
    with half:
        release_range(text, start, end)  # the worker's now; this process reads the file if it must
        del events[mid:]  # their text is gone
        ctx: Any = context()  # typeshed's BaseContext lacks Process
        here, there = ctx.Pipe(duplex=False)
        with main_script_hidden():
            worker = ctx.Process(target=_decode_half, args=(half.name, str(path), there), daemon=True)
            worker.start()
        there.close()
        try:
            first = decode_events(path, events, text)
            try:
                status, second = here.recv()
            except (EOFError, OSError):  # the worker died: its half is decoded here
                status, second = "died", None
        finally:
            here.close()
            worker.join(_JOIN_S)
            if worker.is_alive():
                worker.kill()
                worker.join()
        if status == "error":
            raise RecordError(path, second)
        if status != "ok":
            second = _decode_file(path, half.name)
    first.extend(second)
    return first


def _decode_file(path: Path, name: str) -> ColumnBuilder:
    """The columns of the events in the file ``name`` (a JSON array of them), decoded from
    the file mapped into memory: in /dev/shm its pages are already memory, and a copy
    would hold them twice."""
    with open(name, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        events = _split.decode(mapped)
        try:
            return decode_events(path, events)
        except RecordError as e:  # raised below, once its traceback (views of the mapping) is gone
            problem = e.problem
        finally:
            del events  # views of the mapping: gone before it is closed
    raise RecordError(path, problem)


def _decode_half(name: str, path: str, conn: Connection) -> None:
    """The worker: ``("ok", columns)`` or ``("error", what is wrong with the events)``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the importing process handles an interrupt
    try:
        with paused():  # millions of objects made at once, as in the importing process (gc_pause)
            columns = _decode_file(Path(path), name)
        conn.send(("ok", columns))
    except RecordError as e:
        conn.send(("error", e.problem))
    except Exception as e:  # malformed past what decode_events names
        conn.send(("error", f"malformed trace events ({type(e).__name__}: {e})"))
    finally:
        conn.close()
