"""scripts/gpu_check.sh, the GPU check, tested on the CPU: ``--cpu-smoke`` runs its driver
(the package scripts/gpu_check/) with tiny sizes, the CUDA-only checks skipped with the reason and
every other check run and holding; a check that fails or raises is recorded, not raised."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"
CUDA_ONLY = ["quickstart_nvml", "max_memory_allocated", "cuda_oom", "energy", "rerun_fork", "gpm"]
ON_CPU_TOO = [
    "flash_attention",
    "forecast",
    "lora",
    "cost_ratio",
    "import_trace",
    "tokens",
    "memory_kit",
    "model_forecast",
    "logits",
    "scale",
]
RECORD_KEYS = {"name", "title", "ok", "skipped", "seconds", "details", "error"}


def _driver():
    """The package scripts/gpu_check/ (scripts/ put on sys.path): its harness and registry."""
    scripts = str(ROOT / "scripts")
    if scripts not in sys.path:
        sys.path.append(scripts)
    from gpu_check import harness, registry

    return harness, registry


def test_the_cpu_smoke_runs_every_check_that_needs_no_gpu(tmp_path):
    env = {**os.environ, "PYTHON": sys.executable}  # this interpreter, with swift_nb and its deps
    proc = subprocess.run(
        ["bash", str(SCRIPT), "--cpu-smoke", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    doc = json.loads((tmp_path / "gpu_check.json").read_text())
    assert doc["mode"] == "cpu-smoke" and doc["complete"] and doc["pending"] == []
    assert doc["environment"]["torch"] == torch.__version__
    assert any(line.startswith("using the existing ") for line in doc["setup"])
    checks = {c["name"]: c for c in doc["checks"]}
    assert list(checks) == [c.name for c in _driver()[1].CHECKS] == CUDA_ONLY + ON_CPU_TOO
    assert all(set(c) >= RECORD_KEYS for c in checks.values())
    reason = "--cpu-smoke: CPU only" if torch.cuda.is_available() else "no CUDA device"
    for name in CUDA_ONLY:
        assert checks[name]["skipped"] == reason and checks[name]["ok"] is None
    for name in ON_CPU_TOO:
        c = checks[name]
        assert c["ok"] is True and c["skipped"] is None and c["error"] is None, c
        assert c["details"]["held"] and all(c["details"]["held"].values())
        assert c["seconds"] > 0
    assert doc["summary"] == {"held": len(ON_CPU_TOO), "failed": 0, "skipped": len(CUDA_ONLY)}
    # the numbers behind the statements
    flash = checks["flash_attention"]["details"]
    assert flash["eager"]["backend"] == "eager" and flash["flash_attention"]["backend"] == "flash"
    assert flash["peak_with_over_without"] < 1
    forecast = checks["forecast"]["details"]
    assert abs(forecast["error_at_2b_pct"]) <= forecast["tolerance_pct"]
    assert math.isfinite(checks["cost_ratio"]["details"]["ratio"])
    lora = checks["lora"]["details"]
    assert lora["finetune"]["method"] == "lora" and lora["frozen_at_peak_mib"] == lora["expected_frozen_mib"]
    assert checks["import_trace"]["details"]["imported_steps"] == 3  # the schedule's active steps
    tokens = checks["tokens"]["details"]
    assert tokens["packing"]["padding_pct"] == 0.0 and tokens["fused_ce"]["loss_rel_diff"] <= 1e-3
    log = (tmp_path / "gpu_check.log").read_text()
    assert "[ok] forecast" in log and "[skipped] cuda_oom: " in log
    assert (tmp_path / "logs" / "forecast.log").exists()


def test_a_check_that_fails_or_raises_is_recorded(tmp_path, monkeypatch):
    harness, registry = _driver()

    def does_not_hold(ctx):
        ctx.details["measured"] = math.nan
        ctx.expect("one thing holds", True)
        ctx.expect("another thing holds", False)

    def raises(ctx):
        ctx.expect("before the error", True)
        raise RuntimeError("device lost")

    for name, fn in (("does_not_hold", does_not_hold), ("raises", raises)):
        monkeypatch.setitem(
            registry.BY_NAME, name, registry.Check(name, name, fn, cuda_only=False, limit_s=5)
        )
    failed = harness.run_one("does_not_hold", tmp_path, smoke=True)
    assert failed["ok"] is False and failed["error"] == "did not hold: another thing holds"
    assert failed["details"]["held"] == {"one thing holds": True, "another thing holds": False}
    raised = harness.run_one("raises", tmp_path, smoke=True)
    assert raised["ok"] is False and raised["error"] == "RuntimeError: device lost"
    assert raised["details"]["held"] == {"before the error": True}
    assert "device lost" in raised["details"]["traceback"]
    # NaN is not JSON: it is written as null
    harness.write_json(tmp_path / "r.json", failed)
    assert json.loads((tmp_path / "r.json").read_text())["details"]["measured"] is None


def test_every_check_file_is_registered_once():
    """One check = one file under checks/ + one line in the registry: each file's ``check``
    is in CHECKS exactly once, and every check in CHECKS is such a file's."""
    import pkgutil

    _, registry = _driver()
    from gpu_check import checks

    files = [f"{checks.__name__}.{m.name}" for m in pkgutil.iter_modules(checks.__path__)]
    registered = [c.run.__module__ for c in registry.CHECKS]
    assert files and sorted(registered) == sorted(files)
    assert all(c.run.__name__ == "check" for c in registry.CHECKS)
    assert len(registry.BY_NAME) == len(registry.CHECKS)  # the names are distinct too
