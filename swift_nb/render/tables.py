"""Summary tables of a run: an HTML table for notebooks and reports, plain text for
terminals. Every string that comes from the user or the trace is escaped."""

from __future__ import annotations

from html import escape

import pandas as pd

from swift_nb.core.units import fmt_bytes, fmt_pct, fmt_rate, fmt_seconds, fmt_span
from swift_nb.record import FINETUNE_KEY, Run, finetune_label
from swift_nb.record.write import PROFILER_OFF
from swift_nb.render.html import cell
from swift_nb.render.labels import label, step_column, step_label, step_note
from swift_nb.render.value_text import is_missing, value_text

#: what the run's energy and cost come to, where its summary records them
ENERGY_KEYS = (
    "energy_j",
    "energy_per_step_j",
    "avg_power_w",
    "energy_cost_usd",
    "cost_usd",
    "cost_per_1k_steps_usd",
    "idle_cost_per_1k_steps_usd",
    "price_per_hour",
    "price_per_kwh",
)
#: the summary's rows whose value is a path: shown whole under the table, not in a cell
FOLDER, TRACE = "Folder", "Trace"


def step_time_label(summary: dict) -> str:
    """The Summary's step-time row: median and 90th percentile over the steps the run's step
    time is read from (``record.step_durations``), and which those are."""
    if summary.get("step_time_basis", "profiler off") == "profiler off":
        return "Step time (median / 90th percentile, profiler off)"
    return "Step time (median / 90th percentile, every step: fewer than 3 ran with the profiler off)"


def is_imported(run: Run) -> bool:
    """Whether the run was imported from a profiler trace (``swift_nb.import_trace``)."""
    return bool(run.source.get("imported_from"))


def absent_text(run: Run) -> str:
    """How a value the run lacks is shown: an imported run's trace never holds it."""
    return "not recorded in this trace" if is_imported(run) else "not recorded"


def summary_rows(run: Run) -> list[tuple[str, str]]:
    """(name, value) pairs shown for a run, in display order; what an imported run's trace
    cannot hold (samples, process memory) reads "not recorded in this trace"."""
    s, env, sched = run.summary, run.environment, run.schedule
    absent = absent_text(run) if is_imported(run) else None
    util_name = {"gpu": "GPU utilisation", "cpu": "Process CPU"}.get(
        s.get("util_source") or "", "Utilisation"
    )
    devices = ", ".join(env.get("devices") or []) or "–"
    rows = [
        ("Run", run.id),
        ("Label", run.label or "–"),
        ("Status", run.status),
        (label("steps"), str(s.get("steps", 0))),
        (label("wall_s"), fmt_seconds(run.wall_s)),
        (
            step_time_label(s),
            f"{fmt_seconds(s.get('step_time_median_s'))} / {fmt_seconds(s.get('step_time_p90_s'))}",
        ),
        (
            step_label("steps_per_s", s.get("step_time_basis", PROFILER_OFF)),
            fmt_rate(s.get("steps_per_s"), "steps/s"),
        ),
        *(
            [(label("step_time_traced_median_s"), fmt_seconds(s["step_time_traced_median_s"]))]
            if s.get("step_time_traced_median_s")
            else []
        ),
        *(
            [
                (
                    "torch.compile",
                    f"{fmt_seconds(s['compile_s'])} compiling; {s.get('recompiles', 0)} recompiles, "
                    f"{s.get('graph_breaks', 0)} graph breaks; step time with the compiling steps "
                    f"{fmt_seconds(s.get('step_time_median_all_s'))} / {fmt_seconds(s.get('step_time_p90_all_s'))}",
                )
            ]
            if s.get("compile_s")
            else []
        ),
        (label("peak_mem_bytes"), _or(absent, s.get("peak_mem_bytes"), fmt_bytes)),
        (label("peak_rss_bytes"), _or(absent, s.get("peak_rss_bytes"), fmt_bytes)),
        *[(label(k), value_text(k, s[k])) for k in ENERGY_KEYS if not is_missing(s.get(k))],
        (
            f"{util_name} (mean / peak)",
            absent
            if absent and s.get("mean_util_pct") is None
            else f"{fmt_pct(s.get('mean_util_pct'))} / {fmt_pct(s.get('peak_util_pct'))}",
        ),
        ("Device", f"{env.get('device', '–')} ({devices})"),
        *_gpu_rows(s),
        ("Ranks", _ranks_text(run)),
    ]
    finetune = run.context.get(FINETUNE_KEY)
    if isinstance(finetune, dict) and finetune.get("method"):
        at = rows.index(("Ranks", _ranks_text(run)))
        rows[at:at] = finetune_rows(finetune)
    if sched:
        recorded = s.get("recorded_steps") or []
        rows.append(
            (
                "Profiler schedule",
                f"wait {sched['wait']}, warmup {sched['warmup']}, active {sched['active']}, "
                f"repeat {sched['repeat']}; recorded steps: {', '.join(map(str, recorded)) or 'none'}",
            )
        )
    if run.path is not None:
        rows.append((FOLDER, str(run.path)))
        if run.trace_path is not None:
            rows.append((TRACE, f"{run.trace_path} (open in ui.perfetto.dev)"))
    return rows


