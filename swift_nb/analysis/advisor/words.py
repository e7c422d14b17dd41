"""Wording the verdict and the rules share: percentages, step-scale times, the loader's numbers."""

from __future__ import annotations

from swift_nb.analysis.advisor.evidence import Evidence, Loader
from swift_nb.core.units import fmt_seconds


def pct(x: float) -> float:
    return round(100.0 * x, 1)


def ms(seconds: float) -> str:
    """Step-scale times: ``0.36 ms`` rather than ``361 µs`` between 0.1 and 1 ms."""
    return f"{seconds * 1e3:.2f} ms" if 1e-4 <= seconds < 1e-3 else fmt_seconds(seconds)


def loader_evidence(ev: Evidence) -> dict:
    ld = ev.loader
    out = {
        "data_pct": pct(ev.shares["data"]),
        "data_s_per_step": round(ld.data_s, 6),
        "data_in_ops_s_per_step": round(ld.ops_s, 6),
        "data_in_python_s_per_step": round(ld.python_s, 6),
    }
    if ld.samples:
        assert ld.s_per_sample is not None  # None only without samples
        out["samples_per_batch"] = ld.samples
        out["data_s_per_sample"] = round(ld.s_per_sample, 7)
    return {**out, "loaded_by": ld.where(), "step_s": round(ev.step_s, 6)}


def per_sample(ld: Loader) -> str:
    if not ld.samples:
        return ""
    assert ld.s_per_sample is not None  # None only without samples
    return f" ({ms(ld.s_per_sample)} per sample over {ld.samples})"
