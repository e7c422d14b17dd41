"""One number per quantity, for memory and tokens (issue 52, item 8): a recorded run whose
steps differ (batches padded to their longest sample, as notebooks/06_llm_sft.ipynb trains)
shows one memory "at the peak" (``record.write.peak_step``: the recorded step whose peak is
the median, at its peak moment) in the summary, the Memory section's table and figure, the
forecast and the advisor, and one padding share and one rate of real tokens in the summary,
the Throughput section and the findings. Each expected value is computed here from the
steps as built, not with the package's formulas; no profiler, no training."""

from __future__ import annotations

import math
from html import unescape
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from swift_nb.analysis.advisor.evidence import Evidence, Thresholds
from swift_nb.analysis.advisor.rules.tokens import logits as logits_rule
from swift_nb.analysis.advisor.rules.tokens import padding as padding_rule
from swift_nb.analysis.forecast import forecast
from swift_nb.analysis.memory import memory_footprint
from swift_nb.analysis.throughput import throughput
from swift_nb.analysis.tokens import Tokens
from swift_nb.capture.memory.categories import StepMemory
from swift_nb.capture.memory.snapshots import MemoryRecorder
from swift_nb.core.units import fmt_bytes
from swift_nb.record import MEMORY_CATEGORIES, Run
from swift_nb.record.write import summarize
from swift_nb.render.figures import memory_figure
from swift_nb.render.html import CELL_CHARS
from swift_nb.render.labels import label
from swift_nb.render.sections import memory as memory_section
from swift_nb.render.sections import throughput as throughput_section
from swift_nb.render.sections.base import ReportInputs
from swift_nb.render.tables import finetune_text, summary_table_html

