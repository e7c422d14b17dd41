"""Each advisor rule and the verdict on hand-built evidence: no profiling, milliseconds.
The end-to-end tests that profile real loops are in ``test_advisor.py``."""

from __future__ import annotations

import dataclasses

import pandas as pd
import pytest

from swift_nb.analysis import advisor, device, effects
from swift_nb.analysis.advisor import Evidence, Loader, Thresholds, bottleneck, registry
from swift_nb.analysis.advisor.evidence import DeviceTime
from swift_nb.analysis.advisor.findings import Finding
from swift_nb.analysis.advisor.rules import (
    activations,
    communication,
    data_loading,
    eager_attention,
    fp32_activations,
    leak,
    optimizer_state,
    overhead,
    sequence_parallel,
)
from swift_nb.record import MEMORY_CATEGORIES

MIB = 1 << 20
TH = Thresholds()
SHARES = dict.fromkeys(("data", "forward", "backward", "optimizer", "comm", "h2d", "other", "untraced"), 0.0)


def _footprint(**at_peak: float) -> pd.DataFrame:
    return pd.DataFrame(
        {"category": MEMORY_CATEGORIES, "at_peak_bytes": [at_peak.get(c, 0.0) for c in MEMORY_CATEGORIES]}
    )


def _evidence(**changes) -> Evidence:
    """A 100 ms compute-bound step with 100 MiB at the peak, nothing remarkable."""
    shares = {**SHARES, "forward": 0.3, "backward": 0.6, "optimizer": 0.1, **changes.pop("shares", {})}
    fp = changes.pop("footprint", None)
    if fp is None:
        fp = _footprint(
            parameters=30 * MIB,
            gradients=30 * MIB,
            optimizer_state=10 * MIB,
            activations=25 * MIB,
            other=5 * MIB,
        )
    base = dict(
        step_s=0.1,
        shares=shares,
        ops_per_step=120.0,
        median_op_us=400.0,
        heavy_op_share=0.9,
        attention_seq=0,
        attention_shape=[],
        attention_layers=0,
        footprint=fp,
        peak_bytes=float(fp["at_peak_bytes"].sum()),
        limit_bytes=16 * 1024 * MIB,
        growth_bytes_per_step=0.0,
        growth_source="memory.csv",
    )
    base.update(changes)
    return Evidence(**base)


def test_a_plain_step_raises_nothing_and_is_compute_bound():
    ev = _evidence()
    assert advisor.findings(ev, TH, {}) == []
    verdict = bottleneck(ev, TH)
    assert verdict.kind == "compute-bound"
    assert verdict.reason == "100.0 % of the step is forward, backward and optimizer work"


def test_slow_loading_is_data_bound_with_the_workers_fix():
    ev = _evidence(
        shares={"data": 0.4, "forward": 0.2, "backward": 0.3},
        loader=Loader(data_s=0.04, ops_s=0.01, samples=32, in_workers=False),
    )
    f = data_loading.rule(ev, TH, {})
    assert f is not None and f.id == "data_loading"
    assert f.title == "Data loading takes 40.0 % of each step: 40.0 ms per step"
    assert "DataLoader(num_workers=4" in f.suggestion
    assert f.predicted_effect.startswith("step time ≈ 0.0600 s (−40.0 %)")
    assert bottleneck(ev, TH).kind == "data-bound"
    # below the loader's fixed per-batch cost: a tiny step, not slow loading
    tiny = _evidence(step_s=0.004, shares={"data": 0.4}, loader=Loader(data_s=0.0016, in_workers=False))
    assert data_loading.rule(tiny, TH, {}) is None
    assert overhead.rule(tiny, TH, {}).title.startswith("The step is tiny: 4.0 ms per step")
    assert bottleneck(tiny, TH).kind == "overhead-bound"


def test_many_tiny_ops_are_overhead():
    ev = _evidence(ops_per_step=900.0, median_op_us=8.0, heavy_op_share=0.2)
    f = overhead.rule(ev, TH, {})
    assert f.title == "Many tiny operators: 900 per step, median 8.0 µs"
    assert f.predicted_effect.startswith("up to −80.0 % step time")
    assert "torch.compile(model)" in f.suggestion


