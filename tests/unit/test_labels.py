"""``swift_nb.render.labels``: every key a reader's table shows has a label in words and its value
a unit; a key without a label reads as words, never as the identifier. The tables built from
them (the verdict's and the findings' evidence, the comparison) read at a glance."""

from __future__ import annotations

import ast
import re
from html import escape, unescape
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from swift_nb.analysis.advisor.findings import Verdict
from swift_nb.record import MEMORY_CATEGORIES
from swift_nb.render import labels
from swift_nb.render.comparison.page import (
    compare_table_html,
    compare_table_text,
    display_table,
    prediction_text,
)
from swift_nb.render.html import CELL_CHARS, evidence_html, frame_table
from swift_nb.render.labels import LABELS, label, unit
from swift_nb.render.sections.verdict import ordered
from swift_nb.render.value_text import value_text

ADVISOR = Path(__file__).resolve().parents[2] / "swift_nb" / "analysis" / "advisor"
IDENTIFIER = re.compile(r"^[A-Za-z][A-Za-z0-9]*(_[A-Za-z0-9]+)+$")
#: keys the verdict builds from names (``f"{part}_pct"``, ``f"{limit}_s"``), not literals
VERDICT_BUILT = [
    *(f"{p}_pct" for p in ("data", "forward", "backward", "optimizer", "comm", "h2d", "other", "untraced")),
    *(f"{k}_s" for k in ("communication", "overhead", "data", "copy")),
]
#: dict keys in the advisor's modules that are no evidence: settings a change names, dtypes
NOT_EVIDENCE = {
    "accelerate",
    "bf16",
    "bfloat16",
    "dataloader_num_workers",
    "dataloader_persistent_workers",
    "dataloader_prefetch_factor",
    "float16",
    "float32",
    "float64",
    "fp16",
    "gradient_accumulation_steps",
    "lightning",
    "max_steps",
    "per_device_train_batch_size",
    "torch_compile",
    "transformers",
}


def _evidence_keys() -> set[str]:
    """The keys the advisor's modules write: dict literals, ``.update(key=…)``, ``d["key"] = …``."""
    keys: set[str] = set()
    for path in ADVISOR.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Dict):
                keys |= {
                    k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)
                }
            elif isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "update":
                keys |= {kw.arg for kw in node.keywords if kw.arg}
            elif isinstance(node, ast.Assign):
                keys |= {
                    t.slice.value
                    for t in node.targets
                    if isinstance(t, ast.Subscript) and isinstance(t.slice, ast.Constant)
                    if isinstance(t.slice.value, str)
                }
    return {k for k in keys if re.fullmatch(r"[a-z][a-z0-9_]*", k)} - NOT_EVIDENCE


def test_every_key_the_advisor_writes_has_a_label_written_beside_it():
    keys = _evidence_keys() | set(VERDICT_BUILT)
    assert {"step_s", "score_tensors_kept_at_peak", "blocks_from", "weights_dtype"} <= keys
    missing = sorted(k for k in keys if k not in LABELS)
    assert not missing, f"evidence keys without a label in swift_nb/render/labels.py: {missing}"
    for key in keys:
        assert not IDENTIFIER.match(label(key)), (key, label(key))


def test_the_labels_read_as_the_issue_asks():
    assert (label("step_s"), value_text("step_s", 0.3037)) == ("Step time, traced (profiler on)", "303.7 ms")
    assert (label("data_pct"), value_text("data_pct", 0.0)) == ("Data loading", "0 %")
    assert value_text("score_tensors_kept_at_peak", 8) == "8"
    assert label("score_tensors_kept_at_peak") == "Score matrices kept for backward at the peak"
    assert value_text("score_shape", [1, 4, 1024, 1024]) == "1 × 4 × 1024 × 1024"
    assert value_text("activations_pct", 69.4) == "69.4 %"
    assert value_text("params", 281984) == "281,984"
    assert value_text("seq_len", 1024) == "1024"
    assert value_text("use_reentrant", False) == "no"
    assert value_text("callers", {"aten::item": 12, "aten::nonzero": 3}) == "aten::item 12, aten::nonzero 3"
    assert value_text("peak_bytes", float("nan")) == value_text("peak_bytes", None) == "–"


def test_energy_and_cost_keys_have_labels_and_units():
    assert (label("energy_j"), value_text("energy_j", 1234.0)) == ("Energy", "1.23 kJ")
    assert value_text("energy_per_step_j", 12.5) == "12.5 J"
    assert value_text("avg_power_w", 312.0) == "312 W"
    assert (label("cost_usd"), value_text("cost_usd", 12.3)) == ("Cost", "$12.30")
    assert value_text("cost_usd", 0.0042) == "$0.0042"
    assert label("cost_per_1k_steps_usd") == "Cost per 1 000 steps"
    assert label("idle_cost_per_1k_steps_usd") == "Idle cost per 1 000 steps"
    assert label("energy_cost_usd") == "Energy cost"
    assert value_text("price_per_hour", 2.5) == "$2.50/h"
    assert (label("price_per_kwh"), value_text("price_per_kwh", 0.15)) == ("Energy price", "$0.15/kWh")


