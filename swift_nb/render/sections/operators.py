"""What the two "Top operators" sections share: a bar figure and the table of the top
operators by one metric."""

from __future__ import annotations

import pandas as pd

from swift_nb.analysis.operators import compiled_share
from swift_nb.core.units import fmt_seconds
from swift_nb.record import Run
from swift_nb.render.figure_cache import figure_key
from swift_nb.render.figures import operators_figure
from swift_nb.render.html import empty, frame_table
from swift_nb.render.sections.base import FigurePart, Part, has_rows, not_analyzed
from swift_nb.render.tables import is_imported

ALLOCATIONS_NOT_RECORDED = (
    "Memory allocated by operators was not recorded in this trace: it needs the "
    "profiler's [memory] events, which torch.profiler writes only with profile_memory=True."
)


def _allocations_absent(run: Run, operators: pd.DataFrame) -> bool:
    """An imported trace without the profiler's [memory] events: every operator's bytes
    read 0 because none were recorded, not because none were allocated."""
    if not is_imported(run) or not has_rows(operators) or "alloc_bytes" not in operators:
        return False
    return not pd.to_numeric(operators["alloc_bytes"], errors="coerce").fillna(0).gt(0).any()


def compiled_caption(operators: pd.DataFrame) -> str:
    """What the ``compiled`` column means, and the compiled rows' share of the self time."""
    shown = compiled_share(operators)
    share = ""
    if shown is not None and shown[1] > 0:
        share = (
            f" In the rows shown, compiled code holds {fmt_seconds(shown[0])} of {fmt_seconds(shown[1])} "
            f"self time ({100 * shown[0] / shown[1]:.1f} %)."
        )
    return (
        "Rows marked compiled are torch.compile's code: its regions (CompiledFunction for the forward, "
        "CompiledFunctionBackward for the backward, Torch-Compiled Region, an Inductor graph's call), Inductor's "
        "kernels, dynamo's guard checks, and the operators run inside them; on CPU, Inductor's C++ kernels are "
        "the regions' own self time. An operator run both ways has a row for each. Steps that compiled are left "
        "out." + share
    )


def operator_parts(
    title: str,
    operators: pd.DataFrame | None,
    metric: str,
    caption: str,
    why: str | None = None,
    run: Run | None = None,
) -> list[Part]:
    """The parts of a section titled ``title`` showing ``operators`` (``top_operators``'s
    table) by ``metric``, a column of it; ``run``: the run they come from, when known (an
    imported trace may not have recorded allocations)."""
    if operators is None or not has_rows(operators):
        return [not_analyzed("No operators", why, "the profiler recorded no step (no trace).")]
    if run is not None and _allocations_absent(run, operators):
        if metric == "alloc_bytes":
            return [empty(ALLOCATIONS_NOT_RECORDED)]
        operators = operators.drop(columns="alloc_bytes")
    shown = operators
    if "compiled" in operators:
        caption = f"{caption} {compiled_caption(operators)}"
        shown = operators.assign(compiled=operators["compiled"].map({True: "compiled", False: "eager"}))
    return [
        FigurePart(
            lambda: operators_figure(shown, metric=metric),
            title,
            caption,
            figure_key("operators", shown, metric=metric),
        ),
        frame_table(shown),
    ]
