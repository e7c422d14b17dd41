"""Every public entry point of the forecast checks what it is given before any work:
``swift_nb.plan``, ``swift_nb.forecast`` with and without ``model=``, and the magic's
``--plan``. A bad value is a ``ConfigError`` (the magic: a one-line ``UsageError``) that
names the argument and says what to pass; the work it would have started (measuring the
run, the fake step, loading a run folder) is replaced here by a fake that fails the test
if it is called."""

from __future__ import annotations

import importlib
import math

import pandas as pd
import pytest
from IPython.core.error import UsageError

import swift_nb
from swift_nb.core.errors import ConfigError
from swift_nb.record import MEMORY_CATEGORIES, Run

MIB = 1 << 20
P = 1 << 20  # parameters of the synthetic run


def _run() -> Run:
    """A recorded run (no trace) of a 1 Mi-parameter fp32 model with AdamW, 8 × 512 tokens."""
    peak = {
        "parameters": 4 * P,
        "frozen_parameters": 0.0,
        "gradients": 4 * P,
        "optimizer_state": 8 * P,
        "activations": 100 * MIB,
        "logits": 0.0,
        "other": 10 * MIB,
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
    memory = pd.DataFrame(
        [{"t_s": 0.1 * k, "step": k, **{f"{c}_bytes": peak[c] for c in MEMORY_CATEGORIES}} for k in (2, 3)]
    )
    ctx = {"optimizer": "AdamW", "dtype": "float32", "params": P, "batch_size": 8, "seq_len": 512}
    return Run(id="synthetic", context=ctx, steps=steps, memory=memory)


@pytest.fixture
def run() -> Run:
    return _run()


@pytest.fixture
def no_work(monkeypatch):
    """Every piece of work an entry point could start, replaced by a failure: measuring a
    run, a model's step on fake tensors, reading a run folder."""

    def started(*args, **kwargs):
        raise AssertionError("the work started before the input was checked")

    targets = (
        ("swift_nb.analysis.forecast", "measure"),
        ("swift_nb.analysis.forecast.predict", "measure"),
        ("swift_nb.model_forecast", "measure"),
        ("swift_nb.model_forecast", "fake_step"),
        ("swift_nb.notebook.magic", "load_run"),
        ("swift_nb.notebook.magic", "runs"),
    )
    # Every module imported before any is patched: a module first imported while another is
    # patched binds the replacement by `from ... import`, and monkeypatch would then "restore"
    # it to the replacement, for every later test in this process.
    modules = [importlib.import_module(module) for module, _ in targets]
    for module, (_, name) in zip(modules, targets, strict=True):
        monkeypatch.setattr(module, name, started)


def _refused(call, param: str, *said: str) -> ConfigError:
    with pytest.raises(ConfigError) as e:
        call()
    assert e.value.param == param, str(e.value)
    for words in said:
        assert words in str(e.value), str(e.value)
    return e.value


COUNTS = ("batch_size", "seq_len")
BAD_COUNTS = (-4, 0, 2.5, True, "8", math.nan)


# -- plan --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", COUNTS)
@pytest.mark.parametrize("value", BAD_COUNTS)
def test_plan_refuses_a_batch_or_sequence_that_is_not_a_positive_whole_number(run, no_work, name, value):
    _refused(
        lambda: swift_nb.plan(run, "H100-80GB", **{name: value}),
        name,
        "must be a whole number of at least 1",
        f"got {value!r}",
    )


@pytest.mark.parametrize("name", COUNTS)
def test_plan_with_a_model_refuses_them_before_its_fake_step(no_work, name):
    _refused(
        lambda: swift_nb.plan(device="H100-80GB", model="llama-2-7b", progress=False, **{name: -4}),
        name,
        "whole number of at least 1",
    )


@pytest.mark.parametrize(
    ("device", "said"),
    [
        ("0GB", "a capacity above 0"),
        ("0", "a capacity above 0"),
        (0, "a capacity above 0"),
        (-8e9, "a capacity above 0"),
        (math.inf, "a capacity above 0"),
        ("banana", "must be one of A100-40GB"),
        ("", "must be one of A100-40GB"),
        (True, "must be one of A100-40GB"),
        ("100MB", "leaves no room for tensors"),
    ],
)
def test_plan_refuses_a_device_that_is_neither_a_preset_nor_a_capacity(run, no_work, device, said):
    _refused(lambda: swift_nb.plan(run, device), "device", said)


def test_plan_refuses_a_bad_device_before_a_models_fake_step(no_work):
    for device in ("banana", "0GB"):
        _refused(lambda d=device: swift_nb.plan(device=d, model="llama-2-7b", progress=False), "device")


@pytest.mark.parametrize("budget", [0, -1, math.nan, math.inf, True, "lots"])
def test_plan_refuses_a_budget_that_is_not_a_positive_number_of_bytes(run, no_work, budget):
    _refused(lambda: swift_nb.plan(run, memory_bytes=budget), "memory_bytes", "a positive number of bytes")


@pytest.mark.parametrize("most", [0, 6, 2.5, True])
def test_plan_refuses_a_count_of_toggles_out_of_range(run, no_work, most):
    _refused(lambda: swift_nb.plan(run, "H100-80GB", max_toggles=most), "max_toggles", "between 1 and 5")


def test_plan_refuses_a_toggle_spelled_wrong_before_any_work(run, no_work):
    _refused(
        lambda: swift_nb.plan(run, "H100-80GB", toggles_allowed=["flash_atn"]), "toggle", "flash_attention"
    )
    _refused(
        lambda: swift_nb.plan(run, "H100-80GB", toggles_allowed="flash_atn"), "toggle", "flash_attention"
    )


def test_plan_refuses_what_is_not_a_run(no_work):
    _refused(lambda: swift_nb.plan("swift_nb_runs/latest", "H100-80GB"), "run", "swift_nb.load_run")


def test_plan_refuses_a_progress_that_is_not_a_bool(no_work):
    _refused(
        lambda: swift_nb.plan(device="H100-80GB", model="llama-2-7b", progress="yes"),
        "progress",
        "True or False",
    )


def test_a_negative_batch_no_longer_gives_a_ranked_table(run):
    with pytest.raises(ConfigError):
        swift_nb.plan(run, "H100-80GB", batch_size=-4)
    table = swift_nb.plan(run, "H100-80GB", batch_size=16)  # a good one still plans
    assert (table["step_factor"] > 0).all()


def test_plan_takes_a_capacity_and_a_budget_it_can_read(run):
    assert len(swift_nb.plan(run, "24GB"))
    assert len(swift_nb.plan(run, memory_bytes=1e6))  # nothing fits: said, not refused
    assert len(swift_nb.plan(run, "l4"))


def _shown(value):
    """What an error says it got: the one bad toggle of a list."""
    return value[0] if isinstance(value, list) else value


# -- forecast of a run --------------------------------------------------------------------

BAD_ARGS = [
    ("batch_size", -4, "whole number of at least 1"),
    ("batch_size", 0, "whole number of at least 1"),
    ("batch_size", 2.5, "whole number of at least 1"),
    ("seq_len", 0, "whole number of at least 1"),
    ("seq_len", -1, "whole number of at least 1"),
    ("world_size", 0, "whole number of at least 1"),
    ("world_size", 1.5, "whole number of at least 1"),
    ("steps", 0, "whole number of at least 1"),
    ("steps", -100, "whole number of at least 1"),
    ("device", "0GB", "a capacity above 0"),
    ("device", "banana", "must be one of A100-40GB"),
    ("device", 0, "a capacity above 0"),
    ("device", None, "must be one of A100-40GB"),
    ("dtype", "int8", "must be one of"),
    ("toggles", "flash_atn", "must be among"),
    ("toggles", ["grad_ckpt"], "must be among"),
    ("price_per_hour", -1.0, "a price in USD"),
    ("price_per_hour", "cheap", "a price in USD"),
]


@pytest.mark.parametrize(("name", "value", "said"), BAD_ARGS)
def test_forecast_of_a_run_refuses_a_bad_argument_before_measuring_it(run, no_work, name, value, said):
    _refused(lambda: swift_nb.forecast(run, **{name: value}), name, said, f"got {_shown(value)!r}")


def test_forecast_of_a_run_refuses_an_unknown_optimizer_and_what_is_not_a_run(run, no_work):
    _refused(lambda: swift_nb.forecast(run, optimizer="Lion"), "optimizer", "must be one of")
    _refused(lambda: swift_nb.forecast("swift_nb_runs/latest"), "run", "swift_nb.load_run")
    _refused(lambda: swift_nb.forecast(run, calibration="other_run"), "calibration", "swift_nb.load_run")


def test_forecast_still_reads_a_capacity_and_a_preset_by_prefix(run):
    assert swift_nb.forecast(run, "80GB").capacity_bytes == 80e9
    assert swift_nb.forecast(run, "24GiB").capacity_bytes == 24 * (1 << 30)
    assert swift_nb.forecast(run, "l4").device == "L4-24GB"


# -- forecast of a model from its config ---------------------------------------------------


@pytest.mark.parametrize(("name", "value", "said"), BAD_ARGS)
def test_forecast_of_a_model_refuses_a_bad_argument_before_its_fake_step(no_work, name, value, said):
    _refused(
        lambda: swift_nb.forecast(model="llama-2-7b", progress=False, **{name: value}),
        name,
        said,
        f"got {_shown(value)!r}",
    )


def test_forecast_of_a_model_refuses_the_rest_before_its_fake_step(no_work):
    def model(**kw):
        return lambda: swift_nb.forecast(model="llama-2-7b", **{"progress": False, **kw})

    _refused(model(optimizer="Lion"), "optimizer", "must be one of AdamW, Adam, SGD")
    _refused(model(dtype="float64"), "dtype", "must be one of")
    _refused(model(toggles="lora,qlora"), "toggles", "cannot run together")
    _refused(model(toggles="zero:stage=2"), "world_size", "at least 2")
    _refused(model(toggles="zero:stage=2", world_size=1), "world_size", "at least 2")
    _refused(model(steps=100), "steps", "needs a step time")
    _refused(model(progress=1), "progress", "True or False")
    _refused(lambda: swift_nb.forecast("a_proxy_run", model="llama-2-7b"), "run", "swift_nb.load_run")
    _refused(lambda: swift_nb.forecast(model="llama-9-1t", progress=False), "model", "is no preset")
    _refused(lambda: swift_nb.forecast(model=42, progress=False), "model", "a preset's name")


# -- the magic's --plan ----------------------------------------------------------------------


def _magic(line: str) -> str:
    from swift_nb.notebook.magic import SwiftMagics

    with pytest.raises(UsageError) as e:
        SwiftMagics(shell=None).swift_profile(line)
    said = str(e.value)
    assert "\n" not in said, said
    return said


@pytest.mark.parametrize(
    ("line", "said"),
    [
        ("--plan 0GB", "--plan: device must be a capacity above 0"),
        ("--plan 0", "--plan: device must be a capacity above 0"),
        ("--plan banana", "--plan: device must be one of A100-40GB"),
        ("--plan L4 --batch 0", "--batch must be a whole number of at least 1"),
        ("--plan L4 --batch -4", "--batch must be a whole number of at least 1"),
        ("--plan L4 --seq 0", "--seq must be a whole number of at least 1"),
    ],
)
def test_the_magics_plan_refuses_bad_input_before_reading_a_run(no_work, tmp_path, line, said):
    got = _magic(f"{line} --out {tmp_path}")
    assert said in got, got
