"""swift_nb.render.fonts: a run labelled in a script the default font cannot draw
(``基线-长序列``) draws its figures without a missing-glyph warning or boxes: in an installed
CJK font where there is one, without the label (the run's id instead) where there is none;
report.html keeps the label as text either way.

This machine has no CJK font (``fc-list :lang=zh`` is empty): the "installed" case uses a
font made here with fontTools (matplotlib's own dependency) whose glyphs are plain boxes,
registered with matplotlib for the test under a family name of its own."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import matplotlib as mpl
import pandas as pd
import pytest
from matplotlib import font_manager

import swift_nb
from swift_nb.notebook import panel
from swift_nb.record import load_run
from swift_nb.render import fonts
from swift_nb.render.comparison.page import memory_curves_figure, step_times_figure
from swift_nb.render.figures import figure_png, new_figure, operators_figure, timeline_figure

LABEL = "基线-长序列"
RUN_DIR = Path(__file__).parents[1] / "data" / "cost_run"
TEST_FAMILY = "swift_nb Test CJK"


def make_font(path: Path, family: str, chars: str) -> Path:
    """A TrueType font named ``family`` with a box glyph for each of ``chars``."""
    from fontTools.fontBuilder import FontBuilder
    from fontTools.pens.ttGlyphPen import TTGlyphPen

    names = {ord(c): f"uni{ord(c):04X}" for c in sorted(set(chars))}
    pen = TTGlyphPen(None)
    pen.moveTo((100, 0))
    pen.lineTo((100, 800))
    pen.lineTo((900, 800))
    pen.lineTo((900, 0))
    pen.closePath()
    box, blank = pen.glyph(), TTGlyphPen(None).glyph()
    fb = FontBuilder(1000, isTTF=True)
    fb.setupGlyphOrder([".notdef", "space", *names.values()])
    fb.setupCharacterMap({32: "space", **names})
    fb.setupGlyf({".notdef": blank, "space": blank, **dict.fromkeys(names.values(), box)})
    fb.setupHorizontalMetrics({n: (1000, 0) for n in [".notdef", "space", *names.values()]})
    fb.setupHorizontalHeader(ascent=880, descent=-120)
    fb.setupNameTable({"familyName": family, "styleName": "Regular"})
    fb.setupOS2(sTypoAscender=880, sTypoDescender=-120, usWinAscent=880, usWinDescent=120)
    fb.setupPost()
    fb.save(str(path))
    return path


@pytest.fixture(params=["installed", "absent"])
def cjk_font(request, monkeypatch, tmp_path_factory):
    """Whether a CJK font is installed: one made here, or none (the fallback list empty)."""
    clear = fonts.fallback_families.cache_clear
    clear()
    if request.param == "installed":
        path = tmp_path_factory.mktemp("font") / "test-cjk.ttf"
        font_manager.fontManager.addfont(str(make_font(path, TEST_FAMILY, LABEL + "前向")))
        monkeypatch.setattr(fonts, "FALLBACK_FAMILIES", ("No Such Font", TEST_FAMILY))
        assert fonts.fallback_families() == (TEST_FAMILY,)
    else:
        monkeypatch.setattr(fonts, "fallback_families", lambda: ())
    yield request.param
    clear()


@pytest.fixture
def glyph_warnings_fail():
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=r"Glyph \d+ .*missing from font")
        yield


@pytest.fixture
def labelled_run(tmp_path):
    folder = tmp_path / "run"
    shutil.copytree(RUN_DIR, folder)
    meta = json.loads((folder / "run.json").read_text())
    meta["label"] = LABEL
    (folder / "run.json").write_text(json.dumps(meta, ensure_ascii=False))
    return load_run(folder)


def test_the_default_font_lacks_the_label():
    assert not fonts.drawable(LABEL, tuple(mpl.rcParams["font.family"]))
    assert fonts.drawable("step — 3 µs ×", tuple(mpl.rcParams["font.family"]))


def test_the_report_draws_a_cjk_label_without_glyph_warnings(
    labelled_run, cjk_font, glyph_warnings_fail, monkeypatch
):
    family = list(mpl.rcParams["font.family"])
    reported = swift_nb.report(labelled_run)
    assert LABEL in (labelled_run.path / "report.html").read_text(encoding="utf-8")
    bundles: list[dict] = []  # the notebook's static outputs: the same sections and PNGs
    monkeypatch.setattr(panel, "display", lambda bundle, raw=False: bundles.append(bundle))
    panel.show_static(labelled_run, reported.sections)
    assert LABEL in bundles[0]["text/html"] and any("image/png" in b for b in bundles)
    fig = timeline_figure(labelled_run)
    figure_png(fig)
    title = fig.get_suptitle()
    if cjk_font == "installed":
        assert title.startswith(LABEL) and TEST_FAMILY in fig._suptitle.get_fontfamily()
    else:
        assert title.startswith(labelled_run.id) and LABEL not in title
    assert list(mpl.rcParams["font.family"]) == family  # the user's rcParams untouched


@pytest.mark.parametrize("figure", [step_times_figure, memory_curves_figure])
def test_comparison_legends_name_a_variant_a_font_can_draw(
    labelled_run, cjk_font, glyph_warnings_fail, figure
):
    fig = figure([(LABEL, labelled_run), ("bf16", labelled_run)])
    figure_png(fig)
    names = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert names[1] == "bf16"
    assert names[0] == (LABEL if cjk_font == "installed" else labelled_run.id)


def test_any_other_text_is_drawn_or_its_characters_replaced(cjk_font, glyph_warnings_fail):
    ops = pd.DataFrame({"name": ["前向 forward", "aten::mm"], "self_time_s": [2.0, 1.0], "calls": [3, 4]})
    fig = operators_figure(ops, metric="self_time_s")
    figure_png(fig)
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert ("前向 forward" if cjk_font == "installed" else "?? forward") in labels

    fig = new_figure(4, 2)
    fig.suptitle("русский, ελληνικά, 한국어")  # DejaVu Sans has Cyrillic and Greek, no font here Hangul
    figure_png(fig)
    assert fig.get_suptitle() == "русский, ελληνικά, ???"


def test_the_fallback_fonts_are_looked_up_once(monkeypatch):
    fonts.fallback_families.cache_clear()
    first = fonts.fallback_families()
    monkeypatch.setattr(font_manager.fontManager, "ttflist", [])
    assert fonts.fallback_families() is first
    fonts.fallback_families.cache_clear()
