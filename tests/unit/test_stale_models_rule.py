"""The advisor's ``stale_models`` rule on hand-built evidence: when models alive in the
kernel are the difference between fitting and running out of memory, and what it says.
The runs that record them are in ``integration/test_stale_models.py``."""

from __future__ import annotations

import pandas as pd

from swift_nb.analysis.advisor import Evidence, Thresholds
from swift_nb.analysis.advisor.rules.memory import stale_models
from swift_nb.analysis.oom import Diagnosis
from swift_nb.record import MEMORY_CATEGORIES

MIB = 1 << 20
TH = Thresholds()


def _evidence(stale: list[dict], peak: float = 100 * MIB, **changes) -> Evidence:
    fp = pd.DataFrame({"category": MEMORY_CATEGORIES, "at_peak_bytes": [peak / len(MEMORY_CATEGORIES)] * 7})
    base = dict(
        step_s=0.1,
        shares={},
        ops_per_step=100.0,
        median_op_us=400.0,
        heavy_op_share=0.9,
        attention_seq=0,
        attention_shape=[],
        attention_layers=0,
        footprint=fp,
        peak_bytes=peak,
        limit_bytes=16 * 1024 * MIB,
        growth_bytes_per_step=0.0,
        growth_source="memory.csv",
        stale_models=tuple(stale),
    )
    base.update(changes)
    return Evidence(**base)


def _old(nbytes: float = 24 * MIB, device: str = "cpu", variable: str = "old_model") -> dict:
    return {"variable": variable, "class": "Linear", "bytes": nbytes, "device": device}


def test_a_stale_model_on_a_cpu_run_is_a_warning_with_the_del():
    f = stale_models.rule(_evidence([_old()]), TH, {})
    assert f is not None and f.id == "stale_models" and f.severity == "warning"
    assert f.title == "`old_model` holds 24.0 MiB nobody trains: `del old_model; gc.collect()`"
    assert f.evidence["predicted_peak_bytes"] == 76 * MIB
    assert f.predicted_effect == "peak tensor memory 100.0 MiB → 76.0 MiB (within the 16.0 GiB limit)"


def test_on_cuda_the_cache_is_emptied_too_and_only_the_gpu_bytes_count():
    ev = _evidence([_old(device="cuda:0"), _old(8 * MIB, "cpu", "cpu_copy")], tensors_on="cuda")
    f = stale_models.rule(ev, TH, {})
    assert f is not None
    assert f.title == (
        "`old_model` (24.0 MiB) and `cpu_copy` (8.0 MiB) hold 32.0 MiB nobody trains: "
        "`del old_model, cpu_copy; gc.collect(); torch.cuda.empty_cache()`"
    )
    assert f.evidence["on_device_bytes"] == 24 * MIB and f.evidence["stale_bytes"] == 32 * MIB


def test_critical_when_the_run_fits_the_limit_only_without_them():
    ev = _evidence([_old()], limit_bytes=90 * MIB)
    assert stale_models.rule(ev, TH, {}).severity == "critical"
    # a limit the peak misses by more than they hold: freeing them is not enough
    assert stale_models.rule(_evidence([_old()], limit_bytes=60 * MIB), TH, {}).severity == "warning"


def test_critical_when_the_failed_step_fits_the_room_without_them():
    fits = Diagnosis(need_bytes=120 * MIB, room_bytes=100 * MIB, formula="")
    f = stale_models.rule(_evidence([_old()], oom=fits), TH, {})
    assert f.severity == "critical" and f.evidence["oom_need_bytes"] == 120 * MIB
    assert f.predicted_effect == "the failed step's need 120.0 MiB → 96.0 MiB, within the room of 100.0 MiB"
    short = Diagnosis(need_bytes=200 * MIB, room_bytes=100 * MIB, formula="")
    assert stale_models.rule(_evidence([_old()], oom=short), TH, {}).severity == "warning"
    unknown = Diagnosis(need_bytes=200 * MIB, room_bytes=None, formula="")
    assert stale_models.rule(_evidence([_old()], oom=unknown), TH, {}).severity == "critical"


def test_small_next_to_the_peak_is_info_and_tiny_says_nothing():
    big_peak = _evidence([_old(2 * MIB)], peak=1024 * MIB)
    assert stale_models.rule(big_peak, TH, {}).severity == "info"
    assert stale_models.rule(_evidence([_old(stale_models.MIN_BYTES - 1)]), TH, {}) is None
    assert stale_models.rule(_evidence([]), TH, {}) is None