@pytest.mark.parametrize(
    ("key", "words", "kind", "value", "shown"),
    [
        ("spill_bytes_per_step", "Spill per step", "bytes", 2**20, "1.0 MiB"),
        ("warmup_ms", "Warmup", "ms", 12.5, "12.5 ms"),
        ("kernel_gap_us", "Kernel gap", "us", 250.0, "250 µs"),
        ("queue_wait_s", "Queue wait", "s", 0.004, "4.0 ms"),
        ("idle_gpu_pct", "Idle gpu", "pct", 12.25, "12.2 %"),
        ("fan_energy_j", "Fan energy", "j", 40.0, "40 J"),
        ("board_power_w", "Board power", "w", 75.0, "75 W"),
        ("spot_cost_usd", "Spot cost", "usd", 1.5, "$1.50"),
        ("frames_per_s", "Frames per second", "count", 26.5, "26.5"),
        ("num_layers", "Number of layers", "", 12, "12"),
        ("mean_comm_util_pct", "Mean communication utilisation", "pct", 50.0, "50 %"),
    ],
)
def test_a_key_without_a_label_reads_as_words_in_its_unit(key, words, kind, value, shown):
    if key in LABELS:
        pytest.skip(f"{key} has a label of its own")
    assert (label(key), unit(key), value_text(key, value)) == (words, kind, shown)
    assert "_" not in label(key)


def test_a_label_within_a_finding_says_more_than_the_key_alone():
    assert label("optimizer_pct") == "Optimizer"  # the verdict: a share of the step
    assert label("optimizer_pct", within="optimizer_state") == "Optimizer state's share of the peak"


def _cells(html: str) -> list[str]:
    return [unescape(re.sub(r"<[^>]+>", "", c)) for c in re.findall(r"<t[dh][^>]*>(.*?)</t[dh]>", html)]


def test_evidence_keeps_each_cell_short_and_puts_long_values_under_the_table():
    guards = [f"tensor 'x' size mismatch at index 0. expected {n}, actual {n + 4}" for n in range(4)]
    html = evidence_html({"recompiles": 4, "recompile_s": 1.25, "guards": guards})
    table, listed = html.split("<ul class='evidence'>")
    assert "<th>Recompiles</th><td class='text'>4</td>" in table
    assert "<th>Recompiling</th><td class='text'>1.25 s</td>" in table
    assert "Guards that failed: tensor &#x27;x&#x27; size mismatch" in listed and "guards" not in html
    assert all(len(c) <= CELL_CHARS for c in _cells(html))


def test_a_frame_table_heads_columns_with_labels_and_clips_long_cells():
    name = "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>" * 2
    df = pd.DataFrame({"name": [name], "self_time_s": [0.0012], "alloc_bytes": [2**20], "share of x": [1]})
    html = frame_table(df)
    assert re.findall(r"<th>(.*?)</th>", html) == ["Name", "Self time", "Allocated", "share of x"]
    assert all(len(c) <= CELL_CHARS for c in _cells(html))
    assert f"title='{escape(name)}'" in html  # the whole name in its tooltip
    assert "1.2 ms" in html and "1.0 MiB" in html


def test_the_verdict_puts_its_deciding_numbers_first():
    evidence = {
        "step_s": 0.68,
        "data_pct": 0.0,
        "forward_pct": 49.1,
        "peak_mem_bytes": 1e8,
        "attention_seq": 1024,
    }
    attention = Verdict("memory-bound", "explicit attention materialises 1024×1024 score matrices", evidence)
    assert list(ordered(attention))[:3] == ["attention_seq", "peak_mem_bytes", "step_s"]
    near = Verdict("memory-bound", "peak tensor memory 95 MiB is 92 % of the device", evidence)
    assert next(iter(ordered(near))) == "peak_mem_bytes"
    assert ordered(near) == evidence  # the same numbers, reordered
    ops = Verdict(
        "overhead-bound",
        "812 ops per step; ops of ≥ 50 µs fill only 12 % of it",
        {**evidence, "ops_per_step": 812, "heavy_op_pct": 12.0},
    )
    assert list(ordered(ops))[:2] == ["ops_per_step", "heavy_op_pct"]
    tiny = Verdict(
        "overhead-bound",
        "the step is tiny (1.2 ms): the DataLoader's 0.4 ms per step",
        {**evidence, "data_s_per_step": 4e-4},
    )
    assert list(ordered(tiny))[:2] == ["data_pct", "data_s_per_step"]


