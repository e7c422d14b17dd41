"""One truth per number: the step time and the throughput have one definition (the median
over the steady steps run with the profiler off, and its inverse), and every other figure
of them says what it measures in its label. Read from report.html and compare.html as a
reader sees them. Also: the repeated blocks come from the model's own modules."""

from __future__ import annotations

import contextlib
import html
import io
import re

import pytest
import torch
from torch import nn

import swift_nb
from swift_nb.demo import make_model

#: words that tell a reader a figure measures something other than the step time
QUALIFIED = ("traced", "every step", "wall time", "compiling", "90th", "per rank", "× base")
_UNITS = {"µs": 1e-6, "ms": 1e-3, "s": 1.0, "min": 60.0}


def _loop(out, label):
    torch.manual_seed(0)
    model = make_model(n_layer=2, n_head=2, d_model=64, vocab_size=256, seq_len=64, attn_impl="eager")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randint(0, 256, (4, 64))
    with (
        contextlib.redirect_stdout(io.StringIO()),
        swift_nb.profile(out_dir=out, label=label, wait=1, warmup=1, active=2, profile_memory=True) as run,
    ):
        for _ in range(14):
            model(x, x).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    return swift_nb.load_run(run.path)


def _pairs(page: str) -> list[tuple[str, str]]:
    """(label, value) of every two-cell table row of a page."""
    rows = re.findall(r"<tr>\s*<t[hd][^>]*>(.*?)</t[hd]>\s*<td[^>]*>(.*?)</td>", page, flags=re.S)
    clean = lambda s: html.unescape(re.sub(r"<[^>]+>", "", s)).strip()  # noqa: E731
    return [(clean(a), clean(b)) for a, b in rows]


def _seconds(value: str) -> float | None:
    m = re.match(r"([\d.,]+)\s*(µs|ms|s|min)\b", value)
    return float(m.group(1).replace(",", "")) * _UNITS[m.group(2)] if m else None


def _plain_figures(page: str) -> list[tuple[str, float]]:
    """Every step-time or steps-per-second figure whose label does not say it measures
    something else, as seconds per step."""
    out = []
    for name, value in _pairs(page):
        low = name.lower()
        if any(q in low for q in QUALIFIED):
            continue
        if "step time" in low and (s := _seconds(value)) is not None:
            out.append((name, s))
        elif "steps per second" in low or low == "throughput":
            m = re.match(r"([\d.,]+)", value)
            if m and float(m.group(1).replace(",", "")) > 0:
                out.append((name, 1.0 / float(m.group(1).replace(",", ""))))
    return out


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    return _loop(root, "a"), _loop(root, "b")


def test_report_step_times_agree_or_say_what_they_measure(two_runs):
    run, _ = two_runs
    s = run.summary
    assert s["step_time_basis"] == "profiler off"
    assert s["steps_per_s"] == pytest.approx(1.0 / s["step_time_median_s"])
    assert s["step_time_traced_median_s"] > 0
    page = (run.path / "report.html").read_text()
    figures = _plain_figures(page)
    assert len(figures) >= 2, figures  # the Summary's step time and steps per second, at least
    low, high = min(v for _, v in figures), max(v for _, v in figures)
    assert high <= 1.15 * low, figures
    assert "Step time, traced (profiler on" in html.unescape(page)


def test_compare_page_step_times_agree_or_say_what_they_measure(two_runs):
    a, b = two_runs
    swift_nb.compare(a, b, html=True)
    text = (a.path / "compare.html").read_text()
    assert "step (median)" not in text  # the comparison names its definition
    medians = [a.summary["step_time_median_s"], b.summary["step_time_median_s"]]
    for name, value in _plain_figures(text):
        assert any(value == pytest.approx(m, rel=0.15) for m in medians), (name, value, medians)


def test_a_three_layer_transformer_encoder_is_three_blocks(tmp_path):
    layer = nn.TransformerEncoderLayer(d_model=32, nhead=2, dim_feedforward=64, batch_first=True)
    model = nn.Sequential(nn.Embedding(64, 32), nn.TransformerEncoder(layer, num_layers=3), nn.Linear(32, 64))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randint(0, 64, (4, 16))
    quiet = contextlib.redirect_stdout(io.StringIO())
    with quiet, swift_nb.profile(out_dir=tmp_path, wait=0, warmup=1, active=1, report=False) as run:
        for _ in range(3):
            model(x).sum().backward()
            opt.step()
            opt.zero_grad()
    record = swift_nb.load_run(run.path)
    blocks = record.context["repeated_blocks"]
    assert blocks["count"] == 3 and blocks["class"] == "TransformerEncoderLayer"
    from swift_nb.analysis.forecast import measure

    assert measure(record).blocks == 3
