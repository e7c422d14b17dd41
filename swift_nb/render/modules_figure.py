"""The model as an icicle: one row per depth, each module as wide as its time in a step
(forward + backward), under its parent, coloured by the activations its forward keeps."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd

from swift_nb.core.units import fmt_bytes
from swift_nb.render.figures import new_figure

if TYPE_CHECKING:
    from matplotlib.figure import Figure

#: the deepest level drawn (deeper modules are inside their parent's box)
MAX_DEPTH = 4


def _layout(table: pd.DataFrame) -> list[tuple[pd.Series, float, float]]:
    """(row, left, width) of each module drawn, children laid out left to right inside
    their parent, in call order (the table's)."""
    rows = table.set_index("path", drop=False)
    children: dict[str, list[str]] = {}
    for path, parent in zip(table["path"], table["parent"], strict=True):
        children.setdefault(str(parent), []).append(str(path))
    out: list[tuple[pd.Series, float, float]] = []
    roots = [str(p) for p in table.loc[table["depth"] == 0, "path"]]
    total = float(table.loc[table["depth"] == 0, "total_s"].sum()) or 1.0
    todo = []
    left = 0.0
    for r in roots:
        w = float(rows.at[r, "total_s"]) / total
        todo.append((r, left, w))
        left += w
    while todo:
        path, left, width = todo.pop()
        row = rows.loc[path]
        out.append((row, left, width))
        if int(row["depth"]) >= MAX_DEPTH or float(row["total_s"]) <= 0:
            continue
        x = left
        for child in children.get(path, []):
            w = width * float(rows.at[child, "total_s"]) / float(row["total_s"])
            todo.append((child, x, w))
            x += w
    return out


def modules_figure(table: pd.DataFrame, width_in: float = 10.0) -> Figure:
    from matplotlib import colormaps
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize

    depth = min(MAX_DEPTH, int(table["depth"].max())) + 1
    fig = new_figure(width_in, 0.55 * depth + 1.2)
    ax = fig.add_axes((0.07, 0.18, 0.91, 0.74))  # room on the left for the depths' labels
    saved = table["saved_bytes"].astype(float)
    norm = Normalize(0, max(float(saved.max()), 1.0))
    cmap = colormaps["OrRd"]
    for row, left, width in _layout(table):
        d = int(row["depth"])
        ax.barh(
            -d,
            width,
            left=left,
            height=0.92,
            color=(fill := cmap(0.15 + 0.85 * norm(row["saved_bytes"]))),
            edgecolor="white",
            linewidth=0.6,
        )
        chars = int(width * width_in * 0.96 / 0.065)  # 7-point text, ~0.065 in per character
        if chars >= 3:
            label = f"{str(row['path']).rsplit('.', 1)[-1]} {row['total_s'] * 1e3:.1f} ms"
            label = label if len(label) <= chars else label[: chars - 1] + "…"
            # white on the dark end of the scale (relative luminance of the fill below 0.4)
            dark = 0.2126 * fill[0] + 0.7152 * fill[1] + 0.0722 * fill[2] < 0.4
            ax.text(
                left + width / 2,
                -d,
                label,
                ha="center",
                va="center",
                fontsize=7,
                color="white" if dark else "black",
            )
    ax.set_xlim(0, 1)
    ax.set_ylim(-depth + 0.5, 0.5)
    ax.set_yticks([-d for d in range(depth)], [f"depth {d}" for d in range(depth)], fontsize=7)
    ax.set_xticks([])
    ax.set_title("Time per step by module (width: forward + backward; colour: activations kept)", fontsize=9)
    cax = fig.add_axes((0.3, 0.07, 0.4, 0.03))
    bar = fig.colorbar(ScalarMappable(norm=norm, cmap=cmap), cax=cax, orientation="horizontal")
    bar.ax.tick_params(labelsize=7)
    top = float(norm.vmax or 1.0)
    bar.set_ticks([0, top])
    bar.set_ticklabels(["0", fmt_bytes(top)])
    return fig
