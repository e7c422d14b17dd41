#!/usr/bin/env bash
# Set up with the test extra, lint, type-check, run the viewer's JavaScript unit tests (node
# --test) and the whole test suite, tier by tier (tests/README.md).
# A test skipped that tests/allowed_skips.txt does not list (GPU-only, optional trackers) fails
# the run, and every skip is listed at its end (tests/conftest.py: SkipCheck): an extra that
# failed to install cannot pass with its tests skipped.
# --fast runs the unit tier only (tests/unit: no kernel, notebook, subprocess, process group,
# browser or profiled training loop). Other arguments go to pytest:
#   bash scripts/test.sh --fast -k spec
set -euo pipefail
cd "$(dirname "$0")/.."
fast=0
args=()
for arg in "$@"; do
  if [ "$arg" = "--fast" ]; then fast=1; else args+=("$arg"); fi
done
bash scripts/setup.sh test
# The report test opens report.html in a real Chromium (Debian's package; Playwright drives
# it, and Playwright's own browser download is not used). The fast subset never opens it.
if [ "$fast" = 0 ] && ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  else
    echo "chromium is missing: install it (Debian/Ubuntu: sudo apt-get install -y chromium), then rerun" >&2
    exit 1
  fi
fi
# The viewer's pure functions are unit-tested with Node's own test runner (Debian's nodejs).
if ! command -v node >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs >/dev/null
  else
    echo "node is missing: install it (Debian/Ubuntu: sudo apt-get install -y nodejs), then rerun" >&2
    exit 1
  fi
fi
.venv/bin/ruff check swift_nb tests benchmarks scripts
# type hints (the files and folders listed in pyproject.toml's [tool.mypy])
.venv/bin/mypy
node --test tests/js/
if [ "$fast" = 1 ]; then args=(tests/unit ${args[@]+"${args[@]}"}); fi
# One pytest-xdist worker per core (SWIFT_NB_TEST_WORKERS=N for N, 0 for one process), each
# test file on one worker so that a module's fixtures are made once, the longest tiers handed
# out first (tests/conftest.py). Each worker's torch (and what its tests start) uses one
# thread unless OMP_NUM_THREADS says otherwise: the workers share the cores already.
workers="${SWIFT_NB_TEST_WORKERS:-auto}"
if [ "$workers" != 0 ]; then
  args=(-n "$workers" --dist loadfile ${args[@]+"${args[@]}"})
  export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
fi
set +e
.venv/bin/python -m pytest ${args[@]+"${args[@]}"}
rc=$?
set -e
# pytest exits 5 when a selection collects no test: not a failure of the suite (a selection
# whose modules were all skipped at collection exits 1: SkipCheck).
if [ "$rc" -eq 5 ]; then exit 0; fi
exit "$rc"
