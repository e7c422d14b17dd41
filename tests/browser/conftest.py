"""The browser tier: a real Chromium (Debian's package) driven by Playwright. Every test here is marked ``browser``."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.is_relative_to(__file__.rsplit("/", 1)[0]):
            item.add_marker(pytest.mark.browser)
