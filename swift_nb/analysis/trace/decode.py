"""Decode a Chrome trace file straight into a ``Trace``'s columns.

A trace of a few steps of a large model is gigabytes of JSON and millions of events; a
dict per event (what ``json.loads`` makes) costs several times the JSON's size. Here the
file is decompressed in a stream, refused past ``max_bytes`` or at a stretch no trace has
(``MAX_STRETCH``) before it is whole, and its ``traceEvents`` array is split (by msgspec,
in C) into the byte ranges of its events without decoding them; the events are then
decoded a batch at a time into small typed structs that keep only the fields the tables
have, and appended to the columns, so what stays in memory is the JSON text and the
columns. JSON nested deeper than the decoders recurse is a ``RecordError`` too.
Measured against the alternatives in ``benchmarks/scale.py``.
"""

from __future__ import annotations

import ctypes
import mmap
import operator
import re
import sys
import zlib
from pathlib import Path
from typing import Any, ClassVar

import msgspec
import numpy as np

from swift_nb.core.errors import RecordError

#: the most a trace file may decompress to (bytes) unless the caller allows more
DEFAULT_MAX_BYTES = 16 << 30
GZIP_MAGIC = b"\x1f\x8b"
_BATCH = 50_000  # events decoded to structs at once: a few MB of structs
_READ = 1 << 20
_PIECE = 1 << 20  # the most one call inflates: a gzip bomb's output never arrives in one piece
#: the longest stretch of a gzipped trace's JSON without a '"' (every key and name has them) or
#: without a '}' (every event ends with one): longer is whitespace or one giant value, as a
#: gzip bomb is, refused before more of it is inflated
MAX_STRETCH = 64 << 20
_LEADING_SPACE = re.compile(rb"\s*")


class _Args(msgspec.Struct, gc=False):
    """The ``args`` an event's table columns read; ``UNSET`` where the key is absent."""

    input_dims: Any = msgspec.field(default=msgspec.UNSET, name="Input Dims")
    input_type: Any = msgspec.field(default=None, name="Input type")
    external_id: Any = msgspec.field(default=None, name="External id")
    correlation: Any = -1
    in_nelems: Any = msgspec.field(default=None, name="In msg nelems")
    out_nelems: Any = msgspec.field(default=None, name="Out msg nelems")
    dtype: Any = None
    group_size: Any = msgspec.field(default=None, name="Group size")
    bytes: Any = msgspec.field(default=0, name="Bytes")
    total_allocated: Any = msgspec.field(default=0, name="Total Allocated")
    device_type: Any = msgspec.field(default=0, name="Device Type")
    device_id: Any = msgspec.field(default=-1, name="Device Id")
    addr: Any = msgspec.field(default=None, name="Addr")
    seq: Any = msgspec.field(default=-1, name="Sequence number")
    occupancy: Any = msgspec.field(default=None, name="est. achieved occupancy %")
    blocks_per_sm: Any = msgspec.field(default=None, name="blocks per SM")


_NO_ARGS = _Args()
_ARGS_FIELDS = operator.attrgetter(
    "input_dims",
    "input_type",
    "external_id",
    "correlation",
    "in_nelems",
    "out_nelems",
    "dtype",
    "group_size",
    "seq",
    "occupancy",
    "blocks_per_sm",
)


class _Event(msgspec.Struct, gc=False):
    ph: Any = None
    name: Any = ""
    cat: Any = ""
    ts: Any = msgspec.UNSET
    dur: Any = 0.0
    pid: Any = None
    tid: Any = None
    args: _Args | None = None


_EVENT_FIELDS = operator.attrgetter("name", "cat", "ts", "dur", "pid", "tid", "args")
_split_document = msgspec.json.Decoder(dict[str, msgspec.Raw])
_split_events = msgspec.json.Decoder(list[msgspec.Raw])
_decode_events = msgspec.json.Decoder(list[_Event])


