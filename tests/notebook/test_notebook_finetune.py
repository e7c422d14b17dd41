"""End to end: notebooks/05_finetune_lora.ipynb executed through nbclient/ipykernel,
headless on CPU: a peft LoRA Llama profiled with its frozen base by category, the
fine-tuning named, the findings, ``--compare lora(r=4),lora(r=16)`` on a full fine-tune,
and the QLoRA forecast on a 24 GB card, as the reader sees them."""

from __future__ import annotations

import shutil
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from support.common import kernel_env

import swift_nb

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "notebooks" / "05_finetune_lora.ipynb"


pytest.importorskip("peft")


@pytest.fixture(scope="module")
def executed(tmp_path_factory) -> tuple[nbformat.NotebookNode, Path]:
    folder = tmp_path_factory.mktemp("finetune_lora")
    shutil.copy(NOTEBOOK, folder)
    nb = nbformat.read(folder / NOTEBOOK.name, as_version=4)
    client = NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(folder)}}
    )
    client.execute(env=kernel_env())
    nbformat.write(nb, folder / "executed.ipynb")  # kept beside the runs, for a look when a test fails
    return nb, folder / "swift_nb_runs"


def _text(cell: nbformat.NotebookNode) -> str:
    parts = []
    for o in cell.outputs:
        if o.output_type == "stream":
            parts.append(o.text)
        elif "text/plain" in o.get("data", {}):
            parts.append(o["data"]["text/plain"])
    return "\n".join(parts)


def _cell(nb: nbformat.NotebookNode, contains: str) -> nbformat.NotebookNode:
    (cell,) = [c for c in nb.cells if c.cell_type == "code" and contains in c.source]
    return cell


def test_no_cell_failed(executed):
    nb, _ = executed
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors, [(e["ename"], e["evalue"]) for e in errors]


def test_the_lora_run_shows_its_frozen_base(executed):
    nb, runs = executed
    text = _text(_cell(nb, 'at_peak = lora_run.summary["memory_categories_at_peak"]'))
    assert "frozen_parameters:" in text and "lora r=8 alpha=16 on q_proj, v_proj" in text
    (path,) = swift_nb.runs(runs).query("label == 'lora'").path
    run = swift_nb.load_run(path)
    cats = run.summary["memory_categories_at_peak"]
    assert cats["frozen_parameters"] > 50 * cats["parameters"] > 0


def test_compare_measures_what_lora_saves(executed):
    _, runs = executed
    by_variant = {
        r.context.get("variant"): r
        for r in map(swift_nb.load_run, swift_nb.runs(runs).path)
        if r.label != "lora"
    }
    assert {"baseline", "lora(r=4)", "lora(r=16)"} <= set(by_variant), sorted(map(str, by_variant))
    base, r4, r16 = (
        by_variant[k].summary["memory_categories_at_peak"] for k in ("baseline", "lora(r=4)", "lora(r=16)")
    )
    assert base["optimizer_state"] > 5 * r16["optimizer_state"] > 5 * r4["optimizer_state"] > 0
    assert r4["frozen_parameters"] > 0.9 * base["parameters"]
    for variant in ("lora(r=4)", "lora(r=16)"):
        assert by_variant[variant].context["finetune"]["method"] == "lora"


def test_the_forecast_prices_qlora_on_a_24gb_card(executed):
    nb, _ = executed
    text = _text(_cell(nb, "QLoRA, 4x batch"))
    lines = {line.split(":")[0].strip(): line for line in text.splitlines() if ":" in line}
    assert {"LoRA, fp32", "LoRA, bf16", "QLoRA, 4x batch"} <= set(lines)
    assert "fits" in lines["QLoRA, 4x batch"]


def test_a_7b_model_is_forecast_from_its_config(executed):
    nb, _ = executed
    text = _text(_cell(nb, 'model="llama-2-7b"'))
    lines = {line.split(" on ")[0].strip(): line for line in text.splitlines() if " on " in line}
    assert {"7B full, bf16", "7B LoRA r=16", "7B QLoRA r=16"} <= set(lines), text
    assert "fits" in lines["7B full, bf16"] and "fits" in lines["7B QLoRA r=16"]
