"""End to end: notebooks/04_compile_and_shard.ipynb executed through nbclient/ipykernel,
headless on CPU: the eager baseline, the compiled run with its recompiles and graph break
explained, and ``--compare torch_compile,fsdp(world_size=2)`` with compile time apart and
each rank's memory against the forecast, as the reader sees them."""

from __future__ import annotations

import shutil
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from support.common import kernel_env

import swift_nb
from swift_nb.record.write import EVERY_STEP
from swift_nb.render.comparison.page import display_table, rank_memory_table
from swift_nb.rerun.launcher import Outcome
from swift_nb.toggles.torch_compile import cxx_compiler

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "notebooks" / "04_compile_and_shard.ipynb"

pytestmark = [
    # executes the notebook: a compiled run and three reruns, one of two ranks
    pytest.mark.skipif(
        cxx_compiler() is None,
        reason="Inductor needs a C++ compiler on CPU and none is installed (g++, c++, clang++)",
    ),
]


@pytest.fixture(scope="module")
def executed(tmp_path_factory) -> tuple[nbformat.NotebookNode, Path]:
    """The notebook executed in a fresh folder (its runs land in ./swift_nb_runs)."""
    folder = tmp_path_factory.mktemp("compile_and_shard")
    shutil.copy(NOTEBOOK, folder)
    nb = nbformat.read(folder / NOTEBOOK.name, as_version=4)
    client = NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(folder)}}
    )
    client.execute(env=kernel_env())
    return nb, folder / "swift_nb_runs"


def _cell(nb: nbformat.NotebookNode, starts: str) -> nbformat.NotebookNode:
    (cell,) = [c for c in nb.cells if c.cell_type == "code" and c.source.startswith(starts)]
    return cell


def _text(cell: nbformat.NotebookNode) -> str:
    parts = []
    for o in cell.outputs:
        if o.output_type == "stream":
            parts.append(o.text)
        elif "text/plain" in o.get("data", {}):
            parts.append(o["data"]["text/plain"])
    return "\n".join(parts)


def _runs(folder: Path) -> dict[str, swift_nb.Run]:
    """The notebook's runs by label (a rerun's by variant)."""
    out = {}
    for path in sorted(folder.iterdir()):
        if (path / "run.json").is_file():
            run = swift_nb.load_run(path)
            out[run.context.get("variant") or run.label] = run
    return out


def test_every_cell_ran(executed):
    nb, _ = executed
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors, errors


def test_the_compiled_run_counts_its_compiles_apart_from_the_steady_steps(executed):
    nb, folder = executed
    run = _runs(folder)["compiled"]
    s = run.summary
    assert s["compile_s"] > 0 and s["recompiles"] == 3 and s["graph_breaks"] == 1
    shown = _text(_cell(nb, "# swift_nb: skip (reruns"))
    assert (
        f"compiling: {s['compile_s']:.1f} s, 3 recompile(s), 1 graph break(s); "
        f"steady step {1e3 * s['step_time_median_s']:.1f} ms" in shown
    )
    kinds = [(e["kind"], e["step"]) for e in run.context["compile"]["events"]]
    assert ("graph_break", 0) in kinds and ("recompile", 4) in kinds
    assert "torch_compile: `model` (Net) compiled (backend=aot_eager, mode=default)" in _text(
        _cell(nb, "%%swift_profile --label compiled")
    )


def test_the_recompile_and_the_graph_break_are_explained(executed):
    nb, _ = executed
    shown = _text(_cell(nb, "# swift_nb: skip (it rewrites"))
    assert "recompile: torch.compile recompiled 3×" in shown
    assert "tensor 'x' changed size at dim 0 (32 → 48) at step 4" in shown
    assert "torch._dynamo.mark_dynamic(x, 0)" in shown
    assert "graph_break: torch.compile's graph breaks at" in shown
    assert "Unsupported Tensor.item() call" in shown and "capture_scalar_outputs = True" in shown
    assert "compile_time: Compiling took" in shown


def test_compare_shows_compile_apart_and_each_ranks_memory_against_the_forecast(executed):
    nb, folder = executed
    shown = _text(_cell(nb, "%%swift_profile --compare"))
    assert "reruns finished — baseline: ok, torch_compile: ok, fsdp(world_size=2): ok" in shown
    runs = _runs(folder)
    ran = [(name, runs[name]) for name in ("baseline", "torch_compile", "fsdp(world_size=2)")]
    table = swift_nb.rerun.comparison([(Outcome(n, "ok", str(r.path)), r) for n, r in ran]).table
    compiled = table.set_index("variant").loc["torch_compile"]
    assert compiled["compile_s"] > 0 and compiled["graph_breaks"] == 1
    # the reader's row: compile time in its own column, the steady median beside it
    row = display_table(table).set_index("variant").loc["torch_compile"]
    # 6 steps, the profiler on 4: fewer than 3 ran with it off, so every step's median
    assert table["step_time_basis"].eq(EVERY_STEP).all()
    assert f"{row['step (median, every step)']} {row['compile']}" in " ".join(shown.split())

    per_rank = rank_memory_table(ran)
    fsdp = per_rank[per_rank["variant"] == "fsdp(world_size=2)"]
    held = fsdp[fsdp["category"].isin(["parameters", "gradients", "optimizer state"])]
    assert len(held) == 6 and held["error"].str.endswith("✓").all(), held.to_string()
    for line in per_rank.to_string(index=False).splitlines()[1:]:
        assert line.strip() in shown, line
    page = (runs["baseline"].path / "compare.html").read_text()
    assert "Memory per rank against the forecast" in page