def test_eager_attention_without_allocations_estimates_the_scores():
    shape = [8, 4, 2048, 2048]
    ev = _evidence(attention_seq=2048, attention_shape=shape, attention_layers=2, attention_calls=2)
    f = eager_attention.rule(ev, TH, {})
    assert f.toggle == "flash_attention"
    saved = effects.eager_score_bytes(shape, 2)
    assert f.evidence["peak_saved_bytes"] == saved == 32 * 2048 * 2048 * 4 * 4
    assert f.evidence["predicted_peak_bytes"] == max(0.0, ev.peak_bytes - saved)
    assert f.severity == "warning"
    assert eager_attention.rule(_evidence(attention_seq=512, attention_shape=[1, 512, 512]), TH, {}) is None


def test_activations_predicts_checkpointing_from_the_blocks():
    fp = _footprint(parameters=10 * MIB, activations=80 * MIB, other=10 * MIB)
    ev = _evidence(footprint=fp, attention_calls=4)
    f = activations.rule(ev, TH, {})
    assert f.toggle == "grad_checkpointing"
    assert f.evidence["blocks"] == 4
    assert f.evidence["predicted_peak_bytes"] == effects.checkpointed_peak(100 * MIB, 80 * MIB, 4) == 40 * MIB
    # the run's context says how many blocks when the trace does not
    f = activations.rule(_evidence(footprint=fp), TH, {"n_layer": 8})
    assert f.evidence["blocks_from"] == "run context n_layer"


def test_fp32_activations_only_without_mixed_precision():
    fp = _footprint(parameters=40 * MIB, activations=60 * MIB)
    ev = _evidence(footprint=fp, matmul_types=frozenset({"float"}))
    f = fp32_activations.rule(ev, TH, {})
    assert f.toggle == "bf16_autocast"
    assert f.evidence["predicted_peak_bytes"] == pytest.approx(40 * MIB + 0.6 * 60 * MIB)  # activations × 0.6
    # the code names the device the run's tensors were on
    assert "torch.autocast('cpu', dtype=torch.bfloat16)" in f.suggestion and "'cuda'" not in f.suggestion
    on_gpu = fp32_activations.rule(dataclasses.replace(ev, tensors_on="cuda"), TH, {})
    assert "torch.autocast('cuda', dtype=torch.bfloat16)" in on_gpu.suggestion
    assert (
        fp32_activations.rule(dataclasses.replace(ev, matmul_types=frozenset({"c10::BFloat16"})), TH, {})
        is None
    )
    applied = {"toggles": [{"toggle": "bf16_autocast", "params": {}}]}
    assert fp32_activations.rule(ev, TH, applied) is None


def test_optimizer_state_names_galore_and_its_effect():
    fp = _footprint(parameters=25 * MIB, optimizer_state=50 * MIB, activations=25 * MIB)
    f = optimizer_state.rule(_evidence(footprint=fp), TH, {})
    assert f.toggle == "galore"
    ratio = effects.galore_square_ratio(25 * MIB / 4)
    assert f.predicted_effect == f"optimizer state ≈ ×{ratio:.2f} for square d×d weights (rank 128)"
    shapes = {"matrix_shapes": [[1024, 4096], [64, 64]]}
    f = optimizer_state.rule(_evidence(footprint=fp), TH, shapes)
    # the 64×64 matrix is below the rank: it keeps Adam's two moments
    after = (2 * 128 * 4096 + 1024 * 128 + 2 * 64 * 64) * 4
    assert f.predicted_effect.startswith("optimizer state of the 2-D weights ≈ ")
    assert effects.galore_state({(1024, 4096): 1, (64, 64): 1}, 1024 * 4096 + 64 * 64).elements * 4 == after


def test_sequence_parallel_needs_a_long_sequence_near_the_limit():
    ev = _evidence(limit_bytes=110 * MIB)
    assert sequence_parallel.rule(ev, TH, {"seq_len": 8192}).toggle == "sequence_parallel"
    assert sequence_parallel.rule(ev, TH, {"seq_len": 1024}) is None
    assert sequence_parallel.rule(_evidence(), TH, {"seq_len": 8192}) is None


def test_leak_counts_the_steps_left():
    ev = _evidence(growth_bytes_per_step=4 * MIB, limit_bytes=200 * MIB)
    f = leak.rule(ev, TH, {})
    assert f.predicted_effect == "out of memory after ≈ 25 more steps"
    assert leak.rule(_evidence(growth_bytes_per_step=1024.0), TH, {}) is None


def test_exposed_communication_is_communication_bound():
    ev = _evidence(exposed_comm_share=0.5, collective_share=0.6, world_size=4, shares={"comm": 0.5})
    f = communication.rule(ev, TH, {"params": 1_000_000, "dtype": "float32"})
    assert f.evidence["gradient_bytes"] == 4_000_000
    assert f.evidence["allreduce_wire_bytes_per_step"] == 2 * 0.75 * 4_000_000
    assert f.severity == "critical"
    assert bottleneck(ev, TH).kind == "communication-bound"


