#!/usr/bin/env bash
# The main job: set up, then execute notebooks/01_quickstart.ipynb headless on CPU.
# Leaves notebooks/01_quickstart.executed.ipynb, notebooks/01_quickstart.executed.html
# and the run folders under notebooks/swift_nb_runs/.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# The venv's jupyter resolves the notebook's python3 kernel to the venv's own Python.
.venv/bin/jupyter nbconvert --to notebook --execute --ExecutePreprocessor.timeout=900 --output 01_quickstart.executed.ipynb notebooks/01_quickstart.ipynb
.venv/bin/jupyter nbconvert --to html notebooks/01_quickstart.executed.ipynb
echo "executed notebook: notebooks/01_quickstart.executed.ipynb (HTML: notebooks/01_quickstart.executed.html)"
echo "run folders:       notebooks/swift_nb_runs/"
.venv/bin/swift-nb list notebooks/swift_nb_runs
