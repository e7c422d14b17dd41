"""One self-contained HTML report of a run: summary, verdict, findings, throughput,
figures and tables, environment and notes.

The document opens offline and from an email attachment alike: CSS is inline, figures
are base64 PNGs, there are no scripts, and a Content-Security-Policy forbids loading
anything else. Every string that comes from the user or the trace is escaped.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import importlib.metadata
import json
import math
import numbers
import re
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from html import escape
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from swift_nb.analysis import Analysis
from swift_nb.analysis import ranks as rank_analysis
from swift_nb.analysis.breakdown import trace_breakdown
from swift_nb.analysis.findings import Finding, Verdict
from swift_nb.analysis.operators import by_memory, top_operators
from swift_nb.analysis.trace import Trace
from swift_nb.record import REPORT_FILE, Run, atomic_write_text
from swift_nb.render.figures import (
    breakdown_figure,
    device_figure,
    figure_png,
    memory_figure,
    operators_figure,
    per_rank_figure,
    rank_timeline_figure,
    timeline_figure,
)
from swift_nb.render.forecast import TITLE as FORECAST_TITLE
from swift_nb.render.forecast import forecast_section
from swift_nb.render.oom import TITLE as OOM_TITLE
from swift_nb.render.oom import oom_html
from swift_nb.render.tables import absent_text, is_imported, summary_rows
from swift_nb.units import fmt_bytes, fmt_pct, fmt_rate, fmt_seconds

if TYPE_CHECKING:
    from matplotlib.figure import Figure

SEVERITIES = ("info", "warning", "critical")
UNIT_SUFFIXES = ("_s", "_bytes", "_pct")
SI_PREFIXES = ((1e18, "E"), (1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))

# A policy that allows only inline styles and data: images: even if a string slipped past
# escaping, the page could neither run a script nor reach the network.
CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"

STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, Helvetica, Arial, sans-serif;
       margin: 0 auto; max-width: 1080px; padding: 1.5em; color: #222; line-height: 1.4; }
h1 { font-size: 1.5em; margin-bottom: 0.2em; overflow-wrap: anywhere; }
h2 { font-size: 1.2em; border-bottom: 1px solid #ddd; padding-bottom: 0.2em; margin-top: 1.8em; }
h3 { font-size: 1.05em; margin: 0 0 0.4em; overflow-wrap: anywhere; }
.sub { color: #666; margin-top: 0; }
table { border-collapse: collapse; margin: 0.6em 0; font-size: 0.9em; }
th, td { padding: 0.2em 0.8em 0.2em 0; text-align: left; vertical-align: top; }
thead th { border-bottom: 1px solid #bbb; }
tbody tr:nth-child(even) { background: #f6f6f6; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
td.text { overflow-wrap: anywhere; max-width: 32em; }
tr.agg td { border-top: 1px solid #bbb; font-weight: 600; }
figure { margin: 1em 0; }
figure img { max-width: 100%; height: auto; display: block; }
figcaption { color: #666; font-size: 0.85em; }
.verdict { font-size: 1.1em; }
.kind { display: inline-block; padding: 0.1em 0.6em; border-radius: 0.8em; background: #444; color: #fff;
        font-weight: 600; }
.finding { border-left: 4px solid #e0a800; background: #fffbea; padding: 0.6em 0.9em; margin: 0.8em 0; }
.finding.info { border-color: #4c72b0; background: #f0f5fb; }
.finding.critical { border-color: #c0392b; background: #fdf0ee; }
.finding p { margin: 0.3em 0; }
.severity { text-transform: uppercase; font-size: 0.75em; color: #666; letter-spacing: 0.05em; }
code { background: #eee; padding: 0 0.25em; border-radius: 3px; overflow-wrap: anywhere; }
.empty { color: #777; font-style: italic; }
pre { background: #f6f6f6; padding: 0.6em; overflow-x: auto; font-size: 0.85em; }
"""


def _is_missing(value: Any) -> bool:
    return value is None or (isinstance(value, numbers.Real) and math.isnan(float(value)))