def test_a_trainer_gets_its_settings():
    trainer = {
        "trainer": {
            "framework": "transformers",
            "class": "Trainer",
            "variable": "trainer",
            "arguments": {"dataloader_num_workers": 0},
        }
    }
    ev = _evidence(shares={"data": 0.4}, loader=Loader(data_s=0.04, in_workers=False))
    assert "set TrainingArguments(dataloader_num_workers=4" in data_loading.rule(ev, TH, trainer).suggestion


def test_a_new_rule_is_one_file_and_one_line(monkeypatch):
    """A rule added to the registry is run by the advisor with no other edit."""

    def slow_step(ev: Evidence, th: Thresholds, context) -> Finding | None:
        if ev.step_s < 0.05:
            return None
        return Finding(id="slow_step", title=f"{ev.step_s:g} s per step", evidence={}, suggestion="go faster")

    monkeypatch.setattr(registry, "RULES", [*registry.RULES, slow_step])
    monkeypatch.setattr(advisor, "RULES", registry.RULES)
    assert [f.id for f in advisor.findings(_evidence(), TH, {})] == ["slow_step"]


def test_every_rule_file_is_registered_itself_or_as_the_rule_another_replaces():
    """One rule = one file + one line: a file under rules/ is in RULES, or named by the
    ``replaces=`` of a rule that is; a rule whose file is not is a rumour."""
    import pkgutil

    from swift_nb.analysis.advisor import rules

    files = {
        m.name for m in pkgutil.walk_packages(rules.__path__, f"{rules.__name__}.") if not m.ispkg
    }  # topic folders (rules/tokens/) included
    assert files and files == registry.registered_modules()
    replaced = {r.replaces.__module__ for r in registry.RULES if getattr(r, "replaces", None) is not None}
    assert replaced == {f"{rules.__name__}.overhead", f"{rules.__name__}.activations"}
    # a replaced rule is not run again beside the rule that replaces it
    assert not replaced & {r.rule.__module__ for r in registry.RULES}


@pytest.mark.parametrize("kind_share", [0.0, 0.25])
def test_verdict_reasons_quote_their_own_numbers(kind_share):
    ev = _evidence(shares={"data": kind_share}, loader=Loader(data_s=kind_share * 0.1, in_workers=False))
    v = bottleneck(ev, TH)
    assert (v.kind == "data-bound") == (kind_share >= TH.data_share)
    if v.kind == "data-bound":
        assert v.reason.startswith("25.0 % of the step (25.0 ms per step) waits for the next batch")


# -- a GPU run: the verdict and findings from the device's window ---------------------------


def _device(**changes) -> DeviceTime:
    """A 1 s window on the GPU: 80 % compute, the rest idle with no cause."""
    base = dict(
        window_s=1.0,
        idle_pct=20.0,
        compute_pct=80.0,
        non_compute_pct=0.0,
        overlap_pct=None,
        idle=dict.fromkeys(device.CAUSES, 0.0) | {"other_s": 0.0},
        kinds={"gemm": 0.6, "elementwise/reduction": 0.2},
        steps=4,
        kernels=400,
        kernel_median_us=50.0,
    )
    idle = changes.pop("idle", {})
    base["idle"] = {**base["idle"], **idle}
    base.update(changes)
    return DeviceTime(**base)


@pytest.mark.parametrize(
    ("device_time", "kind", "reason"),
    [
        (
            _device(),
            "compute-bound",
            "the GPU computes 80.0 % of the window (gemm 75.0 %, elementwise/reduction 25.0 %",
        ),
        (
            _device(idle_pct=60.0, compute_pct=40.0, idle={"host_bound_s": 0.5, "sync_s": 0.1}),
            "overhead-bound",
            "the GPU idles 60.0 % of the window; for 600.0 ms of its 600.0 ms idle it waits for the host to launch "
            "work (launch gaps, and 100.0 ms of synchronisation stalls)",
        ),
        (
            _device(idle_pct=50.0, compute_pct=50.0, idle={"data_s": 0.4, "host_bound_s": 0.1}),
            "data-bound",
            "the GPU idles 50.0 % of the window; for 400.0 ms of its 500.0 ms idle the host is loading data",
        ),
        (
            _device(
                idle_pct=40.0,
                compute_pct=30.0,
                non_compute_pct=30.0,
                comm_exposed_s=0.3,
                collective="all_reduce",
                idle={"comm_wait_s": 0.3, "host_bound_s": 0.1},
            ),
            "communication-bound",
            "the GPU waits on communication 60.0 % of the window: 300.0 ms of communication kernels no compute "
            "hides and 300.0 ms of its 400.0 ms idle waiting for collectives (the largest collective: all-reduce)",
        ),
        (
            _device(idle_pct=20.0, compute_pct=50.0, non_compute_pct=30.0, idle={"copy_s": 0.1}),
            "copy-bound",
            "40.0 % of the window the GPU only copies",
        ),
    ],
)
def test_the_verdict_of_a_gpu_run_names_what_keeps_it_from_computing(device_time, kind, reason):
    # the host's breakdown says compute-bound; the GPU's window decides
    v = bottleneck(_evidence(device=device_time), TH)
    assert v.kind == kind and v.reason.startswith(reason), v.reason
    assert v.evidence["device_compute_pct"] == round(device_time.compute_pct, 1)