def finetune_rows(ft: dict) -> list[tuple[str, str]]:
    """The fine-tuning as the summary's rows, one fact each, so that no value needs cutting:
    ``("Fine-tuning", "LoRA r=8 · 0.9 % (α 16, dropout 0.05)")``, the adapted layers, the
    parameters that train, the base model, the models frozen beside it."""
    head = finetune_label(ft)
    if ft.get("alpha") is not None:
        head += f" (α {ft['alpha']:g}, dropout {ft.get('dropout') or 0:g})"
    rows = [(label(FINETUNE_KEY), head)]
    targets = ft.get("target_modules")
    if targets:
        rows.append(("Adapted layers", ", ".join(targets) if isinstance(targets, list) else str(targets)))
    if ft.get("total_params"):
        rows.append(("Parameters that train", f"{ft.get('trainable_params', 0):,} of {ft['total_params']:,}"))
    base = ft.get("base_model") or {}
    if base.get("class"):
        what = ", ".join(
            str(v) for v in (base.get("name_or_path"), ft.get("quantization") or ft.get("base_dtype")) if v
        )
        rows.append(("Base model", str(base["class"]) + (f" ({what})" if what else "")))
    frozen = ft.get("frozen_models") or []
    if frozen:
        rows.append(("Frozen beside it", ", ".join(f"{m['variable']} ({m['class']})" for m in frozen)))
    return rows


def finetune_text(ft: dict) -> str:
    """``LoRA r=8 · 0.9 % (α 16, dropout 0.05) · on q_proj, v_proj · 7,168 of 433,792
    parameters train · base LlamaForCausalLM (float32)``: ``finetune_rows`` in one line."""
    words = {"Adapted layers": "on {}", "Parameters that train": "{} parameters train"}
    words |= {"Base model": "base {}", "Frozen beside it": "frozen beside it: {}"}
    return " · ".join(words.get(k, "{}").format(v) for k, v in finetune_rows(ft))


def _or(absent: str | None, value, fmt) -> str:
    """``fmt(value)``, or ``absent`` for a missing value when that has words."""
    return absent if absent and (value is None or value != value) else fmt(value)


def _ranks_text(run: Run) -> str:
    """``4`` for a single record, ``4 on 2 nodes; missing: 3`` for a job record."""
    world = run.context.get("world_size", run.environment.get("world_size", 1))
    if not len(run.ranks):
        return str(world)
    nodes = run.context.get("nnodes", 1)
    text = f"{world} on {nodes} node{'s' if nodes != 1 else ''}"
    layout = run.context.get("layout") or {}
    if layout.get("parallel"):
        text += f" ({', '.join(layout['parallel'])})"
    if run.context.get("missing_ranks"):
        text += "; missing: " + fmt_span(run.context["missing_ranks"])
    return text


def summary_table_html(run: Run) -> str:
    """The summary as a table of words and values (one fact a row: the fine-tuning's in
    rows of their own, ``finetune_rows``, none cut), the run's folder and trace under it
    (paths are as long as they are: no cell holds them)."""
    rows = summary_rows(run)
    body = "".join(
        f"<tr><th style='text-align:left;padding-right:1em'>{escape(k)}</th>{cell(v, 'text')}</tr>"
        for k, v in rows
        if k not in (FOLDER, TRACE)
    )
    paths = "".join(f"<p>{escape(k)}: <code>{escape(v)}</code></p>" for k, v in rows if k in (FOLDER, TRACE))
    return f"<table><tbody>{body}</tbody></table>{paths}"


def summary_html(run: Run) -> str:
    notes = "".join(f"<li>{escape(n)}</li>" for n in run.notes)
    notes_html = f"<p><b>Notes</b></p><ul>{notes}</ul>" if notes else ""
    return f"<div class='swift-nb-summary'>{summary_table_html(run)}{notes_html}</div>"


def summary_text(run: Run) -> str:
    rows = summary_rows(run)
    width = max(len(k) for k, _ in rows)
    lines = [f"{k:<{width}}  {v}" for k, v in rows]
    lines += [f"note: {n}" for n in run.notes]
    return "\n".join(lines)


def _bases(table: pd.DataFrame) -> list[object]:
    """Each listed run's ``step_time_basis`` (None where it has none)."""
    return list(table["step_time_basis"]) if "step_time_basis" in table else [None] * len(table)


