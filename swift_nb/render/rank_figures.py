"""A job's ranks × steps in one figure, readable from 2 ranks to hundreds."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from swift_nb.render.figures import new_figure

if TYPE_CHECKING:
    from matplotlib.figure import Figure

#: (column of ``analysis.ranks.rank_step_metrics``, panel title, colour map, scale to the shown unit)
PANELS = [
    ("step_s", "Step time (ms)", "viridis", 1e3),
    ("exposed_comm_s", "Exposed communication (ms)", "magma", 1e3),
    ("device_idle_pct", "GPU idle (% of the step)", "cividis", 1.0),
]
_MAX_TICKS = 16


def rank_step_heatmap(metrics: pd.DataFrame, width_in: float = 10.0) -> Figure:
    """One panel per measure of ``analysis.ranks.rank_step_metrics`` (step time, exposed
    communication, GPU idle), a row per rank and a column per profiled step, coloured by
    value: a straggler is a row that differs from the others, a slow step a column. The
    height does not grow with the number of ranks: at hundreds of ranks a row is a line
    of pixels and every n-th rank is labelled."""
    panels = [p for p in PANELS if metrics[p[0]].notna().any()] if len(metrics) else []
    fig = new_figure(width_in, 4.2)
    if not panels:
        ax = fig.subplots()
        ax.set_axis_off()
        ax.text(0.5, 0.5, "No step of any rank was profiled.", ha="center", va="center", color="#555")
        return fig
    ranks = np.sort(metrics["rank"].unique())
    steps = np.sort(metrics["step"].unique())
    fig.subplots_adjust(left=0.8 / width_in, right=1 - 0.2 / width_in, top=0.86, bottom=0.2, wspace=0.35)
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    every = max(1, int(np.ceil(len(ranks) / _MAX_TICKS)))
    for ax, (col, title, cmap, scale) in zip(axes, panels, strict=True):
        grid = metrics.pivot_table(index="rank", columns="step", values=col, aggfunc="mean")
        grid = grid.reindex(index=ranks, columns=steps) * scale
        image = ax.imshow(grid.to_numpy(dtype=float), aspect="auto", interpolation="nearest", cmap=cmap)
        fig.colorbar(image, ax=ax, fraction=0.08, pad=0.03)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("profiled step", fontsize=8)
        step_every = max(1, int(np.ceil(len(steps) / 8)))
        ax.set_xticks(range(0, len(steps), step_every), [str(s) for s in steps[::step_every]], fontsize=7)
        ax.set_yticks(range(0, len(ranks), every), [str(r) for r in ranks[::every]], fontsize=7)
    axes[0].set_ylabel("rank", fontsize=8)
    fig.suptitle(f"{len(ranks)} ranks × {len(steps)} profiled steps", fontsize=10)
    return fig
