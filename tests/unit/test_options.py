"""ProfileOptions is the one home of every option: the API, the magic's flags and the
rerun worker's command line map to and from it without loss."""

from __future__ import annotations

import inspect
import shlex
from dataclasses import fields

import pytest

import swift_nb
from swift_nb.core.errors import ConfigError
from swift_nb.notebook.magic import SwiftMagics, parse_line
from swift_nb.vocabulary.options import ProfileOptions, flag_of

NON_DEFAULT = ProfileOptions(
    wait=0,
    warmup=1,
    active=5,
    repeat=0,
    record_shapes=False,
    profile_memory=False,
    with_stack=True,
    count_flops=True,
    interval_ms=250.0,
    label="my run",
    out_dir="/tmp/some dir",
    keep=3,
    run_id="20260101-000000-x",
    report=False,
    gather_timeout_s=60.0,
    price_per_hour=2.5,
    price_per_kwh=0.3,
    log_to=("tensorboard:log_dir=/tmp/tb runs",),
    forecast=("H100-80GB batch=32 seq=4096 dtype=bf16", "T4-16GB toggles=grad_checkpointing,flash_attention"),
)


def test_every_option_differs_in_the_round_trip_fixture():
    for f in fields(ProfileOptions):
        assert getattr(NON_DEFAULT, f.name) != f.default, f"NON_DEFAULT leaves {f.name} at its default"


def test_flags_round_trip_through_a_magic_line():
    line = shlex.join(NON_DEFAULT.to_argv())
    assert ProfileOptions.from_line(line) == NON_DEFAULT
    assert ProfileOptions.from_line("") == ProfileOptions()
    assert ProfileOptions().to_argv() == []


def test_the_magic_parses_every_option_into_the_same_object():
    args = parse_line(shlex.join(NON_DEFAULT.to_argv()))
    assert ProfileOptions.from_args(args) == NON_DEFAULT
    # every option has its flag in the magic's help, spelled as flag_of spells it
    doc = SwiftMagics.swift_profile.__doc__
    for f in fields(ProfileOptions):
        assert flag_of(f.name) in doc


def test_profile_takes_the_same_options_by_keyword(tmp_path):
    p = swift_nb.profile(out_dir=tmp_path, active=2, count_flops=True, report=False)
    assert p.options == ProfileOptions(out_dir=str(tmp_path), active=2, count_flops=True, report=False)
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'actve'"):
        swift_nb.profile(actve=2)
    # a keyword left out keeps the options object's value; one given overrides it
    base = ProfileOptions(wait=5, label="base", report=False)
    assert swift_nb.profile(base, active=2).options == base.replace(active=2)
    assert swift_nb.profile(base, label=None).options == base.replace(label=None)


def test_profile_signature_names_every_option_as_a_typed_keyword():
    """IDEs and help() see each option: one keyword-only parameter per field of
    ProfileOptions, with the field's type, and no **kwargs."""
    params = inspect.signature(swift_nb.profile).parameters
    assert not [p for p in params.values() if p.kind is inspect.Parameter.VAR_KEYWORD]
    for f in fields(ProfileOptions):
        assert f.name in params, f.name
        assert params[f.name].kind is inspect.Parameter.KEYWORD_ONLY
        assert params[f.name].annotation == f.type, f.name
        assert f"{f.name}:" in swift_nb.profile.__doc__  # its Args: entry


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"active": 0}, "active must be a whole number ≥ 1; got 0"),
        ({"interval_ms": -1}, "interval_ms must be a positive number of milliseconds; got -1"),
        ({"keep": 0}, "keep must be a whole number of runs, at least 1; got 0"),
        ({"run_id": "../x"}, "run_id must be a folder name"),
        ({"gather_timeout_s": 0}, "gather_timeout_s must be a positive number of seconds"),
    ],
)
def test_bad_values_are_refused_before_any_work(kw, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        ProfileOptions(**kw)


def test_a_magic_flag_names_itself_in_the_error():
    with pytest.raises(ConfigError) as e:
        ProfileOptions(interval_ms=0)
    assert e.value.message(flag_of).startswith("--interval-ms must be a positive number")
    assert flag_of("record_shapes") == "--no-shapes"
