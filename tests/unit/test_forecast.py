"""swift_nb.analysis.forecast and swift_nb.render.forecast: exact scaling of parameters,
gradients and optimizer state, the activations' linear and quadratic parts, toggles,
devices, the search for the largest batch and sequence, errors, and what the section says."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

import swift_nb
from swift_nb.analysis.forecast import (
    DEVICES,
    PARTS,
    ScoreBytes,
    forecast,
    measure,
    parse_forecast_spec,
    parse_toggles,
    resolve_device,
)
from swift_nb.core.errors import ConfigError
from swift_nb.core.units import fmt_bytes
from swift_nb.record import MEMORY_CATEGORIES, Run
from swift_nb.render.forecast import TITLE, forecast_figure, forecast_html, forecast_section, forecast_text

MIB = 1 << 20


P = 1 << 20  # parameters of the synthetic runs


def synthetic(
    activations: float = 100 * MIB,
    other: float = 10 * MIB,
    gradients: float | None = None,
    optimizer: str = "AdamW",
    state: float | None = None,
    dtype: str = "float32",
    points: list[list[float]] | None = None,
    logits: float = 0.0,
    **context,
) -> Run:
    """A run whose two recorded steps peak at these category bytes (no trace); ``points``:
    rows of the six categories before ``logits`` (its bytes then 0) or of all seven."""
    e = {"float32": 4, "bfloat16": 2}[dtype]
    peak = {
        "parameters": P * e,
        "frozen_parameters": 0.0,
        "gradients": P * e if gradients is None else gradients,
        "optimizer_state": 2 * P * e if state is None else state,
        "activations": activations,
        "logits": logits,
        "other": other,
    }
    steps = pd.DataFrame(
        [
            {
                "step": k,
                "phase": "active",
                "trigger": "optimizer",
                **{f"{c}_bytes": v for c, v in peak.items()},
            }
            for k in (2, 3)
        ]
    )
    columns = [f"{c}_bytes" for c in MEMORY_CATEGORIES]
    memory = pd.DataFrame(
        [
            {
                "t_s": 0.1 * i,
                "step": k,
                **dict(zip(columns, r if len(r) == len(columns) else [*r[:5], 0.0, *r[5:]], strict=True)),
            }
            for k in (2, 3)
            for i, r in enumerate(points or [list(peak.values())])
        ]
    )
    ctx = {"optimizer": optimizer, "dtype": dtype, "params": P, "batch_size": 8, "seq_len": 512, **context}
    return Run(id="synthetic", context=ctx, steps=steps, memory=memory)


@pytest.fixture
def adam() -> Run:
    return synthetic()


def test_synthetic_run_is_what_the_forecast_reads(adam):
    m = measure(adam)
    assert m.categories["parameters"] == 4 * P and m.batch_size == 8 and m.seq_len == 512
    assert m.timeline.shape[1] == len(PARTS)
    # the same configuration on a device: exactly what was measured
    f = forecast(adam, "H100-80GB")
    assert f.categories == pytest.approx(m.categories)


def test_parameters_gradients_and_state_scale_exactly_with_dtype_and_optimizer(adam):
    bf16 = forecast(adam, dtype="bf16").categories
    assert bf16["parameters"] == 2 * P and bf16["gradients"] == 2 * P and bf16["optimizer_state"] == 4 * P
    sgd = forecast(adam, optimizer="SGD").categories  # with momentum: one state
    assert sgd["optimizer_state"] == 4 * P and sgd["parameters"] == 4 * P
    assert forecast(adam, optimizer="AdamW8bit").categories["optimizer_state"] == 2 * P  # 2 states × 1 byte
    momentum = synthetic(optimizer="SGD", state=4 * P)
    assert forecast(momentum).categories["optimizer_state"] == 4 * P
    assert forecast(momentum, optimizer="Adam").categories["optimizer_state"] == 8 * P
    plain = synthetic(optimizer="SGD", state=0)  # SGD without momentum keeps nothing
    assert forecast(plain).categories["optimizer_state"] == 0
    assert forecast(plain, optimizer="AdamW").categories["optimizer_state"] == 8 * P
    assert forecast(plain, optimizer="SGD", dtype="bf16").categories["optimizer_state"] == 0


def test_gradients_count_as_many_as_the_peak_held(adam):
    partial = synthetic(gradients=P)  # a quarter alive at the peak
    f = forecast(partial, dtype="bf16")
    assert f.categories["gradients"] == P / 2
    assert "25% of the 1,048,576" in f.derivation[2]


def test_galore_state_from_weight_shapes_and_from_the_square_assumption(adam):
    assumed = forecast(adam, toggles=["galore:rank=128"])
    d, r = 1024, 128  # √P, no shapes in a run without a trace
    assert assumed.categories["optimizer_state"] == (2 * r * d + d * r) * 4
    assert "assumed: 1 square 1024×1024" in assumed.derivation[3]
    m = replace(measure(adam), matrices={(512, 1024): 1, (256, 1024): 1, (100, 200): 1})
    f = forecast(m, toggles={"galore": {"rank": 128}})
    projected = (2 * r * 1024 + 512 * r) + (2 * r * 1024 + 256 * r)
    rest = 2 * (P - 512 * 1024 - 256 * 1024)  # (100, 200) has a side ≤ rank: full Adam, like the rest
    assert f.categories["optimizer_state"] == (projected + rest) * 4
    assert "shapes from the trace" in f.derivation[3]


def test_sharding_divides_by_the_world_size(adam):
    for stage, shards in ((1, (1, 1, 4)), (2, (1, 4, 4)), (3, (4, 4, 4))):
        f = forecast(adam, toggles=[f"zero:stage={stage}"], world_size=4, seq_len=512)
        weights = [f.categories[c] for c in ("parameters", "gradients", "optimizer_state")]
        assert weights == [4 * P / shards[0], 4 * P / shards[1], 8 * P / shards[2]]
    fsdp = forecast(adam, toggles=["fsdp"], world_size=8)
    assert fsdp.categories["parameters"] == P / 2
    ddp = forecast(adam, world_size=2)  # replicated, plus the gradient buckets
    assert ddp.categories["other"] == 10 * MIB + 4 * P
    with pytest.raises(ConfigError, match="at least 2 to shard"):
        forecast(adam, toggles=["zero:stage=2"])
    # a one-process run forecast as the fsdp variant: over the variant's ranks
    for toggle, ranks in (("fsdp", 2), ("fsdp(world_size=4)", 4)):
        f = forecast(adam, toggles=toggle)
        assert f.world_size == ranks and f.categories["optimizer_state"] == 8 * P / ranks


def _with_scores(run: Run, **scores) -> object:
    """The measured run with [.., T, T] tensors at its peak, as a trace would show them."""
    m = measure(run)
    sb = ScoreBytes(**scores)
    row = np.array(
        [
            *m.timeline[0, :4],
            m.categories["activations"] - sb.activations_per_sample - sb.activations_batch_free,
            sb.activations_per_sample,
            sb.activations_batch_free,
            m.categories["other"] - sb.other_per_sample - sb.other_batch_free,
            sb.other_per_sample,
            sb.other_batch_free,
            m.categories["logits"],
        ]
    )
    return replace(m, scores=sb, timeline=np.array([row]))


def test_quadratic_attention_part_grows_as_t_squared(adam):
    m = _with_scores(
        adam, activations_per_sample=64 * MIB, activations_batch_free=4 * MIB, other_per_sample=8 * MIB
    )
    rest_a, rest_x = 32 * MIB, 2 * MIB
    longer = forecast(m, seq_len=1024).categories
    assert longer["activations"] == pytest.approx(rest_a * 2 + 64 * MIB * 4 + 4 * MIB * 4)
    assert longer["other"] == pytest.approx(rest_x * 2 + 8 * MIB * 4)
    wider = forecast(m, batch_size=16).categories
    assert wider["activations"] == pytest.approx(rest_a * 2 + 64 * MIB * 2 + 4 * MIB)
    flash = forecast(m, seq_len=1024, toggles=["flash_attention"]).categories
    assert flash["activations"] == pytest.approx(rest_a * 2) and flash["other"] == pytest.approx(rest_x * 2)


def test_calibration_fits_linear_and_quadratic_parts_from_two_runs():
    # 1 KiB per token and 4 B per sample per T², no score tensors visible in either run
    def act(b, t):
        return 1024 * b * t + 4 * b * t * t

    base = synthetic(activations=act(8, 512), other=0.0)
    cal = synthetic(activations=act(8, 1024), other=0.0, seq_len=1024)
    one = forecast(base, seq_len=4096)
    fitted = forecast(base, seq_len=4096, calibration=cal)
    assert fitted.categories["activations"] == pytest.approx(act(8, 4096))
    assert one.categories["activations"] == pytest.approx(act(8, 512) * 8)  # all linear without scores
    assert "fitted to two runs" in fitted.derivation[4]
    # another batch: a constant part and a per-sample part
    cal_b = synthetic(activations=5 * MIB + 2 * 10 * MIB, other=0.0, batch_size=16)
    base_b = synthetic(activations=5 * MIB + 10 * MIB, other=0.0)
    assert forecast(base_b, batch_size=64, calibration=cal_b).categories["activations"] == pytest.approx(
        5 * MIB + 8 * 10 * MIB
    )
    with pytest.raises(ConfigError, match="another batch size or sequence length"):
        forecast(base, calibration=synthetic())


def test_toggles_checkpointing_autocast_and_sequence_parallel(adam):
    ckpt = forecast(synthetic(n_layer=4), toggles=["grad_checkpointing"]).categories
    assert ckpt["activations"] == pytest.approx(0.0)  # all 4 blocks checkpointed; width unknown
    assert ckpt["other"] == pytest.approx(10 * MIB + 100 * MIB / 4)  # one block recomputed in backward
    half = forecast(synthetic(n_layer=4), toggles=["grad_checkpointing:every_n=2"]).categories
    assert half["activations"] == pytest.approx(50 * MIB)
    auto = forecast(adam, toggles=["bf16_autocast"]).categories
    assert auto["parameters"] == 4 * P and auto["optimizer_state"] == 8 * P
    # × AUTOCAST_ACTIVATIONS (0.6), and bf16 copies of the weights in other
    assert auto["activations"] == pytest.approx(60 * MIB) and auto["other"] == pytest.approx(6 * MIB + 2 * P)
    sp = forecast(adam, toggles=["sequence_parallel:sp_size=4"]).categories
    assert sp["activations"] == 25 * MIB and sp["other"] == 10 * MIB / 4
    with pytest.raises(ConfigError, match="n_layer"):
        forecast(adam, toggles=["grad_checkpointing"])


def test_what_the_peak_held_beyond_its_categories_is_kept():
    run = synthetic()
    run.steps["peak_tensor_bytes"] = (
        run.steps[[f"{c}_bytes" for c in MEMORY_CATEGORIES]].sum(axis=1) + 3 * MIB
    )
    f = forecast(run, batch_size=16)
    assert f.categories["other"] == pytest.approx(20 * MIB + 3 * MIB)
    assert any(line.startswith("untracked: the measured peak held 3.0 MiB more") for line in f.derivation)


def test_the_peak_moves_to_where_the_scaled_step_holds_most():
    # the peak in backward; at the optimizer step all gradients and no activations
    peak = [4 * P, 0.0, 0.0, 8 * P, 64 * MIB, 1 * MIB]
    step = [4 * P, 0.0, 4 * P, 8 * P, 0.0, 1 * MIB]
    run = synthetic(gradients=0.0, activations=64 * MIB, other=1 * MIB, points=[peak, step], batch_size=64)
    assert forecast(run).total_bytes == pytest.approx(sum(peak))
    small = forecast(run, batch_size=1)
    assert small.categories["gradients"] == 4 * P and small.categories["activations"] == 0
    assert small.total_bytes == pytest.approx(16 * P + MIB / 64)
    assert any(line.startswith("peak: the forecast step peaks elsewhere") for line in small.derivation)


def test_fits_headroom_and_the_largest_batch_and_sequence_are_consistent(adam):
    f = forecast(adam, device="2GiB", batch_size=8)
    assert f.capacity_bytes == 2 * 2**30 and f.usable_bytes == 2 * 2**30 - 512 * MIB
    assert f.fits == (f.total_bytes <= f.usable_bytes)
    assert f.headroom_bytes == pytest.approx(f.usable_bytes - f.total_bytes)
    b = f.max_batch_size
    assert (
        b and forecast(adam, "2GiB", batch_size=b).fits and not forecast(adam, "2GiB", batch_size=b + 1).fits
    )
    t = f.max_seq_len
    assert t and forecast(adam, "2GiB", seq_len=t).fits and not forecast(adam, "2GiB", seq_len=t + 1).fits
    huge = forecast(adam, "100MB", batch_size=8)
    assert not huge.fits and huge.headroom_bytes < 0 and huge.max_batch_size == 0


def test_device_presets_and_capacities():
    for name in (
        "A100-40GB",
        "A100-80GB",
        "H100-80GB",
        "H100-94GB",
        "H200-141GB",
        "L4-24GB",
        "A10G-24GB",
        "RTX4090-24GB",
        "V100-16GB",
        "V100-32GB",
        "T4-16GB",
        "MI300X-192GB",
    ):
        d = DEVICES[name]
        assert 14e9 < d.capacity_bytes < 220e9 and 256 * MIB <= d.context_bytes <= 2 * 2**30 and d.source
    assert DEVICES["H100-80GB"].capacity_bytes == 85_520_809_984
    assert resolve_device("h100-80gb").name == "H100-80GB" and resolve_device("A10G").name == "A10G-24GB"
    assert resolve_device("24GiB").capacity_bytes == 24 * 2**30
    assert resolve_device("80GB").capacity_bytes == 80 * 10**9
    assert resolve_device(1e9).capacity_bytes == 10**9
    with pytest.raises(ConfigError, match="must be one of A100-40GB, A100-80GB, H100-80GB"):
        resolve_device("H100")  # two presets begin so
    with pytest.raises(ConfigError, match="a capacity such as 80GB or 24GiB"):
        resolve_device("TPUv5")


def test_errors_say_what_to_do(adam):
    with pytest.raises(ConfigError, match="toggles must be among flash_attention") as e:
        forecast(adam, toggles=["flash_attn"])
    assert "got 'flash_attn'" in str(e.value)
    with pytest.raises(ConfigError, match="batch_size must be a whole number of at least 1"):
        forecast(adam, batch_size=0)
    with pytest.raises(ConfigError, match="galore rank must be ≥ 1; got 0"):
        parse_toggles(["galore:rank=0"])
    with pytest.raises(
        ConfigError, match=r"galore depth is not a parameter of galore \(known: rank, update_proj_gap"
    ):
        parse_toggles(["galore:depth=2"])
    with pytest.raises(ConfigError, match="dtype must be one of"):
        forecast(adam, dtype="int8")
    with pytest.raises(ConfigError, match="optimizer must be one of"):
        forecast(adam, optimizer="Lion")
    with pytest.raises(ConfigError, match="galore replaces Adam/AdamW"):
        forecast(synthetic(optimizer="SGD", state=0), toggles=["galore"])
    empty = Run(id="no-memory", steps=pd.DataFrame({"step": [0, 1], "duration_s": [0.1, 0.1]}))
    with pytest.raises(
        ConfigError, match="profile with profile_memory=True so at least one step is recorded"
    ):
        forecast(empty)
    no_seq = synthetic(seq_len=None)
    with pytest.raises(ConfigError, match=r"sequence length is unknown.*context=\{'seq_len': T\}"):
        forecast(no_seq, seq_len=1024)
    assert forecast(no_seq, batch_size=16).max_seq_len is None


def test_spec_line_of_the_magic(adam):
    spec = parse_forecast_spec("H100-80GB batch=32 seq=4096 dtype=bf16 toggles=flash_attention,zero:stage=2")
    assert spec == {
        "device": "H100-80GB",
        "batch_size": 32,
        "seq_len": 4096,
        "dtype": "bfloat16",
        "toggles": ("flash_attention", "zero:stage=2"),
    }
    assert forecast(adam, **{**spec, "world_size": 2}).fits
    assert parse_forecast_spec("24GiB world=8 toggles=fsdp") == {
        "device": "24GiB",
        "world_size": 8,
        "toggles": ("fsdp",),
    }
    assert parse_forecast_spec("batch=4") == {"batch_size": 4}
    with pytest.raises(ConfigError, match="takes a device, then key=value words"):
        parse_forecast_spec("H100-80GB bacth=4")
    with pytest.raises(ConfigError, match="batch_size must be at least 1"):
        parse_forecast_spec("T4 batch=0")


def test_spec_takes_every_parameter_the_toggle_takes():
    """One vocabulary: what --galore and --compare take, a forecast's spec takes too."""
    spec = parse_forecast_spec("T4 toggles=galore:rank=64,gap=9,flash_attention")
    assert spec["toggles"] == ("galore:rank=64,gap=9", "flash_attention")
    parsed = parse_toggles(spec["toggles"])
    assert parsed["galore"]["rank"] == 64 and parsed["galore"]["update_proj_gap"] == 9
    assert parse_toggles("galore(rank=32),grad_checkpointing(n=2)") == {
        "galore": {**parse_toggles("galore")["galore"], "rank": 32},
        "grad_checkpointing": {"every_n": 2},
    }


