"""Text of any script in the figures. matplotlib's default font (DejaVu Sans) has no CJK
glyphs: it draws a box and warns for each. ``fit_text`` gives a figure's texts the
installed fonts that have their glyphs (per text: the user's rcParams are not touched) or,
where no installed font has them, replaces the characters no font can draw; ``shown``
picks what a label-bearing text shows (the run's id for a label no font can draw)."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from matplotlib.figure import Figure

#: fonts with the glyphs DejaVu Sans lacks (CJK, most common first); the installed ones are
#: tried, in this order, after a text's own fonts
FALLBACK_FAMILIES = (
    "Noto Sans CJK SC",
    "Noto Sans CJK TC",
    "Noto Sans CJK JP",
    "Noto Sans CJK KR",
    "Noto Sans SC",
    "Noto Sans JP",
    "Source Han Sans SC",
    "Source Han Sans CN",
    "Source Han Sans TC",
    "Source Han Sans JP",
    "Source Han Sans KR",
    "WenQuanYi Zen Hei",
    "WenQuanYi Micro Hei",
    "Droid Sans Fallback",
    "AR PL UMing CN",
    "AR PL UKai CN",
    "Microsoft YaHei",
    "SimHei",
    "PingFang SC",
    "Hiragino Sans GB",
    "Heiti SC",
    "Hiragino Sans",
    "Yu Gothic",
    "Meiryo",
    "IPAexGothic",
    "IPAGothic",
    "TakaoGothic",
    "Malgun Gothic",
    "Apple SD Gothic Neo",
    "NanumGothic",
    "Arial Unicode MS",
)
#: what a character no installed font can draw becomes in a figure
UNDRAWABLE = "?"


@functools.cache
def fallback_families() -> tuple[str, ...]:
    """The FALLBACK_FAMILIES installed (matplotlib's font list), looked up once."""
    from matplotlib import font_manager

    installed = {f.name for f in font_manager.fontManager.ttflist}
    return tuple(name for name in FALLBACK_FAMILIES if name in installed)


@functools.cache
def _coverage(families: tuple[str, ...]) -> frozenset[int]:
    """The code points the font matplotlib picks for any of ``families`` has a glyph for."""
    from matplotlib import font_manager

    points: set[int] = set()
    for family in families:
        try:
            path = font_manager.findfont(
                font_manager.FontProperties(family=[family]), fallback_to_default=False
            )
        except ValueError:  # not installed
            continue
        points.update(font_manager.get_font(path).get_charmap())
    return frozenset(points)


def _default_families() -> tuple[str, ...]:
    import matplotlib as mpl

    return tuple(mpl.rcParams["font.family"])


def drawable(text: str, families: tuple[str, ...] | None = None) -> bool:
    """Whether a font of ``families`` (default: the rcParams' and the installed fallbacks)
    has every character of ``text`` (line breaks and tabs aside)."""
    if text.isascii():
        return True
    families = families if families is not None else _default_families() + fallback_families()
    cover = _coverage(families)
    return all(ord(c) in cover or c in "\n\r\t" for c in text)


def shown(label: str | None, instead: str) -> str:
    """``label`` where a font can draw it, else ``instead`` (the run's id): a figure never
    shows a label as boxes (the report's text keeps it)."""
    return label if label and drawable(label) else instead


def fit_text(fig: Figure) -> None:
    """Let each text of ``fig`` be drawn without a missing glyph: the installed fallback
    fonts after its own where they have its characters, its undrawable characters replaced
    by ``UNDRAWABLE`` where none has (for tick labels, in what their axis formats, since
    drawing sets them again)."""
    from matplotlib.text import Text

    for text in fig.findobj(Text):
        s = text.get_text()
        if s.isascii():
            continue
        own = tuple(text.get_fontfamily())
        if drawable(s, own):
            continue
        families = own + fallback_families()
        if families != own:
            text.set_fontfamily(list(families))
        text.set_text(_drawn(s, families))
    families = _default_families() + fallback_families()
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            locs = axis.get_majorticklocs()
            labels = axis.get_major_formatter().format_ticks(list(locs))
            if not all(drawable(t, families) for t in labels):
                axis.set_ticks(locs, [_drawn(t, families) for t in labels])


def _drawn(text: str, families: tuple[str, ...]) -> str:
    """``text`` with each character no font of ``families`` has replaced by ``UNDRAWABLE``."""
    if drawable(text, families):
        return text
    cover = _coverage(families)
    return "".join(c if ord(c) in cover or c in "\n\r\t" else UNDRAWABLE for c in text)
