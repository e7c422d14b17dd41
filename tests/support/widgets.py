"""Helpers shared by the tiers of test_widgets's tests."""

from __future__ import annotations

import swift_nb


def _newest(root):
    table = swift_nb.runs(root)
    assert len(table), f"no run recorded under {root}"
    return swift_nb.load_run(table.path[0])
