"""End to end: notebooks/07_will_it_scale.ipynb executed through nbclient/ipykernel,
headless on CPU: the loopback link measured with ``measure_link()``, one process profiled,
``scale()`` for 2 and 4 ranks with its findings, then the 2-rank DDP jobs (fp32 and bf16
gradients, ``--compare``) set beside their forecast. How close the forecast comes is
measured in ``benchmarks/scale_forecast.py``; here, that every piece is there and agrees
with the records it was computed from."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from support.common import kernel_env

import swift_nb

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "notebooks" / "07_will_it_scale.ipynb"


@pytest.fixture(scope="module")
def executed(tmp_path_factory) -> tuple[nbformat.NotebookNode, Path]:
    folder = tmp_path_factory.mktemp("will_it_scale")
    shutil.copy(NOTEBOOK, folder)
    nb = nbformat.read(folder / NOTEBOOK.name, as_version=4)
    client = NotebookClient(
        nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(folder)}}
    )
    client.execute(env={**kernel_env(), "OMP_NUM_THREADS": "1"})
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


def test_the_link_was_measured(executed):
    nb, _ = executed
    text = _text(nb, "swift_nb.measure_link()")
    assert "measured gloo (2 ranks, cpu): all-reduce bus bandwidth" in text
    assert re.search(r"compute runs under \d+% of an all-reduce", text), text


def test_the_jobs_ran_beside_their_forecast(executed):
    nb, runs = executed
    done = swift_nb.runs(runs)
    jobs = done[done["label"].astype(str).str.startswith("ddp(world_size=2")]
    assert sorted(jobs["label"]) == [
        "ddp(world_size=2)",
        "ddp(world_size=2)",
        "ddp(world_size=2,grad_dtype=bf16)",
    ]
    assert (jobs["world_size"] == 2).all() and (jobs["status"] == "ok").all()
    text = _text(nb, "plain_job, bf16_job = ")
    assert "one-rank as ddp(world_size=2)" in text and "one-rank as ddp(world_size=2,grad_dtype=bf16)" in text
    # the forecast table and its findings
    # which DDP term ranks second to compute depends on this machine's copy speed against
    # its loopback all-reduce (a loaded CI machine measured the bucket copies at 34 %)
    lines = _text(nb, "table = swift_nb.scale(base, (1, 2, 4), link)").splitlines()
    ddp_rows = [line for line in lines if re.search(r"^\d+\s+[24]\s+ddp\s", line)]
    fsdp_rows = [line for line in lines if re.search(r"^\d+\s+[24]\s+fsdp\s", line)]
    assert len(ddp_rows) == 2 and len(fsdp_rows) == 2, lines
    assert all(re.search(r"gradient all-reduce|bucket copies|slowest rank", r) for r in ddp_rows), ddp_rows
    assert all(re.search(r"all-gathers|reduce-sca|shard copies|slowest rank", r) for r in fsdp_rows), (
        fsdp_rows
    )
    assert "efficiency forecast" in _text(nb, "for f in table.attrs")


def test_accumulation_is_forecast_from_the_accumulated_run(executed):
    """The one-process run accumulated every gradient 4 times; its forecast reduces them
    once, as the job does: the same communication as the plain run's over 4 × the compute."""
    nb, runs = executed
    done = swift_nb.runs(runs)
    (path,) = done[done["label"] == "accumulated"].path
    accumulated = swift_nb.load_run(path)
    (plain_path,) = done[done["label"] == "one-rank"].path
    plain = swift_nb.load_run(plain_path)
    a = swift_nb.scale(accumulated, (2,), "pcie4", "ddp").iloc[0]
    p = swift_nb.scale(plain, (2,), "pcie4", "ddp").iloc[0]
    assert a["comm_s"] == pytest.approx(p["comm_s"], rel=1e-6)  # the same gradients, reduced once
    # 4 × the compute per reduction (the efficiency also carries the wait for the slowest
    # rank, which is the noise of this machine's steps, not the accumulation)
    # (4 micro-batches measured ~2x one plain step on a loaded 2-core machine: no optimizer
    # step between them, so well under 4x; 1.5x still tells one reduction per 4 apart)
    assert a["compute_s"] > 1.5 * p["compute_s"]
    assert a["comm_s"] / a["compute_s"] < p["comm_s"] / p["compute_s"] / 1.5
    assert "accumulated as ddp(world_size=2)" in _text(nb, "accumulated, accumulated_job = ")