def test_text_html_and_table_say_the_numbers(adam):
    fits = forecast(adam, "H100-80GB", batch_size=16)
    short = forecast(adam, "T4-16GB", batch_size=4096, toggles=["flash_attention"])
    text = str(short)
    assert "It does not fit" in text and fmt_bytes(short.total_bytes) in text and "T4-16GB" in text
    assert "the largest batch that fits at 512 tokens is" in text.lower()
    assert "(± 25 %)" in text and "Expected error: ± 25 % on the total. ± 5 % for the sizes" in text
    assert "flash_attention (± 5 %), no allocations in the trace (± 10 %), 512× the run's tokens" in text
    assert "± 5 %" in str(fits) and "the trace holds no allocations" in str(fits)
    table = fits.table()
    assert list(table["category"]) == [*MEMORY_CATEGORIES, "total"]
    assert table["forecast_bytes"].iloc[-1] == pytest.approx(fits.total_bytes)
    html = forecast_section([fits, short])
    assert "It fits, with" in html and "It does not fit" in html and "<img" in html
    assert (
        fmt_bytes(fits.capacity_bytes) in html
        and "room for tensors" in html
        and "largest batch at 512 tokens" in html
    )
    assert "H100-80GB · batch 16 × 512" in html and "How each number is found" in html
    assert "<script" not in html
    assert "<table>" in forecast_html(fits) and "It fits" in forecast_html(fits)
    words = forecast_text([fits])
    assert words.startswith(TITLE) and "By category" in words
    assert forecast_section([]) == "<p class='empty'>No forecast was asked for.</p>"
    assert len(forecast_figure([fits, short]).axes) == 2


