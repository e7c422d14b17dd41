"""The unit tier: no process, kernel, browser or profiled training loop: pure functions, recorded runs and traces read back (the --fast tier). Every test here is marked ``unit``."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.is_relative_to(__file__.rsplit("/", 1)[0]):
            item.add_marker(pytest.mark.unit)
