#!/usr/bin/env bash
# Create .venv and install swift_nb into it: a torch build first, then the project.
# SWIFT_NB_TORCH overrides the torch requirement, e.g. for a CUDA build:
#   SWIFT_NB_TORCH="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128" bash scripts/setup.sh
# An optional argument names extras to install too (scripts/setup.sh test).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
EXTRAS="${1:-}"

pip_install() {
  # Some pip configurations list local indexes that do not exist; keep their warnings out.
  .venv/bin/python -m pip install -q "$@" 2> >(grep -v "is ignored: it is neither" >&2)
}

if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
pip_install --upgrade pip
# shellcheck disable=SC2086
pip_install ${SWIFT_NB_TORCH:-torch==2.13.0}
pip_install -e ".${EXTRAS:+[$EXTRAS]}"
.venv/bin/python -c "import torch, swift_nb; print('swift_nb', swift_nb.__version__, 'with torch', torch.__version__)"
