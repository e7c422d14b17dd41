"""PNGs of the report's figures drawn before they were asked for.

Drawing is most of a report's time. The figures that depend on the trace alone are drawn
while the profiled cell still runs, and a report written again reuses the figures of the
one it replaces; both go into a ``FigureCache`` that the report then takes them from. A
figure is known by its key (``figure_key``): a digest of what it shows and of the code
that draws it, so a cached PNG is used only where drawing would give the same.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import importlib.metadata
import re
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

import pandas as pd


class FigurePart(Protocol):
    """A figure a section shows (``sections.base.FigurePart``): its key, and its PNG drawn
    on demand or handed out from a cache."""

    key: str | None
    drawn: bytes | None

    @property
    def png(self) -> bytes: ...


class Section(Protocol):
    """A report section (``sections.base.Section``): its parts, text or figures."""

    @property
    def parts(self) -> Sequence[Any]: ...


_KEYED_IMG = re.compile(
    r"<img [^>]*?data-figure='([0-9a-f]{40})' src='data:image/png;base64,([A-Za-z0-9+/=]+)'"
)


@functools.cache
def _drawn_by() -> bytes:
    """What draws the figures: the drawing code and matplotlib's version (a figure drawn
    by other code is drawn again)."""
    from swift_nb.render import figures, fonts

    code = Path(figures.__file__).read_bytes() + Path(fonts.__file__).read_bytes()
    return code + importlib.metadata.version("matplotlib").encode()


def _frame_bytes(df: pd.DataFrame) -> bytes:
    try:
        values = pd.util.hash_pandas_object(df, index=False).to_numpy().tobytes()
    except TypeError:  # unhashable cells (lists): their text stands for them
        values = df.to_csv(index=False).encode()
    return repr([(str(c), str(t)) for c, t in df.dtypes.items()]).encode() + values


def figure_key(kind: str, *frames: pd.DataFrame, **options: Any) -> str:
    """What a figure of ``kind`` drawn from ``frames`` shows, as a ``FigurePart.key``:
    a hex digest of the frames, the options and the code that draws it."""
    digest = hashlib.sha1(_drawn_by())
    digest.update(f"{kind}:{sorted(options.items())}".encode())
    for df in frames:
        digest.update(_frame_bytes(df))
    return digest.hexdigest()


class FigureCache:
    """PNGs by ``FigurePart.key``, the newest ``kept`` of them; one per profiled run or
    report, handed from whoever draws ahead to the report that uses them."""

    def __init__(self, kept: int = 32) -> None:
        self.kept = kept
        self._pngs: OrderedDict[str, bytes] = OrderedDict()

    def __contains__(self, key: object) -> bool:
        return key in self._pngs

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._pngs))

    def __len__(self) -> int:
        return len(self._pngs)

    def png(self, key: str) -> bytes:
        return self._pngs[key]

    def put(self, key: str, png: bytes) -> None:
        self._pngs[key] = png
        self._trim()

    def _trim(self) -> None:
        while len(self._pngs) > self.kept:
            self._pngs.popitem(last=False)

    def keep(self, part: FigurePart) -> None:
        """Draw ``part``'s PNG now and keep it for a later FigurePart with the same key."""
        if part.key is not None:
            self.put(part.key, part.png)

    def reuse(self, html: str) -> int:
        """Keep the figures of an earlier report (its ``html``) for the FigureParts that
        show the same (same key): a report written again from a run folder draws only
        what changed. Returns how many were found."""
        found = _KEYED_IMG.findall(html)
        for key, data in found[-self.kept :]:
            self._pngs[key] = base64.b64decode(data)
        self._trim()
        return len(found)

    def hand_out(self, sections: Sequence[Section]) -> None:
        """Give each figure of ``sections`` its PNG kept here, if any (each PNG once: it
        leaves the cache)."""
        for section in sections:
            for part in section.parts:
                if not isinstance(part, str) and part.key is not None and part.key in self._pngs:
                    part.drawn = self._pngs.pop(part.key)
