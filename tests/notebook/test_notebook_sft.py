"""End to end: notebooks/06_llm_sft.ipynb executed through nbclient/ipykernel, headless on
CPU: a Qwen2-shaped model with Qwen's vocabulary fed padded batches by a collator; the
padding and the logits counted and named in findings; ``--compare fused_ce,packing`` with
the same loss and less memory; and the batch that now fits."""

from __future__ import annotations

import shutil
from pathlib import Path

import cut_cross_entropy  # noqa: F401 (the notebook imports it: missing, it fails here by name)
import nbformat
import pytest
import transformers  # noqa: F401 (the notebook imports it: missing, it fails here by name)
from nbclient import NotebookClient
from support.common import kernel_env

import swift_nb

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "notebooks" / "06_llm_sft.ipynb"


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


def test_no_cell_failed(executed):
    nb, _ = executed
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors, [(e["ename"], e["evalue"]) for e in errors]


def test_the_padding_and_the_logits_are_counted_and_named(executed):
    nb, runs = executed
    (path,) = swift_nb.runs(runs).query("label == 'sft'").path
    run = swift_nb.load_run(path)
    steps = run.steps.dropna(subset=["tokens"])
    expected = 100 * (1 - steps["real_tokens"].sum() / steps["tokens"].sum())
    assert run.summary["padding_pct"] == expected > 20
    assert (
        run.summary["memory_categories_at_peak"]["logits"]
        > run.summary["memory_categories_at_peak"]["activations"]
    )
    text = _text(nb, "for f in swift_nb.report(sft).analysis.findings")
    assert "% of the tokens computed are padding" in text and "toggle: packing" in text
    assert "The loss's logits hold" in text and "× 151,936 × 4 B" in text and "toggle: fused_ce" in text


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
    assert packed.summary["padding_pct"] == 0.0 and base.summary["padding_pct"] > 20
    assert packed.summary["real_tokens_per_step"] == base.summary["real_tokens_per_step"]  # the same samples
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