def fmt_value(name: str, value: Any) -> str:
    """``value`` as text, in the unit its ``name`` carries (``_bytes``, ``_pct``, ``_s``
    anywhere among its ``_``-separated words, e.g. ``growth_bytes_per_step``)."""
    if _is_missing(value):
        return "–"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, numbers.Real):
        words = name.split("_")
        if "bytes" in words:
            return fmt_bytes(value)
        if "pct" in words:
            return fmt_pct(value)
        if "s" in words:
            return fmt_seconds(value)
        return str(value) if isinstance(value, numbers.Integral) else f"{float(value):.4g}"
    if isinstance(value, (list, tuple, dict)):
        return json.dumps(value, default=str)
    return str(value)


def fmt_si(value: float | None, unit: str) -> str:
    """``value`` with an SI prefix: ``fmt_si(3.2e12, "FLOP/s")`` → ``3.20 TFLOP/s``."""
    if _is_missing(value):
        return "–"
    value = float(value)
    for factor, prefix in SI_PREFIXES:
        if abs(value) >= factor:
            return f"{value / factor:.2f} {prefix}{unit}"
    return f"{value:.2f} {unit}"


def _header(column: str) -> str:
    for suffix in UNIT_SUFFIXES:
        if column.endswith(suffix):
            column = column.removesuffix(suffix)
            break
    return column.replace("_", " ")


def _empty(text: str) -> str:
    return f"<p class='empty'>{escape(text)}</p>"


