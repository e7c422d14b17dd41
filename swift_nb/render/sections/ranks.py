"""For a job of several ranks: the slowest ranks against the median; for a few ranks each
rank's bars, row and steps against time, for more one ranks × steps figure (step time,
exposed communication, GPU idle) instead. One section whatever the number of ranks."""

from __future__ import annotations

import pandas as pd

from swift_nb.analysis import ranks as rank_analysis
from swift_nb.core.units import fmt_bytes
from swift_nb.render.figure_cache import figure_key
from swift_nb.render.figures import per_rank_figure, rank_timeline_figure
from swift_nb.render.html import frame_table, is_missing
from swift_nb.render.rank_figures import rank_step_heatmap
from swift_nb.render.sections.base import FigurePart, Part, ReportInputs, SectionKind, has_rows

PER_RANK_TABLE = [
    "rank",
    "node_rank",
    "host",
    "device",
    "status",
    "steps",
    "step_time_median_s",
    "busy_s",
    "collective_share",
    "peak_mem_bytes",
    "straggler",
]
#: up to this many ranks each rank gets its bar, table row and row of steps against time;
#: past it the ranks × steps figure stands for them
FEW_RANKS = 16
SLOWEST = 10


def _collectives_part(collectives: pd.DataFrame) -> list[Part]:
    comm = collectives.rename(columns={"step_share": "step_pct", "busbw_bytes_per_s": "bus_bandwidth"})
    comm["step_pct"] = 100.0 * pd.to_numeric(comm["step_pct"], errors="coerce")
    comm["bus_bandwidth"] = [f"{fmt_bytes(v)}/s" if not is_missing(v) else "–" for v in comm["bus_bandwidth"]]
    return ["<h3>Collectives per step</h3>", frame_table(comm)]


def _slowest_part(per_rank: pd.DataFrame) -> list[Part]:
    slow = rank_analysis.slowest_ranks(per_rank, SLOWEST)
    n_slow = int(per_rank["straggler"].sum())
    median = pd.to_numeric(per_rank["busy_s"], errors="coerce").median()
    said = (
        f"{n_slow} of {len(per_rank)} ranks straggle (work ≥ 15 % above the median, the others wait for them)"
        if n_slow
        else f"no straggler among {len(per_rank)} ranks"
    )
    return [
        f"<h3>Slowest ranks</h3><p>{said}; median work per step {median:.4f} s. The {len(slow)} ranks with the "
        "most work per step (step time outside collectives), against the median:</p>",
        frame_table(slow),
    ]


def build(inputs: ReportInputs) -> list[Part] | None:
    run, per_rank = inputs.run, inputs.per_rank
    if per_rank is None and len(run.ranks) > 1:
        per_rank = rank_analysis.per_rank(run)
    if per_rank is None or len(per_rank) < 2:
        return None
    parts: list[Part] = []
    if len(per_rank) > FEW_RANKS and run.path is not None:
        metrics = rank_analysis.rank_step_metrics(run)
        if len(metrics):
            parts.append(
                FigurePart(
                    lambda: rank_step_heatmap(metrics),
                    "Ranks by steps: step time, exposed communication and GPU idle",
                    "One row per rank, one column per profiled step. A straggler is a row unlike the others: "
                    "longer work, and less exposed communication, since the others wait for it inside the "
                    "collectives; a column unlike the others is a slow step on every rank.",
                    figure_key("rank_step_heatmap", metrics),
                )
            )
    parts += _slowest_part(per_rank)
    if len(per_rank) > FEW_RANKS:
        parts.append(f"<p>Every rank's row: ranks.csv in the run folder ({len(per_rank)} ranks).</p>")
    else:
        table = per_rank[[c for c in PER_RANK_TABLE if c in per_rank.columns]].copy()
        if "collective_share" in table:
            table["collective_pct"] = 100.0 * pd.to_numeric(table.pop("collective_share"), errors="coerce")
        table = table.rename(columns={"busy_s": "work_s"})
        parts += [
            FigurePart(
                lambda: per_rank_figure(per_rank),
                "Bars of each rank's step time and peak memory",
                "Median step time per rank, split into work and time inside collectives, and peak tensor "
                "memory. A rank whose work is ≥ 15 % above the median is a straggler: the others wait for it.",
                figure_key("per_rank", per_rank),
            ),
            frame_table(table),
        ]
        if len(run.rank_steps) and len(run.ranks):
            parts.append(
                FigurePart(
                    lambda: rank_timeline_figure(run.rank_steps, run.ranks),
                    "Each rank's steps against time",
                    "One row per rank; each bar is a step, darker where the profiler recorded it.",
                    figure_key("rank_timeline", run.rank_steps, run.ranks),
                )
            )
    if has_rows(inputs.collectives):
        parts += _collectives_part(inputs.collectives)
    return parts


SECTION = SectionKind("Ranks", tab="Summary", build=build)
