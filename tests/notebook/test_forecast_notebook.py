"""swift_nb.analysis.forecast and swift_nb.render.forecast: exact scaling of parameters,
gradients and optimizer state, the activations' linear and quadratic parts, toggles,
devices, the search for the largest batch and sequence, errors, and what the section says."""

from __future__ import annotations

from swift_nb.render.forecast import TITLE


def test_the_magic_shows_will_it_fit(kernel, tmp_path):
    res = kernel.execute(
        f'%%swift_profile --out {tmp_path} --no-widgets --forecast "T4-16GB batch=64"\nm = train(5)'
    )
    assert res.status == "ok", res.outputs
    shown = "".join(d["data"].get("text/html", "") for d in res.of_type("display_data"))
    assert f"<h4>{TITLE}</h4>" in shown and "On T4-16GB (batch 64" in shown
