"""The recorded steps by module (``swift_nb.analysis.modules``): the model as an icicle,
then the modules that take the most time and those whose forward keeps the most
activations."""

from __future__ import annotations

from html import escape

import pandas as pd

from swift_nb.analysis.modules import adapter_roots, adapters_line
from swift_nb.render.figure_cache import figure_key
from swift_nb.render.html import empty, frame_table
from swift_nb.render.modules_figure import modules_figure
from swift_nb.render.sections.base import FigurePart, Part, ReportInputs, SectionKind, has_rows

TITLE = "Time and memory by module"
TOP = 10
CAPTION = (
    "Each module's forward and backward time per recorded step (its children included), the "
    "activations its forward keeps for backward, and its parameters, gradients and optimizer state. "
    "The backward of a module is the autograd nodes that differentiate the ops its forward ran."
)
#: what the icicle draws: its key (the helper draws it from a table without the peak's share)
DRAWN = ["path", "parent", "depth", "total_s", "saved_bytes"]
SHOWN = ["path", "class", "calls", "forward_s", "backward_s", "step_pct", "saved_bytes", "parameter_bytes"]


def build(inputs: ReportInputs) -> list[Part]:
    table = inputs.modules
    if not has_rows(table):
        run = inputs.run
        why = next((n.removeprefix("modules: ") for n in run.notes if n.startswith("modules: ")), None)
        return [
            empty(
                f"No time by module — {why}." if why else "No time by module: no module scopes were recorded."
            )
        ]
    assert table is not None
    source = table.attrs.get("time_source", "host")
    caption = CAPTION + (" Times are the kernels' (GPU)." if source == "device" else " Times are the host's.")
    base = table[table["role"].astype(str) != "adapter"]
    leaves = base[base["depth"] > 0] if (base["depth"] > 0).any() else base
    stack = table.attrs.get("blocks")
    # the timeline's viewer links a [data-timeline-place] to its place (the model's forward)
    said = []
    if stack:
        spread = f", spread {stack['spread']:.0%}" if stack.get("spread") is not None else ""
        said.append(
            f"<p data-timeline-place='modules'>The stack {escape(stack['parent'])} holds {stack['count']} "
            f"blocks of class {escape(stack['class'])}: {stack['mean_s'] * 1e3:.2f} ms per step each on "
            f"average{spread}; the slowest is {escape(stack['slowest'])}.</p>"
        )
    else:
        said.append("<p data-timeline-place='modules'>The modules' forwards are a track of the timeline.</p>")
    adapters = table.attrs.get("adapters")
    if adapters:
        said += [
            f"<p>The peft adapters, apart from the base model's modules below: {escape(adapters_line(adapters))}.</p>",
            "<h4>Adapters</h4>",
            frame_table(_top(adapter_roots(table), "total_s")),
        ]
    return [
        FigurePart(lambda: modules_figure(table), TITLE, caption, figure_key("modules", table[DRAWN])),
        *said,
        "<h4>By time</h4>",
        frame_table(_top(leaves, "total_s")),
        "<h4>By activations kept for backward</h4>",
        frame_table(_top(leaves, "saved_bytes")),
    ]


def _top(table: pd.DataFrame, by: str) -> pd.DataFrame:
    top = table.nlargest(TOP, by)
    return top.assign(step_pct=100 * top["step_share"])[SHOWN].reset_index(drop=True)


SECTION = SectionKind(TITLE, tab="Modules", build=build)
