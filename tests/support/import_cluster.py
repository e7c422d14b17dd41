"""Helpers shared by the tiers of test_import_cluster's tests."""

from __future__ import annotations

import html
import re
from pathlib import Path

import numpy as np
import pytest

import swift_nb
from support.jobs import write_job
from swift_nb.record import load_run, rank_folder

RANKS = 4


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> Path:
    return write_job(tmp_path_factory.mktemp("job") / "job", RANKS, slow={1: 1.3})


@pytest.fixture(scope="module")
def local_run(job, tmp_path_factory):
    return swift_nb.import_trace(job, tmp_path_factory.mktemp("local"), label="job")


def _report_text(run) -> str:
    page = (run.path / "report.html").read_text().replace(str(run.path), "DIR").replace(run.id, "ID")
    page = re.sub(r"<(script|style)\b.*?</\1>", " ", page, flags=re.S)
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", page)))


def assert_same_run(a, b) -> None:
    """Two imports of one job hold the same figures, tables and traces."""
    a, b = load_run(a.path), load_run(b.path)
    assert a.summary == b.summary and a.context == b.context and a.environment == b.environment
    assert a.steps.equals(b.steps) and a.rank_steps.equals(b.rank_steps)
    assert a.ranks.drop(columns="record").equals(b.ranks.drop(columns="record"))
    assert a.source["imported_from"] == b.source["imported_from"]
    for r in range(RANKS):
        ra, rb = load_run(rank_folder(a.path, r)), load_run(rank_folder(b.path, r))
        assert ra.summary == rb.summary and ra.steps.equals(rb.steps)
        name = f"trace.rank{r}"
        assert (a.path / f"{name}.json.gz").read_bytes() == (b.path / f"{name}.json.gz").read_bytes()
        with np.load(a.path / f"{name}.tables.npz") as ta, np.load(b.path / f"{name}.tables.npz") as tb:
            assert sorted(ta.files) == sorted(tb.files)
            assert all(np.array_equal(ta[k], tb[k], equal_nan=ta[k].dtype.kind == "f") for k in ta.files)
    assert sorted(p.relative_to(a.path) for p in a.path.rglob("*")) == sorted(
        p.relative_to(b.path) for p in b.path.rglob("*")
    )
