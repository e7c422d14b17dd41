"""When models alive in the kernel make the ``stale_models`` finding critical: only their
bytes on the device that ran out of memory (or, without an out-of-memory failure, the
device the run's tensors lived on) count; a model on the CPU is not the difference for a
CUDA out-of-memory, nor one on another GPU. A model split across devices
(``capture.memory.stale_models.entries``) counts its bytes on each where they are."""

from __future__ import annotations

import pandas as pd
import pytest
from torch import nn

from swift_nb.analysis.advisor import Evidence, Thresholds
from swift_nb.analysis.advisor.rules.memory import stale_models as rule
from swift_nb.analysis.oom import Diagnosis
from swift_nb.capture.memory import stale_models
from swift_nb.record import MEMORY_CATEGORIES

MIB = 1 << 20
TH = Thresholds()


def _evidence(stale: list[dict], peak: float = 100 * MIB, **changes) -> Evidence:
    fp = pd.DataFrame(
        {
            "category": MEMORY_CATEGORIES,
            "at_peak_bytes": [peak / len(MEMORY_CATEGORIES)] * len(MEMORY_CATEGORIES),
        }
    )
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


def _model(nbytes: float, device: str, variable: str = "old_model", **more) -> dict:
    return {"variable": variable, "class": "Linear", "bytes": nbytes, "device": device, **more}


def test_a_cpu_model_is_not_critical_for_a_cuda_oom_whose_room_is_unknown():
    oom = Diagnosis(need_bytes=200 * MIB, room_bytes=None, formula="", device="cuda:0")
    f = rule.rule(_evidence([_model(24 * MIB, "cpu")], tensors_on="cuda", oom=oom), TH, {})
    assert f is not None and f.severity != "critical"
    assert f.evidence["on_device_bytes"] == 0 and f.evidence["device"] == "cuda:0"


def test_a_cpu_model_is_not_critical_for_a_cuda_oom_even_without_the_devices_index():
    # a diagnosis that does not name the device: the run's tensors' device stands for it
    oom = Diagnosis(need_bytes=200 * MIB, room_bytes=None, formula="")
    f = rule.rule(_evidence([_model(24 * MIB, "cpu")], tensors_on="cuda", oom=oom), TH, {})
    assert f is not None and f.severity != "critical"


def test_a_model_on_the_failing_gpu_is_critical_when_the_room_is_unknown():
    oom = Diagnosis(need_bytes=200 * MIB, room_bytes=None, formula="", device="cuda:0")
    f = rule.rule(_evidence([_model(24 * MIB, "cuda:0")], tensors_on="cuda", oom=oom), TH, {})
    assert f is not None and f.severity == "critical" and f.evidence["on_device_bytes"] == 24 * MIB


def test_a_model_on_another_gpu_does_not_count_for_the_one_that_ran_out():
    # freeing 24 MiB would fit 120 MiB into 100 MiB, but they are on cuda:1, the OOM on cuda:0
    oom = Diagnosis(need_bytes=120 * MIB, room_bytes=100 * MIB, formula="", device="cuda:0")
    f = rule.rule(_evidence([_model(24 * MIB, "cuda:1")], tensors_on="cuda", oom=oom), TH, {})
    assert f is not None and f.severity != "critical" and f.evidence["on_device_bytes"] == 0
    same = Diagnosis(need_bytes=120 * MIB, room_bytes=100 * MIB, formula="", device="cuda:1")
    f = rule.rule(_evidence([_model(24 * MIB, "cuda:1")], tensors_on="cuda", oom=same), TH, {})
    assert f is not None and f.severity == "critical"


def test_a_split_model_counts_only_its_bytes_on_the_failing_device():
    # most of it on the CPU (its "device"), 30 MiB on the GPU that ran out: freeing those fits
    split = _model(64 * MIB, "cpu", device_bytes={"cpu": 34 * MIB, "cuda:0": 30 * MIB})
    oom = Diagnosis(need_bytes=120 * MIB, room_bytes=100 * MIB, formula="", device="cuda:0")
    f = rule.rule(_evidence([split], tensors_on="cuda", oom=oom), TH, {})
    assert f is not None and f.severity == "critical" and f.evidence["on_device_bytes"] == 30 * MIB
    # most of it on the GPU, but not enough of it to fit
    mostly = _model(64 * MIB, "cuda:0", device_bytes={"cpu": 30 * MIB, "cuda:0": 34 * MIB})
    far = Diagnosis(need_bytes=150 * MIB, room_bytes=100 * MIB, formula="", device="cuda:0")
    f = rule.rule(_evidence([mostly], tensors_on="cuda", oom=far), TH, {})
    assert f is not None and f.severity != "critical" and f.evidence["on_device_bytes"] == 34 * MIB


def test_a_cpu_oom_still_counts_a_cpu_model():
    oom = Diagnosis(need_bytes=200 * MIB, room_bytes=None, formula="", device="cpu")
    f = rule.rule(_evidence([_model(24 * MIB, "cpu")], oom=oom), TH, {})
    assert f is not None and f.severity == "critical"


def test_the_recorded_entry_has_the_bytes_on_each_device(monkeypatch):
    """``entries`` over storages on two devices (as ``_storages`` reads them: data pointer
    -> (bytes, device)); this machine has one device, so the storages are given."""
    a, b = nn.Linear(1, 1), nn.Linear(1, 1)
    storages = {id(a): {1: (30 * MIB, "cuda:0"), 2: (34 * MIB, "cpu")}, id(b): {3: (MIB, "cpu")}}
    monkeypatch.setattr(stale_models, "_storages", lambda m: storages.get(id(m), {}))
    found = stale_models.entries({"a": a, "b": b}, {})
    assert found[0] == {
        "variable": "a",
        "class": "Linear",
        "bytes": 64 * MIB,
        "device": "cpu",
        "device_bytes": {"cpu": 34 * MIB, "cuda:0": 30 * MIB},
    }
    assert found[1]["device_bytes"] == {"cpu": MIB}


@pytest.mark.parametrize("device", ["cpu", "cuda:0"])
def test_a_record_without_bytes_per_device_counts_the_model_where_it_is(device):
    oom = Diagnosis(need_bytes=120 * MIB, room_bytes=100 * MIB, formula="", device="cuda:0")
    f = rule.rule(_evidence([_model(24 * MIB, device)], tensors_on="cuda", oom=oom), TH, {})
    assert f.evidence["on_device_bytes"] == (24 * MIB if device == "cuda:0" else 0)
