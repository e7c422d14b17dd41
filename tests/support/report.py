"""Helpers shared by the tiers of test_report's tests."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

from support.demo_run import EVIL_OP
from swift_nb.analysis.advisor.findings import VERDICTS, Finding, Verdict
from swift_nb.analysis.breakdown import step_breakdown
from swift_nb.analysis.memory import memory_footprint, memory_timeline
from swift_nb.record import Run
from swift_nb.render.document import report_html, write_report

OPERATOR_COLUMNS = ["name", "calls", "self_time_s", "total_time_s", "self_pct", "alloc_bytes", "input_shapes"]


def operators(n: int = 4) -> pd.DataFrame:
    names = [EVIL_OP, "aten::addmm", "autograd::engine::evaluate_function: AddmmBackward0", "aten::$x$"]
    rows = [
        (names[i % len(names)] + ("" if i < len(names) else f"_{i}"), 10 - i, 1e-3 / (i + 1), 2e-3 / (i + 1),
         40.0 / (i + 1), 2**20 * (i + 1), "[[2, 32], [32, 32]]")
        for i in range(n)
    ]  # fmt: skip
    return pd.DataFrame(rows, columns=OPERATOR_COLUMNS)


def findings() -> list[Finding]:
    return [
        Finding(
            id="optimizer_state",
            title=f"Optimizer state is large for {EVIL_OP}",
            evidence={"optimizer_state_bytes": 143168, "optimizer_pct": 30.0, "step_s": 0.0085},
            suggestion="Project gradients to low rank with GaLore.",
            toggle="galore",
            predicted_effect="optimizer state −75 %",
            formula="state_bytes × (1 − rank / d)",
            severity="warning",
        )
    ]


@pytest.fixture(scope="module")
def run(demo_gpt: Run) -> Run:
    """A real profiled run of the demo GPT (the suite's shared one: ``support.demo_run``)."""
    return demo_gpt


@pytest.fixture(scope="module")
def report_path(run: Run) -> Path:
    html = report_html(
        run,
        breakdown=step_breakdown(run),
        footprint=memory_footprint(run),
        timeline=memory_timeline(run),
        operators_time=operators(),
        operators_memory=operators(),
        throughput=SimpleNamespace(
            steps_per_s=100.0,
            samples_per_s=200.0,
            tokens_per_s=6400.0,
            flops_per_step=2.4e7,
            achieved_flops_per_s=2.4e9,
            mfu_pct=None,
        ),
        verdict=Verdict(
            "compute-bound", "forward, backward and optimizer fill the step", {"compute_pct": 70.0}
        ),
        findings=findings(),
    )
    return write_report(run, html)


APART = frozenset(
    ["p", "div", "h1", "h2", "h3", "h4", "li", "ul", "tr", "th", "td", "table", "figure", "figcaption", "br"]
)


class _Text(HTMLParser):
    """The text a reader sees with no CSS at all: inline elements (span, strong, code …)
    run on with their neighbours, block elements and table cells are set apart; style
    and title text are not shown."""

    def __init__(self) -> None:
        super().__init__()
        self.parts: list[str] = []
        self._hidden = 0

    def handle_starttag(self, tag, attrs):
        self._hidden += tag in ("style", "title")
        if tag in APART:
            self.parts.append(" ")

    def handle_endtag(self, tag):
        self._hidden -= tag in ("style", "title")
        if tag in APART:
            self.parts.append(" ")

    def handle_data(self, data):
        if not self._hidden:
            self.parts.append(data)


def reader_text(html: str) -> str:
    parser = _Text()
    parser.feed(html)
    return re.sub(r"\s+", " ", "".join(parser.parts)).strip()


GLUED = re.compile("(?:" + "|".join(map(re.escape, VERDICTS)) + r")[\w(]")
