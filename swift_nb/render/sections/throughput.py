"""Steps, samples and tokens per second, FLOPs and the model FLOPs utilisation."""

from __future__ import annotations

from swift_nb.core.units import fmt_rate
from swift_nb.record.write import PROFILER_OFF
from swift_nb.render.html import fmt_si, is_missing, text_table
from swift_nb.render.labels import label, step_label
from swift_nb.render.sections.base import Part, ReportInputs, SectionKind, not_analyzed


def build(inputs: ReportInputs) -> list[Part]:
    throughput = inputs.throughput
    if throughput is None:
        return [not_analyzed("Throughput was not computed", inputs.not_analyzed, "no analysis ran.")]

    def get(name: str):
        return getattr(throughput, name, None)

    mfu = get("mfu_pct")
    padding = get("padding_pct")
    real = not is_missing(padding)
    rows = [
        (
            step_label("steps_per_s", inputs.run.summary.get("step_time_basis", PROFILER_OFF)),
            fmt_rate(get("steps_per_s"), "steps/s"),
        ),
        (label("samples_per_s"), fmt_rate(get("samples_per_s"), "samples/s")),
        (
            "Tokens per second (real tokens: padding left out)" if real else label("tokens_per_s"),
            fmt_rate(get("tokens_per_s"), "tokens/s"),
        ),
        *([("Padding among the tokens computed", f"{float(padding):.1f} %")] if real else []),
        ("FLOPs per step", fmt_si(get("flops_per_step"), "FLOP")),
        ("Achieved FLOP rate", fmt_si(get("achieved_flops_per_s"), "FLOP/s")),
        ("Device peak FLOP rate", fmt_si(get("peak_flops_per_s"), "FLOP/s")),
        # Significant digits, not decimals: small models on big devices sit well under 1 %.
        (
            "Model FLOPs utilisation (MFU, the real tokens' FLOPs)"
            if real
            else "Model FLOPs utilisation (MFU)",
            "–" if is_missing(mfu) else f"{float(mfu):.3g} %",
        ),
    ]
    return [text_table(rows, "num")]


SECTION = SectionKind("Throughput", tab="Summary", build=build)
