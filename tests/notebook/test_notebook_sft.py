"""End to end: notebooks/06_llm_sft.ipynb executed through nbclient/ipykernel, headless on
CPU: a Qwen2-shaped model with Qwen's vocabulary fed padded batches by a collator; the
padding and the logits counted and named in findings; ``--compare fused_ce,packing`` with
the same loss and less memory; and the batch that now fits.

The tokens are checked against what the notebook fed the model, computed here from its own
recipe (the sample lengths its seeded generator draws, batches of 4, steps 0–3), not from
the columns the record derived them from: the tokens computed per step are 4 × the batch's
longest sample, the real ones the sum of its lengths."""

from __future__ import annotations

import re
import shutil
import statistics
from pathlib import Path

import cut_cross_entropy  # noqa: F401 (the notebook imports it: missing, it fails here by name)
import nbformat
import pytest
import torch
import transformers  # noqa: F401 (the notebook imports it: missing, it fails here by name)
from nbclient import NotebookClient
from support.common import kernel_env

import swift_nb
from swift_nb.analysis.throughput import throughput
from swift_nb.record.write import peak_step

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "notebooks" / "06_llm_sft.ipynb"

#: the notebook's recipe, as its cells spell it (checked below): the lengths its generator
#: draws, its batch, the steps its training cell runs (it breaks after step 3), the vocabulary
RECIPE = (
    "g = torch.Generator().manual_seed(0)",
    "lengths = torch.randint(12, 129, (32,), generator=g).tolist()",
    "DataLoader(samples, batch_size=4, collate_fn=collate)",
    "if step == 3:",
    "vocab_size=151_936",
)
BATCH, STEPS, VOCAB = 4, 4, 151_936
_lengths = torch.randint(12, 129, (32,), generator=torch.Generator().manual_seed(0)).tolist()
#: per step: the lengths of its samples, the tokens the model computes (padded to the longest)
#: and the real ones
BATCHES = [_lengths[i * BATCH : (i + 1) * BATCH] for i in range(STEPS)]
TOKENS = [BATCH * max(b) for b in BATCHES]
REAL = [sum(b) for b in BATCHES]
PADDING_PCT = 100 * (1 - sum(REAL) / sum(TOKENS))


@pytest.fixture(scope="module")
def executed(tmp_path_factory) -> tuple[nbformat.NotebookNode, Path]:
    folder = tmp_path_factory.mktemp("llm_sft")
    shutil.copy(NOTEBOOK, folder)
    nb = nbformat.read(folder / NOTEBOOK.name, as_version=4)
    client = NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(folder)}}
    )
    client.execute(env=kernel_env())
    nbformat.write(nb, folder / "executed.ipynb")  # kept beside the runs, for a look when a test fails
    return nb, folder / "swift_nb_runs"


def _text(nb: nbformat.NotebookNode, contains: str) -> str:
    (cell,) = [c for c in nb.cells if c.cell_type == "code" and contains in c.source]
    parts = []
    for o in cell.outputs:
        if o.output_type == "stream":
            parts.append(o.text)
        elif "text/plain" in o.get("data", {}):
            parts.append(o["data"]["text/plain"])
    return "\n".join(parts)


def test_the_recipe_is_the_notebooks():
    source = "\n".join(c.source for c in nbformat.read(NOTEBOOK, as_version=4).cells if c.cell_type == "code")
    assert all(line in source for line in RECIPE), [line for line in RECIPE if line not in source]
    assert PADDING_PCT > 20  # the notebook's point: a padded batch wastes a fifth or more


def test_no_cell_failed(executed):
    nb, _ = executed
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors, [(e["ename"], e["evalue"]) for e in errors]


def _sft(runs: Path) -> swift_nb.Run:
    (path,) = swift_nb.runs(runs).query("label == 'sft'").path
    return swift_nb.load_run(path)


