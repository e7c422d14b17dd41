"""The toggles' vocabulary: one grammar for every spec, and a toggle registered once is
found by every consumer (the magic's flags and help, --compare, forecast specs, the
forecast form, the rerun panel) with no other edit."""

from __future__ import annotations

from typing import Any

import pytest

from swift_nb import toggles, vocabulary
from swift_nb.analysis.forecast import parse_forecast_spec, parse_toggles
from swift_nb.core.errors import ConfigError
from swift_nb.notebook import magic  # built before the throwaway toggle joins: it must pick it up
from swift_nb.rerun.launcher import magic_flags, parse_variants
from swift_nb.toggles.base import Toggle

WORDS = vocabulary.Entry(
    "throwaway",
    "Throwaway",
    (vocabulary.Param("level", int, 1, "how much", vocabulary.at_least(1), aliases=("lv",)),),
    flag="throwaway",
    help="a toggle only this test knows",
    metavar="level=N",
    implementation=f"{__name__}:Throwaway",
)


@pytest.fixture
def throwaway():
    vocabulary.register(WORDS)
    try:
        yield WORDS
    finally:
        vocabulary.unregister(WORDS.id)


def _define() -> type[Toggle]:
    class Throwaway(Toggle):
        id = "throwaway"

        def _apply_model(self, model: Any, name: str) -> None:
            self.report.change(f"looked at {name}")

    return Throwaway


def __getattr__(name: str) -> Any:
    # the implementation is defined on first import by name, once the entry exists
    if name == "Throwaway":
        cls = _define()
        globals()[name] = cls
        return cls
    raise AttributeError(name)


def test_the_grammar():
    assert vocabulary.parse_item("galore(rank=64,gap=200)") == ("galore", {"rank": "64", "gap": "200"})
    assert vocabulary.parse_item("galore:rank=64") == ("galore", {"rank": "64"})
    assert vocabulary.split_list("flash_attention,galore:rank=64,gap=200") == [
        "flash_attention",
        "galore:rank=64,gap=200",
    ]
    assert vocabulary.parse_variants("flash_attention,grad_checkpointing+galore(rank=64,gap=200)") == [
        ("flash_attention", [("flash_attention", {})]),
        (
            "grad_checkpointing+galore(rank=64,gap=200)",
            [("grad_checkpointing", {}), ("galore", {"rank": "64", "gap": "200"})],
        ),
    ]
    with pytest.raises(ConfigError, match="compare has unbalanced parentheses"):
        vocabulary.parse_variants("galore(rank=64")
    with pytest.raises(ConfigError, match="toggles must name each toggle once"):
        vocabulary.parse_list("galore,galore:rank=2")
    with pytest.raises(ConfigError, match="toggle parameter must be written key=value"):
        vocabulary.parse_params("rank")
    assert vocabulary.spec_text("galore", toggles.get("galore", rank=64).values) == "galore(rank=64)"


def test_parameters_are_checked_by_their_entry():
    galore = vocabulary.TOGGLES["galore"]
    assert galore.validate({"gap": "9", "r": 8}) == {**galore.defaults(), "update_proj_gap": 9, "rank": 8}
    with pytest.raises(ConfigError, match="galore proj must be one of std, reverse_std"):
        galore.validate({"proj": "diagonal"})
    with pytest.raises(ConfigError, match="zero stage must be between 1 and 3; got 4"):
        vocabulary.TOGGLES["zero"].validate({"stage": 4})
    with pytest.raises(ConfigError, match="toggle must be one of flash_attention, grad_checkpointing"):
        toggles.get("zero")  # the forecast knows it; nothing applies it yet


def test_a_registered_toggle_reaches_every_consumer(throwaway):
    from swift_nb.notebook.forecast_form import ForecastForm
    from swift_nb.notebook.rerun_panel import offered
    from swift_nb.record import Run

    # the magic: its help and its flag, parsed into the toggle
    magic.parse_line("--active 1")
    assert "--throwaway" in magic.SwiftMagics.swift_profile.__doc__
    assert "a toggle only this test knows" in magic.SwiftMagics.swift_profile.__doc__
    args = magic.parse_line("--throwaway lv=3")
    built = magic._toggles(args)
    assert [(t.id, t.values) for t in built] == [("throwaway", {"level": 3})]
    assert built[0].title == "Throwaway"
    # errors name the flag as the magic spells it
    with pytest.raises(ConfigError) as e:
        magic._toggles(magic.parse_line("--throwaway level=0"))
    assert e.value.message(magic._toggle_flag) == "--throwaway level must be ≥ 1; got 0"
    # --compare and the rerun's flags
    (variant,) = parse_variants("throwaway(level=2)+flash_attention")
    assert [t.id for t in variant.toggles] == ["throwaway", "flash_attention"]
    assert magic_flags(variant.toggles) == ["--throwaway", "level=2", "--flash-attn"]
    # the forecast's specs, its form and the rerun panel's checkboxes
    assert parse_forecast_spec("T4 toggles=throwaway:level=2")["toggles"] == ("throwaway:level=2",)
    assert parse_toggles("throwaway") == {"throwaway": {"level": 1}}
    assert "throwaway" in ForecastForm(Run(id="r")).toggles.options
    assert "throwaway" in offered()


def test_unregistered_is_gone():
    assert "throwaway" not in vocabulary.TOGGLES
    with pytest.raises(ConfigError, match="toggles must be among"):
        parse_toggles("throwaway")
