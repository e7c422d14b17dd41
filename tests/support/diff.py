"""Helpers shared by the tiers of test_diff's tests."""

from __future__ import annotations

from pathlib import Path

import pytest

import swift_nb

GPU = Path(__file__).parents[1] / "data" / "gpu"


@pytest.fixture(scope="module")
def gpu_pair(tmp_path_factory):
    """A: one V100 training a convolutional net alone (no NCCL kernel); B: rank 0 of two
    A100s whose gradients are all-reduced over NCCL. Their operators differ."""
    root = tmp_path_factory.mktemp("runs")
    return tuple(
        swift_nb.import_trace(GPU / f"{name}.json.gz", root, label=name, report=False)
        for name in ("gpu_1rank_5steps", "gpu_nccl_2ranks_rank0")
    )


def _row(d, kind, name):
    rows = d.changes[(d.changes["kind"] == kind) & (d.changes["name"] == name)]
    assert len(rows) == 1, (kind, name, rows)
    return rows.iloc[0]