def test_the_tokens_are_those_the_notebook_fed(executed):
    nb, runs = executed
    run = _sft(runs)
    steps = run.steps[run.steps["trigger"] != "end"].set_index("step")
    assert list(steps.index) == list(range(STEPS))
    assert steps["tokens"].tolist() == TOKENS and steps["real_tokens"].tolist() == REAL
    assert run.summary["tokens_per_step"] == statistics.mean(TOKENS)
    assert run.summary["real_tokens_per_step"] == statistics.mean(REAL)
    assert run.summary["padding_pct"] == pytest.approx(PADDING_PCT, abs=1e-9)
    # the real tokens per second: the known real tokens per step over the recorded step time,
    # every step's median (all four ran traced: warmup 1, active 3)
    step_s = statistics.median(steps["duration_s"])
    assert run.summary["real_tokens_per_s"] == pytest.approx(statistics.mean(REAL) / step_s, rel=1e-9)
    # and what the notebook printed, in its own format
    printed = re.search(
        r"tokens per step ([\d,]+), real ([\d,]+): ([\d.]+) % padding; ([\d,]+) real tokens/s",
        _text(nb, "tokens per step"),
    )
    assert printed, _text(nb, "tokens per step")
    assert printed.groups()[:3] == (
        f"{statistics.mean(TOKENS):,.0f}",
        f"{statistics.mean(REAL):,.0f}",
        f"{PADDING_PCT:.1f}",
    )
    assert abs(float(printed[4].replace(",", "")) - statistics.mean(REAL) / step_s) <= 0.5  # to the token


def test_the_padding_and_the_logits_are_named_with_the_known_numbers(executed):
    nb, runs = executed
    run = _sft(runs)
    # the tokens of the step the memory's "at the peak" is from, as the notebook fed them
    tokens = TOKENS[peak_step(run.steps)]
    at_peak = run.summary["memory_categories_at_peak"]
    assert at_peak["logits"] >= tokens * VOCAB * 4  # one fp32 copy of that step's logits at least
    assert at_peak["logits"] > at_peak["activations"]
    text = _text(nb, "for f in swift_nb.report(sft).analysis.findings")
    assert f"{PADDING_PCT:.1f} % of the tokens computed are padding" in text and "toggle: packing" in text
    assert "The loss's logits hold" in text and f"{tokens:,} tokens × {VOCAB:,} × 4 B" in text
    assert "toggle: fused_ce" in text


def test_the_throughput_section_shows_the_same_tokens(executed):
    """The report's Throughput section: the same padding, and the known real tokens over the
    same step time (one number per quantity)."""
    _, runs = executed
    run = _sft(runs)
    tp = throughput(run)
    step_s = statistics.median(run.steps.loc[run.steps["trigger"] != "end", "duration_s"])
    assert tp.padding_pct == pytest.approx(PADDING_PCT, abs=1e-9)
    assert tp.tokens_per_s == pytest.approx(statistics.mean(REAL) / step_s, rel=1e-9)


def test_compare_keeps_the_loss_and_removes_the_waste(executed):
    _, runs = executed
    by_variant = {
        r.context.get("variant"): r
        for r in map(swift_nb.load_run, swift_nb.runs(runs).path)
        if r.label != "sft"
    }
    assert {"baseline", "fused_ce", "packing"} <= set(by_variant), sorted(map(str, by_variant))
    base, fused, packed = (by_variant[k] for k in ("baseline", "fused_ce", "packing"))
    assert fused.summary["peak_mem_bytes"] <= 0.6 * base.summary["peak_mem_bytes"]
    # the same samples in each: the baseline pads them as the notebook's collator does, packing
    # computes only their real tokens
    assert base.summary["padding_pct"] == pytest.approx(PADDING_PCT, abs=1e-9)
    assert packed.summary["padding_pct"] == 0.0
    for run in (base, fused, packed):
        assert run.summary["real_tokens_per_step"] == statistics.mean(REAL), run.context.get("variant")
    for run in (fused, packed):
        (report,) = run.context["toggles"]
        assert report["applied"], report


def test_the_forecast_says_what_batch_now_fits(executed):
    nb, _ = executed
    lines = {
        line.split(":")[0].strip(): line
        for line in _text(nb, "largest batch that fits").splitlines()
        if "largest batch" in line
    }
    assert {"as it is", "fused_ce", "fused_ce + packing"} <= set(lines)

    def batch(label: str) -> int:
        return int(lines[label].rsplit(":", 1)[1].replace(",", ""))

    assert batch("fused_ce") > 3 * batch("as it is") > 0
