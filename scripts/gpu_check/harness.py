"""Every CUDA path of swift_nb, checked on one GPU; what held is written as JSON.

    python scripts/gpu_check OUT_DIR [--cpu-smoke] [--budget-s 420]

``bash scripts/gpu_check.sh`` sets up a Python with a CUDA build of torch and calls this.
The checks (``registry.CHECKS``, one file each under ``checks/``) profile the demo GPT of
``swift_nb.demo`` (random weights, synthetic tokens; nothing is downloaded). Each runs in a
child process of its own (``--one NAME``, forked from this process once it has imported
torch and swift_nb: ``fork.py``) under its time limit, so a check that fails, hangs or leaves
the device unusable costs only itself; the parent rewrites
``OUT_DIR/gpu_check.json`` after every check, so a run killed half-way keeps what it
measured. Each check's record is ``{name, title, ok, skipped, seconds, details, error}``:
``details["held"]`` maps each statement the check tests to whether it held, beside the
numbers behind it; ``ok`` is whether all held (None when skipped); ``error`` names those
that did not, or the exception that stopped the check.

``--cpu-smoke`` runs the same driver on the CPU with tiny sizes, to test the script itself on
a machine without a GPU: the CUDA-only checks are skipped (``"skipped": "no CUDA device"``),
the others run as on a GPU, with the statements that only a device can make left out.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from . import fork
from .common import GPU_SIZES, SMOKE_SIZES, Ctx
from .registry import BY_NAME, CHECKS, Check

RESULT_FILE = "gpu_check.json"
ENVIRONMENT = "environment"  # the child that reads the environment's facts (not a check)
ENVIRONMENT_LIMIT_S = 90.0
MIN_START_S = 10.0  # a check is not started with less of the overall budget left
DEFAULT_BUDGET_S = 420.0  # the checks together; setup comes on top (≤ 8 minutes in all)
PACKAGE = Path(__file__).resolve().parent  # what a child runs: ``python PACKAGE OUT --one NAME``


# -- in a child: one check, or the environment ---------------------------------------------------


def environment() -> dict[str, Any]:
    """The versions and the device the checks ran on."""
    import torch

    facts: dict[str, Any] = {
        "python": sys.version.split()[0],
        "executable": sys.executable,
        "platform": platform.platform(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
    }
    for dist, module in (("swift_nb", "swift_nb"), ("nvidia-ml-py", "pynvml"), ("orjson", "orjson")):
        facts[dist] = _version_of(dist, module)
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        facts.update(
            device_count=torch.cuda.device_count(),
            device=props.name,
            capability=f"{props.major}.{props.minor}",
            device_memory_bytes=int(props.total_memory),
            cudnn=torch.backends.cudnn.version(),
            nccl=_attempt(lambda: ".".join(map(str, _tuple(torch.cuda.nccl.version())))),
            driver=_attempt(_driver_version),
        )
    return facts


def _version_of(dist: str, module: str) -> str:
    """The installed version of ``dist``, or what stands in for it (gpu_check.sh's orjson)."""
    from importlib import metadata

    try:
        m = __import__(module)
    except Exception as e:
        return f"not importable ({type(e).__name__}: {e})"
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return (
            getattr(m, "__version__", None) or f"importable, not installed ({getattr(m, '__file__', None)})"
        )


def _tuple(v: Any) -> tuple:
    return v if isinstance(v, tuple) else (v,)


def _driver_version() -> str:
    import pynvml

    pynvml.nvmlInit()
    try:
        v = pynvml.nvmlSystemGetDriverVersion()
        return v.decode() if isinstance(v, bytes) else str(v)
    finally:
        pynvml.nvmlShutdown()


def _attempt(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except Exception as e:
        return f"unknown ({type(e).__name__}: {e})"


def run_one(name: str, runs: Path, smoke: bool) -> dict[str, Any]:
    """One check in this process: its record (never raises)."""
    os.environ.setdefault("MPLBACKEND", "Agg")
    check = BY_NAME[name]
    record = {"name": name, "title": check.title, "ok": False, "skipped": None, "seconds": 0.0, "error": None}
    t0 = time.perf_counter()
    ctx, stopped = None, None
    try:
        import torch

        device = torch.device("cpu" if smoke else "cuda")
        ctx = Ctx(device, SMOKE_SIZES if smoke else GPU_SIZES, runs)
        check.run(ctx)
        failed = [s for s, held in ctx.held.items() if not held]
        record["ok"] = not failed
        record["error"] = "did not hold: " + "; ".join(failed) if failed else None
    except BaseException as e:  # recorded: the statements tested until then stay in details
        record["error"] = f"{type(e).__name__}: {e}"[:2000]
        stopped = traceback.format_exc()[-6000:]
    record["seconds"] = round(time.perf_counter() - t0, 2)
    record["details"] = {"held": ctx.held, **ctx.details} if ctx is not None else {}
    if stopped is not None:
        record["details"]["traceback"] = stopped
    return record


# -- in the parent: every check in a child, the JSON after each ----------------------------------


def clean(obj: Any) -> Any:
    """``obj`` as plain JSON: numpy and pandas scalars as numbers, NaN as null, paths as text."""
    if isinstance(obj, dict):
        return {str(k): clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set)):
        return [clean(v) for v in obj]
    if hasattr(obj, "item") and callable(obj.item) and not isinstance(obj, (str, bytes)):
        try:
            obj = obj.item()
        except (TypeError, ValueError):
            return str(obj)
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if obj is None or isinstance(obj, (bool, int, str)):
        return obj
    return str(obj)


def write_json(path: Path, doc: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(clean(doc), indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def in_child(name: str, out: Path, smoke: bool, limit_s: float) -> tuple[dict[str, Any] | None, str | None]:
    """Run ``--one name`` in a child process of its own under ``limit_s``: (its record,
    None), or (None, why there is none: killed at its limit, or ended without one)."""
    (out / "logs").mkdir(exist_ok=True)
    result = out / "results" / f"{name}.json"
    result.parent.mkdir(exist_ok=True)
    result.unlink(missing_ok=True)
    argv = [str(out), "--one", name, *(["--cpu-smoke"] if smoke else [])]
    log_path = out / "logs" / f"{name}.log"
    with log_path.open("w") as log:
        # its own session (killed whole at its limit), forked from this warm process
        proc = fork.start([sys.executable, str(PACKAGE), *argv], argv, main, log)
        try:
            proc.wait(timeout=limit_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            return None, f"killed at its time limit of {limit_s:.0f} s (log: {log_path})"
    if result.exists():
        return json.loads(result.read_text(encoding="utf-8")), None
    tail = log_path.read_text(errors="replace")[-1500:]
    return None, f"the child ended with exit code {proc.returncode} and no result; its log ends: {tail}"


def run_all(out: Path, smoke: bool, budget_s: float, only: list[str] | None = None) -> int:
    """Every check (or those named in ``only``), each in a child; the JSON rewritten after
    each. Exit status 0 when every check that ran held, 1 otherwise."""
    start = time.monotonic()
    checks = [c for c in CHECKS if not only or c.name in only]
    doc: dict[str, Any] = {
        "mode": "cpu-smoke" if smoke else "cuda",
        "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "finished_at": None,
        "complete": False,
        "budget_s": budget_s,
        "setup": os.environ.get("SWIFT_NB_GPU_CHECK_SETUP", "").splitlines(),  # what gpu_check.sh did
        "environment": {},
        "checks": [],
        "pending": [c.name for c in checks],
        "summary": {},
    }
    path = out / RESULT_FILE
    write_json(path, doc)
    env, why = in_child(ENVIRONMENT, out, smoke, ENVIRONMENT_LIMIT_S)
    doc["environment"] = env if env is not None else {"error": why}
    cuda = bool(doc["environment"].get("cuda_available"))
    print(f"environment: {json.dumps(clean(doc['environment']))}", flush=True)
    write_json(path, doc)
    for check in checks:
        left = budget_s - (time.monotonic() - start)
        record = _record(check, out, smoke, cuda, left)
        doc["checks"].append(record)
        doc["pending"].remove(check.name)
        doc["summary"] = summary(doc["checks"])
        write_json(path, doc)
        print(_line(record), flush=True)
    doc.update(complete=True, finished_at=datetime.now(timezone.utc).isoformat(timespec="seconds"))
    doc["wall_s"] = round(time.monotonic() - start, 1)
    write_json(path, doc)
    s = doc["summary"]
    print(f"{s['held']} held, {s['failed']} failed, {s['skipped']} skipped in {doc['wall_s']} s; {path}")
    return 0 if s["failed"] == 0 and (smoke or cuda) else 1


def _record(check: Check, out: Path, smoke: bool, cuda: bool, left_s: float) -> dict[str, Any]:
    base = {
        "name": check.name,
        "title": check.title,
        "ok": None,
        "skipped": None,
        "seconds": 0.0,
        "error": None,
    }
    if check.cuda_only and (smoke or not cuda):
        return {**base, "skipped": "no CUDA device" if not cuda else "--cpu-smoke: CPU only", "details": {}}
    if left_s < MIN_START_S:
        why = f"not started: {left_s:.0f} s of the overall budget were left"
        return {**base, "ok": False, "error": why, "details": {}}
    t0 = time.monotonic()
    record, why = in_child(check.name, out, smoke, min(check.limit_s, left_s))
    if record is None:
        return {**base, "ok": False, "seconds": round(time.monotonic() - t0, 2), "error": why, "details": {}}
    return record


def summary(checks: list[dict[str, Any]]) -> dict[str, int]:
    return {
        "held": sum(c["ok"] is True for c in checks),
        "failed": sum(c["ok"] is False for c in checks),
        "skipped": sum(c["skipped"] is not None for c in checks),
    }


def _line(record: dict[str, Any]) -> str:
    if record["skipped"]:
        return f"[skipped] {record['name']}: {record['skipped']}"
    mark = "ok" if record["ok"] else "FAILED"
    text = f"[{mark}] {record['name']} ({record['seconds']} s): {record['title']}"
    return text + (f"\n    {record['error']}" if record.get("error") else "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="folder for gpu_check.json, the logs and the run folders")
    parser.add_argument("--cpu-smoke", action="store_true", help="tiny sizes on the CPU: tests this script")
    parser.add_argument(
        "--budget-s", type=float, default=DEFAULT_BUDGET_S, help="all checks together, seconds"
    )
    parser.add_argument("--one", choices=[ENVIRONMENT, *BY_NAME], help=argparse.SUPPRESS)
    parser.add_argument("--only", default="", help="comma-separated check names: run these alone")
    args = parser.parse_args(argv)
    only = [n for n in args.only.split(",") if n]
    unknown = [n for n in only if n not in BY_NAME]
    if unknown:
        parser.error(f"no check named {', '.join(unknown)}; checks are {', '.join(BY_NAME)}")
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    if args.one is None:
        return run_all(out, args.cpu_smoke, args.budget_s, only)
    if args.one == ENVIRONMENT:
        record = environment()
    else:
        record = run_one(args.one, out / "runs" / args.one, args.cpu_smoke)
    write_json(out / "results" / f"{args.one}.json", record)
    return 0