def _frame_table(df: pd.DataFrame, agg_rows: int = 0) -> str:
    """``df`` as an escaped HTML table, each value in the unit its column names; the
    last ``agg_rows`` rows are styled as aggregates."""
    numeric = {c: pd.api.types.is_numeric_dtype(df[c]) for c in df.columns}
    head = "".join(f"<th>{escape(_header(str(c)))}</th>" for c in df.columns)
    rows = []
    for i, record in enumerate(df.itertuples(index=False, name=None)):
        cells = "".join(
            f"<td class='{'num' if numeric[c] else 'text'}'>{escape(fmt_value(str(c), v))}</td>"
            for c, v in zip(df.columns, record, strict=True)
        )
        agg = " class='agg'" if i >= len(df) - agg_rows else ""
        rows.append(f"<tr{agg}>{cells}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def _kv_table(pairs: Sequence[tuple[str, Any]]) -> str:
    body = "".join(
        f"<tr><th>{escape(str(k))}</th><td class='text'>{escape(fmt_value(str(k), v))}</td></tr>"
        for k, v in pairs
    )
    return f"<table><tbody>{body}</tbody></table>"


#: PNGs of figures drawn before they were asked for (``FigurePart.key`` → PNG): the
#: figures that depend on the trace alone are drawn while the cell still runs, and a
#: report written again reuses the figures of the one it replaces (``reuse_figures``)
_PNGS: OrderedDict[str, bytes] = OrderedDict()
_PNGS_KEPT = 32


@functools.cache
def _drawn_by() -> bytes:
    """What draws the figures: the drawing code and matplotlib's version (a figure drawn
    by other code is drawn again)."""
    from swift_nb.render import figures

    return Path(figures.__file__).read_bytes() + importlib.metadata.version("matplotlib").encode()


def _frame_bytes(df: pd.DataFrame) -> bytes:
    try:
        values = pd.util.hash_pandas_object(df, index=False).to_numpy().tobytes()
    except TypeError:  # unhashable cells (lists): their text stands for them
        values = df.to_csv(index=False).encode()
    return repr([(str(c), str(t)) for c, t in df.dtypes.items()]).encode() + values


def figure_key(kind: str, *frames: pd.DataFrame, **options: Any) -> str:
    """What a figure of ``kind`` drawn from ``frames`` shows, as a ``FigurePart.key``:
    a hex digest of the frames, the options and the code that draws it."""
    digest = hashlib.sha1(_drawn_by())
    digest.update(f"{kind}:{sorted(options.items())}".encode())
    for df in frames:
        digest.update(_frame_bytes(df))
    return digest.hexdigest()


_KEYED_IMG = re.compile(
    r"<img [^>]*?data-figure='([0-9a-f]{40})' src='data:image/png;base64,([A-Za-z0-9+/=]+)'"
)


def reuse_figures(html: str) -> int:
    """Keep the figures of an earlier report (its ``html``) for the FigureParts that show
    the same (same key): a report written again from a run folder draws only what
    changed. Returns how many were kept."""
    found = _KEYED_IMG.findall(html)
    for key, data in found[-_PNGS_KEPT:]:
        _PNGS[key] = base64.b64decode(data)
    while len(_PNGS) > _PNGS_KEPT:
        _PNGS.popitem(last=False)
    return len(found)


@dataclass
class FigurePart:
    """A figure inside a section: embedded as a PNG in the report, shown as an image/png
    output in a notebook. ``draw`` makes the figure when it is first needed; ``key``
    (``figure_key``) names what it shows, so that a PNG drawn earlier is used instead."""

    draw: Callable[[], Figure]
    alt: str
    caption: str
    key: str | None = None

    @cached_property
    def figure(self) -> Figure:
        return self.draw()

    @cached_property
    def png(self) -> bytes:
        if self.key is not None and self.key in _PNGS:
            return _PNGS.pop(self.key)
        return figure_png(self.figure)

    def keep(self) -> None:
        """Draw the PNG now and keep it for a later FigurePart with the same key."""
        if self.key is not None:
            _PNGS[self.key] = self.png
            while len(_PNGS) > _PNGS_KEPT:
                _PNGS.popitem(last=False)

    def html(self) -> str:
        data = base64.b64encode(self.png).decode("ascii")
        key = f" data-figure='{self.key}'" if self.key is not None else ""
        return (
            f"<figure><img alt='{escape(self.alt)}'{key} src='data:image/png;base64,{data}'>"
            f"<figcaption>{escape(self.caption)}</figcaption></figure>"
        )


@dataclass
class Section:
    """A titled part of the report: escaped HTML fragments and figures, in order."""

    title: str
    parts: list[str | FigurePart] = field(default_factory=list)

    def html(self) -> str:
        body = "".join(p if isinstance(p, str) else p.html() for p in self.parts)
        return f"<h2>{escape(self.title)}</h2>{body}"


def _has_rows(df: pd.DataFrame | None) -> bool:
    return df is not None and not df.empty


def _summary_section(run: Run) -> Section:
    body = "".join(
        f"<tr><th>{escape(k)}</th><td class='text'>{escape(v)}</td></tr>" for k, v in summary_rows(run)
    )
    return Section("Summary", [f"<table><tbody>{body}</tbody></table>"])


def _not_analysed(what: str, reason: str | None, otherwise: str) -> str:
    """The empty note of a section without its analysis: why the analysis could not run
    when it could not (``reason``), else ``otherwise`` (it ran, and found nothing)."""
    return _empty(f"{what} — {reason}." if reason is not None else f"{what}: {otherwise}")


def _verdict_section(verdict: Verdict | None, not_analysed: str | None = None) -> Section:
    if verdict is None:
        return Section("Verdict", [_not_analysed("No verdict", not_analysed, "the run was not analysed.")])
    evidence = _kv_table(list(verdict.evidence.items())) if verdict.evidence else ""
    return Section(
        "Verdict",
        [
            # The dash separates kind and reason in the text itself, not only the pill's CSS:
            # nbconvert's HTML, feed readers and copied text show no styles.
            f"<p class='verdict'><strong class='kind'>{escape(verdict.kind)}</strong> — "
            f"{escape(verdict.reason)}</p>"
            f"{evidence}"
        ],
    )


def _finding_html(f: Finding) -> str:
    # The severity becomes a CSS class, so only known values may reach the attribute.
    severity = f.severity if f.severity in SEVERITIES else "warning"
    parts = [
        f"<div class='finding {severity}'>",
        f"<div class='severity'>{escape(str(f.severity))} · {escape(f.id)}</div>",
        f"<h3>{escape(f.title)}</h3>",
    ]
    if f.evidence:
        parts.append(_kv_table(list(f.evidence.items())))
    parts.append(f"<p><b>Suggestion:</b> {escape(f.suggestion)}</p>")
    if f.toggle:
        parts.append(f"<p><b>Toggle:</b> <code>{escape(f.toggle)}</code></p>")
    if f.predicted_effect:
        parts.append(f"<p><b>Predicted effect:</b> {escape(f.predicted_effect)}</p>")
    if f.formula:
        parts.append(f"<p><b>Estimated by:</b> <code>{escape(f.formula)}</code></p>")
    parts.append("</div>")
    return "".join(parts)


def _findings_section(findings: Sequence[Finding] | None, not_analysed: str | None = None) -> Section:
    if findings is None:
        return Section("Findings", [_not_analysed("No findings", not_analysed, "the run was not analysed.")])
    if not findings:
        return Section("Findings", [_empty("No findings: no rule's threshold was crossed.")])
    return Section("Findings", ["".join(_finding_html(f) for f in findings)])


def _throughput_section(throughput: Any, not_analysed: str | None = None) -> Section:
    if throughput is None:
        return Section(
            "Throughput", [_not_analysed("Throughput was not computed", not_analysed, "no analysis ran.")]
        )

    def get(name: str):
        return getattr(throughput, name, None)

    mfu = get("mfu_pct")
    rows = [
        ("steps per second", fmt_rate(get("steps_per_s"), "steps/s")),
        ("samples per second", fmt_rate(get("samples_per_s"), "samples/s")),
        ("tokens per second", fmt_rate(get("tokens_per_s"), "tokens/s")),
        ("FLOPs per step", fmt_si(get("flops_per_step"), "FLOP")),
        ("achieved FLOP rate", fmt_si(get("achieved_flops_per_s"), "FLOP/s")),
        ("device peak FLOP rate", fmt_si(get("peak_flops_per_s"), "FLOP/s")),
        # Significant digits, not decimals: small models on big devices sit well under 1 %.
        ("model FLOPs utilisation (MFU)", "–" if _is_missing(mfu) else f"{float(mfu):.3g} %"),
    ]
    body = "".join(f"<tr><th>{escape(k)}</th><td class='num'>{escape(v)}</td></tr>" for k, v in rows)
    return Section("Throughput", [f"<table><tbody>{body}</tbody></table>"])


def _timeline_section(run: Run) -> Section:
    peaks = (
        pd.to_numeric(run.steps["peak_tensor_bytes"], errors="coerce")
        if "peak_tensor_bytes" in run.steps
        else None
    )
    if run.samples.empty and (peaks is None or peaks.isna().all()):
        why = (
            "a profiler trace holds no utilisation or memory samples"
            if is_imported(run)
            else "no sample was taken during the run"
        )
        return Section(
            "Timeline",
            [_empty(f"Utilisation and memory over time were {absent_text(run)}: {why}.")],
        )
    return Section(
        "Timeline",
        [
            FigurePart(
                lambda: timeline_figure(run),
                "Utilisation and memory over time",
                "Utilisation and memory against time; shading marks the profiler's warmup and active steps.",
                figure_key("timeline", run.samples, run.steps),
            )
        ],
    )


def _breakdown_section(breakdown: pd.DataFrame | None, not_analysed: str | None = None) -> Section:
    title = "Step time breakdown"
    if not _has_rows(breakdown):
        return Section(
            title,
            [_not_analysed("No step breakdown", not_analysed, "the profiler recorded no step (no trace).")],
        )
    median = breakdown.median(numeric_only=True).to_frame().T
    # step_s renamed so its header ("step time") differs from the step number's.
    table = (
        pd.concat([breakdown, median], ignore_index=True)
        .astype({"step": object})
        .rename(columns={"step_s": "step_time_s"})
    )
    table.loc[len(table) - 1, "step"] = "median"
    return Section(
        title,
        [
            FigurePart(
                lambda: breakdown_figure(breakdown),
                "Stacked bars of step time by part",
                "Each bar is one profiled step; its parts add up to the step's time.",
                figure_key("breakdown", breakdown),
            ),
            _frame_table(table, agg_rows=1),
        ],
    )


def _memory_section(
    footprint: pd.DataFrame | None,
    timeline: pd.DataFrame | None,
    not_analysed: str | None = None,
    run: Run | None = None,
) -> Section:
    section = Section("Memory by category")
    if _has_rows(timeline):
        section.parts.append(
            FigurePart(
                lambda: memory_figure(timeline),
                "Stacked area of tensor memory by category over time",
                "Live tensor bytes by category during the recorded steps (dashed: step starts).",
                figure_key("memory", timeline),
            )
        )
    if _has_rows(footprint):
        section.parts.append(_frame_table(footprint))
    if not section.parts and run is not None and is_imported(run) and not_analysed is None:
        section.parts.append(
            _empty(
                "Tensor memory by category was not recorded in this trace: it needs the profiler's "
                "[memory] events, which torch.profiler writes only with profile_memory=True."
            )
        )
    if not section.parts:
        section.parts.append(
            _not_analysed(
                "No memory categories",
                not_analysed,
                "they are recorded only for steps the profiler recorded with memory profiling on.",
            )
        )
    return section


def _allocations_absent(run: Run, operators: pd.DataFrame | None) -> bool:
    """An imported trace without the profiler's [memory] events: every operator's bytes
    read 0 because none were recorded, not because none were allocated."""
    if not is_imported(run) or not _has_rows(operators) or "alloc_bytes" not in operators:
        return False
    return not pd.to_numeric(operators["alloc_bytes"], errors="coerce").fillna(0).gt(0).any()


def _operators_section(
    title: str,
    operators: pd.DataFrame | None,
    metric: str,
    caption: str,
    not_analysed: str | None = None,
    run: Run | None = None,
) -> Section:
    if not _has_rows(operators):
        return Section(
            title, [_not_analysed("No operators", not_analysed, "the profiler recorded no step (no trace).")]
        )
    if run is not None and _allocations_absent(run, operators):
        if metric == "alloc_bytes":
            return Section(
                title,
                [
                    _empty(
                        "Memory allocated by operators was not recorded in this trace: it needs the "
                        "profiler's [memory] events, which torch.profiler writes only with profile_memory=True."
                    )
                ],
            )
        operators = operators.drop(columns="alloc_bytes")
    return Section(
        title,
        [
            FigurePart(
                lambda: operators_figure(operators, metric=metric),
                title,
                caption,
                figure_key("operators", operators, metric=metric),
            ),
            _frame_table(operators),
        ],
    )


KIND_WORDS = {
    "gemm": "matrix multiplication (GEMM)",
    "convolution": "convolution",
    "attention": "fused attention",
    "embedding": "embedding",
    "elementwise/reduction": "elementwise and reduction",
    "communication": "communication (NCCL)",
    "memcpy": "memory copy",
    "memset": "memory set",
    "other": "other",
}


def _pct1(value: Any) -> str:
    return "–" if _is_missing(value) else f"{float(value):.1f} %"


def _share(part: float, whole: float) -> str:
    return _pct1(100.0 * part / whole) if whole > 0 else "–"


def _device_sentences(device: dict, gpu: str) -> str:
    scope = (
        "the device work launched before the last profiled step (HolisticTraceAnalysis's window: "
        "the last step's work may be cut off where the profiler stopped)"
        if device.get("last_step_left_out")
        else "all the device work in the trace"
    )
    text = (
        f"Over {fmt_seconds(device['window_s'])} from the first to the last kernel, copy or memset of "
        f"{scope}, {gpu} was idle {_pct1(device['device_idle_pct'])} of the time, ran compute kernels "
        f"{_pct1(device['device_compute_pct'])} of it and ran only non-compute work (communication, "
        f"memory copies and sets) {_pct1(device['device_non_compute_pct'])} of it."
    )
    overlap = device.get("comm_compute_overlap_pct")
    if _is_missing(overlap):
        text += (
            " No communication kernel ran, so there is no overlap of communication with compute to measure."
        )
    else:
        text += f" Communication kernels ran alongside compute kernels for {_pct1(overlap)} of their running time."
    return f"<p>{escape(text)}</p>"


def _idle_sentences(idle_causes: pd.DataFrame, gpu: str) -> str:
    row = idle_causes.iloc[0]
    idle = float(row["idle_s"])
    if not idle > 0:
        return f"<p>{escape(gpu[:1].upper() + gpu[1:])} was never idle in this window.</p>"
    comm, host, other = (float(row[c]) for c in ("comm_wait_s", "host_bound_s", "other_s"))
    text = (
        f"Of the {fmt_seconds(idle)} {gpu} was idle, {fmt_seconds(comm)} ({_share(comm, idle)}) went to "
        "waiting on communication (a collective issued and not yet running, or the host inside a "
        f"collective or a wait), {fmt_seconds(host)} ({_share(host, idle)}) were host-bound launch gaps "
        "(the host busy in operators, CUDA calls or data loading), and "
        f"{fmt_seconds(other)} ({_share(other, idle)}) had no traced cause (the host between operators: "
        "Python, untraced waits)."
    )
    return f"<p>{escape(text)}</p>"


def _kinds_part(kinds: pd.DataFrame) -> list[str]:
    top = kinds.iloc[0]
    words = KIND_WORDS.get(str(top["kind"]), str(top["kind"]))
    count = int(top["count"])
    text = (
        f"{words[:1].upper() + words[1:]} took the most device time: {fmt_seconds(top['time_s'])} in "
        f"{count} kernel{'s' if count != 1 else ''}, {_pct1(top['time_pct'])} of the summed time of all "
        "device work."
    )
    table = pd.DataFrame(
        {
            "kind": kinds["kind"].astype(str),
            "count": kinds["count"].astype(int),
            "device_time_s": kinds["time_s"].astype(float),
            "share of device time": [_pct1(v) for v in kinds["time_pct"]],
        }
    )
    return [f"<h3>Device time by kind of kernel</h3><p>{escape(text)}</p>", _frame_table(table)]


def _device_steps_part(device_steps: pd.DataFrame) -> list[str | FigurePart]:
    table = pd.DataFrame(
        {
            "step": device_steps["step"].astype(int),
            "window_s": device_steps["window_s"].astype(float),
            "idle": [_pct1(v) for v in device_steps["idle_pct"]],
            "compute": [_pct1(v) for v in device_steps["compute_pct"]],
            "non-compute": [_pct1(v) for v in device_steps["non_compute_pct"]],
            "comm/compute overlap": [_pct1(v) for v in device_steps["comm_compute_overlap_pct"]],
            "idle: waiting on communication_s": device_steps["comm_wait_s"].astype(float),
            "idle: host-bound_s": device_steps["host_bound_s"].astype(float),
            "idle: other_s": device_steps["other_s"].astype(float),
        }
    )
    return [
        "<h3>Per step</h3>",
        FigurePart(
            lambda: device_figure(device_steps),
            "Stacked bars of the GPU's time in each profiled step",
            "Each bar is one profiled step's window on the GPU, from its first kernel to the next step's "
            "first: compute, non-compute work alone, and idle time by cause.",
            figure_key("device", device_steps),
        ),
        _frame_table(table),
    ]


def _gpu_section(
    run: Run,
    device: dict | None,
    device_steps: pd.DataFrame | None,
    kernel_kinds: pd.DataFrame | None,
    idle_causes: pd.DataFrame | None,
) -> Section | None:
    """The GPU's time (``analysis.device``; a job's from rank 0's trace): HTA's shares, idle
    time by cause, time by kind of kernel, per step; None for a trace without device work
    (a CPU run)."""
    if not device or _is_missing(device.get("device_idle_pct")):
        return None
    gpu = "rank 0's GPU" if len(run.ranks) > 1 else "the GPU"
    section = Section("GPU", [_device_sentences(device, gpu)])
    if _has_rows(idle_causes):
        section.parts.append(_idle_sentences(idle_causes, gpu))
    if _has_rows(kernel_kinds):
        section.parts += _kinds_part(kernel_kinds)
    if _has_rows(device_steps):
        section.parts += _device_steps_part(device_steps)
    return section


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


def _per_rank_section(
    run: Run, per_rank: pd.DataFrame | None, collectives: pd.DataFrame | None
) -> Section | None:
    """For a job of several ranks: step time, collectives and memory of each rank, and
    their steps against time."""
    if per_rank is None or len(per_rank) < 2:
        return None
    table = per_rank[[c for c in PER_RANK_TABLE if c in per_rank.columns]].copy()
    if "collective_share" in table:
        table["collective_pct"] = 100.0 * pd.to_numeric(table.pop("collective_share"), errors="coerce")
    table = table.rename(columns={"busy_s": "work_s", "step_time_median_s": "step_time_s"})
    section = Section(
        "Ranks",
        [
            FigurePart(
                lambda: per_rank_figure(per_rank),
                "Bars of each rank's step time and peak memory",
                "Median step time per rank, split into work and time inside collectives, and peak tensor "
                "memory. A rank whose work is ≥ 15 % above the median is a straggler: the others wait for it.",
                figure_key("per_rank", per_rank),
            ),
            _frame_table(table),
        ],
    )
    if len(run.rank_steps) and len(run.ranks):
        section.parts.append(
            FigurePart(
                lambda: rank_timeline_figure(run.rank_steps, run.ranks),
                "Each rank's steps against time",
                "One row per rank; each bar is a step, darker where the profiler recorded it.",
                figure_key("rank_timeline", run.rank_steps, run.ranks),
            )
        )
    if _has_rows(collectives):
        comm = collectives.rename(columns={"step_share": "step_pct", "busbw_bytes_per_s": "bus_bandwidth"})
        comm["step_pct"] = 100.0 * pd.to_numeric(comm["step_pct"], errors="coerce")
        comm["bus_bandwidth"] = [
            f"{fmt_bytes(v)}/s" if not _is_missing(v) else "–" for v in comm["bus_bandwidth"]
        ]
        section.parts += ["<h3>Collectives per step</h3>", _frame_table(comm)]
    return section


def _environment_section(run: Run) -> Section:
    return Section(
        "Environment",
        [
            _kv_table(list(run.environment.items())) if run.environment else _empty("Not recorded."),
            "<h3>Context</h3>",
            _kv_table(list(run.context.items())) if run.context else _empty("Not recorded."),
        ],
    )


def _notes_section(notes: Sequence[str], traceback: Any = None) -> Section | None:
    """The run's notes, and the traceback that ended a failed run (collapsed)."""
    parts = []
    if notes:
        parts.append("<ul>" + "".join(f"<li>{escape(n)}</li>" for n in notes) + "</ul>")
    if isinstance(traceback, str) and traceback:
        parts.append(f"<details><summary>Traceback</summary><pre>{escape(traceback)}</pre></details>")
    return Section("Notes", parts) if parts else None


def _oom_section(run: Run) -> list[Section]:
    """A run that ran out of memory leads with why (``swift_nb.render.oom``)."""
    body = oom_html(run)
    return [Section(OOM_TITLE, [body])] if body is not None else []


def _forecast_section(run: Run, forecasts: Sequence[Any] | None, problem: str | None) -> list[Section]:
    """ "Will it fit" for the configurations the run asked for (``--forecast``)."""
    if not run.context.get("forecast"):
        return []
    if problem is not None or not forecasts:
        return [Section(FORECAST_TITLE, [_empty(f"No forecast — {problem or 'the run was not analysed'}.")])]
    return [Section(FORECAST_TITLE, [forecast_section(forecasts)])]


OPERATOR_SECTIONS = (
    (
        "Top operators by self time",
        "self_time_s",
        "Time spent in each operator itself, children excluded, over the profiled steps.",
    ),
    (
        "Top operators by memory allocated",
        "alloc_bytes",
        "Bytes each operator allocated over the profiled steps.",
    ),
)


def draw_ahead(trace: Trace, top_n: int = 15) -> None:
    """Draw the figures that the trace alone determines (the step breakdown and the top
    operators, as ``analyze`` and ``report_sections`` make them) and keep their PNGs, so
    that the report after the cell finds them drawn. For the work done while a profiled
    cell still runs (``swift_nb.api``)."""
    breakdown = trace_breakdown(trace)
    ops = top_operators(None, n=None, trace=trace)
    tables = {"self_time_s": ops, "alloc_bytes": by_memory(ops)}
    parts = [_breakdown_section(breakdown)] + [
        _operators_section(title, tables[metric].head(top_n).reset_index(drop=True), metric, caption)
        for title, metric, caption in OPERATOR_SECTIONS
    ]
    for section in parts:
        for part in section.parts:
            if isinstance(part, FigurePart):
                part.keep()


def report_sections(
    run: Run,
    *,
    breakdown: pd.DataFrame | None = None,
    footprint: pd.DataFrame | None = None,
    timeline: pd.DataFrame | None = None,
    operators_time: pd.DataFrame | None = None,
    operators_memory: pd.DataFrame | None = None,
    throughput: Any = None,
    verdict: Verdict | None = None,
    findings: Sequence[Finding] | None = None,
    per_rank: pd.DataFrame | None = None,
    collectives: pd.DataFrame | None = None,
    device: dict | None = None,
    device_steps: pd.DataFrame | None = None,
    kernel_kinds: pd.DataFrame | None = None,
    idle_causes: pd.DataFrame | None = None,
    forecasts: Sequence[Any] | None = None,
    forecast_problem: str | None = None,
    not_analysed: str | None = None,
) -> list[Section]:
    """The report's sections in order (the notebook shows the same ones), from the
    analyses' outputs (``step_breakdown``, ``memory_footprint``, ``memory_timeline``,
    ``top_operators`` by time and by memory, throughput, the advisor's verdict and
    findings, for a job of several ranks ``analysis.ranks.per_rank`` and the collectives, and
    for a trace with device work ``analysis.device``'s summary, per-step table, kernel kinds
    and idle causes, which make the GPU section); a missing or empty one makes its section
    say so (the GPU section is left out). ``not_analysed``: why the analysis could
    not run (``trace.json.gz is damaged (…): the analysis could not run``), which each
    section without its analysis then says instead of "no trace"."""
    why = not_analysed
    if per_rank is None and len(run.ranks) > 1:
        per_rank = rank_analysis.per_rank(run)
    sections = [
        _summary_section(run),
        *_oom_section(run),
        _verdict_section(verdict, why),
        _findings_section(findings, why),
        _throughput_section(throughput, why),
        _per_rank_section(run, per_rank, collectives),
        _timeline_section(run),
        _breakdown_section(breakdown, why),
        _gpu_section(run, device, device_steps, kernel_kinds, idle_causes),
        _memory_section(footprint, timeline, why, run),
        *_forecast_section(run, forecasts, forecast_problem),
        *(
            _operators_section(title, table, metric, caption, why, run)
            for (title, metric, caption), table in zip(
                OPERATOR_SECTIONS, (operators_time, operators_memory), strict=True
            )
        ),
        _environment_section(run),
        _notes_section(run.notes, run.summary.get("traceback")),
    ]
    return [s for s in sections if s is not None]


def report_html(run: Run, **analyses: Any) -> str:
    """The whole report as one HTML document; ``analyses`` are ``report_sections``'s
    keyword arguments (any may be missing, as for a run without a trace)."""
    return document_html(run, report_sections(run, **analyses))


def document_html(run: Run, sections: Sequence[Section]) -> str:
    """The report document around already-built sections."""
    name = run.label or run.id
    body = [
        f"<h1>swift_nb report — {escape(name)}</h1>",
        f"<p class='sub'>run {escape(run.id)} · started {escape(run.started_at or '–')} · "
        f"status {escape(run.status)}</p>",
        *(section.html() for section in sections),
    ]
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<meta http-equiv='Content-Security-Policy' content=\"{CSP}\">"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        f"<title>swift_nb report — {escape(name)}</title><style>{STYLE}</style></head>"
        f"<body>{''.join(body)}</body></html>\n"
    )