def test_a_bad_forecast_is_refused_before_the_run(tmp_path):
    with pytest.raises(ConfigError, match="forecast takes a device, then key=value words"):
        swift_nb.profile(out_dir=tmp_path, forecast=["T4-16GB batches=8"])
    with pytest.raises(ConfigError, match="device must be one of A100-40GB"):
        swift_nb.profile(out_dir=tmp_path, forecast=["H100 batch=8"])
    assert not any(tmp_path.iterdir())


def test_a_notebook_shows_a_forecast_as_html(adam):
    """The analysis layer holds no markup: swift_nb registers the render layer's with
    IPython's HTML formatter, so a forecast on a cell's last line still shows as HTML."""
    from IPython.core.interactiveshell import InteractiveShell

    import swift_nb

    shell = InteractiveShell.instance()
    swift_nb._results_as_html()
    f = forecast(adam, "H100-80GB", batch_size=16)
    data, _ = shell.display_formatter.format(f)
    assert data["text/html"] == forecast_html(f)


def test_a_toggle_declared_in_its_entry_reaches_the_planner_the_pricing_and_the_fake_step(adam):
    """What the planner, the step's pricing and a model forecast need of a toggle is in its
    vocabulary entry: a throwaway entry is picked up by each with no other edit."""
    from swift_nb import vocabulary
    from swift_nb.analysis import effects
    from swift_nb.analysis.forecast.plan import candidates
    from swift_nb.model_forecast import on_fake_model

    entry = vocabulary.Entry(
        "throwaway_8bit",
        "a throwaway",
        implementation="swift_nb.toggles.optim_8bit:Optim8bit",
        acts_on="adam_state",
        step=vocabulary.StepCost(1.5, "a reason of its own", cpu=(1.25, "slower on the CPU")),
        on_fake_model="grad_checkpointing",
    )
    vocabulary.register(entry)
    try:
        m = measure(adam)
        assert "throwaway_8bit" in candidates(m, True, None, None)
        assert "throwaway_8bit" not in candidates(replace(m, optimizer="SGD"), True, None, None)
        factor, why = effects.step_factor(["throwaway_8bit", "grad_checkpointing"], cuda=True)
        assert factor == pytest.approx(1.5 * 1.33) and why[0] == "throwaway_8bit ×1.50: a reason of its own"
        assert effects.step_factor(["throwaway_8bit"], cuda=False)[0] == 1.25
        assert on_fake_model("throwaway_8bit") == "grad_checkpointing"
    finally:
        vocabulary.unregister(entry.id)
    with pytest.raises(ValueError, match="acts_on must be one of"):
        vocabulary.Entry("odd", "odd", acts_on="everything")