def _runs_display(table: pd.DataFrame) -> pd.DataFrame:
    shown = table.drop(columns=["path", "step_time_basis"], errors="ignore").copy()
    shown["wall_s"] = shown["wall_s"].map(fmt_seconds)
    step_head, shown["step_time_median_s"] = step_column(
        "step (median", [fmt_seconds(v) for v in shown["step_time_median_s"]], _bases(table)
    )
    shown["peak_mem_bytes"] = shown["peak_mem_bytes"].map(fmt_bytes)
    shown["problem"] = shown["problem"].map(lambda v: v if isinstance(v, str) and v else "–")
    if shown["finetune"].isna().all():
        shown = shown.drop(columns=["finetune"])
    for col in ("device_idle_pct", "device_compute_pct"):  # GPU runs only
        values = pd.to_numeric(shown[col], errors="coerce")
        if values.isna().all():
            shown = shown.drop(columns=[col])
        else:
            shown[col] = values.map(lambda v: fmt_pct(v) if pd.notna(v) else None)
    return shown.rename(
        columns={
            "started_at": "started",
            "wall_s": "wall",
            "step_time_median_s": step_head,
            "peak_mem_bytes": "peak memory",
            "device_idle_pct": "GPU idle",
            "device_compute_pct": "GPU compute",
            "world_size": "ranks",
            "finetune": "fine-tuning",
        }
    )


def runs_html(table: pd.DataFrame) -> str:
    """HTML table of ``swift_nb.runs()`` output (escaped)."""
    if table.empty:
        return "<p>No swift_nb runs yet.</p>"
    note = step_note(_bases(table))
    return _runs_display(table).to_html(index=False, escape=True, na_rep="–") + (
        f"<p>{escape(note)}</p>" if note else ""
    )


def runs_text(table: pd.DataFrame) -> str:
    if table.empty:
        return "No swift_nb runs yet."
    note = step_note(_bases(table))
    return _runs_display(table).to_string(index=False, na_rep="–") + (f"\n{note}" if note else "")


def _gpu_rows(s: dict) -> list[tuple[str, str]]:
    """The device's time and how well its kernels fill it, where the run has them."""
    rows = []
    if s.get("device_idle_pct") is not None:
        idle = f"{fmt_pct(s['device_idle_pct'])} / {fmt_pct(s.get('device_compute_pct'))}"
        rows.append(("GPU time (idle / computing)", idle))
    if fill := _fill_text(s):
        rows.append(("GPU kernels (occupancy · under-filled · tensor-core GEMMs)", fill))
    if counted := counters_text(s):
        rows.append(("GPU counters (over the steps)", counted))
    if s.get("throttled_steps_pct") is not None:
        rows.append(("GPU clocks", throttle_text(s)))
    return rows


def counters_text(s: dict) -> str:
    """What the GPU counted over the steps (``swift_nb.record.counters``): "GPU busy 96 % ·
    SMs active 31 % · tensor cores 4 % · DRAM bandwidth 12 %"; empty without GPM."""
    if s.get("mean_sm_active_pct") is None:
        return ""
    parts = [
        f"GPU busy {fmt_pct(s.get('mean_step_util_pct'))}",
        f"SMs active {fmt_pct(s['mean_sm_active_pct'])}",
    ]
    for key, name in (
        ("mean_sm_occupancy_pct", "warps occupied"),
        ("mean_tensor_active_pct", "tensor cores"),
        ("mean_dram_bw_pct", "DRAM bandwidth"),
    ):
        if s.get(key) is not None:
            parts.append(f"{name} {fmt_pct(s[key])}")
    if s.get("pcie_peak_pct") is not None:
        parts.append(f"PCIe peak {fmt_pct(s['pcie_peak_pct'])} of the link")
    return " · ".join(parts)


def throttle_text(s: dict) -> str:
    """ "held down in 35 % of the steps (power cap), 580 MHz below 1980 MHz", or "not throttled"."""
    share = float(s.get("throttled_steps_pct") or 0.0)
    if share <= 0:
        return "not throttled in any step"
    text = f"held down in {fmt_pct(share)} of the steps"
    if s.get("throttle_reasons"):
        text += f" ({', '.join(s['throttle_reasons'])})"
    if s.get("clock_lost_mhz") is not None and s.get("clock_max_mhz"):
        text += f", {s['clock_lost_mhz']:.0f} MHz below their {s['clock_max_mhz']:.0f} MHz"
    return text


def _fill_text(s: dict) -> str:
    """How well the recorded steps' kernels fill the GPU (``analysis.kernels``): "occupancy
    31 % · 42 % of kernel time under-filled · tensor cores 96 % of GEMM time"; empty without."""
    parts = []
    if s.get("kernel_occupancy_pct") is not None:
        parts.append(f"occupancy {fmt_pct(s['kernel_occupancy_pct'])}")
    if s.get("kernel_under_filled_pct") is not None:
        parts.append(f"{fmt_pct(s['kernel_under_filled_pct'])} of kernel time on fewer blocks than SMs")
    if s.get("tensor_core_gemm_pct") is not None:
        parts.append(f"tensor cores {fmt_pct(s['tensor_core_gemm_pct'])} of GEMM time")
    return " · ".join(parts)