def read_json_bytes(path: Path, max_bytes: int = DEFAULT_MAX_BYTES) -> bytearray:
    """The JSON text of a trace file, gunzipped in a stream when it is gzip.

    ``RecordError`` when it is or would decompress to more than ``max_bytes``, is gzip
    holding more than ``MAX_STRETCH`` bytes without a '"' or a '}' (both checked as it
    decompresses, a piece of at most ``_PIECE`` bytes at a time: a gzip bomb is refused
    there, not after), is cut short or is not gzip after all."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            gzipped = f.read(2) == GZIP_MAGIC
            f.seek(0)
            if not gzipped:
                size = path.stat().st_size
                if size > max_bytes:
                    raise _too_large(path, max_bytes)
                out = bytearray(size)
                n = f.readinto(out)
                del out[n:]
                return out
            return _gunzip(f, path, max_bytes)
    except (OSError, EOFError, zlib.error) as e:
        raise RecordError(path, str(e) or type(e).__name__) from None


def _gunzip(f, path: Path, max_bytes: int) -> bytearray:
    out = bytearray()
    stretch = _Stretches(path)
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    data = f.read(_READ)
    while data:
        out += (piece := d.decompress(data, min(_PIECE, max_bytes + 1 - len(out))))
        if len(out) > max_bytes:
            raise _too_large(path, max_bytes)
        stretch.see(piece)
        if d.eof:  # what follows is another member (`cat a.gz b.gz`), or nothing
            data = d.unused_data or f.read(_READ)
            d = zlib.decompressobj(16 + zlib.MAX_WBITS)
            continue
        # the rest of a full piece's input, or more (zlib holds no output past its input's
        # end: the member's trailer follows it)
        data = d.unconsumed_tail or f.read(_READ)
        if not data:
            raise EOFError("Compressed file ended before the end-of-stream marker was reached")
    return out


class _Stretches:
    """How far the JSON inflated so far runs past its last '"' and its last '}';
    ``RecordError`` past ``MAX_STRETCH`` (checked a piece at a time, so a stretch may
    run one piece further)."""

    _WHAT: ClassVar[dict[bytes, str]] = {b'"': "a string ('\"')", b"}": "the end of an object ('}')"}

    def __init__(self, path: Path) -> None:
        self.path = path
        self.since = dict.fromkeys(self._WHAT, 0)

    def see(self, piece: bytes) -> None:
        for char, since in self.since.items():
            last = piece.rfind(char)
            self.since[char] = since = len(piece) - 1 - last if last >= 0 else since + len(piece)
            if since > MAX_STRETCH:
                raise RecordError(
                    self.path,
                    f"inflates to more than {MAX_STRETCH >> 20} MiB of JSON without {self._WHAT[char]} "
                    "(whitespace or one giant value, as in a gzip bomb): not a Chrome trace",
                )


def _too_large(path: Path, max_bytes: int) -> RecordError:
    return RecordError(
        path,
        f"decompresses to more than max_bytes={max_bytes} ({max_bytes / 2**30:g} GiB), the cap on a trace's "
        "size; pass a larger max_bytes= (swift_nb.import_trace(..., max_bytes=...), "
        "swift_nb.analysis.trace.tables.read_trace(path, max_bytes=...)) if the trace really is this large",
    )


#: the deepest nesting an event's argument may have: a tensor's shapes are two levels deep,
#: a list of tensors' three. Past it the trace is refused as nested too deeply, whatever
#: the interpreter's recursion limit (a process that compiled with Inductor raises it)
MAX_NESTING = 32


def _too_nested(text: str) -> bool:
    """Whether the text of an argument (``str`` of its JSON value) nests lists or objects
    deeper than ``MAX_NESTING``; a scan only when it has that many brackets at all."""
    if text.count("[") + text.count("{") <= MAX_NESTING:
        return False
    depth = deepest = 0
    for ch in text:
        if ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest > MAX_NESTING


def check_nesting(texts: list[str]) -> list[str]:
    """``texts``, or ``RecursionError`` (read as ``too_deep``) when one of them nests too
    deeply."""
    # nesting past MAX_NESTING takes twice as many characters: most texts are shorter
    if max(map(len, texts), default=0) > 2 * MAX_NESTING and any(
        _too_nested(s) for s in texts if len(s) > 2 * MAX_NESTING
    ):
        raise RecursionError("an event's arguments are nested past MAX_NESTING")
    return texts


def too_deep(path: Path) -> RecordError:
    """The error for JSON nested deeper than the decoders recurse (``RecursionError``)."""
    return RecordError(path, "not JSON: nested too deeply (maximum recursion depth exceeded)")


def split_document(path: Path, data: bytearray) -> tuple[dict[str, Any], list[msgspec.Raw]]:
    """A trace's top-level keys but ``traceEvents`` decoded (``distributedInfo``, …), and
    the byte ranges of its events; ``RecordError`` for a file that is not a Chrome trace
    (the object or the bare array form)."""
    leading = _LEADING_SPACE.match(data)
    assert leading is not None  # \s* matches every input, the empty one included
    start = leading.end()
    if start == len(data):
        raise RecordError(path, "the file is empty")
    try:
        if data[start : start + 1] == b"[":
            return {}, _split_events.decode(data)
        top = _split_document.decode(data)
        raw_events = top.pop("traceEvents", None)
        events = _split_events.decode(raw_events) if raw_events is not None else None
        meta = {k: msgspec.json.decode(v) for k, v in top.items()}
    except msgspec.ValidationError:
        raise RecordError(path, "not a Chrome trace: no list of traceEvents") from None
    except msgspec.DecodeError as e:
        raise RecordError(path, f"not JSON: {e}") from None
    except RecursionError:
        raise too_deep(path) from None
    if events is None:
        raise RecordError(path, "not a Chrome trace: no list of traceEvents")
    return meta, events


class ColumnBuilder:
    """The columns of ``parse_events``'s tables, filled a batch of events at a time; the
    values are those ``parse_events`` makes of the same events' dicts."""

    def __init__(self) -> None:
        self.text: dict[str, list] = {
            k: [] for k in ("name", "cat", "pid", "tid", "input_dims", "input_types")
        }
        self.text["msg_dtype"] = []
        self.num: dict[str, list[np.ndarray]] = {
            k: []
            for k in (
                "ts",
                "dur",
                "ext_id",
                "correlation",
                "msg_nelems",
                "group_size",
                "seq",
                "occupancy",
                "blocks_per_sm",
            )
        }
        self.ext_missing = 0
        self.mem_num: dict[str, list[np.ndarray]] = {
            k: [] for k in ("ts", "bytes", "total_allocated", "device_type", "device_id")
        }
        self.mem_addr: list = []
        self._ids: dict[Any, Any] = {}

    def add(self, events: list[_Event]) -> None:
        xs = [e for e in events if e.ph == "X"]
        mem = [e for e in events if e.ph == "i" and e.name == "[memory]"]
        if xs:
            self._add_complete(xs)
        if mem:
            self._add_memory(mem)

    def _add_complete(self, xs: list[_Event]) -> None:
        # attrgetter and zip run in C: a column per field without a Python call per value
        name, cat, ts, dur, pid, tid, args = zip(*map(_EVENT_FIELDS, xs), strict=True)
        dims, types, ext, corr, n_in, n_out, dtype, group, seq, occupancy, blocks = zip(
            *map(_ARGS_FIELDS, [a or _NO_ARGS for a in args]), strict=True
        )
        if msgspec.UNSET in ts:
            raise KeyError("ts")
        t = self.text
        t["name"] += _interned(name)
        t["cat"] += _interned(cat)
        ids = self._ids  # one object per distinct pid and tid: a new int per event would outlive its batch
        t["pid"] += [ids.setdefault(v, v) for v in pid]
        t["tid"] += [ids.setdefault(v, v) for v in tid]
        dims_text = [str(d) if d else "" for d in dims]
        types_text = [
            str(k) if k and d is not msgspec.UNSET else "" for k, d in zip(types, dims, strict=True)
        ]
        check_nesting(dims_text)
        check_nesting(types_text)
        t["input_dims"] += _interned(dims_text)
        t["input_types"] += _interned(types_text)
        t["msg_dtype"] += _interned([d or "" for d in dtype])
        c = self.num
        c["ts"].append(np.array(ts, dtype=float))
        c["dur"].append(np.array(dur, dtype=float))
        self.ext_missing += ext.count(None)
        c["ext_id"].append(np.array(ext, dtype=float))  # None → NaN
        c["correlation"].append(np.array(corr, dtype=np.int64))
        in_nelems, out_nelems = np.array(n_in, dtype=float), np.array(n_out, dtype=float)
        # the larger of the two, a missing one read as 0; NaN when both are missing
        nelems = np.fmax(np.nan_to_num(in_nelems), np.nan_to_num(out_nelems))
        c["msg_nelems"].append(np.where(np.isnan(in_nelems) & np.isnan(out_nelems), np.nan, nelems))
        c["group_size"].append(np.array(group, dtype=float))
        c["seq"].append(np.array(seq, dtype=np.int64))
        c["occupancy"].append(np.array(occupancy, dtype=float))  # None → NaN: not a kernel
        c["blocks_per_sm"].append(np.array(blocks, dtype=float))

    def _add_memory(self, mem: list[_Event]) -> None:
        n = len(mem)
        args = [e.args or _NO_ARGS for e in mem]
        m = self.mem_num
        ts = [e.ts for e in mem]
        if msgspec.UNSET in ts:
            raise KeyError("ts")
        m["ts"].append(np.array(ts, dtype=float))
        for key, attr in (
            ("bytes", "bytes"),
            ("total_allocated", "total_allocated"),
            ("device_type", "device_type"),
            ("device_id", "device_id"),
        ):
            m[key].append(np.fromiter((int(getattr(a, attr)) for a in args), dtype=np.int64, count=n))
        self.mem_addr += [a.addr for a in args]

    def extend(self, other: ColumnBuilder) -> None:
        """Append ``other``'s events after this one's (the second half of a trace's)."""
        for k, v in other.text.items():
            self.text[k] += v
        for k, parts in other.num.items():
            self.num[k] += parts
        for k, parts in other.mem_num.items():
            self.mem_num[k] += parts
        self.ext_missing += other.ext_missing
        self.mem_addr += other.mem_addr

    def columns(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """(event columns, memory columns) as ``parse_events`` builds its frames from."""
        num = {k: _cat(v) for k, v in self.num.items()}
        ext = num["ext_id"]
        if len(ext) and self.ext_missing == len(ext):
            ext = np.full(len(ext), None, dtype=object)  # what pandas makes of a list of None
        elif not self.ext_missing and isinstance(ext, np.ndarray):
            ext = ext.astype(np.int64)
        events = {
            **self.text,
            "ts": num["ts"],
            "dur": num["dur"],
            "ext_id": ext,
            "correlation": num["correlation"],
            "msg_nelems": num["msg_nelems"],
            "group_size": num["group_size"],
            "seq": num["seq"],
            "occupancy": num["occupancy"],
            "blocks_per_sm": num["blocks_per_sm"],
        }
        mem = {k: _cat(v) for k, v in self.mem_num.items()}
        mem["addr"] = self.mem_addr
        return events, mem


def _cat(parts: list[np.ndarray]) -> np.ndarray | list:
    # no events: an empty list, as parse_events has (pandas types the two alike)
    return np.concatenate(parts) if parts else []


def _interned(values) -> list:
    # one str object per distinct value: a trace's million events have a few thousand names
    values = list(values)
    try:
        return list(map(sys.intern, values))
    except TypeError:  # a null or a number where a name belongs: kept as it is
        return [sys.intern(v) if type(v) is str else v for v in values]


def decode_events(path: Path, events: list[msgspec.Raw], text: bytearray | None = None) -> ColumnBuilder:
    """The columns of the events whose byte ranges ``split_document`` found, decoded
    ``_BATCH`` at a time; ``RecordError`` for a malformed event. ``text``: the JSON the
    ranges are in, whose pages are given back to the system as their events are decoded
    (it must not be read afterwards)."""
    cols = ColumnBuilder()
    release = _Release(text) if text is not None and _MADVISE is not None else None
    try:
        for i in range(0, len(events), _BATCH):
            batch = events[i : i + _BATCH]
            cols.add(_decode_events.decode(b"[" + b",".join(batch) + b"]"))
            if release is not None:
                release.upto(batch[-1])
    except (msgspec.DecodeError, KeyError, TypeError, ValueError, OverflowError) as e:
        raise RecordError(path, f"malformed trace events ({type(e).__name__}: {e})") from None
    except RecursionError:  # an event nested deeper than msgspec (or str() of its args) recurses
        raise too_deep(path) from None
    return cols


def _libc_madvise():
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return fn


_MADVISE = _libc_madvise()


def give_back_freed_memory() -> None:
    """Return the C heap's free pages to the system (glibc's ``malloc_trim``): the millions
    of small objects a decode frees leave hundreds of MB in the process otherwise, on top
    of which the analyses that follow would grow."""
    if _MADVISE is None:
        return
    trim = getattr(ctypes.CDLL(None), "malloc_trim", None)
    if trim is not None:
        trim(0)


def release_range(text: bytearray, start: int, end: int) -> None:
    """Give the whole pages of ``text[start:end]`` back to the system; they read as zeros
    afterwards (nothing on a platform without ``madvise``)."""
    if _MADVISE is None or end <= start:
        return
    view = np.frombuffer(text, dtype=np.uint8)
    first = -(-(view.ctypes.data + start) // _PAGE) * _PAGE
    last = ((view.ctypes.data + end) // _PAGE) * _PAGE
    del view
    if last > first:
        _MADVISE(first, last - first, _MADV_DONTNEED)


_MADV_DONTNEED = 4
_PAGE = mmap.PAGESIZE


class _Release:
    """Gives the pages of a bytearray back to the system up to a point, as a stream
    parser would drop what it has read: the JSON of a 1 GB trace need not stay whole
    while its events become columns. The bytearray reads as zeros there afterwards."""

    def __init__(self, text: bytearray) -> None:
        view = np.frombuffer(text, dtype=np.uint8)
        self.start, self.end = view.ctypes.data, view.ctypes.data + len(view)
        self.done = -(-self.start // _PAGE) * _PAGE  # the first whole page
        del view

    def upto(self, raw: msgspec.Raw) -> None:
        at = np.frombuffer(raw, dtype=np.uint8)
        addr = at.ctypes.data
        if not self.start <= addr < self.end:  # not a view of the text (a copy): nothing to give back
            return
        until = (addr // _PAGE) * _PAGE
        if until > self.done:
            _MADVISE(self.done, until - self.done, _MADV_DONTNEED)
            self.done = until
