"""core.quiet: what a library logs or warns while imported is kept as lines, not printed."""

from __future__ import annotations

import logging
import sys
import types
import warnings

from swift_nb.core.quiet import collected, quiet_import


def test_log_records_and_warnings_become_lines_and_nothing_reaches_stderr(capsys):
    with collected("noisy_lib") as lines:
        logging.getLogger("noisy_lib.backends").warning("Failed to load %s", "a kernel")
        logging.getLogger("noisy_lib").info("not a warning")
        warnings.warn("an optional part is missing", UserWarning, stacklevel=1)
        warnings.warn("old API", DeprecationWarning, stacklevel=1)
    assert lines == [
        "noisy_lib.backends: Failed to load a kernel",
        "UserWarning: an optional part is missing",
    ]
    assert capsys.readouterr().err == ""
    assert logging.getLogger("noisy_lib").propagate  # the logger is as it was


def test_quiet_import_returns_the_module_and_its_lines():
    module = types.ModuleType("noisy_mod")
    sys.modules["noisy_mod"] = module
    try:
        got, lines = quiet_import("noisy_mod")
    finally:
        del sys.modules["noisy_mod"]
    assert got is module and lines == []