def analysis_fields(analysis: Analysis | None) -> dict[str, Any]:
    """The keyword arguments of ``report_html``/``report_sections`` for an Analysis."""
    if analysis is None:
        return {}
    return dict(
        breakdown=analysis.breakdown,
        footprint=analysis.footprint,
        timeline=analysis.timeline,
        operators_time=analysis.operators_time,
        operators_memory=analysis.operators_memory,
        throughput=analysis.throughput,
        verdict=analysis.verdict,
        findings=analysis.findings,
        per_rank=analysis.per_rank,
        collectives=analysis.collectives,
        device=analysis.device,
        device_steps=analysis.device_steps,
        kernel_kinds=analysis.kernel_kinds,
        idle_causes=analysis.idle_causes,
        forecasts=analysis.forecasts,
        forecast_problem=analysis.forecast_problem,
    )


def render_report(run: Run, analysis: Analysis | None) -> str:
    """``report_html`` of everything ``swift_nb.analysis.analyze(run)`` returned."""
    return report_html(run, **analysis_fields(analysis))


def write_report(run: Run, html: str) -> Path:
    """Write ``html`` to ``report.html`` in the run folder (atomically) and name it in
    ``run.files["report"]``; saving ``run.json`` again is the caller's job."""
    if run.path is None:
        raise ValueError("this run has not been saved yet; save it (swift_nb.save) before writing its report")
    path = Path(run.path) / REPORT_FILE
    atomic_write_text(path, html)
    run.files["report"] = REPORT_FILE
    return path