def test_gpu_findings_each_claim_their_own_part_of_the_window():
    d = _device(
        idle_pct=45.0,
        compute_pct=55.0,
        idle={"sync_s": 0.2, "copy_s": 0.05, "host_bound_s": 0.2},
        syncs={"aten::item": 30, "aten::nonzero": 10},
        sync_sites={"train.py(42): <module>": 40},
        pageable_copies=12,
        pageable_copy_s=0.08,
        simt_sgemm_s=0.3,
        gemm_s=0.35,
        kernels=4000,
        kernel_median_us=6.0,
    )
    found = {f.id: f for f in advisor.findings(_evidence(device=d), TH, {})}
    assert set(found) == {"overhead", "sync_stalls", "pageable_copies", "fp32_gemm"}
    assert found["sync_stalls"].predicted_effect.startswith("up to −20.0 % of the GPU's window")
    assert (
        "30 × .item()" in found["sync_stalls"].suggestion
        and "10 × nonzero()" in found["sync_stalls"].suggestion
    )
    assert found["overhead"].evidence["launch_gap_s"] == 0.2  # the sync stalls are not counted again
    assert "1,000 kernels of median 6.0 µs" in found["overhead"].suggestion
    assert found["pageable_copies"].evidence["pageable_copies"] == 12
    assert found["fp32_gemm"].toggle == "bf16_autocast"
    # each part under 10 % of the window: nothing is raised
    small = _device(idle={"sync_s": 0.05, "host_bound_s": 0.05}, syncs={"aten::item": 1}, simt_sgemm_s=0.05)
    assert advisor.findings(_evidence(device=small), TH, {}) == []


def test_loading_time_is_not_claimed_as_overhead_too():
    """A loop that spends 72 % of its steps loading data: data-bound, and the many-tiny-ops
    finding does not promise the same time again."""
    ev = _evidence(
        shares={"data": 0.72, "forward": 0.1, "backward": 0.1, "optimizer": 0.02},
        loader=Loader(data_s=0.072, ops_s=0.01, samples=32, in_workers=False),
        ops_per_step=900.0,
        median_op_us=8.0,
        heavy_op_share=0.2,
    )
    assert bottleneck(ev, TH).kind == "data-bound"
    found = {f.id for f in advisor.findings(ev, TH, {})}
    assert "data_loading" in found and "overhead" not in found  # 1 − 0.2 − 0.72 = 8 % < 10 %
    # with less loading, the overhead finding claims only what loading does not hold
    ev = dataclasses.replace(ev, shares={**ev.shares, "data": 0.3})
    overhead_finding = {f.id: f for f in advisor.findings(ev, TH, {})}["overhead"]
    assert overhead_finding.predicted_effect.startswith("up to −50.0 % step time")


def test_a_rank_whose_gpu_idles_more_than_the_others():
    from swift_nb.analysis.ranks import idle_rank_finding

    table = pd.DataFrame({"rank": [0, 1, 2, 3], "device_idle_pct": [20.0, 22.0, 21.0, 48.0]})
    f = idle_rank_finding(table)
    assert f.id == "idle_rank" and f.evidence["rank"] == 3
    assert f.title == "Rank 3's GPU idles 26.5 points more than the ranks' median"
    assert idle_rank_finding(table.assign(device_idle_pct=[20.0, 22.0, 21.0, 30.0])) is None
    assert idle_rank_finding(pd.DataFrame({"rank": [0], "device_idle_pct": [90.0]})) is None  # one rank
    assert idle_rank_finding(table.assign(device_idle_pct=None)) is None  # a CPU job
