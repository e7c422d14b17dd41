"""core.quiet, as the user sees it: a library that logs and warns while it is imported,
written for the test and imported for the first time in a fresh interpreter (pytest's own
capture of warnings and log records would hide the chatter in-process). Imported plainly,
its chatter reaches stderr; through ``quiet_import`` it comes back as lines and stderr stays
empty, also where the user configured logging; a warning its logger gives after the import
reaches stderr again."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: the environment of a user's interpreter: Python's default warning filters
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}

#: a library that chatters at import: a warning on a child logger, an info record, a
#: UserWarning and a DeprecationWarning
NOISY = """
    import logging
    import warnings

    logging.getLogger("noisy_lib.backends").warning("Failed to load %s", "a kernel")
    logging.getLogger("noisy_lib").info("not a warning")
    warnings.warn("an optional part is missing", UserWarning, stacklevel=1)
    warnings.warn("old API", DeprecationWarning, stacklevel=1)
"""


@pytest.fixture
def noisy_lib(tmp_path: Path) -> Path:
    (tmp_path / "noisy_lib").mkdir()
    (tmp_path / "noisy_lib" / "__init__.py").write_text(textwrap.dedent(NOISY))
    return tmp_path


def _python(code: str, path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=path,
        capture_output=True,
        text=True,
        timeout=120,
        env={**ENV, "PYTHONPATH": f"{path}{os.pathsep}{ROOT}", "OMP_NUM_THREADS": "1"},
    )


def test_imported_plainly_the_library_chatters_on_stderr(noisy_lib):
    done = _python("import noisy_lib", noisy_lib)
    assert done.returncode == 0, done.stderr
    assert "Failed to load a kernel" in done.stderr
    assert "UserWarning: an optional part is missing" in done.stderr


def test_quiet_import_keeps_the_chatter_as_lines_and_stderr_empty(noisy_lib):
    done = _python(
        """
        import json, logging, sys
        from swift_nb.core.quiet import quiet_import

        logging.basicConfig(format="%(levelname)s %(name)s: %(message)s")  # a user's own logging
        fresh = "noisy_lib" not in sys.modules
        module, lines = quiet_import("noisy_lib")
        log = logging.getLogger("noisy_lib")
        print(json.dumps({"fresh": fresh, "file": module.__file__, "lines": lines,
                          "propagate": log.propagate, "handlers": len(log.handlers)}))
        logging.getLogger("noisy_lib.backends").warning("after the import")
        """,
        noisy_lib,
    )
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert got["fresh"] and Path(got["file"]).parent == noisy_lib / "noisy_lib"
    assert got["lines"] == [
        "noisy_lib.backends: Failed to load a kernel",
        "UserWarning: an optional part is missing",
    ]
    assert (got["propagate"], got["handlers"]) == (True, 0)  # the logger as it was
    assert (
        done.stderr == "WARNING noisy_lib.backends: after the import\n"
    )  # nothing of the import; then as ever


def test_an_import_error_passes_through(noisy_lib):
    done = _python(
        """
        from swift_nb.core.quiet import quiet_import
        try:
            quiet_import("no_such_lib")
        except ModuleNotFoundError as e:
            print(e.name)
        """,
        noisy_lib,
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, "no_such_lib\n", "")