M = 1_000_000
VOCAB = 10_000
COPIES = 3  # the loss's logits, their log-softmax and their gradient: fp32 B·T × V each
#: the steps as a padding collator makes them: tokens computed and real ones per step
TOKENS = [476, 324, 512, 480, 400]
REAL = [343, 222, 365, 300, 250]
DURATION_S = [4.0, 1.7, 5.2, 7.5, 3.0]
#: step 0 warms the profiler up, steps 1-4 are recorded; bytes other than the logits at each
#: recorded step's peak (the logits: COPIES fp32 copies of that step's tokens × VOCAB)
BASE = {"parameters": 4 * M, "frozen_parameters": 0, "gradients": 4 * M, "optimizer_state": 8 * M}
ACTIVATIONS = {1: 10 * M, 2: 5 * M, 3: 1 * M, 4: 12 * M}
OTHER = {1: 5 * M, 2: 2 * M, 3: M // 2, 4: 1 * M}
#: what a forward holds before the loss, at its own moment: more activations than at the peak
FORWARD_EXTRA = 3 * M
#: the recorded steps that follow another recorded step are 2, 3, 4; their peaks are
#: 77.44 MB, 67.1 MB and 69.0 MB (16 MB of weights and state + logits + activations +
#: other): the median is step 4's, not the highest (step 2's). Per category, their medians
#: would take the logits from step 3, the activations from step 2 and other from step 4.
PEAK_STEP = 4


def _logits(k: int) -> int:
    return COPIES * TOKENS[k] * VOCAB * 4


def _at_peak(k: int) -> dict[str, int]:
    return {**BASE, "activations": ACTIVATIONS[k], "logits": _logits(k), "other": OTHER[k]}


def _step_memory(k: int) -> StepMemory:
    """Step k's replay: the weights alone, the forward's activations at their most, the peak
    (logits alive), the step's end."""
    peak = _at_peak(k)
    start = {**BASE, "gradients": 0}
    forward = {**start, "activations": ACTIVATIONS[k] + FORWARD_EXTRA}
    end = {**BASE}
    rows = [
        [ts, *(point.get(c, 0) for c in MEMORY_CATEGORIES)]
        for ts, point in ((0.0, start), (100.0, forward), (200.0, peak), (300.0, end))
    ]
    return StepMemory(at_peak=peak, maxima=peak, timeline=np.array(rows, dtype=float), start_us=0.0)


def _finetune() -> dict:
    return {
        "method": "full",
        "trainable_params": 19_522_112,
        "total_params": 19_522_112,
        "base_model": {"class": "Qwen2ForCausalLM"},
        "base_dtype": "float32",
    }


@pytest.fixture
def run() -> Run:
    """The run as the capture writes it: steps.csv with tokens, memory by category from the
    replay of steps 1-4 (``MemoryRecorder.add_to``), then the summary."""
    n = len(TOKENS)
    starts = np.concatenate([[0.0], np.cumsum(DURATION_S)[:-1]])
    steps = pd.DataFrame(
        {
            "step": range(n),
            "start_s": starts,
            "end_s": starts + DURATION_S,
            "duration_s": DURATION_S,
            "phase": ["warmup", *["active"] * (n - 1)],
            "trigger": ["optimizer"] * n,
            "tokens": [float(t) for t in TOKENS],
            "real_tokens": [float(r) for r in REAL],
        }
    )
    notes: list[str] = []
    out = Run(
        id="sft",
        environment={"device": "cpu"},
        context={
            "batch_size": 4,
            "seq_len": 128,
            "vocab_size": VOCAB,
            "dtype": "float32",
            "finetune": _finetune(),
        },
    )
    trace = SimpleNamespace(memory={k: _step_memory(k) for k in (1, 2, 3, 4)})
    MemoryRecorder(None, [], notes.append).add_to(out, steps, trace, cuda=False)  # type: ignore[arg-type]
    out.steps = steps
    out.summary.update(summarize(steps, out.samples))
    assert not notes
    return out


def _mib(x: float) -> float:
    return round(float(x) / 2**20, 3)


def test_the_summary_the_footprint_and_the_forecast_read_one_step_at_its_peak(run):
    expected = {c: float(v) for c, v in _at_peak(PEAK_STEP).items()}
    assert run.summary["memory_categories_at_peak"] == expected
    footprint = memory_footprint(run).set_index("category")
    assert footprint["at_peak_bytes"].to_dict() == expected
    assert footprint["share_pct"].sum() == pytest.approx(100.0)
    predicted = forecast(run, 24e9)  # the run as it is
    assert predicted.measured == expected
    assert _mib(predicted.categories["logits"]) == _mib(expected["logits"])
    assert _mib(predicted.categories["activations"]) == _mib(expected["activations"])


def test_each_categorys_own_maximum_is_labelled_as_such(run):
    footprint = memory_footprint(run).set_index("category")
    # the activations were at their most in step 3's forward, not at any step's peak
    assert footprint.loc["activations", "max_bytes"] == max(ACTIVATIONS[k] for k in (2, 3, 4)) + FORWARD_EXTRA
    assert footprint.loc["logits", "max_bytes"] == _logits(2)
    assert "own maximum" in label("max_bytes")
    inputs = ReportInputs(run=run, footprint=memory_footprint(run), timeline=run.memory)
    text = unescape(" ".join(p for p in memory_section.build(inputs) if isinstance(p, str)))
    assert "own maximum" in text and f"peak moment of step {PEAK_STEP}" in text
    assert "median of steps 2, 3, 4" in text


def test_the_memory_figure_marks_the_same_peak_and_names_the_highest_apart(run):
    total = sum(_at_peak(PEAK_STEP).values())
    highest = sum(_at_peak(2).values())
    title = memory_figure(run.memory, PEAK_STEP).axes[0].get_title()
    assert f"at the peak (step {PEAK_STEP}) {fmt_bytes(total)}" in title
    assert f"highest {fmt_bytes(highest)}" in title


def _evidence(run: Run) -> Evidence:
    footprint = memory_footprint(run)
    shares = dict.fromkeys(
        ("data", "forward", "backward", "optimizer", "comm", "h2d", "other", "untraced"), 0.0
    )
    return Evidence(
        step_s=float(run.summary["step_time_median_s"]),
        shares={**shares, "forward": 0.3, "backward": 0.6, "optimizer": 0.1},
        ops_per_step=120.0,
        median_op_us=400.0,
        heavy_op_share=0.9,
        attention_seq=0,
        attention_shape=[],
        attention_layers=0,
        footprint=footprint,
        peak_bytes=float(footprint["at_peak_bytes"].sum()),
        limit_bytes=16e9,
        growth_bytes_per_step=0.0,
        growth_source="memory.csv",
        tokens=Tokens.of(run),
    )


def test_the_logits_finding_counts_the_tokens_of_the_step_at_the_peak(run):
    found = logits_rule.rule(_evidence(run), Thresholds(), run.context)
    assert found is not None
    assert found.evidence["logits_bytes"] == _logits(PEAK_STEP)
    assert found.evidence["copies"] == COPIES
    assert f"{TOKENS[PEAK_STEP]:,} tokens × {VOCAB:,} × 4 B, kept {COPIES:.1f} times" in found.title


def test_one_padding_share_and_one_rate_of_real_tokens(run):
    # the steps that counted tokens are every step but none that ended the run
    padding = 100 * (1 - sum(REAL) / sum(TOKENS))
    # every step ran traced or warming up: the step time is the median over every step
    real_per_s = (sum(REAL) / len(REAL)) / float(np.median(DURATION_S))
    tp = throughput(run)
    assert run.summary["padding_pct"] == pytest.approx(padding, rel=1e-12)
    assert tp.padding_pct == run.summary["padding_pct"]
    assert run.summary["real_tokens_per_s"] == pytest.approx(real_per_s, rel=1e-12)
    assert tp.tokens_per_s == run.summary["real_tokens_per_s"]
    assert run.summary["real_tokens_per_step"] / run.summary["tokens_per_step"] == pytest.approx(
        1 - padding / 100
    )
    section = unescape(" ".join(p for p in throughput_section.build(ReportInputs(run=run, throughput=tp))))
    assert f"{padding:.1f} %" in section
    found = padding_rule.rule(_evidence(run), Thresholds(), run.context)
    assert found is not None and found.title.startswith(f"{padding:.1f} % of the tokens")
    assert found.evidence["padding_pct"] == round(padding, 1)
    assert found.evidence["real_tokens_per_s"] == tp.tokens_per_s
    assert math.isclose(Tokens.of(run).padding_pct, padding, rel_tol=1e-12)  # type: ignore[union-attr]


def test_the_summary_shows_the_fine_tuning_whole_in_rows_no_cell_cuts(run):
    html = unescape(summary_table_html(run))
    whole = finetune_text(_finetune())
    assert len(whole) > CELL_CHARS  # longer than a table cell holds: it was cut mid-word
    assert "…" not in html
    for part in ("full", "19,522,112 of 19,522,112", "Qwen2ForCausalLM (float32)"):
        assert part in html and part in whole
    assert "Parameters that train" in html and "Base model" in html
