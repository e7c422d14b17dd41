#!/usr/bin/env bash
# Every CUDA path of swift_nb on one GPU, unattended, in under 8 minutes: writes
# OUT_DIR/gpu_check.json (what held, with its numbers), OUT_DIR/gpu_check.log (this output),
# OUT_DIR/logs/ (each check's output) and OUT_DIR/runs/ (the run folders the checks made).
# scripts/gpu_check/checks/ says what each check does (one file each; registry.py lists them).
#   bash scripts/gpu_check.sh [OUT_DIR]               on a machine with an NVIDIA GPU
#   bash scripts/gpu_check.sh --cpu-smoke OUT_DIR     the script's own test, on the CPU
#   bash scripts/gpu_check.sh --only=lora,cuda_oom    those checks alone
# OUT_DIR defaults to swift_nb_runs/gpu_check (git ignores it). The Python: the first of
# $PYTHON, .venv/bin/python and python3 whose torch sees CUDA (--cpu-smoke: any torch), used
# as it is, with swift_nb (pip install -e . --no-deps) and only the dependencies it lacks
# installed into it (from the wheels in .whl/ where that folder has any, for a machine that
# reaches no package index); with none, scripts/setup.sh makes .venv with $SWIFT_NB_TORCH (default:
# torch 2.13.0 for CUDA 12.8). Exit status: 0 every check held, 1 one did not, 2 no Python.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
START=$SECONDS
TOTAL_S=480 # the whole command, setup included

smoke=0
only=""
out=""
for arg in "$@"; do
  case "$arg" in
    --cpu-smoke) smoke=1 ;;
    --only=*) only="${arg#--only=}" ;;
    -h | --help)
      sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'
      exit 0
      ;;
    -*)
      echo "unknown option $arg; usage: bash scripts/gpu_check.sh [--cpu-smoke] [OUT_DIR]" >&2
      exit 2
      ;;
    *) out="$arg" ;;
  esac
done
out="${out:-swift_nb_runs/gpu_check}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
exec > >(tee "$out/gpu_check.log") 2>&1

say() { echo "gpu_check: $*"; }
setup_notes=()
note() {
  say "$*"
  setup_notes+=("$*")
}

# A Python that can run the checks: torch importable, and (on a GPU) seeing CUDA.
usable() {
  if [ "$smoke" = 1 ]; then
    "$1" -c "import torch" >/dev/null 2>&1
  else
    "$1" -c "import torch; assert torch.cuda.is_available()" >/dev/null 2>&1
  fi
}

# pip, bounded (the GPU machine may reach no index, and pip's retries would wait minutes),
# its output kept in OUT_DIR/logs/setup.log.
pip_quiet() {
  mkdir -p "$out/logs"
  echo "\$ $PY -m pip install $*" >>"$out/logs/setup.log"
  PIP_RETRIES=0 PIP_TIMEOUT=10 PIP_DISABLE_PIP_VERSION_CHECK=1 timeout 180 "$PY" -m pip install -q "$@" \
    >>"$out/logs/setup.log" 2>&1
}

# Installs swift_nb and the dependencies $PY lacks; what cannot be installed is said, and
# PYTHONPATH makes the working tree's swift_nb the one imported whatever pip could do.
complete_python() {
  if (cd / && "$PY" -c "import swift_nb") >/dev/null 2>&1; then
    say "swift_nb is installed in $PY"
  else
    local isolation=()
    if "$PY" -c "import setuptools, sys; sys.exit(int(setuptools.__version__.split('.')[0]) < 77)" 2>/dev/null; then
      isolation=(--no-build-isolation) # builds offline with the setuptools already there
    fi
    if pip_quiet ${isolation[@]+"${isolation[@]}"} --no-deps -e .; then
      note "installed swift_nb into $PY (pip install -e . --no-deps)"
    else
      note "could not pip install -e . into $PY (logs/setup.log): swift_nb is imported from $ROOT through PYTHONPATH"
    fi
  fi
  local -A wheel=([pandas]=pandas [psutil]=psutil [matplotlib]=matplotlib [pynvml]=nvidia-ml-py [orjson]=orjson
    [msgspec]=msgspec)
  local missing=()
  for module in pandas psutil matplotlib pynvml orjson msgspec; do
    "$PY" -c "import $module" >/dev/null 2>&1 || missing+=("${wheel[$module]}")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    local source=()
    if compgen -G "$ROOT/.whl/*.whl" >/dev/null; then
      source=(--no-index --find-links "$ROOT/.whl") # wheels brought along for a machine without an index
    fi
    if pip_quiet ${source[@]+"${source[@]}"} "${missing[@]}"; then
      note "installed the missing ${missing[*]} into $PY"
    else
      note "could not install ${missing[*]} into $PY (logs/setup.log)"
    fi
  fi
  if ! "$PY" -c "import orjson" >/dev/null 2>&1; then
    # swift_nb uses orjson's loads, dumps and JSONDecodeError only: the json module's, slower
    mkdir -p "$out/stand-ins"
    cat >"$out/stand-ins/orjson.py" <<'EOF'
"""A stand-in for orjson, written by scripts/gpu_check.sh where orjson cannot be installed."""
import json

JSONDecodeError = json.JSONDecodeError


def loads(data):
    return json.loads(data)


def dumps(obj, default=None, option=None):
    return json.dumps(obj, default=default, separators=(",", ":")).encode()
EOF
    export PYTHONPATH="$PYTHONPATH:$out/stand-ins"
    note "orjson is missing: using the json module in its place ($out/stand-ins/orjson.py; traces parse slower)"
  fi
}

export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
PY=""
for candidate in "${PYTHON:-}" .venv/bin/python python3; do
  [ -n "$candidate" ] || continue
  if command -v "$candidate" >/dev/null 2>&1 && usable "$candidate"; then
    PY="$(command -v "$candidate")"
    case "$PY" in /*) ;; *) PY="$ROOT/$PY" ;; esac # .venv/bin/python: kept as a path, links and all
    break
  fi
done
if [ -n "$PY" ]; then
  note "using the existing $PY ($("$PY" -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda)'))"
  complete_python
else
  if [ "$smoke" = 1 ]; then
    torch_spec="${SWIFT_NB_TORCH:-torch==2.13.0}"
  else
    torch_spec="${SWIFT_NB_TORCH:-torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128}"
  fi
  note "no Python with a usable torch: scripts/setup.sh makes .venv with $torch_spec"
  if SWIFT_NB_TORCH="$torch_spec" bash scripts/setup.sh && usable .venv/bin/python; then
    PY="$ROOT/.venv/bin/python"
  else
    say "no usable Python: scripts/setup.sh failed or its torch sees no CUDA; nothing was checked"
    exit 2
  fi
fi

budget=$((TOTAL_S - (SECONDS - START) - 20))
[ "$budget" -lt 180 ] && budget=180
mode="on the GPU"
[ "$smoke" = 1 ] && mode="on the CPU, tiny sizes (--cpu-smoke)"
say "setup took $((SECONDS - START)) s; checks $mode, $budget s at most, into $out"
args=("$out" --budget-s "$budget")
[ "$smoke" = 1 ] && args+=(--cpu-smoke)
[ -n "$only" ] && args+=(--only "$only")
SWIFT_NB_GPU_CHECK_SETUP="$(printf '%s\n' "${setup_notes[@]}")" PYTHONUNBUFFERED=1 \
  "$PY" scripts/gpu_check.py "${args[@]}"
rc=$?
say "done in $((SECONDS - START)) s (exit status $rc); results: $out/gpu_check.json"
exit "$rc"
