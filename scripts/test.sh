#!/usr/bin/env bash
# Set up with the test extra, lint, and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test
.venv/bin/ruff check swift_nb tests benchmarks
set +e
.venv/bin/python -m pytest "$@"
rc=$?
set -e
# pytest exits 5 when a selection collects no test: not a failure of the suite.
if [ "$rc" -eq 5 ]; then exit 0; fi
exit "$rc"