def _compare_row(variant: str, peak: float, predicted: float | None, **more) -> dict:
    return {
        "variant": variant,
        "status": "ok",
        "step_time_median_s": 0.04,
        "step_time_ratio": 0.36,
        "steps_per_s": 25.0,
        "peak_mem_bytes": peak,
        "peak_mem_ratio": 0.2,
        "mean_util_pct": 144.0,
        "predicted": f"{variant}: peak tensor memory ≈ 22.8 MiB instead of 117.3 MiB: "
        + "no score matrix " * 12
        if predicted
        else "",
        "predicted_peak_bytes": predicted if predicted else np.nan,
        "notes": "",
        **{f"{c}_bytes": 2**20 for c in MEMORY_CATEGORIES},
        **more,
    }


def test_the_comparison_puts_the_prediction_beside_the_measurement():
    assert prediction_text(22.8 * 2**20, 22.9 * 2**20) == "predicted 22.8 MiB · measured 22.9 MiB · +0.4 %"
    assert prediction_text(2**20, 0.5 * 2**20) == "predicted 1.0 MiB · measured 512.0 KiB · −50.0 %"
    assert prediction_text(None, 2**20) == prediction_text(np.nan, 2**20) == ""
    table = pd.DataFrame(
        [
            _compare_row("baseline", 117.3 * 2**20, None),
            _compare_row("flash_attention", 22.9 * 2**20, 22.8 * 2**20),
        ]
    )
    shown = display_table(table).set_index("variant")
    assert shown.loc["flash_attention", "peak predicted"] == "predicted 22.8 MiB · measured 22.9 MiB · +0.4 %"
    assert shown.loc["baseline", "peak predicted"] == "–"
    assert "predicted" not in shown.columns and "notes" not in shown.columns
    html = compare_table_html(table)
    assert all(len(c) <= CELL_CHARS for c in _cells(html))
    # the reasoning under the table, and as the prediction's tooltip
    assert (
        "How each prediction was made:" in html and "<li>flash_attention — peak tensor memory ≈ 22.8" in html
    )
    assert "title='peak tensor memory ≈ 22.8 MiB" in html
    text = compare_table_text(table)
    assert (
        "predicted 22.8 MiB · measured 22.9 MiB · +0.4 %" in text
        and "\nflash_attention — peak tensor" in text
    )


def test_a_column_the_comparison_gains_is_shown_with_its_label_and_unit():
    """A throwaway column, as another analysis adds it: the table picks it up with no
    other edit, headed in words, valued in its unit."""
    table = pd.DataFrame(
        [
            _compare_row(
                "baseline", 2**20, None, energy_j=1500.0, cost_per_1k_steps_usd=0.42, fan_noise_pct=np.nan
            ),
            _compare_row(
                "flash", 2**20, None, energy_j=900.0, cost_per_1k_steps_usd=0.25, fan_noise_pct=np.nan
            ),
        ]
    )
    shown = display_table(table).set_index("variant")
    assert shown.loc["flash", "Energy"] == "900 J" and shown.loc["baseline", "Energy"] == "1.5 kJ"
    assert shown.loc["flash", "Cost per 1 000 steps"] == "$0.25"
    assert "Fan noise" not in shown.columns  # nothing recorded: no column of dashes
    headers = re.findall(r"<th>(.*?)</th>", compare_table_html(table))
    assert not [h for h in headers if IDENTIFIER.match(h)], headers


def test_labels_module_is_the_one_place_of_the_words():
    """The render layer asks ``labels`` for a key's words: a key added there is what a
    table shows, with no other edit."""
    labels.LABELS["throwaway_bytes"] = labels.Label("A throwaway")
    try:
        html = frame_table(pd.DataFrame({"throwaway_bytes": [2048]}))
        assert "<th>A throwaway</th>" in html and "2.0 KiB" in html
    finally:
        del labels.LABELS["throwaway_bytes"]


def test_the_summary_shows_energy_and_cost_in_words_where_recorded():
    from swift_nb.record import Run
    from swift_nb.render.tables import summary_rows

    bare = dict(summary_rows(Run(id="r")))
    assert "Energy" not in bare and "Cost" not in bare  # nothing recorded: no row of dashes
    run = Run(id="r", summary={"energy_j": 5400.0, "cost_usd": 0.0042, "cost_per_1k_steps_usd": 1.25})
    rows = dict(summary_rows(run))
    assert (
        rows["Energy"] == "5.4 kJ" and rows["Cost"] == "$0.0042" and rows["Cost per 1 000 steps"] == "$1.25"
    )
